"""The whole job's stacks and failure notices through the rendezvous store: what the
``numarun-store`` thread (:mod:`numarun.rendezvous.storewatch`) does at each event of the
whole-job view, and the round's state it keeps. The hang verdict is
:mod:`numarun.jobwide.hangverdict`'s. Every key and event is listed in docs/protocol.md.

The whole job in O(1) store requests per node per event (:mod:`numarun.stacks.digest`,
:mod:`numarun.stacks.merge`): each node posts a *digest* of its ranks' stacks (a few hundred
bytes: class ids with rank sets) and, the first time in the round a class is seen by anyone (an
``add`` on its claim key returns 1), that class's frames; one node merges the digests.

* ``numarun stacks`` for the whole job: the asking node posts ``stacks``; every node appends its
  digest to ``numarun/replies/<k>`` (one request) and counts itself in ``numarun/replied/<k>``;
  the node whose count reaches the round's size (the rendezvous's own count of its nodes, never
  a count read before every node registered) sets ``numarun/complete/<k>``, which the asking node
  waits for (at most :data:`COLLECT_LIMIT` seconds); the asking node reads every digest in one
  request, merges them, reads the frames of the classes it has not seen, and answers its client:
  the merged view never travels through the store, and no other node reads it.
* a failure notice (``stop``) carries the failing node's digest; each node reads the first
  notice of the round with the frames it names, and no later one (the round is over for it).

Whatever is read back is untrusted (:mod:`numarun.stacks.digest`): a post that is not one is named
in one line (:meth:`StoreWatch.note`) and left out; decoding it costs memory and time in
proportion to its size and the job's (rank sets bounded by the job's ranks, in all); frames a
digest names that never come are waited for once per round. A counter that is not what numarun
wrote is named and repaired. What raises past this module (a store error, a bug) is the store
watch's to contain (:meth:`StoreWatch.guarded`): one line, never a lost rendezvous.
"""

from __future__ import annotations

from collections.abc import Callable

from numarun.jobwide.results import Ask, Merged
from numarun.rendezvous.storeops import Conn, Forged, as_count, first_line
from numarun.rendezvous.storeresults import Notice
from numarun.rendezvous.storewatch import (
    ALIVE_KEY,
    NODES_KEY,
    StoreWatch,
    WatchedRound,
)
from numarun.stacks.digest import (
    FRAMES_LIMIT,
    Classes,
    PostError,
    Raw,
    node_digest,
    node_label,
    read_digest,
)
from numarun.stacks.merge import merge

FRAMES_KEY = "numarun/frames/{}"
CLAIM_KEY = "numarun/claim/{}"
REPLIES_KEY = "numarun/replies/{}"
REPLIED_KEY = "numarun/replied/{}"
COMPLETE_KEY = "numarun/complete/{}"
COLLECT_LIMIT = 2.0  # seconds the asking node waits for the other nodes' digests
ANSWER_LIMIT = 1.5  # seconds this node's loop has to hand over its own stacks
FRAMES_WAIT = 0.5  # seconds to wait for frames a digest names (their poster is still writing)
FRAMES_KEPT = 1024  # frames posts kept per round (a forged view may name thousands of classes)
NEVER_CAME_KEPT = 4096  # class ids whose frames never came, kept per round (then none waited for)
_MISSING_CHECKED = 64  # nodes that did not answer whose heartbeat is read to say why
NOT_NUMARUN = "not a numarun node (torchrun?): its ranks not shown"


class JobRound:
    """The whole-job view's state of one watched round (``WatchedRound.job``): this node's
    still/done marks and the verdicts it heard (:mod:`numarun.jobwide.hangverdict`), the classes and
    frames seen."""

    def __init__(self) -> None:
        self.now = "moving"  # this node's fresh evidence: "still", "moving" or "done"
        self.still = False  # this node is counted in numarun/stills
        self.done: list[Raw] | None = None  # this node's ranks all ended: they, for answers
        self.listed = False
        self.post: bytes | None = None  # this node's still post, as set
        self.marks = 0  # marks handed to the posting threads (loop side)
        self.applied = 0  # the last mark applied in the store
        self.pending: dict[int, tuple[object, int]] = {}  # verdict event -> (view, its judge)
        self.acted = False  # a verdict was handed to the loop
        self.waves = 0  # takeover waves done (hangverdict)
        self.chain = 0  # this node's still marks: the waves of an earlier one stop
        self.complete_at = 0  # the last wave at which this node read a complete count
        self.frame_posts: dict[str, bytes] = {}  # class id -> its frames post, this round
        self.never_came: set[str] = set()  # class ids whose frames were not there in time
        self.claimed: set[str] = set()
        self.classes = Classes()  # the store thread's
        self.mark_classes = Classes()  # the posting threads'


def state(round_: WatchedRound) -> JobRound:
    """The round's :class:`JobRound`, made at its first use."""
    if round_.job is None:
        round_.job = JobRound()
    return round_.job


def nodes(watch: StoreWatch, round_: WatchedRound, conn: Conn) -> int:
    """How many numarun nodes the round has, read now (``numarun/nodes``, within 1 and the
    group's size; else named, and the group's size). Never cached: a node of the round may
    register after another read it. With a diagnostics store of its own (``round_.own_diag``):
    the round's size, as the rendezvous's result gives it (``numarun/nodes`` is on the
    rendezvous store, which the view does not load: docs/protocol.md)."""
    if round_.own_diag:
        return round_.size
    try:
        count = conn.count(NODES_KEY)
    except Forged as forged:
        watch.note(round_, NODES_KEY, f"{forged}; every node of the round is counted instead")
        return round_.size
    if not 1 <= count <= round_.size:
        watch.note(round_, NODES_KEY, f"{NODES_KEY} is {count}, not from 1 to {round_.size}: "
                   "every node of the round is counted instead")  # fmt: skip
        return round_.size
    return count


def publish(
    watch: StoreWatch | None, round_: WatchedRound, frames: dict[str, bytes], conn: Conn
) -> None:
    """Post the frames of classes nobody posted yet in this round: the first node whose
    ``add`` on a class's claim key returns 1 sets its frames key (on ``conn``; ``watch`` None:
    nothing is said)."""
    job = state(round_)
    if len(job.frame_posts) < FRAMES_KEPT:
        job.frame_posts.update(frames)
    for ident, post in frames.items():
        if ident in job.claimed:
            continue
        try:
            first = conn.add(CLAIM_KEY.format(ident), 1) == 1
        except Forged as forged:
            if watch is not None:
                watch.note(round_, CLAIM_KEY, str(forged))
            continue
        job.claimed.add(ident)
        if first:
            conn.set(FRAMES_KEY.format(ident), post)
            round_.shared += [FRAMES_KEY.format(ident), CLAIM_KEY.format(ident)]


def frames_of(round_: WatchedRound, ids: list[str], conn: Conn | None = None) -> dict[str, bytes]:
    """The frames post of each class of ``ids`` that is there: this node's own, those read
    before in the round, the others read now (in one request when all are there, else each
    that is there). A class whose frames are not there within :data:`FRAMES_WAIT` seconds (a
    claim whose poster died before its ``set``, or an id a forged post made up) is waited for
    once per round, never again. Decoded and checked where they are shown
    (:meth:`numarun.stacks.merge.JobView.resolve`), not here."""
    conn = conn or round_.conn
    assert conn is not None
    job = state(round_)
    posts, never = job.frame_posts, job.never_came
    fetch = [i for i in dict.fromkeys(ids) if i not in posts and i not in never]
    fetch = fetch[:FRAMES_KEPT]
    found: dict[str, bytes] = {}
    if fetch:
        wait = FRAMES_WAIT if len(never) < NEVER_CAME_KEPT else 0.0
        values = conn.get_many([FRAMES_KEY.format(i) for i in fetch], wait)
        for ident, value in zip(fetch, values, strict=True):
            if value is not None and len(value) <= FRAMES_LIMIT:
                found[ident] = value
            elif len(never) < NEVER_CAME_KEPT:
                never.add(ident)
        if len(posts) < FRAMES_KEPT:
            posts.update(found)
    return {i: posts.get(i) or found[i] for i in ids if i in posts or i in found}


def noter(watch: StoreWatch, round_: WatchedRound) -> Callable[[str], None]:
    return lambda line: watch.note(round_, "events", line)


def read_digests(
    watch: StoreWatch | None, round_: WatchedRound, posts: list[bytes], what: str, ranks: int
) -> tuple[list, list[str]]:
    """The digests among ``posts`` (each checked; one that is not, or that would bring the
    ranks named past ``ranks`` in all, or names a node outside the round, or a node read
    before (the first, as read, is kept), left out and named in the notes): decoding them
    costs memory in proportion to the job's ranks (a second digest of a node is decoded
    within what is left, then dropped: a forged one cannot crowd out another node's)."""
    digests, notes = [], []
    left = ranks
    read: set[int] = set()
    for post in posts:
        try:
            digest = read_digest(post, below=round_.world, most=max(0, left))
        except PostError as error:
            if len(notes) < 16:
                notes.append(f"{what}: {error}")
            continue
        if digest.node >= round_.size:
            if len(notes) < 16:
                notes.append(f"{what}: a digest of node {digest.node}, not one of {round_.size}")
            continue
        if digest.node in read:
            if len(notes) < 16:
                notes.append(f"{what}: a second digest of node {digest.node}: ignored")
            continue
        read.add(digest.node)
        left -= digest.rank_count
        digests.append(digest)
    if watch is not None and notes:
        watch.note(round_, f"digests {what}", f"{what}: {len(notes)} post(s) left out: "
                   f"{notes[0]}")  # fmt: skip
    return digests, notes


def missing_nodes(
    round_: WatchedRound, answered: set[int], late: str, conn: Conn | None = None
) -> list[tuple[str, list[int]]]:
    """The nodes of the round that did not answer, by why: a node that never beat is not a
    numarun node (a torchrun node); the others were ``late``."""
    conn = conn or round_.conn
    assert conn is not None
    missing = [node for node in range(round_.size) if node not in answered]
    checked = missing[:_MISSING_CHECKED]
    if round_.own_diag:  # the beats are the rendezvous store's (its health connection)
        conn = round_.health_conn() or conn
    beats = conn.get_many([ALIVE_KEY.format(node) for node in checked], 0.0)  # a few requests
    torchrun = [node for node, beat in zip(checked, beats, strict=True)
                if not (as_count(beat) or 0) > 0]  # fmt: skip
    slow = [node for node in missing if node not in set(torchrun)]
    return [(why, found) for why, found in ((NOT_NUMARUN, torchrun), (late, slow)) if found]


# --- numarun stacks for the whole job ------------------------------------------------------------


def answer_request(
    watch: StoreWatch, round_: WatchedRound, number: int, asker: int, token: str
) -> None:
    """Request ``number``: this node's digest appended to the request's replies; on the asking
    node, then, every node's merged (:func:`collect`), whatever happened to its own answer (a
    failure there is one line; the asking node still answers its client)."""
    if asker != round_.me:
        _answer(watch, round_, number)  # what it raises: one line (the event's guard)
        return
    watch.guarded(round_, f"this node's answer to stacks request {number}", _answer, watch,
                  round_, number)  # fmt: skip
    try:
        collect(watch, round_, number, token)
    except Exception as error:
        if token:
            why = f"{type(error).__name__}: {first_line(error)}"
            watch.report(round_, Merged(token, None, {}, f"merging them failed ({why})"))
        raise


def _answer(watch: StoreWatch, round_: WatchedRound, number: int) -> None:
    conn = round_.conn
    assert conn is not None
    job = state(round_)
    if job.done is not None and not watch.attached:  # in the exit barrier: its ended ranks
        dumps: list[Raw] | None = job.done
    else:
        dumps = watch.ask_loop(round_, number, Ask(number), ANSWER_LIMIT)  # type: ignore[assignment]
    if dumps is None:
        return
    digest, frames = node_digest(dumps, node=round_.me, host=round_.host, pid=round_.pid,
                                 state="answer", known=job.classes)  # fmt: skip
    publish(watch, round_, frames, conn)
    conn.append(REPLIES_KEY.format(number), str(round_.me), digest.encode())
    try:
        replied = conn.add(REPLIED_KEY.format(number), 1)
    except Forged as forged:
        watch.note(round_, REPLIED_KEY, str(forged))
        replied = 0
    if replied >= round_.size:  # the round's own count: every node of it answered
        conn.set(COMPLETE_KEY.format(number), b"1")


def collect(watch: StoreWatch, round_: WatchedRound, number: int, token: str) -> None:
    """Every node's digest for request ``number`` (all nodes of the round, or what came within
    :data:`COLLECT_LIMIT` seconds) in one request, merged here with the frames of its classes,
    and handed to this node's loop (the merged view never goes through the store)."""
    conn = round_.conn
    assert conn is not None
    conn.wait([COMPLETE_KEY.format(number)], COLLECT_LIMIT)
    lines = conn.lines(REPLIES_KEY.format(number), range(round_.size))
    round_.local += [REPLIES_KEY.format(number), REPLIED_KEY.format(number),
                     COMPLETE_KEY.format(number)]  # fmt: skip
    if not conn.extended:
        round_.local += [f"{REPLIES_KEY.format(number)}/{part}" for part in range(round_.size)]
    digests, notes = read_digests(None, round_, lines[: 2 * round_.size + 16],
                                  f"an answer to {number}", round_.world)  # fmt: skip
    missing = missing_nodes(round_, {d.node for d in digests},
                            f"did not answer within {COLLECT_LIMIT:g} s")  # fmt: skip
    view = merge(digests, kind="stacks", by=node_label(round_.me, round_.host),
                 size=round_.size, missing=missing, notes=notes, world=round_.world)  # fmt: skip
    posts = frames_of(round_, view.frame_ids())
    view.add_posts(posts)
    if token:
        watch.report(round_, Merged(token, view, posts))


# --- failure notices -----------------------------------------------------------------------------


def read_notice(round_: WatchedRound, sender: int, post: bytes) -> Notice:
    """Where the ranks of node ``sender``'s notice were: its digest (``post``, what followed
    its line) and the frames it names (the line itself is the rendezvous's). Raises
    :class:`PostError` for a post that is not one."""
    digest = read_digest(post, below=round_.world, most=round_.world)  # checked where shown
    frames = frames_of(round_, [ident for ident, _, _ in digest.classes])
    return Notice("", digest, frames)


def notice_post(round_: WatchedRound, dumps: list[Raw], conn: Conn) -> bytes:
    """What follows this node's notice line: the digest of ``dumps`` (its ranks), its classes'
    frames published on ``conn`` (the posting thread's)."""
    digest, frames = node_digest(dumps, node=round_.me, host=round_.host, pid=round_.pid,
                                 state="notice", known=Classes())  # fmt: skip
    publish(None, round_, frames, conn)
    return digest.encode()

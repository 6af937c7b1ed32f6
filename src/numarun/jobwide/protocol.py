"""The whole job's stacks, hang verdict and failure notices through the rendezvous store: what the
``numarun-store`` thread (:mod:`numarun.rendezvous.storewatch`) does at each event of the
whole-job view. Every function here runs in that thread, on the round's connection; every key and
event is listed in docs/protocol.md.

The whole job in O(1) store requests per node per event (:mod:`numarun.stacks.digest`,
:mod:`numarun.stacks.merge`): each node posts a *digest* of its ranks' stacks (a few hundred
bytes: class ids with rank sets) and, the first time in the round a class is seen by anyone (an
``add`` on its claim key returns 1), that class's frames; one node merges every digest into the
job's classes and posts the one merged result as an event; every node reads that one event and
the frames of the classes it has not seen yet.

* ``numarun stacks`` for the whole job: the asking node posts ``stacks``; every node appends its
  digest to ``numarun/replies/<k>`` (one request) and counts itself in ``numarun/replied/<k>``;
  the last numarun node sets ``numarun/complete/<k>``, which the asking node waits for (at most
  :data:`COLLECT_LIMIT` seconds), reads every digest in one request, merges and posts ``merged``.
* ``--hang-timeout``: a node whose ranks are all still posts its digest at ``numarun/still/<n>``,
  lists itself once in ``numarun/still-nodes`` and adds 1 to ``numarun/stills`` (and sets its key
  to ``moving`` and takes the 1 back when a rank moves); a node whose ranks all ended counts as
  still for good (it waits in the exit barrier, still watching). The node that brings the count
  to the number of numarun nodes (``numarun/nodes``) reads the listed nodes' keys in one request,
  checks that each is still (a count moved by another client is named and repaired, ``recount``),
  merges and posts ``hang``; every node stops with the same summary. A node that was never still
  names a verdict it receives as coming from the store, and ignores it.
* a failure notice (``stop``) carries the failing node's digest; each node reads it in one
  request.

Whatever is read back is untrusted (:mod:`numarun.stacks.digest`): a post that is not one is named
in one line (:meth:`StoreWatch.note`) and left out; a counter that is not what numarun wrote is
named and repaired. What raises past this module (a store error, a bug) is the store watch's to
contain (:meth:`StoreWatch.guarded`): one line, never a lost rendezvous.
"""

from __future__ import annotations

from collections.abc import Callable

from numarun.jobwide.results import Ask, Hang, Merged
from numarun.rendezvous.storeops import Conn, Forged
from numarun.rendezvous.storeresults import Notice
from numarun.rendezvous.storewatch import (
    ALIVE_KEY,
    NODES_KEY,
    StoreWatch,
    WatchedRound,
    post_event,
    read_count,
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
from numarun.stacks.merge import encode_view, merge, read_view

FRAMES_KEY = "numarun/frames/{}"
CLAIM_KEY = "numarun/claim/{}"
REPLIES_KEY = "numarun/replies/{}"
REPLIED_KEY = "numarun/replied/{}"
COMPLETE_KEY = "numarun/complete/{}"
STILL_KEY = "numarun/still/{}"
STILLS_KEY = "numarun/stills"
STILL_NODES_KEY = "numarun/still-nodes"
MOVING = b"moving"
COLLECT_LIMIT = 2.0  # seconds the asking node waits for the other nodes' digests
ANSWER_LIMIT = 1.5  # seconds this node's loop has to hand over its own stacks
FRAMES_WAIT = 0.5  # seconds to wait for frames a digest names (their poster is still writing)
_MISSING_CHECKED = 64  # nodes that did not answer whose heartbeat is read to say why
NOT_NUMARUN = "not a numarun node (torchrun?): its ranks not shown"


class JobRound:
    """The whole-job view's state of one watched round (``WatchedRound.job``): this node's
    still/done marks, the classes and frames seen, the node count once read."""

    def __init__(self) -> None:
        self.still = False
        self.still_once = False  # this node's ranks were still (or ended) in this round
        self.done: list[Raw] | None = None  # this node's ranks all ended: they, for answers
        self.listed = False
        self.nodes: int | None = None  # numarun nodes in the round, once read
        self.frame_posts: dict[str, bytes] = {}  # class id -> its frames post, this round
        self.claimed: set[str] = set()
        self.classes = Classes()


def state(round_: WatchedRound) -> JobRound:
    """The round's :class:`JobRound`, made at its first use."""
    if round_.job is None:
        round_.job = JobRound()
    return round_.job


def on_event(watch: StoreWatch, round_: WatchedRound, number: int, kind: str, sender: int,
             fields: list[str], body: bytes) -> None:  # fmt: skip
    """Event ``number`` of the round, of a kind that is not the rendezvous's own, read by the
    store thread: ``stacks`` (a request), ``merged`` (a request's result), ``hang`` (the
    verdict); anything else is named and ignored."""
    if kind == "stacks":
        token = fields[2][:32] if len(fields) > 2 else ""
        answer_request(watch, round_, number, sender, token)
    elif kind == "merged":
        token = fields[3][:32] if len(fields) > 3 and sender == round_.me else ""
        read_merged(watch, round_, sender, token, body)
    elif kind == "hang":
        read_verdict(watch, round_, sender, body)
    else:
        watch.note(round_, f"event {number}", f"event {number} is of no kind numarun posts: "
                   "ignored")  # fmt: skip


def mark_still(watch: StoreWatch, dumps: list[Raw]) -> None:
    """This node's ranks are all still (``dumps``: their last samples): counted, in the thread
    at its next wake-up; the hang is declared when every numarun node is."""
    watch.queue(lambda round_: still(watch, round_, dumps, "still"))


def mark_done(watch: StoreWatch, dumps: list[Raw]) -> None:
    """This node's ranks all ended (it waits in the exit barrier): still for the round's rest."""

    def done(round_: WatchedRound) -> None:
        state(round_).done = dumps
        still(watch, round_, dumps, "done")

    watch.queue(done)


def mark_moving(watch: StoreWatch) -> None:
    """A rank of this node moved again: its still post and count taken back."""

    def moving(round_: WatchedRound) -> None:
        conn, job = round_.conn, state(round_)
        if job.still and job.done is None and conn is not None:
            job.still = False
            conn.set(STILL_KEY.format(round_.me), MOVING)
            try:
                count = conn.add(STILLS_KEY, -1)
            except Forged as forged:
                recount(watch, round_, None, forged.value)
                return
            if count < 0:
                recount(watch, round_, count)

    watch.queue(moving)


def count_still(watch: StoreWatch, round_: WatchedRound) -> int:
    """Count this node in ``numarun/stills``; the new count (a forged one repaired)."""
    conn = round_.conn
    assert conn is not None
    try:
        return conn.add(STILLS_KEY, 1)
    except Forged as forged:
        return recount(watch, round_, None, forged.value)


def nodes(watch: StoreWatch, round_: WatchedRound) -> int:
    """How many numarun nodes the round has (``numarun/nodes``, within 1 and the group's
    size; else named, and the group's size)."""
    job = state(round_)
    if job.nodes is not None:
        return job.nodes
    conn = round_.conn
    assert conn is not None
    try:
        count = conn.count(NODES_KEY)
    except Forged as forged:
        watch.note(round_, NODES_KEY, f"{forged}; every node of the round is counted instead")
        count = round_.size
    if not 1 <= count <= round_.size:
        watch.note(round_, NODES_KEY, f"{NODES_KEY} is {count}, not from 1 to {round_.size}: "
                   "every node of the round is counted instead")  # fmt: skip
        count = round_.size
    job.nodes = count
    return count


def publish(
    watch: StoreWatch | None,
    round_: WatchedRound,
    frames: dict[str, bytes],
    conn: Conn | None = None,
) -> None:
    """Post the frames of classes nobody posted yet in this round: the first node whose
    ``add`` on a class's claim key returns 1 sets its frames key (on ``conn``, default the
    round's; ``watch`` None: nothing is said)."""
    conn = conn or round_.conn
    assert conn is not None
    job = state(round_)
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


def frames_of(round_: WatchedRound, ids: list[str]) -> dict[str, bytes]:
    """The frames post of each class of ``ids`` that is there: this node's own, those read
    before in the round, the others read now (in one request when all are there). Decoded and
    checked where they are shown (:meth:`numarun.stacks.merge.JobView.resolve`), not here."""
    conn, posts = round_.conn, state(round_).frame_posts
    assert conn is not None
    fetch = [i for i in dict.fromkeys(ids) if i not in posts]
    if fetch:
        values = conn.get_many([FRAMES_KEY.format(i) for i in fetch], FRAMES_WAIT)
        for ident, value in zip(fetch, values, strict=True):
            if value is not None and len(value) <= FRAMES_LIMIT:
                posts[ident] = value
    return {i: posts[i] for i in ids if i in posts}


def _noter(watch: StoreWatch, round_: WatchedRound) -> Callable[[str], None]:
    return lambda line: watch.note(round_, "events", line)


def _digest(round_: WatchedRound, dumps: list[Raw], kind: str) -> tuple:
    return node_digest(dumps, node=round_.me, host=round_.host, pid=round_.pid, state=kind,
                       known=state(round_).classes)  # fmt: skip


# --- numarun stacks for the whole job ------------------------------------------------------------


def answer_request(
    watch: StoreWatch, round_: WatchedRound, number: int, asker: int, token: str
) -> None:
    """Request ``number``: this node's digest appended to the request's replies; on the asking
    node, then, every node's merged (:func:`collect`)."""
    conn = round_.conn
    assert conn is not None
    done = state(round_).done
    if done is not None and not watch.attached:  # in the exit barrier: its ended ranks
        dumps: list[Raw] | None = done
    else:
        dumps = watch.ask_loop(round_, number, Ask(number), ANSWER_LIMIT)  # type: ignore[assignment]
    if dumps is not None:
        digest, frames = _digest(round_, dumps, "answer")
        publish(watch, round_, frames)
        conn.append(REPLIES_KEY.format(number), str(round_.me), digest.encode())
        try:
            replied = conn.add(REPLIED_KEY.format(number), 1)
        except Forged as forged:
            watch.note(round_, REPLIED_KEY, str(forged))
            replied = 0
        if replied >= nodes(watch, round_):
            conn.set(COMPLETE_KEY.format(number), b"1")
    if asker == round_.me:
        collect(watch, round_, number, token)


def collect(watch: StoreWatch, round_: WatchedRound, number: int, token: str) -> None:
    """Every node's digest for request ``number`` (all numarun nodes, or what came within
    :data:`COLLECT_LIMIT` seconds) in one request, merged and posted as one ``merged`` event."""
    conn = round_.conn
    assert conn is not None
    conn.wait([COMPLETE_KEY.format(number)], COLLECT_LIMIT)
    lines = conn.lines(REPLIES_KEY.format(number), range(round_.size))
    round_.local += [REPLIES_KEY.format(number), REPLIED_KEY.format(number),
                     COMPLETE_KEY.format(number)]  # fmt: skip
    if not conn.extended:
        round_.local += [f"{REPLIES_KEY.format(number)}/{part}" for part in range(round_.size)]
    digests, notes = _digests(round_, lines[: 2 * round_.size + 16], f"an answer to {number}")
    missing = missing_nodes(round_, {d.node for d in digests},
                            f"did not answer within {COLLECT_LIMIT:g} s")  # fmt: skip
    view = merge(digests, kind="stacks", by=node_label(round_.me, round_.host),
                 size=round_.size, missing=missing, notes=notes)  # fmt: skip
    key = post_event(conn, f"merged {round_.me} {number} {token or '-'}", encode_view(view),
                     after=round_.seen, note=_noter(watch, round_))  # fmt: skip
    if key is not None:
        round_.shared.append(key)


def _digests(round_: WatchedRound, posts: list[bytes], what: str) -> tuple[list, list[str]]:
    digests, notes = [], []
    for post in posts:
        try:
            digest = read_digest(post, below=round_.world)
        except PostError as error:
            notes.append(f"{what}: {error}")
            continue
        if digest.node >= round_.size:
            notes.append(f"{what}: a digest of node {digest.node}, not one of {round_.size}")
            continue
        digests.append(digest)
    return digests, notes


def missing_nodes(
    round_: WatchedRound, answered: set[int], late: str
) -> list[tuple[str, list[int]]]:
    """The nodes of the round that did not answer, by why: a node that never beat is not a
    numarun node (a torchrun node); the others were ``late``."""
    conn = round_.conn
    assert conn is not None
    missing = [node for node in range(round_.size) if node not in answered]
    torchrun, slow = [], []
    for index, node in enumerate(missing):
        if index < _MISSING_CHECKED and not read_count(conn, ALIVE_KEY.format(node), 1, 1 << 62):
            torchrun.append(node)
        else:
            slow.append(node)
    return [(why, found) for why, found in ((NOT_NUMARUN, torchrun), (late, slow)) if found]


def read_merged(
    watch: StoreWatch, round_: WatchedRound, sender: int, token: str, body: bytes
) -> None:
    """A ``merged`` event: the job's classes, with the frames this node had not read."""
    try:
        view, _ = read_view(body)
    except PostError as error:
        watch.note(round_, f"merged {sender}", f"the merged stacks of node {sender}: {error}")
        if token:
            watch.report(round_, Merged(token, None, {}))
        return
    posts = frames_of(round_, view.frame_ids())
    view.add_posts(posts)
    watch.report(round_, Merged(token, view, posts))


# --- failure notices -----------------------------------------------------------------------------


def read_notice(round_: WatchedRound, sender: int, post: bytes) -> Notice:
    """Where the ranks of node ``sender``'s notice were: its digest (``post``, what followed
    its line) and the frames it names (the line itself is the rendezvous's). Raises
    :class:`PostError` for a post that is not one."""
    digest = read_digest(post, below=round_.world)  # checked again where it is shown
    frames = frames_of(round_, [ident for ident, _, _ in digest.classes])
    return Notice("", digest, frames)


def notice_post(round_: WatchedRound, dumps: list[Raw], conn: Conn) -> bytes:
    """What follows this node's notice line: the digest of ``dumps`` (its ranks), its classes'
    frames published on ``conn`` (the posting thread's)."""
    digest, frames = node_digest(dumps, node=round_.me, host=round_.host, pid=round_.pid,
                                 state="notice", known=Classes())  # fmt: skip
    publish(None, round_, frames, conn)
    return digest.encode()


# --- the hang verdict ----------------------------------------------------------------------------


def still(watch: StoreWatch, round_: WatchedRound, dumps: list[Raw], kind: str) -> None:
    """This node is still (``kind`` ``"still"``) or its ranks all ended (``"done"``): its
    digest at ``numarun/still/<n>``, itself listed and counted; the node that completes the
    count judges the job (:func:`judge`)."""
    conn = round_.conn
    assert conn is not None
    digest, frames = _digest(round_, dumps, kind)
    publish(watch, round_, frames)
    key, job = STILL_KEY.format(round_.me), state(round_)
    conn.set(key, digest.encode())
    if not job.listed:
        conn.append(STILL_NODES_KEY, str(round_.me), str(round_.me).encode())
        job.listed = True
        round_.shared += [key]
    job.still_once = True
    if job.still:
        return
    job.still = True
    count = count_still(watch, round_)
    if count >= nodes(watch, round_):
        judge(watch, round_, count)


def _still_digests(watch: StoreWatch, round_: WatchedRound) -> tuple[list, list[int]]:
    """(digests of the listed nodes that are still or done, the listed nodes)."""
    conn = round_.conn
    assert conn is not None
    listed: list[int] = []
    for line in conn.lines(STILL_NODES_KEY, range(round_.size)):
        for token in line.split(b","):
            if token.strip().isdigit() and int(token) < round_.size and int(token) not in listed:
                listed.append(int(token))
            elif token.strip():
                watch.note(round_, STILL_NODES_KEY, f"{STILL_NODES_KEY} holds "
                           f"{token[:20]!r}, not a node: ignored")  # fmt: skip
    values = conn.get_many([STILL_KEY.format(node) for node in listed], FRAMES_WAIT)
    found = []
    for node, value in zip(listed, values, strict=True):
        if value is None or value == MOVING:
            continue
        try:
            digest = read_digest(value, below=round_.world)
        except PostError as error:
            watch.note(round_, f"still {node}", f"{STILL_KEY.format(node)}: {error}: ignored")
            continue
        if digest.node != node or digest.state not in ("still", "done"):
            watch.note(round_, f"still {node}", f"{STILL_KEY.format(node)} is not node {node}'s "
                       "post: ignored")  # fmt: skip
            continue
        found.append(digest)
    return found, listed


def judge(watch: StoreWatch, round_: WatchedRound, count: int) -> None:
    """The count says every numarun node is still: read every listed node's post in one
    request; when each is still (or done), post the verdict with the merged classes."""
    conn = round_.conn
    assert conn is not None
    digests, listed = _still_digests(watch, round_)
    need = nodes(watch, round_)
    if len(digests) < need:
        if count > len(listed):
            watch.note(round_, STILLS_KEY, f"{STILLS_KEY} is {count}, more than the "
                       f"{len(listed)} nodes ever still (another client of the store?)")
            conn.repair(STILLS_KEY, str(count).encode(), len(digests))
        return
    judged = {digest.node for digest in digests}
    others = [node for node in range(round_.size) if node not in judged]
    missing = [("not a numarun node (torchrun?): its ranks not judged", others)] if others else []
    view = merge(digests, kind="hang", by=node_label(round_.me, round_.host),
                 size=round_.size, missing=missing)  # fmt: skip
    key = post_event(conn, f"hang {round_.me}", encode_view(view), after=round_.seen,
                     note=_noter(watch, round_))  # fmt: skip
    if key is not None:
        round_.shared.append(key)


def recount(
    watch: StoreWatch, round_: WatchedRound, count: int | None, found: bytes | None = None
) -> int:
    """``numarun/stills`` is not a number or below zero: set it to the number of nodes whose
    posts say still (one request for all), named; returns it (and judges when it is all)."""
    digests, _ = _still_digests(watch, round_)
    conn = round_.conn
    assert conn is not None
    shown = found if found is not None else str(count).encode()
    watch.note(round_, f"{STILLS_KEY} repair", f"{STILLS_KEY} held {shown[:20]!r}: set to the "
               f"{len(digests)} nodes whose posts say still")  # fmt: skip
    conn.repair(STILLS_KEY, shown, len(digests))
    return len(digests)


def read_verdict(watch: StoreWatch, round_: WatchedRound, sender: int, body: bytes) -> None:
    """A ``hang`` event: the verdict with the job's classes, for the loop to stop on; one
    reaching a node whose ranks were never still is named as coming from the store and
    ignored (every numarun node is still before a verdict is posted)."""
    if not state(round_).still_once:
        watch.note(round_, f"verdict {sender}", f"a hang verdict posted by node {sender} "
                   "reached this node, whose ranks were never still: not numarun's (forged?); "
                   "ignored")  # fmt: skip
        return
    try:
        view, _ = read_view(body)
    except PostError as error:
        watch.note(round_, f"verdict {sender}", f"the hang verdict of node {sender}: {error}: "
                   "ignored")  # fmt: skip
        return
    if view.kind != "hang":
        watch.note(round_, f"verdict {sender}", f"the hang verdict of node {sender} is not one: "
                   "ignored")  # fmt: skip
        return
    view.add_posts(frames_of(round_, view.frame_ids()))
    watch.report(round_, Hang(view, sender))

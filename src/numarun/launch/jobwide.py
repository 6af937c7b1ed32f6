"""The whole job's stacks, hang verdict and failure notices through the rendezvous store: what the
``numarun-store`` thread (:mod:`numarun.launch.storewatch`, whose docstring states the protocol)
does at each event. Every function here runs in that thread, on the round's connection.

Whatever is read back is untrusted (:mod:`numarun.stacks.remote`): a post that is not one is named
in one line (:meth:`StoreWatch.note`) and left out; a counter that is not what numarun wrote is
named and repaired; nothing read raises past this module but the store's own errors.
"""

from __future__ import annotations

from collections.abc import Callable

from numarun.launch.storeops import Conn, Forged
from numarun.launch.storeresults import Hang, Merged, Notice
from numarun.launch.storewatch import (
    ALIVE_KEY,
    CLAIM_KEY,
    COLLECT_LIMIT,
    COMPLETE_KEY,
    FRAMES_KEY,
    FRAMES_WAIT,
    MOVING,
    NODES_KEY,
    REPLIED_KEY,
    REPLIES_KEY,
    STILL_KEY,
    STILL_NODES_KEY,
    STILLS_KEY,
    Round,
    StoreWatch,
    post_event,
    read_count,
)
from numarun.stacks.merge import encode_view, merge, read_view
from numarun.stacks.remote import (
    FRAMES_LIMIT,
    PostError,
    Raw,
    node_digest,
    node_label,
    printable,
    read_digest,
)

_MISSING_CHECKED = 64  # nodes that did not answer whose heartbeat is read to say why
NOT_NUMARUN = "not a numarun node (torchrun?): its ranks not shown"


def on_event(watch: StoreWatch, round_: Round, number: int, value: bytes) -> None:
    """Event ``number`` of the round, read by the store thread: ``stop`` (another node's
    notice), ``stacks`` (a request), ``merged`` (a request's result), ``hang`` (the verdict),
    ``wake``; anything else is named and ignored."""
    head, _, rest = value.partition(b"\n")
    fields = head[:200].decode("ascii", "replace").split()
    if len(fields) < 2 or not fields[1].isdigit() or len(fields[1]) > 9:
        watch.note(round_, f"event {number}", f"event {number} is not numarun's: ignored")
        return
    kind, sender = fields[0], int(fields[1])
    if sender >= round_.size:
        watch.note(round_, f"event {number}", f"event {number} names node {sender}, not one "
                   f"of the {round_.size} nodes: ignored")  # fmt: skip
        return
    if kind == "stop" and sender != round_.me:
        read_notice(watch, round_, sender, rest)
    elif kind == "stacks":
        token = fields[2][:32] if len(fields) > 2 else ""
        answer_request(watch, round_, number, sender, token)
    elif kind == "merged":
        token = fields[3][:32] if len(fields) > 3 and sender == round_.me else ""
        read_merged(watch, round_, sender, token, rest)
    elif kind == "hang":
        read_verdict(watch, round_, sender, rest)
    elif kind not in ("stop", "wake"):
        watch.note(round_, f"event {number}", f"event {number} is of no kind numarun posts: "
                   "ignored")  # fmt: skip


def mark_still(watch: StoreWatch, dumps: list[Raw]) -> None:
    """This node's ranks are all still (``dumps``: their last samples): counted, in the thread
    at its next wake-up; the hang is declared when every numarun node is."""
    watch.queue(lambda round_: still(watch, round_, dumps, "still"))


def mark_done(watch: StoreWatch, dumps: list[Raw]) -> None:
    """This node's ranks all ended (it waits in the exit barrier): still for the round's rest."""

    def done(round_: Round) -> None:
        round_.done = dumps
        still(watch, round_, dumps, "done")

    watch.queue(done)


def mark_moving(watch: StoreWatch) -> None:
    """A rank of this node moved again: its still post and count taken back."""

    def moving(round_: Round) -> None:
        conn = round_.conn
        if round_.still and round_.done is None and conn is not None:
            round_.still = False
            conn.set(STILL_KEY.format(round_.me), MOVING)
            try:
                count = conn.add(STILLS_KEY, -1)
            except Forged as forged:
                recount(watch, round_, None, forged.value)
                return
            if count < 0:
                recount(watch, round_, count)

    watch.queue(moving)


def count_still(watch: StoreWatch, round_: Round) -> int:
    """Count this node in ``numarun/stills``; the new count (a forged one repaired)."""
    conn = round_.conn
    assert conn is not None
    try:
        return conn.add(STILLS_KEY, 1)
    except Forged as forged:
        return recount(watch, round_, None, forged.value)


def nodes(watch: StoreWatch, round_: Round) -> int:
    """How many numarun nodes the round has (``numarun/nodes``, within 1 and the group's
    size; else named, and the group's size)."""
    if round_.nodes is not None:
        return round_.nodes
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
    round_.nodes = count
    return count


def publish(
    watch: StoreWatch | None, round_: Round, frames: dict[str, bytes], conn: Conn | None = None
) -> None:
    """Post the frames of classes nobody posted yet in this round: the first node whose
    ``add`` on a class's claim key returns 1 sets its frames key (on ``conn``, default the
    round's; ``watch`` None: nothing is said)."""
    conn = conn or round_.conn
    assert conn is not None
    round_.frame_posts.update(frames)
    for ident, post in frames.items():
        if ident in round_.claimed:
            continue
        try:
            first = conn.add(CLAIM_KEY.format(ident), 1) == 1
        except Forged as forged:
            if watch is not None:
                watch.note(round_, CLAIM_KEY, str(forged))
            continue
        round_.claimed.add(ident)
        if first:
            conn.set(FRAMES_KEY.format(ident), post)
            round_.shared += [FRAMES_KEY.format(ident), CLAIM_KEY.format(ident)]


def frames_of(round_: Round, ids: list[str]) -> dict[str, bytes]:
    """The frames post of each class of ``ids`` that is there: this node's own, those read
    before in the round, the others read now (in one request when all are there). Decoded and
    checked where they are shown (:meth:`numarun.stacks.merge.JobView.resolve`), not here."""
    conn = round_.conn
    assert conn is not None
    fetch = [i for i in dict.fromkeys(ids) if i not in round_.frame_posts]
    if fetch:
        values = conn.get_many([FRAMES_KEY.format(i) for i in fetch], FRAMES_WAIT)
        for ident, value in zip(fetch, values, strict=True):
            if value is not None and len(value) <= FRAMES_LIMIT:
                round_.frame_posts[ident] = value
    return {i: round_.frame_posts[i] for i in ids if i in round_.frame_posts}


def _noter(watch: StoreWatch, round_: Round) -> Callable[[str], None]:
    return lambda line: watch.note(round_, "events", line)


def _digest(round_: Round, dumps: list[Raw], state: str) -> tuple:
    return node_digest(dumps, node=round_.me, host=round_.host, pid=round_.pid, state=state,
                       known=round_.classes)  # fmt: skip


# --- numarun stacks for the whole job ------------------------------------------------------------


def answer_request(watch: StoreWatch, round_: Round, number: int, asker: int, token: str) -> None:
    """Request ``number``: this node's digest appended to the request's replies; on the asking
    node, then, every node's merged (:func:`collect`)."""
    conn = round_.conn
    assert conn is not None
    dumps = watch.wait_answer(round_, number)
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


def collect(watch: StoreWatch, round_: Round, number: int, token: str) -> None:
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


def _digests(round_: Round, posts: list[bytes], what: str) -> tuple[list, list[str]]:
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


def missing_nodes(round_: Round, answered: set[int], late: str) -> list[tuple[str, list[int]]]:
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


def read_merged(watch: StoreWatch, round_: Round, sender: int, token: str, body: bytes) -> None:
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


def read_notice(watch: StoreWatch, round_: Round, sender: int, body: bytes) -> None:
    """Another node's ``stop`` notice: its line (escaped, cut), its digest and frames."""
    text, _, post = body.partition(b"\n")
    notice = printable(text[:2000].decode("utf-8", "replace").strip())[:500]
    digest, frames = None, {}
    if post:  # the digest and frames are checked again where they are shown
        try:
            digest = read_digest(post, below=round_.world)
        except PostError as error:
            watch.note(round_, f"notice {sender}", f"the notice of node {sender}: {error}: its "
                       "ranks not shown")  # fmt: skip
    if digest is not None:
        frames = frames_of(round_, [ident for ident, _, _ in digest.classes])
    watch.report(round_, Notice(notice, digest, frames))


def notice_post(round_: Round, dumps: list[Raw], text: str, conn: Conn) -> tuple[str, bytes]:
    """(header, body) of this node's notice (``text``, with the digest of ``dumps``), its
    classes' frames published on ``conn`` (the posting thread's)."""
    from numarun.stacks.remote import Classes

    digest, frames = node_digest(dumps, node=round_.me, host=round_.host, pid=round_.pid,
                                 state="notice", known=Classes())  # fmt: skip
    publish(None, round_, frames, conn)
    body = text.replace("\n", " ").encode("utf-8", "replace")
    return f"stop {round_.me}", body + b"\n" + (digest.encode() if dumps else b"")


# --- the hang verdict ----------------------------------------------------------------------------


def still(watch: StoreWatch, round_: Round, dumps: list[Raw], state: str) -> None:
    """This node is still (``state`` ``"still"``) or its ranks all ended (``"done"``): its
    digest at ``numarun/still/<n>``, itself listed and counted; the node that completes the
    count judges the job (:func:`judge`)."""
    conn = round_.conn
    assert conn is not None
    digest, frames = _digest(round_, dumps, state)
    publish(watch, round_, frames)
    key = STILL_KEY.format(round_.me)
    conn.set(key, digest.encode())
    if not round_.listed:
        conn.append(STILL_NODES_KEY, str(round_.me), str(round_.me).encode())
        round_.listed = True
        round_.shared += [key]
    round_.still_once = True
    if round_.still:
        return
    round_.still = True
    count = count_still(watch, round_)
    if count >= nodes(watch, round_):
        judge(watch, round_, count)


def _still_digests(watch: StoreWatch, round_: Round) -> tuple[list, list[int]]:
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


def judge(watch: StoreWatch, round_: Round, count: int) -> None:
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


def recount(watch: StoreWatch, round_: Round, count: int | None, found: bytes | None = None) -> int:
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


def read_verdict(watch: StoreWatch, round_: Round, sender: int, body: bytes) -> None:
    """A ``hang`` event: the verdict with the job's classes, for the loop to stop on; one
    reaching a node whose ranks were never still is named as coming from the store and
    ignored (every numarun node is still before a verdict is posted)."""
    if not round_.still_once:
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

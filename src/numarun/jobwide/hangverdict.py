"""The hang verdict over every numarun node of a torch rendezvous (``--hang-timeout``), through
the store: each node's evidence, the count, the judge, the window in which a node whose ranks
move denies a verdict, and another node taking over a judge that died. Keys and events:
docs/protocol.md.

* A node whose ranks are all still (:class:`numarun.stacks.hang.HangWatch` says so) *marks*
  itself still: its digest at ``numarun/still/<n>``, itself listed once in
  ``numarun/still-nodes``, 1 added to ``numarun/stills``; moving again, it sets its key to
  ``moving`` and takes the 1 back; a node whose ranks all ended marks itself done (still for
  good; it waits in the exit barrier, still watching). Marks are posted at once from the
  loop, in order (:func:`mark`: a posting thread, never the store thread's next wake-up), so a
  node that moves is never counted still after its move.
* The node whose ``add`` brings the count to the number of numarun nodes (read then, never
  cached) is the judge: it reads the listed nodes' posts (:data:`READ_CHUNK` at a time),
  checks each, and when every node's says still (or done; not all done: that is a finished
  job) posts ``hang`` with the job's merged classes (bounded: :func:`numarun.stacks.merge.
  encode_view`).
* Every node that reads a verdict acts on it only after :data:`DENY_WINDOW` seconds without a
  ``deny``, and only while its own fresh evidence agrees (its ranks still, or ended). A node
  whose ranks move when a verdict reaches it (or while one waits its window) says so in one
  line, does not act, and posts ``deny <n> <verdict>`` (one node per verdict, the first whose
  ``add`` on ``numarun/deny/<verdict>`` returns 1); every node drops a denied verdict. So a
  post forged for a node whose ranks move (its digest, its number listed, the count raised)
  at most delays the verdict: it never stops a node.
* The judge may die once the count is complete: every still node looks again every
  :data:`TAKEOVER_LOOKS` look intervals while no verdict came; the first to add 1 to
  ``numarun/takeover/<wave>`` reads the count and, when it was complete at the last wave too
  (``numarun/takeover-complete/<wave>``, set by that wave's first node, whichever it was) and
  no verdict came meanwhile, judges (within three waves of the judge's death).

Counters are untrusted: one that is not a number, or outside 0 to the round's size, is named
and set to the number of nodes whose posts say still (one read of all posts). A stream of
forged posts can deny or delay a verdict (named once per round), never produce one.
"""

from __future__ import annotations

from collections.abc import Callable

from numarun.jobwide.protocol import (
    FRAMES_WAIT,
    frames_of,
    nodes,
    noter,
    publish,
    state,
)
from numarun.jobwide.results import Hang
from numarun.rendezvous.events import EVENTS_KEY, post_event
from numarun.rendezvous.storeops import Conn, Forged, read_count
from numarun.rendezvous.storewatch import StoreWatch, WatchedRound
from numarun.stacks.digest import PostError, Raw, node_digest, node_label, read_digest
from numarun.stacks.merge import encode_view, merge, read_view

STILL_KEY = "numarun/still/{}"
STILLS_KEY = "numarun/stills"
STILL_NODES_KEY = "numarun/still-nodes"
DENY_KEY = "numarun/deny/{}"
TAKEOVER_KEY = "numarun/takeover/{}"
COMPLETE_KEY = "numarun/takeover-complete/{}"  # the count was complete at that wave
MOVING = b"moving"
DENY_WINDOW = 1.0  # seconds a verdict waits for a node whose ranks move to deny it
TAKEOVER_LOOKS = 2  # look intervals between a still node's looks at a count nobody judged
READ_CHUNK = 256  # posts the judge reads in one request
_PENDING = 8  # verdicts waiting their window at once (more: forged; the oldest dropped)
NOT_JUDGED = "not a numarun node (torchrun?): its ranks not judged"


def mark(watch: StoreWatch, round_: WatchedRound | None, kind: str, dumps: list[Raw]) -> None:
    """In the loop (or the thread that waits in the exit barrier): this node's ranks are
    ``"still"`` (``dumps``: their last samples), ``"moving"`` again, or all ``"done"``. The
    node's fresh evidence changes at once; the store hears of it from a posting thread, marks
    in the order made (one overtaken by a later one is dropped)."""
    if round_ is None:
        return
    job = state(round_)
    if job.now == "done":
        return  # its ranks ended: still for the rest of the round
    job.now = kind
    job.marks += 1
    number = job.marks

    def apply(conn: Conn) -> Callable[[], None] | None:
        if number <= job.applied:
            return None
        job.applied = number
        if kind == "moving":
            _moving(watch, round_, conn)
            return None
        return _still(watch, round_, conn, dumps, kind)

    watch.post(round_, apply, f"this node's hang mark ({kind})")


def agrees(round_: WatchedRound) -> bool:
    """Whether this node's fresh evidence agrees with a hang: its ranks still, or ended."""
    return state(round_).now in ("still", "done")


def _still(watch: StoreWatch, round_: WatchedRound, conn: Conn, dumps: list[Raw],
           kind: str) -> Callable[[], None] | None:  # fmt: skip
    """This node's post, listing and count. The node that completes the count judges: the
    judging is returned, for the posting thread to run out of turn (:meth:`StoreWatch.post`)
    on a connection of its own, so that it never holds up this node's beats."""
    job = state(round_)
    if kind == "done":
        job.done = dumps
    digest, frames = node_digest(dumps, node=round_.me, host=round_.host, pid=round_.pid,
                                 state=kind, known=job.mark_classes)  # fmt: skip
    publish(watch, round_, frames, conn)
    key = STILL_KEY.format(round_.me)
    job.post = digest.encode()
    conn.set(key, job.post)
    if not job.listed:
        conn.append(STILL_NODES_KEY, str(round_.me), str(round_.me).encode())
        job.listed = True
        round_.shared += [key]
    if job.still:
        return None
    job.still = True
    count = _count(watch, round_, conn, 1)
    job.chain += 1
    _next_wave(watch, round_, job.chain)  # until a verdict: a judge that died, a post overwritten
    if count < nodes(watch, round_, conn):
        return None

    def judging() -> None:
        own = Conn(round_.diag_store)  # the view's store (a store of its own, or the rendezvous's)
        try:
            judge(watch, round_, own, count)
        finally:
            own.close()

    return judging


def _moving(watch: StoreWatch, round_: WatchedRound, conn: Conn) -> None:
    """A rank of this node moved again: verdicts waiting their window denied, its still post
    and count taken back."""
    job = state(round_)
    for number in list(job.pending):
        deny(watch, round_, conn, number)
    if not job.still or job.done is not None:
        return
    job.still = False
    conn.set(STILL_KEY.format(round_.me), MOVING)
    _count(watch, round_, conn, -1)


def _count(watch: StoreWatch, round_: WatchedRound, conn: Conn, amount: int) -> int:
    """Add ``amount`` to ``numarun/stills``: the new count, or, when it is not a number or not
    from 0 to the round's size (another client of the store), the number of nodes whose posts
    say still, named and set (:func:`recount`)."""
    try:
        count = conn.add(STILLS_KEY, amount)
    except Forged as forged:
        return recount(watch, round_, conn, forged.value)
    if not 0 <= count <= round_.size:
        return recount(watch, round_, conn, str(count).encode())
    return count


def recount(watch: StoreWatch, round_: WatchedRound, conn: Conn, found: bytes) -> int:
    """``numarun/stills`` holds ``found``, which numarun did not write: set it to the number of
    nodes whose posts say still (one read of all posts), named; returns it."""
    digests, _, _ = still_digests(watch, round_, conn)
    watch.note(round_, f"{STILLS_KEY} repair", f"{STILLS_KEY} held {found[:20]!r}: set to the "
               f"{len(digests)} nodes whose posts say still")  # fmt: skip
    conn.repair(STILLS_KEY, found, len(digests))
    return len(digests)


def still_digests(watch: StoreWatch, round_: WatchedRound, conn: Conn) -> tuple[list, list, list]:
    """(digests of the listed nodes that are still or done, the listed nodes, those whose
    post says moving). The posts are read :data:`READ_CHUNK` at a time and decoded with a
    bound on the ranks they name in all (the job's): memory in proportion to the job."""
    listed: dict[int, None] = {}  # in the order listed, each node once
    bad = 0
    for line in conn.lines(STILL_NODES_KEY, range(round_.size)):
        for token in line.split(b","):
            token = token.strip()
            if token.isdigit() and len(token) < 10 and int(token) < round_.size:
                listed[int(token)] = None
            elif token:
                bad += 1
    if bad:
        watch.note(round_, STILL_NODES_KEY, f"{STILL_NODES_KEY} holds {bad} line(s) that name "
                   "no node of the round: ignored")  # fmt: skip
    found: dict[int, object] = {}
    moving: list[int] = []
    refused: list[str] = []
    ranks = round_.world  # ranks the posts may name in all
    order = list(listed)
    for start in range(0, len(order), READ_CHUNK):
        chunk = order[start : start + READ_CHUNK]
        values = conn.get_many([STILL_KEY.format(node) for node in chunk], FRAMES_WAIT)
        for node, value in zip(chunk, values, strict=True):
            if value is None:
                continue
            if value == MOVING:
                moving.append(node)
                continue
            try:
                digest = read_digest(value, below=round_.world, most=max(0, ranks))
            except PostError as error:
                refused.append(f"{STILL_KEY.format(node)}: {error}")
                continue
            if digest.node != node or digest.state not in ("still", "done"):
                refused.append(f"{STILL_KEY.format(node)} is not node {node}'s still post")
                continue
            ranks -= digest.rank_count
            found[node] = digest
    if refused:
        watch.note(round_, "still posts", f"{len(refused)} still post(s) left out: "
                   f"{refused[0]}")  # fmt: skip
    return list(found.values()), order, moving


def judge(watch: StoreWatch, round_: WatchedRound, conn: Conn, count: int) -> None:
    """The count says every numarun node is still: read every listed node's post; when each
    is still or done (and not all done), post the verdict with the merged classes."""
    digests, listed, moving = still_digests(watch, round_, conn)
    need = nodes(watch, round_, conn)
    unique = {digest.node: digest for digest in digests}  # one per node (still_digests)
    if len(unique) < need:
        if count > len(listed):
            watch.note(round_, STILLS_KEY, f"{STILLS_KEY} is {count}, more than the "
                       f"{len(listed)} nodes ever still (another client of the store?)")
            conn.repair(STILLS_KEY, str(count).encode(), len(unique))
        elif moving and count >= need:
            watch.note(round_, "verdict waits", f"the count says every node is still, but "
                       f"node {moving[0]}'s post says moving: the hang verdict waits (its ranks "
                       "moved, or another client of the store wrote it)")  # fmt: skip
        return
    if all(digest.state == "done" for digest in unique.values()):
        return  # every node's ranks ended: the job finished, it did not hang
    if count != len(unique):
        watch.note(round_, f"{STILLS_KEY} repair", f"{STILLS_KEY} said {count} while "
                   f"{len(unique)} nodes' posts say still: set to {len(unique)}")  # fmt: skip
        conn.repair(STILLS_KEY, str(count).encode(), len(unique))
    others = [node for node in range(round_.size) if node not in unique]
    view = merge(list(unique.values()), kind="hang", by=node_label(round_.me, round_.host),
                 size=round_.size, missing=[(NOT_JUDGED, others)] if others else [],
                 world=round_.world)  # fmt: skip
    key = post_event(conn, f"hang {round_.me}", encode_view(view), after=round_.seen,
                     note=noter(watch, round_))  # fmt: skip
    if key is not None:
        round_.shared.append(key)


# --- a verdict heard -----------------------------------------------------------------------------


def read_verdict(watch: StoreWatch, round_: WatchedRound, number: int, sender: int,
                 body: bytes) -> None:  # fmt: skip
    """A ``hang`` event (number ``number``, posted by node ``sender``): denied at once when
    this node's ranks move; else acted on after :data:`DENY_WINDOW` seconds unless denied
    meanwhile (:func:`_act`)."""
    job = state(round_)
    if job.acted:
        return
    if not agrees(round_):
        watch.note(round_, f"verdict {sender}", f"a hang verdict posted by node {sender} "
                   "reached this node, whose ranks are moving: not acted on, and denied "
                   "(another client of the store, or ranks that moved since)")  # fmt: skip
        deny(watch, round_, round_.conn, number)
        if round_.conn is not None and not job.still:  # a post forged for it: taken back
            round_.conn.set(STILL_KEY.format(round_.me), MOVING)
        return
    try:
        view, _ = read_view(body, world=round_.world, nodes=round_.size)
    except PostError as error:
        watch.note(round_, f"verdict {sender}", f"the hang verdict of node {sender}: {error}: "
                   "ignored")  # fmt: skip
        return
    if view.kind != "hang":
        watch.note(round_, f"verdict {sender}", f"the hang verdict of node {sender} is not one: "
                   "ignored")  # fmt: skip
        return
    if len(job.pending) >= _PENDING:
        job.pending.pop(next(iter(job.pending)))
    job.pending[number] = (view, sender)
    watch.later(round_, DENY_WINDOW, lambda later: _act(watch, later, number))


def _act(watch: StoreWatch, round_: WatchedRound, number: int) -> None:
    job = state(round_)
    entry = job.pending.pop(number, None)
    if entry is None or job.acted:
        return  # denied meanwhile
    if not agrees(round_):
        watch.note(round_, "verdict moved", "a hang verdict reached this node, whose ranks "
                   "moved since: not acted on, and denied")  # fmt: skip
        deny(watch, round_, round_.conn, number)
        return
    view, sender = entry
    view.add_posts(frames_of(round_, view.frame_ids()))  # type: ignore[attr-defined]
    job.acted = True
    job.pending.clear()
    watch.report(round_, Hang(view, sender))  # type: ignore[arg-type]


def deny(watch: StoreWatch, round_: WatchedRound, conn: Conn | None, number: int) -> None:
    """Deny verdict ``number``: the first node to claim it posts ``deny`` (one per verdict)."""
    state(round_).pending.pop(number, None)
    if conn is None:
        return
    try:
        first = conn.add(DENY_KEY.format(number), 1) == 1
    except Forged:
        first = True
    if first:
        key = post_event(conn, f"deny {round_.me} {number}", after=round_.seen,
                         note=noter(watch, round_))  # fmt: skip
        if key is not None:
            round_.shared += [key, DENY_KEY.format(number)]


def read_deny(watch: StoreWatch, round_: WatchedRound, sender: int, fields: list[str]) -> None:
    """A ``deny`` event: node ``sender``'s ranks move; the verdict it names is dropped."""
    number = fields[2] if len(fields) > 2 else ""
    if not number.isdigit() or len(number) > 18:
        return
    entry = state(round_).pending.pop(int(number), None)
    if entry is not None:
        watch.note(round_, f"denied {number}", f"node {sender} denied the hang verdict of node "
                   f"{entry[1]} (its ranks move): not acted on")  # fmt: skip


# --- taking over a judge that died ---------------------------------------------------------------


def _next_wave(watch: StoreWatch, round_: WatchedRound, chain: int) -> None:
    job = state(round_)
    delay = TAKEOVER_LOOKS * watch.interval * (1 + job.waves // 30)
    watch.later(round_, delay, lambda later: _wave(watch, later, chain))


def _wave(watch: StoreWatch, round_: WatchedRound, chain: int) -> None:
    """In the store thread, while this node is still (since the mark that started ``chain``)
    and no verdict came: its post set again when another client overwrote it; the first still
    node of each wave reads the count and judges a complete one that stayed unjudged for a
    whole wave (the judge died after its count; one still at work is given that wave), and
    now and then (wave 4, then every 8th) checks every post whatever the count says (a count
    that another client lowered). Neither while this node has events to read (a verdict may
    be among them)."""
    job = state(round_)
    if not job.still or job.acted or chain != job.chain:
        return
    job.waves += 1
    conn = round_.conn
    if conn is not None:
        key = STILL_KEY.format(round_.me)
        if job.post is not None and conn.get_now(key) != job.post:
            watch.note(round_, f"{key} overwritten", f"{key} was overwritten by another client "
                       "of the store: set again")  # fmt: skip
            conn.set(key, job.post)
        if not job.pending and _first(conn, TAKEOVER_KEY.format(job.waves)):
            round_.shared.append(TAKEOVER_KEY.format(job.waves))
            count = _count(watch, round_, conn, 0)
            complete = count >= nodes(watch, round_, conn)
            full = job.waves == 4 or job.waves % 8 == 0
            unread = read_count(conn, EVENTS_KEY, 0, 1 << 62) != round_.seen
            # Each wave's first node is any still node: whether the count was complete at the
            # last wave is in the store (a node's own memory of it held only when the same node
            # came first twice running: at a thousand nodes, almost never).
            before = job.complete_at == job.waves - 1 or (
                complete and conn.has(COMPLETE_KEY.format(job.waves - 1))
            )
            if not unread and ((complete and before) or full):
                judge(watch, round_, conn, count)
            elif complete:  # a forged mark at most makes the next wave's node judge (read)
                conn.set(COMPLETE_KEY.format(job.waves), b"1")
                round_.shared.append(COMPLETE_KEY.format(job.waves))
            job.complete_at = job.waves if complete else 0
    _next_wave(watch, round_, chain)


def _first(conn: Conn, key: str) -> bool:
    try:
        return conn.add(key, 1) == 1
    except Forged:
        return False

"""The whole-job view of one node of a torch rendezvous, as its :class:`ElasticNode
<numarun.rendezvous.torchrdzv.ElasticNode>` calls it (its ``diagnostics``): where this node's
ranks were with each failure notice, the whole job's ``numarun stacks``, and the bridge from
``--hang-timeout`` to the job-wide verdict.

The protocol is :mod:`numarun.jobwide.protocol`'s (docs/protocol.md lists the keys); the store
thread's findings come back as :mod:`numarun.jobwide.results` records acted on in the supervisor's
loop. The node guards every call into this module: what fails here is one line, never the
training's outcome.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from numarun.jobwide import hangverdict, protocol
from numarun.jobwide.results import Ask, Hang, Merged
from numarun.rendezvous.diagstore import PENDING
from numarun.rendezvous.events import post_event
from numarun.rendezvous.storeops import first_line
from numarun.rendezvous.storewatch import StoreWatch

ASK_LIMIT = 4.5  # seconds a whole-job request may take before its client is told why not

TYPE_CHECKING = False
if TYPE_CHECKING:
    from numarun.process.spec import WorkerExit
    from numarun.rendezvous.storeops import Conn
    from numarun.rendezvous.storeresults import Notice
    from numarun.rendezvous.storewatch import WatchedRound
    from numarun.rendezvous.torchrdzv import ElasticNode
    from numarun.stacks.digest import Raw
    from numarun.stacks.jobstacks import JobStacks
    from numarun.stacks.merge import JobView


class JobNotices:
    """The whole-job view of ``node``'s job: set as ``node.diagnostics``; per attempt,
    :meth:`attach` the attempt's stacks (``None``: this node's ranks are not shown)."""

    def __init__(self, node: ElasticNode) -> None:
        self._node = node
        self._watch = node.watch
        self._stacks: JobStacks | None = None
        self._asks: dict[str, Callable[[dict], None]] = {}
        self._timers: dict[str, object] = {}

    def attach(self, stacks: JobStacks | None) -> None:
        """This attempt's stacks: the whole job's served through them (``numarun stacks``),
        and ``--hang-timeout`` judged over every node."""
        self._stacks = stacks
        self._asks.clear()
        if stacks is not None:
            stacks.job_wide = self._ask_job_stacks

    # --- the node's calls (ElasticNode.Diagnostics) --------------------------------------------

    def on_event(self, round_: WatchedRound, number: int, kind: str, sender: int,
                 fields: list[str], body: bytes) -> None:  # fmt: skip
        """In the store thread, event ``number`` of a kind that is not the rendezvous's own:
        ``stacks`` (a request), ``hang`` (a verdict), ``deny`` (a node whose ranks move denies
        one); anything else is named and ignored."""
        watch = self._watch
        if kind == "stacks":
            token = fields[2][:32] if len(fields) > 2 else ""
            protocol.answer_request(watch, round_, number, sender, token)
        elif kind == "hang":
            hangverdict.read_verdict(watch, round_, number, sender, body)
        elif kind == "deny":
            hangverdict.read_deny(watch, round_, sender, fields)
        elif kind != "merged":  # an earlier numarun's answer: its asking node's alone
            watch.note(round_, f"event {number}", f"event {number} is of no kind numarun "
                       "posts: ignored")  # fmt: skip

    def read_notice(self, round_: WatchedRound, sender: int, post: bytes) -> Notice:
        return protocol.read_notice(round_, sender, post)

    def notice_post(self, round_: WatchedRound, dumps: list, conn: Conn) -> bytes:
        return protocol.notice_post(round_, dumps, conn)

    def before_stop(self, notice: Notice, stop: Callable[[], None]) -> bool:
        """Another node stopped: this node's ranks' stacks noted with its notice, then
        ``stop``; False (stop now) without stacks."""
        stacks = self._stacks
        if stacks is None:
            return False

        def taken(dumps: list[Raw]) -> None:  # this node's ranks, before the teardown
            try:
                stacks.note_notice(notice.text, notice.digest, notice.frames, dumps)
                stacks.keep_flight(dumps)
            finally:
                stop()

        # With the flight recorders: where this node's ranks were in their collectives is
        # the other half of the failure's "where the others were" (their dumps kept here).
        stacks.take_async(taken, flight=True)
        return True

    def on_result(self, result: object) -> None:
        if isinstance(result, Ask):
            number = result.number
            if self._stacks is None:
                self._watch.answer(number, [])
            else:
                stacks = self._stacks
                # With the flight recorders: the digest carries their summary; the dumps
                # stay on this node, kept in its log directory.
                stacks.take_async(lambda dumps: self._watch.answer(number, stacks.keep_flight(
                    dumps)), flight=True)  # fmt: skip
        elif isinstance(result, Merged):
            reply = self._asks.pop(result.token, None) if result.token else None
            timer = self._timers.pop(result.token, None)
            if timer is not None:
                timer.cancel()  # type: ignore[attr-defined]
            if reply is not None:
                reply(_job_fields(result.view, result.frames, result.why))
        elif isinstance(result, Hang):
            hang = self._stacks.hang if self._stacks is not None else None
            if hang is not None:
                hang.declare_job(result.view, self._declared_by(result.sender))

    def while_waiting(self) -> _BarrierHang:
        return _BarrierHang(self._node, self._watch, self._declared_by)

    def unwatched(self) -> None:
        for reply in self._asks.values():
            reply({"error": "the attempt ended before every node answered"})
        self._asks.clear()
        for timer in self._timers.values():
            timer.cancel()  # type: ignore[attr-defined]
        self._timers.clear()

    # --- the launcher's calls --------------------------------------------------------------------

    def hang_job(self) -> _HangJob:
        """What ``--hang-timeout`` calls to judge over every node (:mod:`numarun.stacks.hang`)."""
        return _HangJob(self._node, self._watch)

    def on_worker_failure(self, ended: WorkerExit) -> None:
        """The supervisor's ``on_failure``: the node tells the other nodes at once, with where
        this node's other ranks were (the stacks taken at the failure, when there are)."""
        # The notice goes with or without where the ranks were.
        dumps = self._node.guarded("where this node's ranks were at the failure",
                                   self._failure_dumps)  # fmt: skip
        self._node.on_worker_failure(ended, dumps or [])

    def _failure_dumps(self) -> list[Raw]:
        stacks = self._stacks
        at_failure = stacks.at_failure if stacks is not None else None
        if stacks is None or at_failure is None:
            return []
        from numarun.stacks.dumps import Raw

        flight = {answer.rank: answer for answer in stacks.flight_at_failure}
        found = [Raw.of(item) for item in at_failure[1]]
        for raw in found:  # the notice's digest carries their flight summary
            raw.flight = flight.get(raw.rank)
        return found

    def _declared_by(self, sender: int) -> str:
        node_round = self._node.round
        if node_round is not None and sender == node_round.group_rank:
            return "this node"
        return f"node {sender}, through the rendezvous store"

    def _ask_job_stacks(self, reply: Callable[[dict], None]) -> None:
        """A ``numarun stacks`` request for the whole job, from the loop: posted
        fire-and-forget; every node (this one too) answers through its thread; this node's
        merges the answers and the merged result comes back through it to ``reply``."""
        round_ = self._node.watched_round
        if round_ is None:
            reply({"error": "the job is between attempts; ask again"})
            return
        off = round_.view_off()
        if off is not None and off != PENDING:  # while it connects, the request waits for it
            reply({"error": f"whole-job diagnostics unavailable this round: {off}"})
            return
        token = os.urandom(6).hex()
        self._asks[token] = reply
        me, after, watch = round_.me, round_.seen, self._watch
        stacks = self._stacks
        timer = stacks.call_later(ASK_LIMIT, lambda: self._expired(token)) if stacks else None
        if timer is not None:
            self._timers[token] = timer

        def noted(line: str) -> None:
            watch.note(round_, "events", line)

        def ask(conn: Conn) -> None:
            try:
                key = post_event(conn, f"stacks {me} {token}", after=after, note=noted)
            except Exception as error:
                watch.report(round_, Merged(token, None, {}, "the request could not be posted "
                                            f"({type(error).__name__}: {first_line(error)})"))
                raise
            if key is not None:
                round_.shared.append(key)

        watch.post(round_, ask, "this node's stacks request")

    def _expired(self, token: str) -> None:
        self._timers.pop(token, None)
        reply = self._asks.pop(token, None)
        if reply is not None:
            reply({"error": f"no merged answer came back through the store within "
                            f"{ASK_LIMIT:g} s (see the launcher's warnings)"})


class _HangJob:
    """``--hang-timeout`` over every node: this node's still/moving marks, posted at once
    (:func:`numarun.jobwide.hangverdict.mark`)."""

    def __init__(self, node: ElasticNode, watch: StoreWatch) -> None:
        self._node = node
        self._watch = watch

    def still(self, dumps: list[Raw], idle: float) -> None:
        hangverdict.mark(self._watch, self._node.watched_round, "still", dumps)

    def moving(self) -> None:
        hangverdict.mark(self._watch, self._node.watched_round, "moving", [])


class _BarrierHang:
    """While this node waits in the exit barrier (its ranks all ended) it counts as still, and
    the others' hang verdict ends the wait (:class:`numarun.rendezvous.exitbarrier.ExitBarrier`)."""

    def __init__(
        self, node: ElasticNode, watch: StoreWatch, declared_by: Callable[[int], str]
    ) -> None:
        self._node = node
        self._watch = watch
        self._declared_by = declared_by

    def enter(self) -> None:
        node_round = self._node.round
        assert node_round is not None
        ended = "ended with exit code 0; its node waits in the exit barrier"
        hangverdict.mark(self._watch, self._node.watched_round, "done", [
            _raw(place.rank, local_rank, ended)
            for local_rank, place in enumerate(node_round.workers)
        ])  # fmt: skip

    def verdict(self, result: object) -> tuple[JobView, str] | None:
        if isinstance(result, Hang):
            return result.view, self._declared_by(result.sender)
        return None


def _raw(rank: int, local_rank: int, problem: str) -> Raw:
    from numarun.stacks.dumps import Raw

    return Raw(rank, local_rank, None, "", problem)


def _job_fields(view: JobView | None, frames: dict[str, bytes], why: str = "") -> dict:
    """The reply fields of a whole-job ``numarun stacks`` request: the merged classes with
    their frames, as one JSON text the client reads back checked."""
    if view is None:
        return {"error": f"the whole job's stacks are unavailable: {why or 'unreadable'}"}
    from numarun.stacks.merge import REPLY_LIMIT, encode_view

    return {"job_wide": True, "view": encode_view(view, frames, limit=REPLY_LIMIT).decode()}

"""What this node and the other numarun nodes of a torch rendezvous tell each other while
workers run: failure notices (with where this node's ranks were), the whole job's ``numarun
stacks``, and the bridge from ``--hang-timeout`` to the job-wide verdict.

The protocol is :mod:`numarun.launch.jobwide`'s and DESIGN.md's ("Stacks"); notices are posted
fire-and-forget from the store thread, answers come back as :mod:`numarun.launch.storeresults`
records acted on in the supervisor's loop.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable

from numarun.launch import jobwide, storewatch
from numarun.launch.exitbarrier import ANNOUNCE_WAIT
from numarun.launch.storeops import Conn
from numarun.launch.storeresults import REJOIN, Ask, Hang, Merged, Notice
from numarun.launch.storewatch import StoreWatch, post_event

TYPE_CHECKING = False
if TYPE_CHECKING:
    from numarun.process.spec import WorkerExit
    from numarun.stacks.dumps import Raw
    from numarun.stacks.merge import JobView


class JobNotices:
    """:class:`numarun.launch.torchrdzv.ElasticNode`'s notices, whole-job stacks and hang
    bridge (a part of it: the state is the node's)."""

    def _on_notice(self, result: Notice) -> None:
        """Another node stopped: this node's ranks' stacks noted with its notice, then stop."""
        notice, digest, frames = result.text, result.digest, result.frames
        self.last_notice = notice
        stacks = self._stacks
        if self.change is not None or stacks is None:
            self._stop(REJOIN, notice)
            return

        def taken(dumps: list[Raw]) -> None:  # this node's ranks, before the teardown
            stacks.note_notice(notice, digest, frames, dumps)
            self._stop(REJOIN, notice)

        stacks.take_async(taken)

    def _on_ask(self, result: Ask) -> None:
        number = result.number
        if self._stacks is None:
            self._watch.answer(number, [])
        else:
            self._stacks.take_async(lambda dumps: self._watch.answer(number, dumps))

    def _on_merged(self, result: Merged) -> None:
        reply = self._asks.pop(result.token, None) if result.token else None
        if reply is not None:
            reply(_job_fields(result.view, result.frames))

    def _on_hang(self, result: Hang) -> None:
        if self._stacks is not None and self._stacks.hang is not None:
            self._stacks.hang.declare_job(result.view, self._declared_by(result.sender))

    def hang_job(self) -> _HangJob:
        """What ``--hang-timeout`` calls to judge over every node (:mod:`numarun.stacks.hang`)."""
        return _HangJob(self)

    def _declared_by(self, sender: int) -> str:
        if self.round is not None and sender == self.round.group_rank:
            return "this node"
        return f"node {sender}, through the rendezvous store"

    def _ask_job_stacks(self, reply: Callable[[dict], None]) -> None:
        """A ``numarun stacks`` request for the whole job, from the loop: posted
        fire-and-forget; every node (this one too) answers through its thread; this node's
        merges the answers and the merged result comes back through it to ``reply``."""
        round_ = self._watched_round
        if round_ is None:
            reply({"error": "the job is between attempts; ask again"})
            return
        token = os.urandom(6).hex()
        self._asks[token] = reply
        me, after = round_.me, round_.seen

        def noted(line: str) -> None:
            self._watch.note(round_, "events", line)

        def ask(conn: Conn) -> None:
            key = post_event(conn, f"stacks {me} {token}", after=after, note=noted)
            if key is not None:
                round_.shared.append(key)

        StoreWatch.post(round_, ask)

    def on_worker_failure(self, ended: WorkerExit) -> None:
        """The supervisor's ``on_failure``: tell the other nodes at once, with where this
        node's other ranks were (the stacks taken at the failure, when there are)."""
        from numarun.stacks.dumps import Raw

        code = ended.exit_code
        what = f"signal {ended.signal_name}" if ended.signal_name else f"exit code {code}"
        at_failure = self._stacks.at_failure if self._stacks is not None else None
        dumps = [Raw.of(item) for item in at_failure[1]] if at_failure is not None else []
        self.announce(f"rank {ended.rank} (local_rank {ended.local_rank}) failed with {what}",
                      dumps)  # fmt: skip

    def _notice_text(self, message: str) -> str:
        assert self.round is not None
        me = self.round.group_rank
        if message.startswith(f"node {me} "):
            return message
        return f"node {me} ({self.host}): {message}"

    def announce(self, message: str, dumps: list[Raw] | None = None) -> threading.Event:
        """Post ``message`` (prefixed with this node) for the other numarun nodes of the round,
        with the digest of ``dumps`` (this node's ranks), from a short-lived thread nobody
        waits for; once per round, best effort (a store that is gone loses nothing here).
        Returns an event set once it was posted (or failed)."""
        posted = threading.Event()
        if self._announced or self.round is None or self._store is None:
            posted.set()
            return posted
        self._announced = True
        self._announcing = posted
        text = self._notice_text(message)
        round_ = self._watched_round or self._last_round
        if round_ is None:  # not watched yet: the round's store all the same
            round_ = storewatch.Round(self._store, self._handler, self.round.group_rank,
                                      self.round.group_world_size, lambda result: None)  # fmt: skip
        store, me = self._store, self.round.group_rank

        def noted(line: str) -> None:
            self._watch.note(round_, "events", line)

        def send(conn: Conn) -> None:
            try:
                if dumps:
                    header, body = jobwide.notice_post(round_, dumps, text, conn)
                else:
                    header, body = f"stop {me}", notice_body(text)
                key = post_event(conn, header, body, after=round_.seen, note=noted)
                if key is not None:
                    self._posted.append((store, key))
            finally:
                posted.set()

        StoreWatch.post(round_, send)
        return posted

    def announce_and_linger(self, message: str) -> None:
        """:meth:`announce`, then wait at most :data:`ANNOUNCE_WAIT` seconds for it to leave
        (the launcher is about to exit or re-join; a frozen store costs no more)."""
        self.announce(message).wait(ANNOUNCE_WAIT)

    def _delete_posted(self) -> None:
        """Delete what this node posted for the others in rounds every node has left (store
        calls: not from the loop)."""
        for ended in self._ended:
            self._posted += [(ended.store, key) for key in ended.shared]
            ended.shared = []
        self._ended.clear()
        while self._posted:
            store, key = self._posted.pop()
            with contextlib.suppress(Exception):
                store.delete_key(key)


class _HangJob:
    """``--hang-timeout`` over every node: this node's still/moving marks go to the store
    thread (:mod:`numarun.launch.jobwide`)."""

    def __init__(self, node: JobNotices) -> None:
        self._node = node

    def still(self, dumps: list[Raw], idle: float) -> None:
        jobwide.mark_still(self._node._watch, dumps)

    def moving(self) -> None:
        jobwide.mark_moving(self._node._watch)


def notice_body(text: str) -> bytes:
    """A notice without stacks: its one line (newlines would end it)."""
    return text.replace("\n", " ").encode("utf-8", "replace") + b"\n"


def _job_fields(view: JobView | None, frames: dict[str, bytes]) -> dict:
    """The reply fields of a whole-job ``numarun stacks`` request: the merged classes with
    their frames, as one JSON text the client reads back checked."""
    if view is None:
        return {"error": "the merged stacks that came back through the store are unreadable"}
    from numarun.stacks.merge import encode_view

    return {"job_wide": True, "view": encode_view(view, frames).decode()}

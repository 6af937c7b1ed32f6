"""The end of this node's job in a torch rendezvous: torch's exit barrier, then ``shutdown()``.

As torchrun ends it (DESIGN.md, "Rendezvous and restarts"): after success, wait in torch's exit
barrier (``torchelastic/agent/terminal_state``, 300 s) for every node of the round, counting as
still meanwhile under ``--hang-timeout``; after a final failure, give the others time to read this
node's notice; then ``handler.shutdown()``, bounded.
"""

from __future__ import annotations

import contextlib
import threading
import time

from numarun.launch import jobwide
from numarun.launch.storeops import Woken, first_line, root_cause, run_blocking
from numarun.launch.storeresults import Hang
from numarun.launch.storewatch import NODES_KEY

TYPE_CHECKING = False
if TYPE_CHECKING:
    from numarun.stacks.dumps import Raw

EXIT_BARRIER_TIMEOUT = 300.0  # torch's SimpleElasticAgent default
_BARRIER_KEY = "torchelastic/agent/terminal_state"  # torch's _TERMINAL_STATE_SYNC_ID
ANNOUNCE_WAIT = 1.0  # seconds a last notice may delay the launcher's exit
_SHUTDOWN_LIMIT = 10.0  # seconds the closing of the rendezvous may take at the end


class ExitBarrier:
    """:class:`numarun.launch.torchrdzv.ElasticNode`'s end (a part of it: the state is the
    node's)."""

    def finish(self, *, succeeded: bool) -> str | None:
        """The end of this node's job, as torchrun ends it: after success, wait in torch's
        exit barrier for every node of the round (at most 300 s), then ``shutdown()`` (closes
        the rendezvous); after a final failure, ``shutdown()`` at once. Returns a warning line
        when the barrier or the shutdown failed (torchrun logs and goes on), else None. Not
        called after a signal: torchrun leaves the rendezvous open then, for the others.

        With ``--hang-timeout`` this node counts as still while it waits in the barrier (its
        ranks all ended) and keeps watching the round: a hang verdict of the other nodes ends
        the wait; it is left in :attr:`verdict` (the job's classes, who declared it)."""
        warning = None
        # This node's failure notice leaves before the rendezvous closes: the others then
        # read why it ended, not a bare "closed by another node".
        self._announcing.wait(ANNOUNCE_WAIT)
        if not succeeded and self._announced:
            self._await_readers()
        if succeeded and self.round is not None and self._store is not None:
            try:
                self._wait_in_barrier()
            except Exception as error:
                warning = (
                    f"not every node of the {self.where} finished within "
                    f"{EXIT_BARRIER_TIMEOUT:g} s of this one: {first_line(root_cause(error))}"
                )
        self._end_watch()
        try:
            # Bounded: a store that stopped answering must not hold the summary for the
            # store's own timeout.
            run_blocking(self._handler.shutdown, limit=_SHUTDOWN_LIMIT)
        except Exception as error:
            warning = warning or f"closing the {self.where} failed: {first_line(error)}"
        return warning

    def _await_readers(self) -> None:
        """After a final failure: give the other numarun nodes (they look every poll
        interval) time to read this node's notice before ``shutdown()`` and this process's
        exit, which takes the rendezvous store along when this node hosts it (the others then
        saw only "lost the rendezvous: Connection reset by peer"; torch 2.4's store goes at
        once). Each node that read it re-joins (torch's ``num_nodes_waiting``); at most two
        poll intervals and a second, 10 s."""
        if self.round is None or self._store is None or self._handler is None:
            return
        store, handler = self._store, self._handler

        def others_rejoined() -> None:
            others = max(0, int(store.add(NODES_KEY, 0)) - 1)
            deadline = time.monotonic() + min(2 * self.poll_interval + 1, 10.0)
            while others and time.monotonic() < deadline:
                if handler.num_nodes_waiting() >= others:
                    return
                time.sleep(0.05)

        with contextlib.suppress(Exception):
            run_blocking(others_rejoined, limit=10.5)

    def _wait_in_barrier(self) -> None:
        """Torch's exit barrier for ``self`` (:meth:`ElasticNode.finish`); with ``--hang-timeout``
        this node counts as still meanwhile and a hang verdict ends the wait (``self.verdict``)."""
        assert self.round is not None
        store, size = self._store, self.round.group_world_size

        def barrier() -> None:
            import torch.distributed.elastic.utils.store as store_util

            store_util.barrier(
                store=store,
                world_size=size,
                key_prefix=_BARRIER_KEY,
                barrier_timeout=EXIT_BARRIER_TIMEOUT,
            )

        if not self.config.hang_timeout or self._watch._round is None:
            run_blocking(barrier)
            return
        wake = threading.Event()
        self._watch.delivered = wake
        self._in_barrier = True
        ended = "ended with exit code 0; its node waits in the exit barrier"
        jobwide.mark_done(self._watch, [
            _raw(place.rank, local_rank, ended)
            for local_rank, place in enumerate(self.round.workers)
        ])  # fmt: skip
        while True:
            try:
                run_blocking(barrier, wake=wake)
                return
            except Woken:
                pass
            for result in self._watch.take_delivered():
                if isinstance(result, Hang):
                    self.verdict = (result.view, self._declared_by(result.sender))
            if self.verdict is not None:
                return
            wake = threading.Event()  # the abandoned call sets the old one when it ends
            self._watch.delivered = wake


def _raw(rank: int, local_rank: int, problem: str) -> Raw:
    from numarun.stacks.dumps import Raw

    return Raw(rank, local_rank, None, "", problem)

"""The end of one round for this node: torch's exit barrier, or, after a final failure, time for
the others to read this node's notice.

As torchrun ends it (DESIGN.md, "Rendezvous and restarts"): after success, wait in torch's exit
barrier (``torchelastic/agent/terminal_state``, 300 s) for every node of the round; after a final
failure, give the others time to read this node's notice. :meth:`ElasticNode.finish
<numarun.rendezvous.torchrdzv.ElasticNode.finish>` then calls ``handler.shutdown()``, bounded.

Unlike torchrun's, the wait does not outlast the job: while it waits the round stays watched, and
another node's end that the store thread reports (its failure notice, the rendezvous closed, the
next node silent) ends the wait at once (issue 32: a finished node waited minutes for a failed
one). torch's barrier runs on a connection of its own (a clone of the round's store), so torch's
connection stays free for the handler's look at the rendezvous and for ``shutdown()`` after an
early end (a TCPStore client makes one call at a time: behind a barrier's ``wait`` they waited up
to its 300 s).
"""

from __future__ import annotations

import contextlib
import threading
import time

from numarun.rendezvous.storeops import run_blocking
from numarun.rendezvous.storeresults import Change, Lost, Notice
from numarun.rendezvous.storewatch import NODES_KEY

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, Protocol

    from numarun.rendezvous.storeops import Conn
    from numarun.rendezvous.storewatch import StoreWatch, WatchedRound

    class WhileWaiting(Protocol):
        """What may end the wait in the barrier early (the whole-job view's hang verdict)."""

        def enter(self) -> None:
            """This node's ranks all ended and it waits: say so (in the store thread)."""

        def verdict(self, result: object) -> object | None:
            """A result the store thread delivered meanwhile: what ends the wait, or None."""


EXIT_BARRIER_TIMEOUT = 300.0  # torch's SimpleElasticAgent default
_BARRIER_KEY = "torchelastic/agent/terminal_state"  # torch's _TERMINAL_STATE_SYNC_ID
_LAST_MEMBER_KEY = _BARRIER_KEY + "/last_member"  # set by torch's barrier once all arrived
ANNOUNCE_WAIT = 1.0  # seconds a last notice may delay the launcher's exit
LOST_GRACE = 5.0  # seconds the barrier may still end well once the store thread lost the store


def barrier_passed(conn: Conn) -> bool:
    """Whether every node of the round arrived in torch's exit barrier (its last member's key
    is set): a node that closes the rendezvous or falls silent after that finished well."""
    return conn.get_now(_LAST_MEMBER_KEY) is not None


class ExitBarrier:
    """One round's end for this node: its ``store`` (torch's per-round store), ``size`` nodes,
    torch's ``handler``, the round's ``watch`` (results delivered while the barrier waits)."""

    def __init__(self, store: Any, size: int, handler: Any, watch: StoreWatch) -> None:
        self._store = store
        self._size = size
        self._handler = handler
        self._watch = watch
        self.apart = False  # whether the barrier waits on a connection of its own

    def await_readers(self, poll_interval: float) -> None:
        """After a final failure: give the other numarun nodes (they look every poll
        interval) time to read this node's notice before ``shutdown()`` and this process's
        exit, which takes the rendezvous store along when this node hosts it (the others then
        saw only "lost the rendezvous: Connection reset by peer"; torch 2.4's store goes at
        once). Each node that read it re-joins (torch's ``num_nodes_waiting``); at most two
        poll intervals and a second, 10 s."""
        store, handler = self._store, self._handler

        def others_rejoined() -> None:
            others = max(0, int(store.add(NODES_KEY, 0)) - 1)
            deadline = time.monotonic() + min(2 * poll_interval + 1, 10.0)
            while others and time.monotonic() < deadline:
                if handler.num_nodes_waiting() >= others:
                    return
                time.sleep(0.05)

        with contextlib.suppress(Exception):
            run_blocking(others_rejoined, limit=10.5)

    def look(self, round_: WatchedRound, closed: Callable[[], bool],
             silent: int | None) -> str | int | None:  # fmt: skip
        """In the store thread, while this node waits in the barrier: what ended the job
        elsewhere, for the look to report (:meth:`wait` ends on it): ``"closed"`` (the
        rendezvous closed by another node: a torchrun node's last failure posts no notice;
        ``closed()`` is asked only while the barrier waits on a connection of its own, since
        torch's handler would wait behind it), ``silent`` (the next node's group rank, its
        beat stopped), or None; never once every node arrived in the barrier (the closer, or
        the silent one, then finished well)."""
        is_closed = self.apart and closed()
        conn = round_.health_conn()  # torch's barrier keys: the rendezvous store's
        assert conn is not None
        if not (is_closed or silent is not None) or barrier_passed(conn):
            return None
        return "closed" if is_closed else silent

    def wait_for_all(
        self, where: str, while_waiting: WhileWaiting | None, because: str = ""
    ) -> tuple[str | None, str | None, object]:
        """:meth:`wait`, in words: (why the job ended elsewhere, or None; a warning for a
        barrier that failed, or None; what ``while_waiting`` named, or None). ``because``
        follows a :class:`Change`'s message (the last notice read, which says why)."""
        from numarun.rendezvous import torchcompat
        from numarun.rendezvous.storeops import root_cause, store_error

        unknown = "; whether they finished is not known"
        try:
            ended = self.wait(while_waiting)
        except Exception as error:
            if torchcompat.is_store_timeout(root_cause(error)):
                timeout = f"{EXIT_BARRIER_TIMEOUT:g} s"
                return None, f"not every node of the {where} finished within {timeout}", None
            return None, (f"the {where} went away while this node waited for the others to "
                          f"finish ({store_error(error)}){unknown}"), None  # fmt: skip
        if isinstance(ended, Notice):
            return ended.text, None, None
        if isinstance(ended, Change):
            return ended.message + because, None, None
        if isinstance(ended, Lost):
            return None, (f"lost the {where} while this node waited for the others to finish "
                          f"({store_error(ended.error)}){unknown}"), None  # fmt: skip
        return None, None, ended

    def own_connection(self) -> Any:
        """The store torch's barrier waits on: a clone of the round's (its own connection:
        :attr:`apart`), or the round's where torch cannot clone it."""
        clone = getattr(self._store, "clone", None)
        if clone is not None:
            with contextlib.suppress(Exception):
                store = clone()
                self.apart = True
                return store
        return self._store

    def wait(self, while_waiting: WhileWaiting | None = None) -> object | None:
        """Torch's exit barrier, called once (at most :data:`EXIT_BARRIER_TIMEOUT` seconds;
        raises what torch raises). Returns None once every node arrived, or what ended the wait
        first, delivered by the store thread while the round is watched: another node's
        :class:`Notice` (it stopped: a failure, a signal), a :class:`Change` (the rendezvous
        closed by another node, the next node silent: :meth:`ElasticNode._look
        <numarun.rendezvous.torchrdzv.ElasticNode._look>` reports it only while the barrier
        has not passed), a :class:`Lost` store once the barrier did not end within
        :data:`LOST_GRACE` seconds of it, or what ``while_waiting`` names (a hang verdict)."""
        store, size = self.own_connection(), self._size
        watch = self._watch
        finished = threading.Event()
        wake = threading.Event()
        outcome: dict[str, BaseException] = {}

        def barrier() -> None:
            import torch.distributed.elastic.utils.store as store_util

            try:
                store_util.barrier(
                    store=store,
                    world_size=size,
                    key_prefix=_BARRIER_KEY,
                    barrier_timeout=EXIT_BARRIER_TIMEOUT,
                )
            except BaseException as error:  # handed to the waiting thread
                outcome["error"] = error
            finally:
                finished.set()
                wake.set()

        if not watch.watching:  # nothing can end it early
            finished.set()
            run_blocking(barrier)
        else:
            watch.on_delivery(wake)
            if while_waiting is not None:
                while_waiting.enter()
            threading.Thread(target=barrier, name="numarun-barrier", daemon=True).start()
        lost_at: float | None = None
        lost: Lost | None = None
        # The main thread waits here (signal handlers run); the barrier's thread and the
        # store thread's deliveries both set ``wake``; ``finished`` is checked before each wait,
        # so an end that comes while results are taken (which clears ``wake``) is never missed.
        while not finished.is_set():
            left = None if lost_at is None else lost_at + LOST_GRACE - time.monotonic()
            if left is not None and left <= 0:
                return lost
            wake.wait(left)
            if finished.is_set():
                break
            for result in watch.take_delivered():
                if isinstance(result, Notice | Change):
                    return result
                if isinstance(result, Lost) and lost is None:
                    lost, lost_at = result, time.monotonic()
                verdict = while_waiting.verdict(result) if while_waiting is not None else None
                if verdict is not None:
                    return verdict
        if "error" in outcome:
            raise outcome["error"]
        return None

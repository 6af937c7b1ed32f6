"""The end of one round for this node: torch's exit barrier, or, after a final failure, time for
the others to read this node's notice.

As torchrun ends it (DESIGN.md, "Rendezvous and restarts"): after success, wait in torch's exit
barrier (``torchelastic/agent/terminal_state``, 300 s) for every node of the round; after a final
failure, give the others time to read this node's notice. :meth:`ElasticNode.finish
<numarun.rendezvous.torchrdzv.ElasticNode.finish>` then calls ``handler.shutdown()``, bounded.
"""

from __future__ import annotations

import contextlib
import threading
import time

from numarun.rendezvous.storeops import Woken, run_blocking
from numarun.rendezvous.storewatch import NODES_KEY

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Protocol

    from numarun.rendezvous.storewatch import StoreWatch

    class WhileWaiting(Protocol):
        """What may end the wait in the barrier early (the whole-job view's hang verdict)."""

        def enter(self) -> None:
            """This node's ranks all ended and it waits: say so (in the store thread)."""

        def verdict(self, result: object) -> object | None:
            """A result the store thread delivered meanwhile: what ends the wait, or None."""


EXIT_BARRIER_TIMEOUT = 300.0  # torch's SimpleElasticAgent default
_BARRIER_KEY = "torchelastic/agent/terminal_state"  # torch's _TERMINAL_STATE_SYNC_ID
ANNOUNCE_WAIT = 1.0  # seconds a last notice may delay the launcher's exit


class ExitBarrier:
    """One round's end for this node: its ``store`` (torch's per-round store), ``size`` nodes,
    torch's ``handler``, the round's ``watch`` (results delivered while the barrier waits)."""

    def __init__(self, store: Any, size: int, handler: Any, watch: StoreWatch) -> None:
        self._store = store
        self._size = size
        self._handler = handler
        self._watch = watch

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

    def wait(self, while_waiting: WhileWaiting | None = None) -> object | None:
        """Torch's exit barrier (at most :data:`EXIT_BARRIER_TIMEOUT` seconds; raises what
        torch raises). With ``while_waiting`` the round stays watched meanwhile and what it
        names in a delivered result ends the wait: returned (else None)."""
        store, size = self._store, self._size

        def barrier() -> None:
            import torch.distributed.elastic.utils.store as store_util

            store_util.barrier(
                store=store,
                world_size=size,
                key_prefix=_BARRIER_KEY,
                barrier_timeout=EXIT_BARRIER_TIMEOUT,
            )

        if while_waiting is None:
            run_blocking(barrier)
            return None
        watch = self._watch
        wake = threading.Event()
        watch.on_delivery(wake)
        while_waiting.enter()
        while True:
            try:
                run_blocking(barrier, wake=wake)
                return None
            except Woken:
                pass
            for result in watch.take_delivered():
                verdict = while_waiting.verdict(result)
                if verdict is not None:
                    return verdict
            wake = threading.Event()  # the abandoned call sets the old one when it ends
            watch.on_delivery(wake)

"""This node's side of a PyTorch rendezvous: c10d, etcd, etcd-v2 or a ``torchrun.handlers`` plugin.

Imported only when ``--rdzv-backend`` names a torch backend; the static path never loads this
module or torch. The rendezvous is torch's own, used as a library: the handler comes from
``torch.distributed.elastic.rendezvous.registry.get_rendezvous_handler(RendezvousParameters(...))``
with the parameters torchrun's ``launch_agent`` builds; each round is
``handler.next_rendezvous()``; ranks are assigned by torch's ``SimpleElasticAgent
._assign_worker_ranks`` (the same keys in the same store, so a torchrun node in the same
rendezvous agrees on every rank); a successful node waits in torch's exit barrier
(``torchelastic/agent/terminal_state``, 300 s) and then calls ``handler.shutdown()``, as
torchrun does. So a numarun node and a torchrun node form one job.

While workers run, :meth:`ElasticNode.watch` looks at the rendezvous from the supervisor's loop
every ``--monitor-interval`` seconds (default :data:`DEFAULT_POLL_INTERVAL`) and asks the
supervisor to stop the local group when:

* ``num_nodes_waiting() > 0``: a node waits to join; the group re-forms without using a restart
  (torchrun's rule);
* a notice from another numarun node appears in the round's store (``numarun/stop/<group
  rank>``, counted by ``numarun/stops``): that node's worker failed, or it stopped on a signal;
  posted by :meth:`ElasticNode.announce` the moment it happens, so healthy nodes re-form within
  one interval instead of after a collective timeout;
* the next numarun node (by group rank) stops beating: each numarun node adds 1 to
  ``numarun/alive/<group rank>`` three times per keep-alive window (``keep_alive_interval *
  keep_alive_max_attempt``, torch's own; at least three looks) and reads its successor's; a
  counter that stays still for that window means its launcher is gone (SIGKILL, a dead
  machine), which the watcher announces to all (torch assumes, as numarun does, that every
  node is given the same keep-alive settings);
* ``is_closed()``: a node ended the job (its last restart failed): this node ends too;
* the store cannot be reached: the node that hosted it is gone; this node ends.

Keys under ``numarun/`` are scoped to the round (torch's per-round ``PrefixStore``) and are
never read by torch; torchrun nodes ignore them.

Every call that may block in torch (creating the handler connects to or hosts the TCPStore;
``next_rendezvous``; rank assignment; the exit barrier; ``shutdown``) runs in a helper thread
while the launcher's thread waits for it, because torch's store calls block in C++ where no
Python signal handler runs (a ``TCPStore.get`` holds Ctrl-C off for its whole timeout): the
launcher's signal handlers (see :mod:`numarun.launch.job`) stay responsive. torch's C++ log
lines are silenced (``TORCH_CPP_LOG_LEVEL=FATAL`` unless set); numarun reports errors in one
line instead.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from numarun.errors import NumarunError, UsageError
from numarun.launch.rendezvous import Round, WorkerPlace

if TYPE_CHECKING:
    from numarun.launch.config import LaunchConfig
    from numarun.process.spec import WorkerExit
    from numarun.process.supervisor import Supervisor

DEFAULT_POLL_INTERVAL = 2.0
"""Seconds between looks at the rendezvous while workers run, unless ``--monitor-interval``.

A look costs about 0.3 ms of CPU on a busy 2-core machine (torch's state fetched and
unpickled, a store round trip; measured in place, caches cold), and torch's own keep-alive
thread already spends about 0.45 ms per second (one heartbeat every 5 s). Two seconds keeps
the launcher's total well under 1 ms of CPU per second of wall time while a joining node or
another node's failure is still seen within two seconds (torchrun: 0.1 s polls, and its state
cache makes joins visible after up to 1 s)."""

EXIT_BARRIER_TIMEOUT = 300.0  # torch's SimpleElasticAgent default
_BARRIER_KEY = "torchelastic/agent/terminal_state"  # torch's _TERMINAL_STATE_SYNC_ID
_STOPS_KEY = "numarun/stops"
_STOP_KEY = "numarun/stop/{}"
_ALIVE_KEY = "numarun/alive/{}"
_MIN_LOOKS = 3  # a silent neighbour is declared gone after at least this many looks

REJOIN = "rejoin"
END = "end"

T = TypeVar("T")


class RendezvousFailed(NumarunError):
    """The rendezvous could not form or went away; one line, exit status 1."""

    exit_code = 1


class NotAdmitted(NumarunError):
    """torch's graceful exit: the rendezvous closed while this node waited as a spare."""

    exit_code = 0


@dataclass(frozen=True)
class Change:
    """Why this node stopped its workers for the rendezvous: ``kind`` is :data:`REJOIN`
    (re-form the group, no restart used) or :data:`END` (the job is over for this node)."""

    kind: str
    message: str

    @property
    def reason(self) -> str:
        """The ``stop_reason`` given to the supervisor."""
        return f"rendezvous: {self.message}"


def run_blocking(call: Callable[[], T], *, limit: float | None = None) -> T:
    """``call()`` in a daemon thread; wait here, where signal handlers run (see the module
    docstring). Returns its value or raises its exception; :class:`TimeoutError` after
    ``limit`` seconds (the call goes on in its thread). An exception raised by a signal
    handler while waiting propagates; the call is then abandoned."""
    done = threading.Event()
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed to the waiting thread
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=target, name="numarun-rendezvous", daemon=True).start()
    if not done.wait(limit):
        raise TimeoutError(f"no answer within {limit:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.split("\n", 1)[0]


def _root(error: BaseException) -> BaseException:
    """The innermost cause: torch wraps store errors in "see inner exception" messages."""
    while error.__cause__ is not None:
        error = error.__cause__
    return error


class ElasticNode:
    """This node in a torch rendezvous: rounds, the watch while workers run, the end.

    :meth:`connect` once, then per attempt :meth:`next_round` -> :meth:`watch` (with the
    supervisor of that attempt) -> the launcher runs the workers -> :meth:`finish` at the end
    of the job. Errors are one line: :class:`UsageError` (exit 2) for parameters torch
    refuses, :class:`RendezvousFailed` (exit 1) for a rendezvous that cannot form (the store
    unreachable, ``join_timeout`` passed, closed by another node), :class:`NotAdmitted`
    (exit 0) when torch lets a spare node go.
    """

    def __init__(self, config: LaunchConfig) -> None:
        self.config = config
        self.change: Change | None = None
        self.round: Round | None = None
        self.last_notice: str | None = None  # the last other node's notice seen
        self.poll_interval = config.monitor_interval or DEFAULT_POLL_INTERVAL
        conf = dict(config.rdzv_conf)
        window = int(conf.get("keep_alive_interval", 5)) * int(
            conf.get("keep_alive_max_attempt", 3)
        )
        self.silence_limit = max(float(window), _MIN_LOOKS * self.poll_interval)
        # Beats matter on the scale of the keep-alive window, not of a look: three per window.
        self.beat_interval = self.silence_limit / _MIN_LOOKS
        self._next_beat = 0.0
        self.host = socket.gethostname()
        self._handler: Any = None
        self._store: Any = None
        self._announced = False
        self._stops_seen = 0
        self._supervisor: Supervisor | None = None
        self._watched: int | None = None
        self._watched_beat = 0
        self._watched_since = 0.0
        self._round_started = 0.0
        default = "localhost:29400" if config.rdzv_backend == "c10d" else "its default endpoint"
        self.where = (
            f"{config.rdzv_backend} rendezvous {config.run_id!r} at "
            f"{config.rdzv_endpoint or default}"
        )

    # --- joining -------------------------------------------------------------------------------

    def connect(self) -> None:
        """Create torch's handler with torchrun's parameters (the c10d backend connects to
        the TCPStore at the endpoint, or hosts it when the endpoint is this machine)."""
        # torch's C++ layer prints multi-line stack dumps for store errors; numarun says the
        # same in one line. Set before torch loads, in this process only (workers get the
        # environment numarun read at start).
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
        config = self.config
        conf: dict[str, Any] = dict(config.rdzv_conf)
        conf.setdefault("timeout", 900)  # torchrun's LaunchConfig adds it for every backend

        def create() -> Any:
            from torch.distributed.elastic.rendezvous import RendezvousParameters
            from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

            parameters = RendezvousParameters(
                backend=config.rdzv_backend,
                endpoint=config.rdzv_endpoint,
                run_id=config.run_id,
                min_nodes=config.min_nodes,
                max_nodes=config.max_nodes,
                local_addr=config.local_addr,
                **conf,
            )
            return get_rendezvous_handler(parameters)

        try:
            self._handler = run_blocking(create)
        except (ValueError, TypeError) as error:
            raise UsageError(f"{self.where}: {_first_line(error)}") from None
        except Exception as error:
            raise RendezvousFailed(self._failure_text(error)) from None

    def next_round(self) -> Round:
        """Join the next round (torch's ``next_rendezvous``) and assign ranks (torch's
        ``_assign_worker_ranks``); returns what the workers need. Forgets the last change."""
        handler = self._handler
        config = self.config
        previous = self.round

        def join() -> tuple[Any, Any, list[Any]]:
            from types import SimpleNamespace

            from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
            from torch.distributed.elastic.rendezvous.api import RendezvousStoreInfo

            if previous is None:
                info = handler.next_rendezvous()
            else:
                if previous.group_rank == 0 and previous.use_agent_store:
                    _clear_worker_store(previous)
                info = _without_first_join_delay(handler.next_rendezvous)
            store_info = info.bootstrap_store_info
            if handler.use_agent_store:
                # torch's handler publishes the workers' store (MASTER_ADDR, MASTER_PORT in
                # the round's store) only in the first round it is rank 0 in, and its other
                # nodes read them only in their first round: a node joining a later round
                # then waits forever for the keys (torchrun too: the first node of
                # --nnodes 1:2 never admits the second). Every round, rank 0 publishes them
                # again and the others read them, with torch's own RendezvousStoreInfo.build.
                store_info = RendezvousStoreInfo.build(
                    info.rank,
                    info.store,
                    local_addr=store_info.master_addr,
                    server_port=store_info.master_port,
                )
            spec = SimpleNamespace(role=config.role, local_world_size=config.nproc_per_node)
            # A method that uses none of the agent's state: torch's own rank assignment
            # (and keys in the store), so torchrun nodes in the same round agree with ours.
            workers = SimpleElasticAgent._assign_worker_ranks(
                None, info.store, info.rank, info.world_size, spec
            )
            info.store.add(_ALIVE_KEY.format(info.rank), 1)  # "a numarun node", at once
            return info, store_info, workers

        try:
            info, store_info, workers = run_blocking(join)
        except Exception as error:
            name = type(error).__name__
            if name == "RendezvousGracefulExitError":
                raise NotAdmitted(
                    f"numarun: {self.where} closed while this node waited as a spare "
                    "(every place was taken); nothing to run"
                ) from None
            raise RendezvousFailed(self._failure_text(error)) from None
        self._store = info.store
        self.round = Round(
            group_rank=info.rank,
            group_world_size=info.world_size,
            master_addr=store_info.master_addr,
            master_port=int(store_info.master_port),
            workers=tuple(
                WorkerPlace(w.global_rank, w.role_rank, w.world_size, w.role_world_size)
                for w in workers
            ),
            use_agent_store=bool(handler.use_agent_store),
        )
        self.change = None
        self._announced = False
        self._stops_seen = 0
        self._round_started = time.monotonic()
        size = info.world_size
        self._watched = (info.rank + 1) % size if size > 1 else None
        self._watched_beat = 0
        self._watched_since = self._round_started
        self._next_beat = 0.0
        return self.round

    def _failure_text(self, error: BaseException) -> str:
        name = type(error).__name__
        cause = _root(error)
        conf = dict(self.config.rdzv_conf)
        if name == "RendezvousTimeoutError":
            join = conf.get("join_timeout", "600")
            return (
                f"{self.where} did not complete within join_timeout={join} s: fewer than "
                f"{self.config.min_nodes} node(s) joined"
            )
        if name == "RendezvousClosedError":
            return f"{self.where} was closed by another node" + _because(self.last_notice)
        if name == "RendezvousConnectionError" or "Network" in type(cause).__name__:
            return f"cannot reach the {self.where}: {_first_line(cause)}"
        return f"{self.where}: {name}: {_first_line(cause)}"

    # --- while workers run ---------------------------------------------------------------------

    def watch(self, supervisor: Supervisor) -> None:
        """Look at the rendezvous every :attr:`poll_interval` seconds from ``supervisor``'s
        loop; on a change, :attr:`change` is set and the supervisor asked to stop with
        ``change.reason``."""
        self._supervisor = supervisor
        supervisor.call_every(self.poll_interval, self._look)

    def _look(self) -> None:
        if self.change is not None or self.round is None:
            return
        me = self.round.group_rank
        silent = None
        try:
            waiting = self._handler.num_nodes_waiting()
            closed = self._handler.is_closed()  # served from the state just synced
            notice = self._new_notice()
            now = time.monotonic()
            if now >= self._next_beat:
                self._next_beat = now + self.beat_interval
                self._store.add(_ALIVE_KEY.format(me), 1)
                silent = self._silent_neighbour()
        except Exception as error:
            self._stop(END, f"lost the {self.where}: {_first_line(_root(error))}")
            return
        if closed:
            self._stop(END, f"{self.where} was closed by another node" + _because(notice))
        elif notice:
            self._stop(REJOIN, notice)
        elif waiting > 0:
            self._stop(REJOIN, f"{waiting} node(s) waiting to join; re-forming the group")
        elif silent is not None:
            message = (
                f"node {silent} stopped answering (no heartbeat for "
                f"{self.silence_limit:g} s: its launcher is gone)"
            )
            self.announce(message)
            self._stop(REJOIN, message)

    def _new_notice(self) -> str | None:
        count = self._store.add(_STOPS_KEY, 0)
        if count <= self._stops_seen:
            return None
        self._stops_seen = count
        assert self.round is not None
        for rank in range(self.round.group_world_size):
            key = _STOP_KEY.format(rank)
            if rank != self.round.group_rank and self._store.check([key]):
                self.last_notice = self._store.get(key).decode("utf-8", "replace")
                return self.last_notice
        return None  # only our own notice

    def _silent_neighbour(self) -> int | None:
        """The watched node's group rank once its beat stood still for the silence limit.
        A node that never beat (a torchrun node) is passed over for the next one."""
        if self._watched is None or self.round is None:
            return None
        now = time.monotonic()
        beat = self._store.add(_ALIVE_KEY.format(self._watched), 0)
        if beat != self._watched_beat:
            self._watched_beat = beat
            self._watched_since = now
            return None
        if now - self._watched_since < self.silence_limit:
            return None
        if beat == 0:
            following = (self._watched + 1) % self.round.group_world_size
            self._watched = None if following == self.round.group_rank else following
            self._watched_since = now
            return None
        return self._watched

    def _stop(self, kind: str, message: str) -> None:
        self.change = Change(kind, message)
        if self._supervisor is not None:
            self._supervisor.request_stop(self.change.reason)

    def on_worker_failure(self, ended: WorkerExit) -> None:
        """The supervisor's ``on_failure``: tell the other nodes at once."""
        code = ended.exit_code
        what = f"signal {ended.signal_name}" if ended.signal_name else f"exit code {code}"
        self.announce(f"rank {ended.rank} (local_rank {ended.local_rank}) failed with {what}")

    def announce(self, message: str) -> None:
        """Post ``message`` (prefixed with this node) for the other numarun nodes of the
        round; once per round, best effort (a store that is gone loses nothing here)."""
        if self._announced or self.round is None or self._store is None:
            return
        self._announced = True
        me = self.round.group_rank
        text = f"node {me} ({self.host}): {message}"
        if message.startswith(f"node {me} "):
            text = message
        try:
            self._store.set(_STOP_KEY.format(me), text.encode())
            self._stops_seen = self._store.add(_STOPS_KEY, 1)
        except Exception:
            pass

    # --- the end -------------------------------------------------------------------------------

    def finish(self, *, succeeded: bool) -> str | None:
        """The end of this node's job, as torchrun ends it: after success, wait in torch's
        exit barrier for every node of the round (at most 300 s), then ``shutdown()`` (closes
        the rendezvous); after a final failure, ``shutdown()`` at once. Returns a warning line
        when the barrier or the shutdown failed (torchrun logs and goes on), else None. Not
        called after a signal: torchrun leaves the rendezvous open then, for the others."""
        warning = None
        if succeeded and self.round is not None and self._store is not None:
            store, size = self._store, self.round.group_world_size

            def barrier() -> None:
                import torch.distributed.elastic.utils.store as store_util

                store_util.barrier(
                    store=store,
                    world_size=size,
                    key_prefix=_BARRIER_KEY,
                    barrier_timeout=EXIT_BARRIER_TIMEOUT,
                )

            try:
                run_blocking(barrier)
            except Exception as error:
                warning = (
                    f"not every node of the {self.where} finished within "
                    f"{EXIT_BARRIER_TIMEOUT:g} s of this one: {_first_line(_root(error))}"
                )
        try:
            run_blocking(self._handler.shutdown)
        except Exception as error:
            warning = warning or f"closing the {self.where} failed: {_first_line(error)}"
        return warning


def _without_first_join_delay(call: Callable[[], T]) -> T:
    """``call()`` (torch's ``next_rendezvous``) without the random 0-0.3 s sleep torch takes
    while the rendezvous is in round 0, meant to spread the nodes' *first* joins: the round
    stays 0 until the first re-rendezvous, so every job's first restart paid it too (0.15 s
    on average, a third of a restart on one node). Only that random sleep (torch's
    ``_delay`` called with a range) is skipped; the one-second waits between polls stay."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    original = getattr(dynamic_rendezvous, "_delay", None)
    if original is None:  # another torch: nothing to skip
        return call()

    def delay(seconds: float | tuple[float, float]) -> None:
        if not isinstance(seconds, tuple):
            original(seconds)

    dynamic_rendezvous._delay = delay
    try:
        return call()
    finally:
        dynamic_rendezvous._delay = original


def _clear_worker_store(previous: Round) -> None:
    """Delete every key the last attempt's workers left in the store this node hosts for them
    (torch's shared TCPStore, MASTER_ADDR:MASTER_PORT), before the next round.

    torch gives every attempt the same store without a per-attempt prefix, so without this
    the next attempt's workers can read a dead worker's address (gloo: "Connection refused",
    or a hang). Only the node that hosted the store in the last round does it, before it
    rejoins: no worker of the next round can start before the round completes."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    store = TCPStore(
        previous.master_addr, previous.master_port, is_master=False, timeout=timedelta(seconds=10)
    )
    for key in store.list_keys():
        store.delete_key(key)


def _because(notice: str | None) -> str:
    return f" ({notice})" if notice else ""

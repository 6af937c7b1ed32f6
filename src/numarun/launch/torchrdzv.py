"""This node's side of a PyTorch rendezvous: c10d, etcd, etcd-v2 or a ``torchrun.handlers`` plugin.

Imported only when ``--rdzv-backend`` names a torch backend; the static path never loads this
module or torch. The rendezvous is torch's own, used as a library: the handler comes from
``torch.distributed.elastic.rendezvous.registry.get_rendezvous_handler(RendezvousParameters(...))``
with the parameters torchrun's ``launch_agent`` builds; each round is
``handler.next_rendezvous()``; ranks are assigned by torch's ``SimpleElasticAgent
._assign_worker_ranks`` (the same keys in the same store, so a torchrun node in the same
rendezvous agrees on every rank). So a numarun node and a torchrun node form one job.

While workers run, :meth:`ElasticNode.watch` hands the store to the ``numarun-store`` thread
(:mod:`numarun.launch.storewatch`), which looks every ``--monitor-interval`` seconds (default
:data:`DEFAULT_POLL_INTERVAL`) and wakes at another node's event; its results
(:mod:`numarun.launch.storeresults`) ask the supervisor to stop the local group when:

* ``num_nodes_waiting() > 0``: a node waits to join; the group re-forms without using a restart
  (torchrun's rule);
* another numarun node's notice arrives (:mod:`numarun.launch.jobnotices`): its worker failed,
  or it stopped on a signal or a hang;
* the next numarun node (by group rank) stops beating (:mod:`numarun.launch.liveness`): its
  launcher is gone, which this node announces to all;
* ``is_closed()``: a node ended the job (its last restart failed): this node ends too;
* the store cannot be reached: the node that hosted it is gone; this node ends.

The end is :mod:`numarun.launch.exitbarrier`'s. Keys under ``numarun/`` are scoped to the round
(torch's per-round ``PrefixStore``) and never read by torch; torchrun nodes ignore them.

Every call that may block in torch runs through :func:`numarun.launch.storeops.run_blocking`, so
the launcher's signal handlers stay responsive; while this node waits in the rendezvous, a line
every :data:`WAIT_LINE_EVERY` seconds says how many nodes are there, how many are awaited and
where. torch's noise stays off stderr and its private names are checked before use
(:mod:`numarun.launch.torchcompat`).
"""
from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from numarun.errors import NumarunError, UsageError
from numarun.launch import jobwide, storewatch, torchcompat
from numarun.launch.exitbarrier import EXIT_BARRIER_TIMEOUT, ExitBarrier
from numarun.launch.jobnotices import JobNotices, notice_body
from numarun.launch.liveness import Heartbeats
from numarun.launch.round import Round, WorkerPlace
from numarun.launch.storeops import Conn, Forged, first_line, root_cause, run_blocking
from numarun.launch.storeresults import END, REJOIN, Ask, Change, Hang, Lost, Merged, Notice
from numarun.launch.storewatch import ALIVE_KEY, NODES_KEY, StoreWatch, post_event

if TYPE_CHECKING:
    from numarun.launch.config import LaunchConfig
    from numarun.launch.storeresults import Result
    from numarun.process.supervisor import Supervisor
    from numarun.stacks.jobstacks import JobStacks
    from numarun.stacks.merge import JobView

DEFAULT_POLL_INTERVAL = 2.0
"""Seconds between looks at the rendezvous while workers run, unless ``--monitor-interval``.

A look costs about 0.3 ms of CPU on a busy 2-core machine (torch's state fetched and
unpickled, a store round trip; measured in place, caches cold), and torch's own keep-alive
thread already spends about 0.45 ms per second (one heartbeat every 5 s). Two seconds keeps
the launcher's total well under 1 ms of CPU per second of wall time while a joining node or
another node's failure is still seen within two seconds (torchrun: 0.1 s polls, and its state
cache makes joins visible after up to 1 s)."""

WAIT_LINE_EVERY = 10.0  # seconds between the lines that say what a rendezvous waits for
__all__ = ["END", "EXIT_BARRIER_TIMEOUT", "REJOIN", "Change", "ElasticNode", "NotAdmitted",
           "RendezvousFailed"]  # fmt: skip


class RendezvousFailed(NumarunError):
    """The rendezvous could not form or went away; one line, exit status 1."""

    exit_code = 1


class NotAdmitted(NumarunError):
    """torch's graceful exit: the rendezvous closed while this node waited as a spare."""

    exit_code = 0


class ElasticNode(JobNotices, Heartbeats, ExitBarrier):
    """This node in a torch rendezvous: rounds, the watch while workers run, the end.

    :meth:`connect` once, then per attempt :meth:`next_round` -> :meth:`watch` (with the
    supervisor of that attempt) -> the launcher runs the workers -> :meth:`unwatch` -> ... ->
    :meth:`finish` at the end of the job. Errors are one line: :class:`UsageError` (exit 2) for
    parameters torch refuses or a torch without what numarun needs, :class:`RendezvousFailed`
    (exit 1) for a rendezvous that cannot form (the store unreachable, ``join_timeout``
    passed, closed by another node), :class:`NotAdmitted` (exit 0) when torch lets a spare node
    go.
    """

    def __init__(self, config: LaunchConfig) -> None:
        self.config = config
        self.change: Change | None = None
        self.round: Round | None = None
        self.last_notice: str | None = None  # the last other node's notice seen
        self.poll_interval = config.monitor_interval or DEFAULT_POLL_INTERVAL
        self._init_heartbeats(config, self.poll_interval)
        self.host = socket.gethostname()
        self._handler: Any = None
        self._store: Any = None
        self._announced = False
        self._announcing = threading.Event()  # set once this node's last notice left
        self._announcing.set()
        self._supervisor: Supervisor | None = None
        self._stacks: JobStacks | None = None
        self._asks: dict[str, Callable[[dict], None]] = {}
        # Keys this node posted that other nodes read (events, frames, its hang post), and the
        # rounds whose watch ended: deleted once the next round formed, when every node has
        # left the round they were posted in.
        self._posted: list[tuple[Any, str]] = []
        self._ended: list[storewatch.Round] = []
        self.verdict: tuple[JobView, str] | None = None  # a hang verdict met in the exit barrier
        self._in_barrier = False
        self._watch = StoreWatch(self.poll_interval, self._look, jobwide.on_event)
        self._watched_round: storewatch.Round | None = None
        self._last_round: storewatch.Round | None = None
        self._round_started = 0.0
        self._waiting_since = 0.0
        default = "localhost:29400" if config.rdzv_backend == "c10d" else "its default endpoint"
        self.where = (
            f"{config.rdzv_backend} rendezvous {config.run_id!r} at "
            f"{config.rdzv_endpoint or default}"
        )

    # --- joining -------------------------------------------------------------------------------

    def connect(self) -> None:
        """Create torch's handler with torchrun's parameters (the c10d backend connects to
        the TCPStore at the endpoint, or hosts it when the endpoint is this machine)."""
        torchcompat.quiet_torch()
        config = self.config
        conf: dict[str, Any] = dict(config.rdzv_conf)
        conf.setdefault("timeout", 900)  # torchrun's LaunchConfig adds it for every backend

        def create() -> Any:
            torchcompat.check_torch()  # first: an older torch's parameters differ too
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

        self._waiting_since = time.monotonic()
        try:
            self._handler = run_blocking(create, every=WAIT_LINE_EVERY, tick=self._waiting_line)
        except UsageError:
            raise
        except (ValueError, TypeError) as error:
            raise UsageError(f"{self.where}: {first_line(error)}") from None
        except Exception as error:
            raise RendezvousFailed(self._failure_text(error)) from None

    def _waiting_line(self) -> None:
        """One line on stderr: how long this node waits, how many nodes are there, how many
        are awaited (read from the state torch's thread last synced; no store call)."""
        waited = time.monotonic() - self._waiting_since
        state = getattr(getattr(self._handler, "_state_holder", None), "state", None)
        config = self.config
        wanted = f"{config.min_nodes}" + (
            f" to {config.max_nodes}" if config.max_nodes != config.min_nodes else ""
        )
        count = ""
        participants = getattr(state, "participants", None)
        if isinstance(participants, dict):
            here = len(participants)
            awaited = max(0, config.min_nodes - here)
            count = f": {here} of {wanted} node(s) there, {awaited} more awaited"
            if getattr(state, "complete", False) and self.round is None:
                count = f": the round is complete with {here} node(s); this node waits as a spare"
        else:
            count = f": waiting for {wanted} node(s)"
        sys.stderr.write(f"numarun: waiting {waited:.0f} s for the {self.where}{count}\n")
        sys.stderr.flush()

    def next_round(self) -> Round:
        """Join the next round (torch's ``next_rendezvous``) and assign ranks (torch's
        ``_assign_worker_ranks``); returns what the workers need. Forgets the last change."""
        handler = self._handler
        config = self.config
        previous = self.round
        self._end_watch()
        last_watched, self._last_round = self._last_round, None
        def join() -> tuple[Any, tuple[str, int, bool], list[Any]]:
            from types import SimpleNamespace

            from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

            if last_watched is not None:  # its thread may sleep in the old round's store
                with contextlib.suppress(Exception):
                    conn = Conn(last_watched.store, clone=False)
                    storewatch.wake(conn, last_watched.me)
                    conn.close()
            if previous is None:
                info = torchcompat.first_join(handler, config.max_nodes)
            else:
                if previous.group_rank == 0 and previous.use_agent_store:
                    torchcompat.clear_worker_store(previous)
                info = torchcompat.rejoin(handler)
            self._delete_posted()
            # The workers' store as torch's handler gives it, published again every round
            # (torchcompat.workers_store says how, for each torch).
            store_info = torchcompat.workers_store(
                handler, info, first_round=previous is None, local_addr=config.local_addr
            )
            spec = SimpleNamespace(role=config.role, local_world_size=config.nproc_per_node)
            workers = torchcompat.assign_ranks(SimpleElasticAgent, info, spec)
            # Read before added to: a forged value must not make the store close torch's
            # connection (a connection of numarun's own would cost a connection per round).
            conn = Conn(info.store, clone=False)
            try:
                for key in (ALIVE_KEY.format(info.rank), NODES_KEY):  # "a numarun node", at once
                    with contextlib.suppress(Forged):  # named by the watch when it matters
                        conn.add(key, 1)
            finally:
                conn.close()
            return info, store_info, workers

        self._waiting_since = time.monotonic()
        try:
            info, store_info, workers = run_blocking(
                join, every=WAIT_LINE_EVERY, tick=self._waiting_line
            )
        except UsageError:
            raise
        except Exception as error:
            name = type(error).__name__
            if name == "RendezvousGracefulExitError":
                raise NotAdmitted(
                    f"numarun: {self.where} closed while this node waited as a spare "
                    "(every place was taken); nothing to run"
                ) from None
            raise RendezvousFailed(self._failure_text(error)) from None
        self._store = info.store
        master_addr, master_port, shared = store_info
        self.round = Round(
            group_rank=info.rank,
            group_world_size=info.world_size,
            master_addr=master_addr,
            master_port=master_port,
            workers=tuple(
                WorkerPlace(w.global_rank, w.role_rank, w.world_size, w.role_world_size)
                for w in workers
            ),
            use_agent_store=shared,
        )
        self.change = None
        self._announced = False
        self._in_barrier = False
        self._round_started = time.monotonic()
        self._watch_neighbour(info.rank, info.world_size, self._round_started)
        return self.round

    def _failure_text(self, error: BaseException) -> str:
        name = type(error).__name__
        cause = root_cause(error)
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
            if self.last_notice:
                # The node that posted it ended, and its store with it (it hosted it).
                return (
                    f"{self.where} went away after another node ended"
                    f"{_because(self.last_notice)}: {first_line(cause)}"
                )
            return f"cannot reach the {self.where}: {first_line(cause)}"
        return f"{self.where}: {name}: {first_line(cause)}"

    # --- while workers run ---------------------------------------------------------------------

    def watch(self, supervisor: Supervisor, stacks: JobStacks | None = None) -> None:
        """Hand this round to the ``numarun-store`` thread; on a change, :attr:`change` is set
        and the supervisor asked to stop with ``change.reason``. With ``stacks``, the whole
        job's stacks are served and ``--hang-timeout`` is judged over every node."""
        assert self.round is not None
        self._supervisor = supervisor
        self._stacks = stacks
        self._asks.clear()
        if stacks is not None:
            stacks.job_wide = self._ask_job_stacks
        workers = self.round.workers
        round_ = storewatch.Round(
            self._store, self._handler, self.round.group_rank, self.round.group_world_size,
            self._on_result, world=workers[0].world_size if workers else 1 << 22,
            host=self.host,
        )  # fmt: skip
        self._watched_round = round_
        self._watch.begin(supervisor, round_)

    def unwatch(self) -> None:
        """The attempt's run is over: its results no longer go to the supervisor's loop; the
        round stays watched until the next round or :meth:`finish` (a verdict may still come
        while this node waits in the exit barrier)."""
        self._watch.detach()
        self._supervisor = None
        for reply in self._asks.values():
            reply({"error": "the attempt ended before every node answered"})
        self._asks.clear()

    def _end_watch(self) -> None:
        """The thread lets the round go (deleting the keys only this node reads)."""
        ended = self._watch.end()
        if ended is not None:
            self._last_round = ended
            self._ended.append(ended)
        self._watched_round = None

    def _look(self, round_: storewatch.Round) -> list[Result]:
        """In the store thread, every look interval: results for :meth:`_on_result`. In the
        exit barrier only this node's heartbeat: torch's barrier waits on torch's connection,
        which torch's handler would wait behind."""
        if self._in_barrier:
            if time.monotonic() >= self._next_beat:
                self._next_beat = time.monotonic() + self.beat_interval
                self._beat(round_)
            return []
        if self.change is not None:
            return []
        waiting = self._handler.num_nodes_waiting()
        closed = self._handler.is_closed()  # served from the state just synced
        silent = None
        now = time.monotonic()
        if now >= self._next_beat:
            self._next_beat = now + self.beat_interval
            self._beat(round_)
            silent = self._silent_neighbour(round_)
        if closed:
            message = f"{self.where} was closed by another node" + _because(self.last_notice)
            return [Change(END, message)]
        if waiting > 0:
            return [Change(REJOIN, f"{waiting} node(s) waiting to join; re-forming the group")]
        if silent is not None:
            message = (
                f"node {silent} stopped answering (no heartbeat for "
                f"{self.silence_limit:g} s: its launcher is gone)"
            )
            assert round_.conn is not None
            body = notice_body(self._notice_text(message))
            key = post_event(round_.conn, f"stop {round_.me}", body, after=round_.seen)
            if key is not None:
                round_.shared.append(key)
            self._announced = True
            return [Change(REJOIN, message)]
        return []

    def _on_result(self, result: Result) -> None:
        """In the supervisor's loop: what the store thread found."""
        if isinstance(result, Change):
            self._stop(result.kind, result.message)
        elif isinstance(result, Lost):
            self._stop(END, f"lost the {self.where}: {first_line(root_cause(result.error))}")
        elif isinstance(result, Notice):
            self._on_notice(result)
        elif isinstance(result, Ask):
            self._on_ask(result)
        elif isinstance(result, Merged):
            self._on_merged(result)
        elif isinstance(result, Hang):
            self._on_hang(result)

    def _stop(self, kind: str, message: str) -> None:
        if self.change is not None:
            return
        self.change = Change(kind, message)
        if self._supervisor is not None:
            self._supervisor.request_stop(self.change.reason)

    # --- the end -------------------------------------------------------------------------------

    def close(self) -> None:
        """The job is over: the store thread ends (at most half a second). What this node
        posted in its last round stays in the round's store (it goes with it): a node that looks
        only every few seconds must still read why this one ended (deleted here, it read a bare
        "closed by another node"). What it posted in earlier rounds, which every node has left,
        is deleted, best effort, waited for at most half a second."""
        self._watch.close(self._last_round or self._watched_round)
        if self._posted or self._ended:
            with contextlib.suppress(Exception):
                run_blocking(self._delete_posted, limit=0.5)


def _because(notice: str | None) -> str:
    return f" ({notice})" if notice else ""

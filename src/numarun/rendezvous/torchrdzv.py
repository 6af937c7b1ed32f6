"""This node's side of a PyTorch rendezvous: c10d, etcd, etcd-v2 or a ``torchrun.handlers`` plugin.

Imported only when ``--rdzv-backend`` names a torch backend; the static path never loads this
module or torch. The rendezvous is torch's own, used as a library: the handler comes from
``torch.distributed.elastic.rendezvous.registry.get_rendezvous_handler(RendezvousParameters(...))``
with the parameters torchrun's ``launch_agent`` builds; each round is
``handler.next_rendezvous()``; ranks are assigned by torch's ``SimpleElasticAgent
._assign_worker_ranks`` (the same keys in the same store, so a torchrun node in the same
rendezvous agrees on every rank). So a numarun node and a torchrun node form one job.

While workers run, :meth:`ElasticNode.watch` hands the store to the ``numarun-store`` thread
(:mod:`numarun.rendezvous.storewatch`), which looks every ``--monitor-interval`` seconds (default
:data:`DEFAULT_POLL_INTERVAL`) and wakes at another node's event; its results
(:mod:`numarun.rendezvous.storeresults`) ask the supervisor to stop the local group when:

* ``num_nodes_waiting() > 0``: a node waits to join; the group re-forms without using a restart
  (torchrun's rule);
* another numarun node's notice arrives (a ``stop`` event): its worker failed, or it stopped on
  a signal or a hang;
* the next numarun node (by group rank) stops beating (:mod:`numarun.rendezvous.liveness`): its
  launcher is gone, which this node announces to all;
* ``is_closed()``: a node ended the job (its last restart failed): this node ends too;
* the store cannot be reached: the node that hosted it is gone; this node ends.

The end is :mod:`numarun.rendezvous.exitbarrier`'s. Keys under ``numarun/`` are scoped to the round
(torch's per-round ``PrefixStore``) and never read by torch; torchrun nodes ignore them
(docs/protocol.md lists them).

The whole-job view (stacks, hang verdicts, where a failed node's ranks were) is not this module's:
it plugs in as :attr:`ElasticNode.diagnostics` (:class:`numarun.jobwide.notices.JobNotices`), and
every call into it is guarded: what it raises is one line, and the rendezvous goes on.

Every call that may block in torch runs through :func:`numarun.rendezvous.storeops.run_blocking`, so
the launcher's signal handlers stay responsive; while this node waits in the rendezvous, a line
every 10 s says what it is doing, who is there and how many more are awaited
(:mod:`numarun.rendezvous.waiting`). torch's noise stays off stderr and its private names are
checked before use (:mod:`numarun.rendezvous.torchcompat`).
"""
from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from numarun.errors import NumarunError, UsageError
from numarun.rendezvous import diagstore, torchcompat
from numarun.rendezvous.events import notice_body, post_event, post_notice, wake
from numarun.rendezvous.exitbarrier import ANNOUNCE_WAIT, EXIT_BARRIER_TIMEOUT, ExitBarrier
from numarun.rendezvous.liveness import BEAT_INTERVAL, Heartbeats, LostNodes, next_read, register
from numarun.rendezvous.round import Round, WorkerPlace
from numarun.rendezvous.storeops import (
    Conn,
    first_line,
    root_cause,
    run_blocking,
    store_error,
    store_gone,
)
from numarun.rendezvous.storeresults import END, REJOIN, Change, Lost, Notice
from numarun.rendezvous.storewatch import GONE_WORD, NEXT_BEAT, StoreWatch, WatchedRound
from numarun.rendezvous.waiting import CONNECTING, IMPORTING, JOINING, TICK, Waiting

if TYPE_CHECKING:
    from numarun.cmdline.config import LaunchConfig
    from numarun.process.supervisor import Supervisor
    from numarun.rendezvous.exitbarrier import WhileWaiting
    from numarun.rendezvous.storeresults import Result

    class Diagnostics(Protocol):
        """The whole-job view as the node calls it (:class:`numarun.jobwide.notices.JobNotices`);
        every call is guarded (:meth:`ElasticNode.guarded`)."""

        def on_event(self, round_: WatchedRound, number: int, kind: str, sender: int,
                     fields: list[str], body: bytes) -> None:  # fmt: skip
            """In the store thread: an event of a kind that is not the rendezvous's own."""

        def read_notice(self, round_: WatchedRound, sender: int, post: bytes) -> Notice:
            """In the store thread: the notice of node ``sender`` with where its ranks were
            (``post``: what followed its line)."""

        def notice_post(self, round_: WatchedRound, dumps: list, conn: Conn) -> bytes:
            """In a posting thread: what follows this node's notice line (its ranks)."""

        def before_stop(self, notice: Notice, stop: Callable[[], None]) -> bool:
            """In the loop: another node stopped; True when ``stop`` will be called once
            this node's ranks' stacks are noted with the notice (False: stop now)."""

        def on_result(self, result: object) -> None:
            """In the loop: a result of the whole-job view's own."""

        def while_waiting(self) -> WhileWaiting | None:
            """What may end this node's wait in the exit barrier (a hang verdict)."""

        def unwatched(self) -> None:
            """The attempt's run is over (requests still open are answered)."""


DEFAULT_POLL_INTERVAL = 2.0
"""Seconds between looks at the rendezvous while workers run, unless ``--monitor-interval``.

A look costs about 0.3 ms of CPU on a busy 2-core machine (torch's state fetched and
unpickled, a store round trip; measured in place, caches cold), and torch's own keep-alive
thread already spends about 0.45 ms per second (one heartbeat every 5 s). Two seconds keeps
the launcher's total well under 1 ms of CPU per second of wall time while a joining node or
another node's failure is still seen within two seconds (torchrun: 0.1 s polls, and its state
cache makes joins visible after up to 1 s)."""

__all__ = ["END", "EXIT_BARRIER_TIMEOUT", "REJOIN", "Change", "ElasticNode", "NotAdmitted",
           "RendezvousFailed"]  # fmt: skip
_SHUTDOWN_LIMIT = 10.0  # seconds the closing of the rendezvous may take at the end


class RendezvousFailed(NumarunError):
    """The rendezvous could not form or went away; one line, exit status 1."""

    exit_code = 1


class NotAdmitted(NumarunError):
    """torch's graceful exit: the rendezvous closed while this node waited as a spare."""

    exit_code = 0


class ElasticNode:
    """This node in a torch rendezvous: rounds, the watch while workers run, the end.

    :meth:`connect` once, then per attempt :meth:`next_round` -> :meth:`begin_watch` (with the
    supervisor of that attempt) -> the launcher runs the workers -> :meth:`unwatch` -> ... ->
    :meth:`finish` at the end of the job. Errors are one line: :class:`UsageError` (exit 2) for
    parameters torch refuses or a torch without what numarun needs, :class:`RendezvousFailed`
    (exit 1) for a rendezvous that cannot form (the store unreachable, ``join_timeout``
    passed, closed by another node), :class:`NotAdmitted` (exit 0) when torch lets a spare node
    go.

    Composed of :attr:`watch` (the ``numarun-store`` thread), :attr:`heartbeats` and, at the
    end, an :class:`ExitBarrier`; :attr:`diagnostics`, when set, is the whole-job view, which
    never decides the rendezvous's outcome (a failure in it is one line).
    """

    def __init__(self, config: LaunchConfig) -> None:
        self.config = config
        self.change: Change | None = None
        self.round: Round | None = None
        self.last_notice: str | None = None  # the last other node's notice seen
        self.poll_interval = config.monitor_interval or DEFAULT_POLL_INTERVAL
        self.host = socket.gethostname()
        self.diagnostics: Diagnostics | None = None
        self.verdict: object = None  # what ended the exit barrier's wait (a hang verdict)
        # This node's heartbeat, every second while a round is watched (the barrier included).
        beat = (BEAT_INTERVAL, lambda round_, conn: self.heartbeats.beat(round_, conn))
        self.watch = StoreWatch(self.poll_interval, self._look, self._on_event, beat)
        self.heartbeats = Heartbeats(config, self.poll_interval, lambda *note: self.watch.note(
            *note, "the rendezvous store"))  # its keys', whichever store the view uses
        self._handler: Any = None
        self._store: Any = None
        self._announced = False
        self._announcing = threading.Event()  # set once this node's last notice left
        self._announcing.set()
        self._supervisor: Supervisor | None = None
        self._said: set[str] = set()  # the lines of failed diagnostics said so far
        # Keys this node posted that other nodes read (events, frames, its hang post), and the
        # rounds whose watch ended: deleted once the next round formed, when every node has
        # left the round they were posted in.
        self._posted: list[tuple[Any, str]] = []
        self._ended: list[WatchedRound] = []
        self._barrier: ExitBarrier | None = None  # while this node waits in it
        # --diagnostics-store own: the view's store, hosted by group rank 0 (diagstore.host_round)
        self.own_diag = getattr(config, "diagnostics_store", "rendezvous") == "own"
        self._diag_server: Any = None
        self.ended_elsewhere: str | None = None  # why the job ended on another node (finish)
        self.watched_round: WatchedRound | None = None  # the round the thread watches now
        self._last_round: WatchedRound | None = None
        self._round_started = 0.0
        default = "localhost:29400" if config.rdzv_backend == "c10d" else "its default endpoint"
        self.where = (
            f"{config.rdzv_backend} rendezvous {config.run_id!r} at "
            f"{config.rdzv_endpoint or default}"
        )
        self.waiting = Waiting(config, self.where)  # the waiting lines and status

    # --- joining -------------------------------------------------------------------------------

    def connect(self) -> None:
        """Create torch's handler with torchrun's parameters (the c10d backend connects to
        the TCPStore at the endpoint, or hosts it when the endpoint is this machine)."""
        torchcompat.quiet_torch()
        config = self.config
        conf: dict[str, Any] = dict(config.rdzv_conf)
        conf.setdefault("timeout", 900)  # torchrun's LaunchConfig adds it for every backend

        waiting = self.waiting

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
            waiting.doing = CONNECTING
            return get_rendezvous_handler(parameters)

        waiting.begin(IMPORTING)
        try:
            self._handler = run_blocking(create, every=TICK, tick=waiting.tick)
        except UsageError:
            raise
        except (ValueError, TypeError) as error:
            raise UsageError(f"{self.where}: {first_line(error)}") from None
        except Exception as error:
            raise RendezvousFailed(_failure_text(self, error)) from None
        waiting.handler = self._handler

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

            if last_watched is not None and last_watched.diag_store is not None:
                # Its thread may sleep in the old round's store (the view's: with a store of
                # its own, that store is served until the next round formed).
                with contextlib.suppress(Exception):
                    # (a store of its own: a connection of its own, the thread's is busy)
                    conn = Conn(last_watched.diag_store, clone=last_watched.own_diag)
                    wake(conn, last_watched.me)
                    conn.close()
            lost = LostNodes(handler, self.where)  # a participant whose launcher is gone
            if previous is None:
                info = torchcompat.first_join(handler, config.max_nodes, between=lost.look)
            else:
                if previous.group_rank == 0 and previous.use_agent_store:
                    torchcompat.clear_worker_store(previous)
                info = torchcompat.rejoin(handler, config.max_nodes, between=lost.look)
            self._delete_posted()
            # The workers' store as torch's handler gives it, published again every round
            # (torchcompat.workers_store says how, for each torch).
            store_info = torchcompat.workers_store(
                handler, info, first_round=previous is None, local_addr=config.local_addr
            )
            spec = SimpleNamespace(role=config.role, local_world_size=config.nproc_per_node)
            workers = torchcompat.assign_ranks(SimpleElasticAgent, info, spec)
            register(info.store, info.rank)
            self._host_diagnostics(info)
            return info, store_info, workers

        self.waiting.begin(JOINING)
        try:
            info, store_info, workers = run_blocking(join, every=TICK, tick=self.waiting.tick)
        except UsageError:
            raise
        except Exception as error:
            self.waiting.end()
            name = type(error).__name__
            if name == "RendezvousGracefulExitError":
                raise NotAdmitted(
                    f"numarun: {self.where} closed while this node waited as a spare "
                    "(every place was taken); nothing to run"
                ) from None
            raise RendezvousFailed(_failure_text(self, error)) from None
        self.waiting.end()
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
        self._barrier = None
        self.ended_elsewhere = None
        self._round_started = time.monotonic()
        self.heartbeats.watch_neighbour(info.rank, info.world_size, self._round_started)
        return self.round

    def _host_diagnostics(self, info: Any) -> None:
        """Once a round formed: :func:`numarun.rendezvous.diagstore.host_round`."""
        self._diag_server = diagstore.host_round(self._diag_server, info, self.own_diag,
                                                 self.config.rdzv_endpoint)  # fmt: skip

    # --- while workers run ---------------------------------------------------------------------

    def begin_watch(self, supervisor: Supervisor) -> None:
        """Hand this round to the ``numarun-store`` thread; on a change, :attr:`change` is set
        and the supervisor asked to stop with ``change.reason``."""
        assert self.round is not None
        self._supervisor = supervisor
        workers = self.round.workers
        round_ = WatchedRound(
            self._store, self._handler, self.round.group_rank, self.round.group_world_size,
            self._on_result, world=workers[0].world_size if workers else 1 << 22,
            host=self.host, own_diag=self.own_diag,
        )  # fmt: skip
        self.watched_round = round_
        self.watch.begin(supervisor, round_)
        if self.own_diag:
            threading.Thread(target=_watch_health, args=(self, round_), name="numarun-health",
                             daemon=True).start()  # fmt: skip

    def unwatch(self) -> None:
        """The attempt's run is over: its results no longer go to the supervisor's loop; the
        round stays watched until the next round or :meth:`finish` (a verdict may still come
        while this node waits in the exit barrier)."""
        self.watch.detach()
        self._supervisor = None
        if self.diagnostics is not None:
            self.guarded("the end of the whole-job view's requests", self.diagnostics.unwatched)

    def _end_watch(self) -> None:
        """The thread lets the round go (deleting the keys only this node reads)."""
        ended = self.watch.end()
        if ended is not None:
            self._last_round = ended
            self._ended.append(ended)
        self.watched_round = None

    def _look(self, round_: WatchedRound) -> list[Result]:
        """In the store thread, every look interval: results for :meth:`_on_result`; in the
        exit barrier, what ended the job elsewhere (:meth:`ExitBarrier.look`). Only torch's
        handler's calls may raise out of here (the rendezvous's own health); numarun's keys
        (the neighbour's heartbeat, the silent neighbour's notice) that fail are one line."""
        barrier = self._barrier
        if barrier is not None:
            silent = self.watch.tolerant(round_, NEXT_BEAT, self.heartbeats.look, round_,
                                         self._handler)  # fmt: skip
            why = barrier.look(round_, self._handler.is_closed, silent)
            if why == "closed":
                return [Change(END, f"{self.where} was closed by another node")]
            return [] if why is None else [Change(END, self._announce_silent(round_, why))]
        if self.change is not None:
            return []
        waiting = self._handler.num_nodes_waiting()
        closed = self._handler.is_closed()  # served from the state just synced
        silent = None if round_.own_diag else self.watch.tolerant(  # own: _watch_health's
            round_, NEXT_BEAT, self.heartbeats.look, round_, self._handler)
        if closed:
            message = f"{self.where} was closed by another node" + _because(self.last_notice)
            return [Change(END, message)]
        if waiting > 0:
            return [Change(REJOIN, f"{waiting} node(s) waiting to join; re-forming the group")]
        if silent is not None:
            return [Change(REJOIN, self._announce_silent(round_, silent))]
        return []

    def _announce_silent(self, round_: WatchedRound, silent: int) -> str:
        """Tell every node that node ``silent`` stopped beating; the line said."""
        message = _silent_line(self, silent)
        body = notice_body(self._notice_text(message))
        self.watch.tolerant(round_, "this node's notice", post_notice, round_, body)
        self._announced = True
        round_.stopping = True  # the round is over for this node: no other notice is read
        return message

    def _on_event(self, round_: WatchedRound, number: int, value: bytes) -> None:
        """In the store thread, event ``number`` of the round: ``stop`` (another node's
        notice) and ``wake`` are the rendezvous's; any other kind goes to the whole-job view
        (guarded by the caller, :meth:`StoreWatch.guarded`); one that is not numarun's is
        named and ignored."""
        head, _, rest = value.partition(b"\n")
        fields = head[:200].decode("ascii", "replace").split()
        watch = self.watch
        if len(fields) < 2 or not fields[1].isdigit() or len(fields[1]) > 9:
            watch.note(round_, f"event {number}", f"event {number} is not numarun's: ignored")
            return
        kind, sender = fields[0], int(fields[1])
        if sender >= round_.size:
            watch.note(round_, f"event {number}", f"event {number} names node {sender}, not "
                       f"one of the {round_.size} nodes: ignored")  # fmt: skip
            return
        if kind == "stop":
            # The round is over for this node: the events after the first notice (a failure
            # cascade: hundreds of nodes' notices) are not read (docs/protocol.md).
            round_.stopping = True
        if kind == "wake" or (kind == "stop" and sender == round_.me):
            return
        if kind == "stop":
            watch.report(round_, self._read_notice(round_, sender, rest))
        elif self.diagnostics is not None:
            self.diagnostics.on_event(round_, number, kind, sender, fields, rest)

    def _read_notice(self, round_: WatchedRound, sender: int, body: bytes) -> Notice:
        """Another node's ``stop`` notice: its line (escaped, cut), and where its ranks were
        when the whole-job view can read it (else the line alone, its failure named)."""
        from numarun.stacks.digest import printable

        text, _, post = body.partition(b"\n")
        notice = Notice(printable(text[:2000].decode("utf-8", "replace").strip())[:500])
        if post and self.diagnostics is not None:
            read = self.diagnostics.read_notice
            try:
                return read(round_, sender, post).replace(text=notice.text)
            except Exception as error:  # a post that is not one (PostError), or a failure
                why = first_line(error)
                if type(error).__name__ != "PostError":
                    why = f"{type(error).__name__}: {why}"
                self.watch.note(round_, f"notice {sender}", f"the notice of node {sender}: "
                                f"{why}: its ranks not shown")  # fmt: skip
        return notice

    def _on_result(self, result: Result) -> None:
        """In the supervisor's loop: what the store thread found. Another node's notice, or
        the rendezvous closed, is kept in :attr:`ended_elsewhere` too: when this node's ranks
        had all finished meanwhile, :meth:`finish` does not wait for the others."""
        if isinstance(result, Change):
            if result.kind == END:
                self.ended_elsewhere = result.message
            self.stop(result.kind, result.message)
        elif isinstance(result, Lost):
            self.stop(END, f"lost the {self.where}: {first_line(root_cause(result.error))}")
        elif isinstance(result, Notice):
            self.last_notice = self.ended_elsewhere = result.text

            def stop() -> None:
                self.stop(REJOIN, result.text)

            # The whole-job view notes this node's ranks first and stops after; when it
            # cannot (absent, or failing), the stop is not delayed.
            if self.change is not None or self.diagnostics is None or not self.guarded(
                "noting where this node's ranks were", self.diagnostics.before_stop, result, stop
            ):
                stop()
        elif self.diagnostics is not None:
            self.guarded("the whole-job view", self.diagnostics.on_result, result)

    def stop(self, kind: str, message: str) -> None:
        """Stop this node's workers for the rendezvous (:attr:`change`; the first one wins)."""
        if self.change is not None:
            return
        self.change = Change(kind, message)
        if self._supervisor is not None:
            self._supervisor.request_stop(self.change.reason)

    def guarded(self, what: str, call: Callable[..., Any], *args: object) -> Any:
        """``call(*args)`` of the whole-job view, in the loop: what it raises is one line on
        stderr (once per kind of failure) and None is returned; the rendezvous goes on."""
        try:
            return call(*args)
        except Exception as error:
            line = f"{what} failed ({type(error).__name__}: {first_line(error)})"
            if line not in self._said:
                self._said.add(line)
                with contextlib.suppress(OSError, ValueError):
                    sys.stderr.write(f"numarun: warning: {line}; the training goes on\n")
                    sys.stderr.flush()
            return None

    # --- notices -------------------------------------------------------------------------------

    def on_worker_failure(self, ended: object, dumps: list | None = None) -> None:
        """A local worker failed: tell the other nodes at once (``dumps``: where this node's
        other ranks were, for the whole-job view's post)."""
        code = getattr(ended, "exit_code", None)
        signal_name = getattr(ended, "signal_name", None)
        what = f"signal {signal_name}" if signal_name else f"exit code {code}"
        rank, local_rank = getattr(ended, "rank", "?"), getattr(ended, "local_rank", "?")
        self.announce(f"rank {rank} (local_rank {local_rank}) failed with {what}", dumps)

    def _notice_text(self, message: str) -> str:
        assert self.round is not None
        me = self.round.group_rank
        if message.startswith(f"node {me} "):
            return message
        return f"node {me} ({self.host}): {message}"

    def announce(self, message: str, dumps: list | None = None) -> threading.Event:
        """Post ``message`` (prefixed with this node) for the other numarun nodes of the round,
        with where ``dumps`` (this node's ranks) were when the whole-job view can say it, from a
        short-lived thread nobody waits for; once per round, best effort (a store that is gone
        loses nothing here). Returns an event set once it was posted (or failed)."""
        posted = threading.Event()
        if self._announced or self.round is None or self._store is None:
            posted.set()
            return posted
        self._announced = True
        self._announcing = posted
        text = self._notice_text(message)
        round_ = self.watched_round or self._last_round
        if round_ is None:  # not watched yet: the round's store all the same
            round_ = WatchedRound(self._store, self._handler, self.round.group_rank,
                                  self.round.group_world_size, lambda result: None,
                                  own_diag=self.own_diag)  # fmt: skip
            round_.diag_why = "this node's round is not watched yet"
        store, me, watch = self._store, self.round.group_rank, self.watch
        diagnostics = self.diagnostics

        def noted(line: str) -> None:
            watch.note(round_, "events", line)

        def send(conn: Conn) -> None:
            try:
                body = notice_body(text)
                if dumps and diagnostics is not None:
                    try:
                        body += diagnostics.notice_post(round_, dumps, conn)
                    except Exception as error:
                        noted(f"this node's notice goes without its ranks ({first_line(error)})")
                key = post_event(conn, f"stop {me}", body, after=round_.seen, note=noted)
                if key is not None and not round_.own_diag:  # its own store goes with the round
                    self._posted.append((store, key))
            finally:
                posted.set()

        round_.stopping = True  # this node's attempt is over: no other notice is read
        watch.post(round_, send, "this node's notice")
        if round_.own_diag and round_.poster is None and round_.diag_why != diagstore.PENDING:
            posted.set()  # the view is off this round (or not watched yet): nothing to wait for
        return posted

    def announce_and_linger(self, message: str) -> None:
        """:meth:`announce`, then wait at most :data:`ANNOUNCE_WAIT` seconds for it to leave
        (the launcher is about to exit or re-join; a frozen store costs no more)."""
        self.announce(message).wait(ANNOUNCE_WAIT)

    def _delete_posted(self) -> None:
        """Delete what this node posted for the others in rounds every node has left (store
        calls: not from the loop)."""
        for ended in self._ended:
            if not ended.own_diag:  # a store of its own goes with its round: nothing to delete
                self._posted += [(ended.store, key) for key in ended.shared]
            ended.shared = []
        self._ended.clear()
        while self._posted:
            store, key = self._posted.pop()
            with contextlib.suppress(Exception):
                store.delete_key(key)

    # --- the end -------------------------------------------------------------------------------

    def finish(self, *, succeeded: bool) -> str | None:
        """The end of this node's job, as torchrun ends it: after success, wait in torch's exit
        barrier for every node of the round (at most 300 s), then ``shutdown()`` (closes
        the rendezvous); after a final failure, ``shutdown()`` once the others could read this
        node's notice. Returns a warning line when the barrier or the shutdown failed (torchrun
        logs and goes on), else None. Not called after a signal: torchrun leaves the
        rendezvous open then, for the others.

        The wait in the barrier ends as soon as the job ended on another node (its failure
        notice, the rendezvous closed by another node, the next node silent; also when that
        came while this node's ranks were ending): :attr:`ended_elsewhere` says why, in one
        line, and the rendezvous is closed at once (a node re-joining after a failure cannot
        form a round without this one, whose ranks finished: torchrun's node closes it after
        its barrier's 300 s). With ``--hang-timeout`` and the whole-job view, this node counts
        as still while it waits in the barrier (its ranks all ended): a hang verdict of the
        other nodes ends the wait too; it is left in :attr:`verdict`."""
        warning = None
        # This node's failure notice leaves before the rendezvous closes: the others then
        # read why it ended, not a bare "closed by another node".
        self._announcing.wait(ANNOUNCE_WAIT)
        if self.round is not None and self._store is not None:
            barrier = ExitBarrier(self._store, self.round.group_world_size, self._handler,
                                  self.watch)  # fmt: skip
            if not succeeded and self._announced:
                barrier.await_readers(self.poll_interval)
            if succeeded and self.ended_elsewhere is None:
                warning = self._wait_in_barrier(barrier)
        self._end_watch()
        try:
            # Bounded: a store that stopped answering must not hold the summary for the
            # store's own timeout.
            run_blocking(self._handler.shutdown, limit=_SHUTDOWN_LIMIT)
        except Exception as error:
            # A store that is gone (its host ended after the job did) has nothing to close.
            if not store_gone(error) and self.ended_elsewhere is None:
                warning = warning or f"closing the {self.where} failed: {store_error(error)}"
        return warning

    def _wait_in_barrier(self, barrier: ExitBarrier) -> str | None:
        while_waiting = None
        if self.config.hang_timeout and self.watch.watching and self.diagnostics is not None:
            while_waiting = self.guarded("the hang watch in the exit barrier",
                                         self.diagnostics.while_waiting)  # fmt: skip
        self._barrier = barrier
        try:
            ended, warning, self.verdict = barrier.wait_for_all(
                self.where, while_waiting, _because(self.last_notice)
            )
        finally:
            self._barrier = None
        self.ended_elsewhere = ended
        return warning

    def close(self) -> None:
        """The job is over: the store thread ends (at most half a second). What this node
        posted in its last round stays in the round's store (it goes with it): a node that looks
        only every few seconds must still read why this one ended (deleted here, it read a bare
        "closed by another node"). What it posted in earlier rounds, which every node has left,
        is deleted, best effort, waited for at most half a second."""
        self.watch.close(self._last_round or self.watched_round)
        if self._posted or self._ended:
            with contextlib.suppress(Exception):
                run_blocking(self._delete_posted, limit=0.5)
        server, self._diag_server = self._diag_server, None
        if server is not None:  # the last: the others' watch of the round has ended too
            server.close()


def _failure_text(node: ElasticNode, error: BaseException) -> str:
    """Why the rendezvous could not form or went away, in one line."""
    name = type(error).__name__
    cause = root_cause(error)
    conf = dict(node.config.rdzv_conf)
    if name == "RendezvousTimeoutError":
        join = conf.get("join_timeout", "600")
        return (
            f"{node.where} did not complete within join_timeout={join} s: fewer than "
            f"{node.config.min_nodes} node(s) joined"
        )
    if name == "RendezvousClosedError":
        return f"{node.where} was closed by another node" + _because(node.last_notice)
    if name == "RendezvousConnectionError" or "Network" in type(cause).__name__:
        if node.last_notice:
            # The node that posted it ended, and its store with it (it hosted it).
            return (
                f"{node.where} went away after another node ended"
                f"{_because(node.last_notice)}: {first_line(cause)}"
            )
        return f"cannot reach the {node.where}: {first_line(cause)}"
    return f"{node.where}: {name}: {first_line(cause)}"


def _because(notice: str | None) -> str:
    return f" ({notice})" if notice else ""


def _watch_health(node: ElasticNode, round_: WatchedRound) -> None:
    """With the view's store apart (``own``): the neighbour's beat and the word that a node
    is gone (:data:`liveness.GONE_KEY`) read every beat interval (1 s: a node's death known
    everywhere within the silence plus two of them, where looks 2 s apart made it 3 to 4 s
    more), in a thread of its own, neither in the look's thread (torch's handler spaces its
    looks out: its lock, held for seconds by the keep-alive's retries on a saturated store)
    nor in the store thread (a read on the rendezvous store would hold up the view's events).
    The reads are due every beat interval from the first on (:func:`liveness.next_read`), not
    a beat interval after the last one ended: on a store that torch's traffic saturates, each
    read takes a good part of a second.

    Once a call on the view's store failed (the round's events: every node's at once when
    that store's host, group rank 0, is gone, the one death whose notice that store cannot
    carry), the word is waited for by ``numarun-word`` (:func:`_wait_word`) instead of read
    here."""
    period = min(node.poll_interval, node.heartbeats.beat_interval)
    due = time.monotonic()
    what, beats = NEXT_BEAT, node.heartbeats
    waiting = False  # numarun-word started (once per round)
    while True:
        view_failed = round_.diag_host_unreachable or round_.events_down
        if view_failed and not waiting and not _quiet(node, round_):
            waiting = True
            threading.Thread(target=_wait_word, args=(node, round_), name="numarun-word",
                             daemon=True).start()  # fmt: skip
        due = next_read(due, time.monotonic(), period)
        time.sleep(max(0.0, due - time.monotonic()))
        if not round_.active:
            return
        if _quiet(node, round_):
            continue
        # Not beats.look: its own "due" gate, for the store thread's looks, would skip a read
        # made a hair sooner than a period after the last one's start.
        silent = node.watch.tolerant(round_, what, beats.silent_neighbour, round_, node._handler)
        if silent is not None:
            # What raises here is one line (guarded), never a thread's traceback.
            node.watch.guarded(round_, what, _report_silent, node, round_, silent)
            return
        if beats.waits_for_word(round_):
            continue
        gone = node.watch.tolerant(round_, what, beats.gone_elsewhere, round_)
        if gone is not None:
            _report_word(node, round_, gone)
            return


WORD_WAIT = 2.0
"""Seconds one wait of ``numarun-word`` lasts (:func:`_wait_word`): how long after its round's
end the thread and its connection may stay; each wait that times out costs two requests
(torch's client cancels it)."""


def _wait_word(node: ElasticNode, round_: WatchedRound) -> None:
    """``numarun-word``: the word that another node saw one gone (:data:`liveness.GONE_KEY`),
    waited for on a connection of its own to the rendezvous store (``round_.word``, made here)
    and taken the moment it is set. Started by ``numarun-health`` once a call on the view's
    store failed: its host, group rank 0, may be gone, and then the word is the only news of
    it (its notice went to the dead node's store). Read once a second on a store that
    torch's traffic saturates, the word reached the last of 1,024 nodes about 3 s after the
    first had it: past the asking node's death's 19 s bound. Made only then, the connection
    costs nothing in a healthy round (at a round's start it would double the connect storm on
    the rendezvous store). Where it cannot be made, or once the word's wait returned (a word
    not taken stays there: waiting again would return at once), ``numarun-health`` reads it
    every beat interval."""
    what, beats = GONE_WORD, node.heartbeats
    conn = node.watch.tolerant(round_, what, Conn, round_.store)
    if conn is None or not conn.own or not round_.active:
        return
    round_.word = conn
    try:
        while round_.active:
            if _quiet(node, round_) or not beats.waits_for_word(round_):
                return  # the round is over for this node, or numarun-health reads the word
            try:
                heard = beats.wait_word(round_, time.monotonic() + WORD_WAIT)
            except Exception as error:
                # Over meanwhile, the round's store may have gone with the node that hosts it
                # (the job's end): a line then would be a false warning.
                if round_.active and not _quiet(node, round_):
                    node.watch.unavailable(round_, what, error)
                return
            if heard is not None and round_.active and not _quiet(node, round_):
                _report_word(node, round_, heard)
                return
    finally:
        # The thread's connection, closed with it (a round kept after its end keeps none);
        # numarun-health reads the word from now on, where it still matters.
        round_.word = None


def _report_word(node: ElasticNode, round_: WatchedRound, word: tuple[int, int]) -> None:
    """Re-form on another node's word ``(silent, by)`` (:data:`liveness.GONE_KEY`)."""
    line = f"{_silent_line(node, word[0])}, as node {word[1]} saw"
    node.watch.report(round_, Change(REJOIN, line))


def _quiet(node: ElasticNode, round_: WatchedRound) -> bool:
    """Whether ``numarun-health`` and ``numarun-word`` read nothing now: the exit barrier's
    look reads the neighbour's beat; a change ends the round; a stopping round is over for
    this node (its notice posted, or another's read), and the store may go with the node that
    hosts it: a read then would only say so in a false warning."""
    return node._barrier is not None or node.change is not None or round_.stopping


def _silent_line(node: ElasticNode, silent: int) -> str:
    return (
        f"node {silent} stopped answering (no heartbeat for "
        f"{node.heartbeats.silence_limit:g} s: its launcher is gone)"
    )


def _report_silent(node: ElasticNode, round_: WatchedRound, silent: int) -> None:
    """The change first, then the word on the rendezvous store (:data:`liveness.GONE_KEY`,
    which every node's ``numarun-health`` reads), then the notice: the rendezvous's own health
    never waits for the view's store, whose host may be the silent node (posting there then
    fails, after a probe: seconds when its machine is gone). torch's wait list tells the
    others too, once this node re-joins, later on a saturated store."""
    node.watch.report(round_, Change(REJOIN, _silent_line(node, silent)))
    node.watch.tolerant(round_, NEXT_BEAT, node.heartbeats.say_gone, round_, silent)
    node._announce_silent(round_, silent)

"""Workers started ahead of their run: a supervisor whose workers wait to be handed their run.

A *standby* is a worker started before what it will run is known: the launcher's ``--preload``
starts one per local rank while the previous attempt runs, or while the rendezvous forms, and
hands each its attempt later (:mod:`numarun.launch.warm`). It is an ordinary worker of a
:class:`StandbySupervisor`: started by the same code path as every worker (the watchdog forks
and binds it at birth, closes every fd it is not given, makes it the watchdog's descendant), so
every guarantee of :mod:`numarun.process.supervisor` holds for it from birth: if the launcher
dies the watchdog kills it, a teardown finds it, and it is never anyone else's.

What a standby does not know at birth is filled in later, without touching the process:

* :class:`LateSink` stands for an output sink that is made later (an attempt's log files do
  not exist yet): what the standby writes before the sink is attached is held, up to a bound,
  and given to the sink, in order, once attached; what the console of the sink-to-be is must
  be known at birth (the loop learns the consoles when the workers start).
* :meth:`StandbySupervisor.hand_over` sets each worker's global rank (``WorkerExit.rank``) and
  the ``on_failure`` / ``on_exit`` callbacks, all known only once the attempt is.
* :meth:`StandbySupervisor.run` on a supervisor started earlier runs ``on_started`` (the
  launcher writes each standby its attempt there) and waits, under one signal scope, as
  :meth:`Supervisor.run` does for a supervisor it starts itself.

Signals: :meth:`Supervisor.start` and :meth:`Supervisor.stop` enter the supervisor's signal scope,
which would take a teardown signal meant for the launcher (or for another supervisor that runs
meanwhile) as its own. The launcher therefore starts and discards standbys with its teardown
signals blocked (:func:`signals_blocked`): one that comes meanwhile is delivered once the call
returned, to whoever handles it then.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager

from numarun.process.supervisor import _RUNNING, Supervisor, serve_started

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence

    from numarun.process.spec import OutputSink, RunResult, WorkerExit

LATE_HELD = 1024 * 1024  # bytes a LateSink holds before its sink is attached


class LateSink:
    """An output sink attached after the worker started (module docstring).

    Before :meth:`attach`, :meth:`feed` holds up to ``max_held`` bytes (what comes after is
    dropped and counted in :attr:`dropped`, and a line saying so is fed to the sink first
    thing); :meth:`close` is remembered. :meth:`attach` gives the held bytes to the sink, in
    order, then the line about what was dropped, then closes it if the stream already ended;
    afterwards every call goes straight to the sink. ``console``: the
    :class:`numarun.process.console.Console` the attached sink will show on (None: none), for
    the supervisor's loop, which learns consoles when the workers start."""

    def __init__(self, console: object = None, max_held: int = LATE_HELD) -> None:
        self.console = console
        self.sink: OutputSink | None = None
        self.dropped = 0
        self._held: list[bytes] = []
        self._room = max_held
        self._closed = False

    def feed(self, data: bytes) -> None:
        if self.sink is not None:
            self.sink.feed(data)
            return
        kept = data[: self._room]
        if kept:
            self._held.append(bytes(kept))
            self._room -= len(kept)
        self.dropped += len(data) - len(kept)

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()
        self._closed = True

    def attach(self, sink: OutputSink) -> None:
        """From now on the stream goes to ``sink`` (once; a second call raises
        RuntimeError)."""
        if self.sink is not None:
            raise RuntimeError("LateSink.attach() may be called once")
        held, self._held = self._held, []
        for data in held:
            sink.feed(data)
        if self.dropped:
            sink.feed(
                b"\n[numarun: %d bytes the process wrote before its attempt began were "
                b"dropped]\n" % self.dropped
            )
        self.sink = sink
        if self._closed:
            sink.close()


class StandbySupervisor(Supervisor):
    """A :class:`Supervisor` whose workers are started ahead of their run (module docstring).

    Made and started like any supervisor (:meth:`Supervisor.start`, with the launcher's
    teardown signals blocked); its workers' ranks (``WorkerSpec.rank``) and callbacks are
    placeholders until :meth:`hand_over`. Discarded with :meth:`stop`, like any run."""

    def hand_over(
        self,
        ranks: Mapping[int, int],
        *,
        on_failure: Callable[[WorkerExit], None] | None = None,
        on_exit: Callable[[WorkerExit], None] | None = None,
    ) -> None:
        """Before :meth:`run`: ``ranks`` maps each local rank to its global rank (what
        ``WorkerExit.rank`` says from now on); ``on_failure`` and ``on_exit`` as in
        :class:`Supervisor`, replacing those given to the constructor."""
        for worker in self._workers:
            rank = ranks.get(worker.spec.local_rank, worker.spec.rank)
            if rank != worker.spec.rank:
                worker.spec = worker.spec.replace(rank=rank)
        self._on_failure = on_failure
        self._on_exit = on_exit

    def run(self, on_started: Callable[[], None] | None = None) -> RunResult:
        """As :meth:`Supervisor.run`; on a supervisor whose :meth:`start` returned earlier
        (and that was not waited for since), ``on_started`` and then :meth:`wait` run under
        one signal scope: a teardown signal that comes while ``on_started`` runs is acted on
        by the wait. Raises RuntimeError for a supervisor that ran already."""
        if not self._started_ahead():
            return super().run(on_started)
        with self._signal_scope():
            return serve_started(self, on_started)

    def _started_ahead(self) -> bool:
        return self._phase == _RUNNING and self._result is None

    def pending_exits(self) -> bool:
        """Whether a worker ended since the start: its end was seen, or the watchdog's report
        of it waits unread (kept by the start, or on the status pipe, whose only lines after
        the start are ends: the loop has not run); never blocks, reads nothing."""
        from numarun.process.proctable import readable

        status = self._link.status_fd
        return (
            any(w.exited for w in self._workers)
            or b"X " in self._link._pending
            or (status is not None and readable(status, 0))
        )


@contextmanager
def signals_blocked(signals: Sequence[int]) -> Iterator[None]:
    """Block ``signals`` in the calling thread meanwhile; one that came is delivered when the
    block ends (module docstring). Only in the main thread; elsewhere it does nothing."""
    import threading

    if threading.current_thread() is not threading.main_thread() or not signals:
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)

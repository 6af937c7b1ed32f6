"""``ProcessContext`` (alias ``SpawnContext``): running workers, as torch's, and how a run's end
becomes return values or the exception torch would raise."""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING, Any

from numarun.errors import InvalidArgument
from numarun.spawning.exceptions import (
    ProcessException,
    ProcessExitedException,
    ProcessRaisedException,
    raised_as,
    warn,
)

if TYPE_CHECKING:
    from numarun.process.spec import RunResult, WorkerExit
    from numarun.spawning.childmain import WorkerProcess
    from numarun.spawning.workerrun import WorkerRun


class ProcessContext:
    """Running workers, returned by ``start_processes(..., join=False)``, as torch's.

    ``processes``: one :class:`multiprocessing.process.BaseProcess` per local rank (``pid``,
    ``name``, ``sentinel``, ``exitcode``, ``is_alive()``, ``join(timeout)``, ``terminate()``,
    ``kill()``, ``daemon``); ``sentinels``: ``{sentinel: local rank}`` of the workers
    :meth:`join` has not seen end; ``error_files``: ``None`` per rank (tracebacks come through
    a pipe, not files). Call :meth:`join` until it returns True, or use the context as a
    context manager: leaving the ``with`` block tears down workers still running (SIGTERM to
    each worker's tree, SIGKILL after the grace period) without raising for them.

    A context that is never joined: at interpreter exit multiprocessing's exit handler waits
    for non-daemon workers and terminates daemon ones; if this process dies, its workers die
    with it (parent-death signal). The thread that called ``start_processes`` must outlive the
    workers: the kernel's parent-death signal (SIGKILL) fires when the thread that created a
    worker exits.
    """

    def __init__(
        self, run: WorkerRun, processes: list[WorkerProcess], grace_period: float
    ) -> None:
        self.processes = processes
        self.error_files: list[str | None] = [None] * len(processes)
        self.sentinels = {process.sentinel: rank for rank, process in enumerate(processes)}
        self._run = run
        self._grace_period = grace_period
        self._values: list[Any] | None = None
        self._error: BaseException | None = None
        self._later: list[ProcessException] = []  # what later join() calls raise, in order
        self._finished = False

    def pids(self) -> list[int]:
        """The workers' pids, by local rank."""
        return [int(process.pid) for process in self.processes]

    @property
    def return_values(self) -> list[Any] | None:
        """``fn``'s return values by local rank once :meth:`join` returned True, else None."""
        return self._values

    def join(self, timeout: float | None = None, grace_period: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (None: until the end) for the workers.

        Returns True when every worker finished successfully (then :attr:`return_values` is
        set; later calls return True at once), False when the timeout passed first (workers keep
        running). On the first failure, as torch: with ``grace_period`` the other workers get
        that long to end on their own, then SIGTERM (with a ``Terminating process N via signal
        SIGTERM`` warning logged for each, as torch logs), then ``grace_period`` (default: the
        one given to ``spawn``) before SIGKILL; numarun sends these to each worker's whole
        process tree. Then :class:`ProcessRaisedException` or
        :class:`ProcessExitedException` is raised; as in torch, each later call raises the
        next worker that did not end with 0 (the ones torn down included: ``process 0
        terminated with signal SIGTERM``), in rank order, one per call, and then returns True.
        The teardown warning is logged on the ``torch.multiprocessing.spawn`` logger, as torch's.

        Signals while waiting (here and in ``spawn(join=True)``): a SIGINT is relayed to every
        process of the job (each worker's ``except KeyboardInterrupt`` and ``finally`` blocks
        run, as when a terminal's Ctrl-C reaches torch's workers), SIGKILL follows after the
        grace period for what is left (a second SIGINT skips the rest of it), then
        :class:`KeyboardInterrupt` is raised; SIGTERM or SIGHUP are relayed the same way, then
        re-delivered to this process with its previous disposition (the default one ends the
        process), and if that returns, :class:`SystemExit` with ``128 + signal`` is raised. Of
        these three, a signal this process ignored when ``spawn`` was called (SIGHUP under
        ``nohup``) stays ignored and tears nothing down. Signals are handled only when joining
        in the main thread; elsewhere they keep their usual effect on this process (the
        workers, in their own sessions, do not receive the terminal's Ctrl-C).
        """
        if self._error is not None:
            if self._later:
                raise self._later.pop(0)
            return True
        if self._finished:
            return True
        if grace_period is not None:
            check_grace_period(grace_period)
        self._run.failure_grace = grace_period
        supervisor = self._run.supervisor
        assert supervisor is not None
        supervisor.grace_period = float(
            self._grace_period if grace_period is None else grace_period
        )
        self._run.joining = True
        try:
            result = self._run.join(timeout)
        except BaseException:
            self._finish_after_error()
            raise
        finally:
            self._run.joining = False
        for rank in range(len(self.processes)):
            if self._run.has_ended(rank):
                self.sentinels.pop(self.processes[rank].sentinel, None)
        if result is None:
            return False
        self._finished = True
        try:
            self._values = _outcome(result, self._run)
        except ProcessException as exc:
            self._error = exc
            self._later = _later_failures(result, self._run, exc)
            raise
        finally:
            self._finish()
        return True

    def stop(self, grace_period: float | None = None) -> None:
        """Tear down workers still running now (SIGTERM, SIGKILL after ``grace_period``).

        Nothing is raised for the workers; afterwards :meth:`join` returns True and
        :attr:`return_values` stays None. Does nothing once :meth:`join` has finished.
        """
        if not self._finished:
            self._finished = True
            supervisor = self._run.supervisor
            assert supervisor is not None
            self._run.result = supervisor.stop(grace_period)
            self._finish()

    def _finish_after_error(self) -> None:
        self._finished = True
        supervisor = self._run.supervisor
        assert supervisor is not None
        self._run.result = supervisor.stop()
        self._finish()

    def _finish(self) -> None:
        """The run is over: results are decoded or dropped; multiprocessing forgets the
        workers (each ``sentinel`` stays valid until its process is closed or collected)."""
        from multiprocessing import process

        for worker in self.processes:
            process._children.discard(worker)  # type: ignore[attr-defined]
        for reader in self._run.readers:
            reader.close()
        self.sentinels.clear()

    def _release(self) -> None:
        """Close everything, sentinels too (the context was never handed out)."""
        self._finish()
        for worker in self.processes:
            if worker._popen is not None:  # type: ignore[attr-defined]
                worker._popen.close()  # type: ignore[attr-defined]
        self._run.close()

    def __enter__(self) -> ProcessContext:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


SpawnContext = ProcessContext  # torch's old name; numarun's name before ProcessContext


def check_grace_period(grace_period: object) -> None:
    if (
        isinstance(grace_period, bool)
        or not isinstance(grace_period, (int, float))
        or not grace_period >= 0
    ):
        raise InvalidArgument(
            f"grace_period must be a number of seconds >= 0, got {grace_period!r}"
        )


def _outcome(result: RunResult, run: WorkerRun) -> list[Any]:
    """The workers' return values, or raise what the run's outcome calls for.

    Workers that survived SIGKILL (uninterruptible sleep) cannot be waited for; each gets a
    RuntimeWarning naming its pid and state before anything is returned or raised.
    """
    for worker in result.unkillable:
        warn(
            f"local rank {worker.local_rank} (pid {worker.pid}) survived SIGKILL in state "
            f"{worker.proc_state or '?'}; it is still running and numarun stopped waiting for it"
        )
    if result.received_signal is not None:
        _raise_for_signal(result.received_signal)
    failed = [w for w in result.workers if w.state == "failed"]
    if result.first_failure is not None or failed:
        first = result.first_failure or min(failed, key=_death_time)
        others = sorted((w for w in failed if w.local_rank != first.local_rank), key=_death_time)
        error = _failure(first, run)
        error.failures = [_failure(w, run) for w in others]
        raise error
    by_rank = sorted(result.workers, key=lambda w: w.local_rank)
    if len(by_rank) != run.nprocs:
        raise RuntimeError(f"numarun: expected {run.nprocs} worker results, got {len(by_rank)}")
    return [_value_of(worker, run) for worker in by_rank]


def _later_failures(
    result: RunResult, run: WorkerRun, first: ProcessException
) -> list[ProcessException]:
    """What torch's later ``join()`` calls raise after the first failure: every other worker
    that did not end with 0, in rank order (torch pops the remaining sentinels in order)."""
    rest = [
        worker
        for worker in sorted(result.workers, key=lambda w: w.local_rank)
        if worker.local_rank != first.error_index and worker.exit_code != 0
    ]
    return [_failure(worker, run) for worker in rest]


def _death_time(worker: WorkerExit) -> float:
    return worker.ended_at if worker.ended_at is not None else float("inf")


def _value_of(worker: WorkerExit, run: WorkerRun) -> Any:
    """``fn``'s return value; None when the worker sent none (it left by ``SystemExit(0)``).
    Each result is unpickled from the one buffer it was read into, then dropped."""
    try:
        outcome = run.readers[worker.local_rank].outcome()
    except Exception as exc:
        raise raised_as(ProcessRaisedException)(
            f"\n\n-- Process {worker.local_rank} returned a value that cannot be unpickled "
            f"here: {exc!r}\n",
            worker.local_rank,
            worker.pid,
        ) from exc
    if outcome is None or outcome[0] != "ok":
        return None
    return outcome[1]


def _failure(worker: WorkerExit, run: WorkerRun) -> ProcessException:
    """The exception describing one failed worker, in torch.multiprocessing's words."""
    from numarun.process.spec import signal_name

    index = worker.local_rank
    try:
        outcome = run.readers[index].outcome()
    except Exception:
        outcome = None
    if outcome is not None and outcome[0] == "raised":
        message = f"\n\n-- Process {index} terminated with the following error:\n{outcome[1]}"
        return raised_as(ProcessRaisedException)(message, index, worker.pid)
    code = worker.exit_code if worker.exit_code is not None else -signal.SIGKILL
    exited = raised_as(ProcessExitedException)
    if code < 0:
        name = worker.signal_name or signal_name(code)
        return exited(
            f"process {index} terminated with signal {name}", index, worker.pid, code, name
        )
    return exited(f"process {index} terminated with exit code {code}", index, worker.pid, code)


def _raise_for_signal(signum: int) -> None:
    """Act on the signal that made the supervisor tear down, after the teardown."""
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    # The supervisor has restored our previous disposition: the default one ends us the way
    # the signal meant to; a Python handler runs (and may raise) inside os.kill.
    os.kill(os.getpid(), signum)
    raise SystemExit(128 + signum)

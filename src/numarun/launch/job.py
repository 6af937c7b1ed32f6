"""One launch's job: its attempts, one after another, each started and watched by a supervisor.

:class:`Job` runs torchrun's semantics (its docstring states them): a failed attempt is followed
by another while ``--max-restarts`` allows; a node joining or leaving a torch rendezvous re-forms
the group without using a restart; a teardown signal ends the job, also between attempts, where
no supervisor runs (:class:`_SignalGuard`); every attempt keeps its own directory
(``attempt_<restart count>``, ``.N`` after the N-th re-forming); the end report names each
attempt's root cause. Each attempt's stack dumps (:mod:`numarun.stacks.dumps`) are set up here,
and once its workers are under way the failure report's modules are imported in the background
(:func:`_prefetch_failure_report`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence

from numarun.errors import NumarunError, UsageError
from numarun.launch.logdir import error_file, next_attempt_dir
from numarun.launch.report import (
    exit_code_for,
    failure_summary,
    lost_logs,
    rank_reports,
    signal_text,
)
from numarun.launch.workers import (
    close_sinks,
    line_filters,
    rank_binding,
    rank_env,
    setup_error,
    unbound_omp_threads,
    worker_argv,
    worker_sinks,
)
from numarun.placement import workerenv

TYPE_CHECKING = False
if TYPE_CHECKING:
    from numarun.launch.config import LaunchConfig
    from numarun.launch.elastic import ElasticNode
    from numarun.launch.rendezvous import Round
    from numarun.placement.plan import Plan
    from numarun.process.spec import RunResult, WorkerExit, WorkerSpec
    from numarun.stacks.dumps import JobStacks


class _Interrupted(BaseException):
    """A teardown signal arrived between attempts (see :class:`_SignalGuard`)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_interrupted(signum: int, frame: object) -> None:
    raise _Interrupted(signum)


class _SignalGuard:
    """While no supervisor runs (a rendezvous, the exit barrier, the gap between attempts),
    a teardown signal ends the launch at once: its handler raises :class:`_Interrupted` in
    the main thread, wherever it waits (:func:`numarun.launch.elastic.run_blocking` keeps torch's
    blocking calls off that thread). The supervisor's own handling replaces this while workers
    run. A signal the caller ignores stays ignored when it is in ``keep_ignored`` (SIGHUP under
    ``nohup``). Main thread only; elsewhere it does nothing. Restores the previous handlers."""

    def __init__(
        self, signals: Sequence[int], keep_ignored: Sequence[int] = (signal.SIGHUP,)
    ) -> None:
        self._signals = tuple(signals)
        self._keep_ignored = tuple(keep_ignored)
        self._previous: dict[int, object] = {}

    def __enter__(self) -> _SignalGuard:
        import threading

        if threading.current_thread() is not threading.main_thread():
            return self
        for signum in self._signals:
            previous = signal.getsignal(signum)
            if previous is None or (previous == signal.SIG_IGN and signum in self._keep_ignored):
                continue
            self._previous[signum] = previous
            signal.signal(signum, _raise_interrupted)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)  # type: ignore[arg-type]
        self._previous.clear()


class _Attempt:
    """One attempt's end: its directory name (``attempt_<restart count>``, ``.N`` after the
    N-th re-forming of the group at the same count), result, and its line in the report."""

    def __init__(
        self, name: str, directory: str, result: RunResult, lost: list[str], stacks: object
    ) -> None:
        self.name = name
        self.directory = directory
        self.result = result
        self.lost = lost
        self.stacks = stacks  # numarun.stacks.dumps.JobStacks (closed) or None
        self.line = ""


class Job:
    """The attempts of one launch: one loop (:meth:`run`) over :meth:`run_attempt`.

    torchrun's semantics: a failed attempt (a worker failed, or the supervisor was stopped
    for any reason but this node's rendezvous) is followed by another, with
    TORCHELASTIC_RESTART_COUNT one higher, while ``--max-restarts`` allows; a node joining
    (or leaving) the rendezvous re-forms the group without using a restart; a teardown signal
    ends the job. Every attempt keeps its own directory; the end report lists each attempt's
    root cause.
    """

    def __init__(
        self,
        config: LaunchConfig,
        plan: Plan | None,
        base: Mapping[str, str],
        binary_path: str | None,
        mem_policies: list,
        outputs: tuple[dict[int, int], dict[int, int], set[int]],
        shown_log_dir: str | None,
        *,
        announce: Callable[[Round | None], None] | None = None,
        remove_if_killed: str | None = None,
    ) -> None:
        self.config = config
        self.plan = plan
        self.base = base
        self.binary_path = binary_path
        self.mem_policies = mem_policies
        self.outputs = outputs
        self.shown_log_dir = shown_log_dir
        # The start line: once the first attempt's files are set up, with its round (a torch
        # rendezvous) or None (static).
        self.announce = announce
        self.remove_if_killed = remove_if_killed
        self.started = False  # once workers ran: the log directory may hold their output
        self.attempts: list[_Attempt] = []
        self.node: ElasticNode | None = None
        self.waiting_for = "between attempts"  # what a signal interrupts, for its line

    def run(self, first_dir: str, port: int) -> int:
        """Run attempts until one succeeds, fails with no restart left, or a signal or the
        rendezvous ends the job; print the report; return the exit status."""
        config = self.config
        if not config.elastic and not config.max_restarts:
            # One attempt, as numarun has always run it: no guard, nothing imported.
            return self.report(self.run_attempt(None, port, "attempt_0", first_dir, 0))
        try:
            with _SignalGuard(config.teardown_signals):
                return self._loop(first_dir, port)
        except _Interrupted as stop:
            sys.stderr.write(
                f"numarun: stopped on {signal_text(stop.signum)} while {self.waiting_for}; "
                "no worker was running\n"
            )
            return 128 + stop.signum

    def _loop(self, first_dir: str, port: int) -> int:
        config = self.config
        if config.elastic:
            from numarun.launch.elastic import ElasticNode, NotAdmitted

            self.node = ElasticNode(config)
            self.waiting_for = f"waiting for the {self.node.where}"
            self.node.connect()
        restart_count = 0
        reforms = 0
        directory = first_dir
        group: Round | None = None  # the static rendezvous: config and port
        while True:
            name = f"attempt_{restart_count}" + (f".{reforms}" if reforms else "")
            if self.attempts:
                directory = next_attempt_dir(first_dir, name, config.nproc_per_node)
            if self.node is not None:
                try:
                    group = self.node.next_round()
                except NotAdmitted as done:
                    sys.stderr.write(str(done) + "\n")
                    return 0
            attempt = self.run_attempt(group, port, name, directory, restart_count)
            result = attempt.result
            change = self.node.change if self.node is not None else None
            ours = change is not None and result.stop_reason == change.reason
            if result.received_signal:
                if self.node is not None:
                    self._announce(f"stopped on {signal_text(result.received_signal)}")
                return self.report(attempt)
            if ours and change is not None and change.kind == "rejoin":
                attempt.line = f"{name}: stopped: {change.message} (no restart used)"
                if not config.quiet:
                    sys.stderr.write(f"numarun: {attempt.line}\n")
                reforms += 1
                continue
            if ours and change is not None:
                attempt.line = f"{name}: stopped: {change.message}"
                sys.stderr.write(f"numarun: {change.message}; this node stops\n")
                return 1
            if exit_code_for(result) == 0:
                if self.node is not None:
                    self.waiting_for = f"waiting for the other nodes to finish ({self.node.where})"
                    warning = self.node.finish(succeeded=True)
                    if warning and not config.quiet:
                        sys.stderr.write(f"numarun: warning: {warning}\n")
                return self.report(attempt)
            self._describe_failure(attempt)
            if self.node is not None and result.first_failure is None:
                self._announce(f"stopped: {result.stop_reason}")
            if restart_count >= config.max_restarts:
                if self.node is not None:
                    self.node.finish(succeeded=False)
                return self.report(attempt)
            restart_count += 1
            reforms = 0
            if not config.quiet:
                sys.stderr.write(
                    f"numarun: {attempt.line}; restarting (restart {restart_count} of "
                    f"{config.max_restarts})\n"
                )
            if self.node is None and config.master_port is None:
                port = workerenv.free_port()  # the old store's port may still be held

    def _announce(self, message: str) -> None:
        assert self.node is not None
        from numarun.launch.elastic import run_blocking

        node = self.node
        # Best effort, bounded: a store that stopped answering must not hold the exit.
        with contextlib.suppress(TimeoutError):
            run_blocking(lambda: node.announce(message), limit=5.0)

    def run_attempt(
        self, group: Round | None, port: int, name: str, directory: str, restart_count: int
    ) -> _Attempt:
        """Start this node's workers for ``group`` (a round of a torch rendezvous; None: the
        static rendezvous with the store on ``port``) with their files under ``directory``,
        wait for the supervisor's end, return the attempt. Raises :class:`UsageError` (one
        line, nothing started) when the workers' files cannot be set up (out of fds, say)."""
        import gc

        from numarun.process.spec import WorkerSpec
        from numarun.process.supervisor import Supervisor

        config, plan, base = self.config, self.plan, self.base
        duplicates: tuple = (None, None)
        stacks = None
        specs: list[WorkerSpec] = []
        try:
            try:
                duplicates = line_filters(config, directory)
                threads = unbound_omp_threads(config, base)
                envs = [
                    {
                        **base,
                        **rank_env(
                            config,
                            local_rank,
                            base=base,
                            error_file=error_file(directory, local_rank),
                            binding=rank_binding(plan, local_rank),
                            plan_env=plan.env if plan is not None else (),
                            unbound_threads=threads,
                            master_port=port,
                            group=group,
                            restart_count=restart_count,
                        ),
                    }
                    for local_rank in range(config.nproc_per_node)
                ]
                # This attempt's ranks (under a torch rendezvous they come from the round).
                ranks = [(local_rank, int(env["RANK"])) for local_rank, env in enumerate(envs)]
                stacks = _job_stacks(config, ranks)
                for local_rank, env in enumerate(envs):
                    binding = rank_binding(plan, local_rank)
                    if stacks is not None:
                        env.update(stacks.worker_env(local_rank))
                    rank = int(env["RANK"])
                    stdout, stderr = worker_sinks(
                        config, self.outputs, local_rank, directory, base, duplicates, rank=rank
                    )
                    if stacks is not None:
                        stacks.count_output((stdout, stderr))
                    specs.append(
                        WorkerSpec(
                            local_rank=local_rank,
                            rank=rank,
                            env=env,
                            argv=worker_argv(config, self.binary_path, local_rank),
                            cpus=binding.cpus if binding is not None else None,
                            mem=self.mem_policies[local_rank],
                            stdout=stdout,
                            stderr=stderr,
                        )
                    )
            except OSError as error:  # out of fds, an unwritable log file: nothing started
                close_sinks(specs)
                raise setup_error(error, config) from None
            if self.announce is not None:
                self.announce(group)
                self.announce = None
            supervisor = Supervisor(
                specs,
                grace_period=config.grace_period,
                teardown_signals=config.teardown_signals,
                forward_signals=config.forward_signals,
                # torchrun's semantics: the workers get the signal numarun got (Ctrl-C:
                # SIGINT, so `except KeyboardInterrupt` runs); only a nohup'd SIGHUP stays
                # ignored, so a background job (started with SIGINT and SIGQUIT ignored)
                # still stops on kill -INT.
                relay_signal=True,
                keep_ignored=(signal.SIGHUP,),
                on_failure=self._on_failure_callbacks(stacks),
                on_exit=stacks.on_exit if stacks is not None else None,
                remove_if_killed=self.remove_if_killed,
            )
            if self.node is not None:
                self.node.watch(supervisor)
            if stacks is not None:
                stacks.attach(supervisor)  # stacks on demand, at a failure, and --hang-timeout
            # Everything allocated so far lives until exit; freezing it keeps the collector
            # from walking it again, which on a slow machine costs 10+ ms at interpreter exit.
            gc.freeze()
            try:
                result = supervisor.run(on_started=lambda: _on_started(stacks))
            except NumarunError:
                raise  # a worker could not start: one line
            except BaseException:
                self.started = True
                raise
            finally:
                close_sinks(specs)  # closed already when the run ended; not when start failed
            self.started = True
        finally:
            if stacks is not None:
                stacks.close()  # what the summary needs stays in memory
            for line_filter in duplicates:
                if line_filter is not None:
                    line_filter.close()
        attempt = _Attempt(name, directory, result, lost_logs(specs), stacks)
        self.attempts.append(attempt)
        return attempt

    def _on_failure_callbacks(self, stacks: object) -> Callable[[WorkerExit], None] | None:
        """What runs at a local worker's failure, before the others are stopped: the notice
        to the other nodes first (it is quick), then the other ranks' stacks (at most ~1 s)."""
        calls = []
        if self.node is not None:
            calls.append(self.node.on_worker_failure)
        if stacks is not None:
            calls.append(stacks.on_failure)  # type: ignore[attr-defined]
        if not calls:
            return None

        def on_failure(ended: WorkerExit) -> None:
            for call in calls:
                call(ended)

        return on_failure

    def _describe_failure(self, attempt: _Attempt) -> None:
        """Set ``attempt.line``: its root cause in one line (rank, exit or signal, error)."""
        from numarun.launch import failures

        reports = rank_reports(self.config, attempt.result, attempt.directory, self.outputs)
        stopped = attempt.result.stop_reason
        attempt.line = failures.attempt_line(attempt.name, reports, stopped_by=stopped)

    def report(self, last: _Attempt) -> int:
        """The end of the job: the failure summary of the last attempt (naming every earlier
        attempt's root cause) when it failed, else a short note of the earlier attempts' root
        causes, if any; returns the exit status."""
        code = exit_code_for(last.result)
        lost = [line for attempt in self.attempts for line in attempt.lost]
        earlier = [attempt.line for attempt in self.attempts[:-1] if attempt.line]
        if code != 0:
            sys.stdout.flush()
            summary = failure_summary(
                self.config,
                last.result,
                last.directory,
                self.outputs,
                self.shown_log_dir,
                lost,
                earlier=earlier,
                stacks=last.stacks,
            )
            sys.stderr.write(summary + "\n")
            sys.stderr.flush()
            return code
        if earlier or lost:
            from numarun.launch import failures

            if earlier and not self.config.quiet:
                sys.stderr.write(failures.format_attempts(earlier) + "\n")
            if lost:
                sys.stderr.write(failures.format_lost_logs(lost) + "\n")
        return code


def _job_stacks(config: LaunchConfig, ranks: Sequence[tuple[int, int]]) -> JobStacks | None:
    """One attempt's stack dumps and ``numarun stacks`` socket (:mod:`numarun.stacks.dumps`)
    for its ``(local rank, global rank)`` pairs.

    Where they cannot be set up (the per-user runtime directory is refused), the job runs
    without them after one warning line; with ``--hang-timeout`` that is an error instead."""
    from numarun.stacks.dumps import JobStacks

    entrypoint = " ".join([config.entrypoint, *config.args])
    try:
        return JobStacks(
            ranks,
            python=config.entrypoint_kind != "binary",
            describe={"run_id": config.run_id, "host": os.uname().nodename,
                      "entrypoint": entrypoint[:200]},
            hang_timeout=config.hang_timeout,
        )  # fmt: skip
    except (NumarunError, OSError) as error:
        if config.hang_timeout is not None:
            raise UsageError(f"--hang-timeout needs numarun's stack dumps: {error}") from None
        if not config.quiet:
            print(f"numarun: warning: `numarun stacks` will not reach this job: {error}",
                  file=sys.stderr)  # fmt: skip
        return None


def _on_started(stacks: JobStacks | None) -> None:
    if stacks is not None:
        stacks.listen()
    _prefetch_failure_report()


def _prefetch_failure_report(delay: float = 0.25) -> None:
    """Import the failure summary's modules in the background once the workers are under way.

    Importing :mod:`numarun.launch.failures` (json, traceback, ...) costs 10-20 ms, which would
    otherwise sit between a worker's failure and the launcher's exit. The delay keeps the
    import off the CPUs while the workers start; a failure before it just imports in line.
    """
    import threading

    timer = threading.Timer(delay, _import_failures)
    timer.daemon = True
    timer.start()


def _import_failures() -> None:
    # The stacks taken at a failure are parsed with numarun.stacks.parse.
    import numarun.launch.failures
    import numarun.stacks.parse  # noqa: F401

"""One launch's job: its attempts, one after another, each started and watched by a supervisor.

:class:`Job` runs torchrun's semantics (its docstring states them): a failed attempt is followed
by another while ``--max-restarts`` allows; a node joining or leaving a torch rendezvous re-forms
the group without using a restart; a teardown signal ends the job, also between attempts, where
no supervisor runs (:class:`SignalGuard`); every attempt keeps its own directory
(``attempt_<restart count>``, ``.N`` after the N-th re-forming); the end report names each
attempt's root cause. Each attempt's stack dumps (:mod:`numarun.stacks.dumps`) are set up here.

What a failure needs is imported before any failure is acted on, in the main thread
(:mod:`numarun.launch.failurepath` says when and why).
"""

from __future__ import annotations

import _signal as signal  # not signal.py, whose enums cost a launch ~2 ms (DESIGN.md)
import errno
import os
import sys

from numarun.errors import NumarunError, UsageError
from numarun.launch.failurepath import FAILURE_PATH_DELAY, after_import, import_failure_path
from numarun.launch.outcome import (
    exit_code_for,
    failure_summary,
    lost_logs,
    rank_reports,
    signal_text,
)
from numarun.launch.workersetup import (
    MainCode,
    close_sinks,
    has_log_files,
    line_filters,
    rank_setups,
    setup_error,
    worker_sinks,
)
from numarun.placement import workerenv

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from numarun.cmdline.config import LaunchConfig
    from numarun.files.rundirs import RunDirs
    from numarun.files.safedir import Directory
    from numarun.jobwide.notices import JobNotices
    from numarun.launch.warm import Standbys, Warm
    from numarun.placement.plan import Plan
    from numarun.process.spec import RunResult, WorkerExit, WorkerSpec
    from numarun.process.supervisor import Supervisor
    from numarun.rendezvous.round import Round
    from numarun.rendezvous.torchrdzv import ElasticNode
    from numarun.stacks.jobstacks import JobStacks
    from numarun.stacks.pending import PendingRecord


class Interrupted(BaseException):
    """A teardown signal arrived while no supervisor ran (see :class:`SignalGuard`)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted(signum)


class SignalGuard:
    """While no supervisor runs (the workers' files being set up, a rendezvous, the exit
    barrier, the gap between attempts), a teardown signal ends the launch at once: its handler
    raises :class:`Interrupted` in the main thread, wherever it waits
    (:func:`numarun.rendezvous.storeops.run_blocking` keeps torch's blocking calls off that thread).
    The supervisor's own handling replaces this while workers run. A signal the caller ignores
    stays ignored when it is in ``keep_ignored`` (SIGHUP under ``nohup``). Main thread only;
    elsewhere it does nothing. Restores the previous handlers."""

    def __init__(
        self, signals: Sequence[int], keep_ignored: Sequence[int] = (signal.SIGHUP,)
    ) -> None:
        self._signals = tuple(signals)
        self._keep_ignored = tuple(keep_ignored)
        self._previous: dict[int, object] = {}

    def __enter__(self) -> SignalGuard:
        from numarun.process.signals import in_main_thread

        if not in_main_thread():
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
        self.stacks = stacks  # numarun.stacks.jobstacks.JobStacks (closed) or None
        self.line = ""


class _Bounded:
    """Lines of a job's history, bounded however long the job runs: the first ``head`` and the
    last ``tail`` lines added, and how many between them were dropped. A job restarted 100,000
    times keeps a screenful (each line was said on stderr when it happened) and its memory
    stays flat."""

    def __init__(self, what: str, head: int = 3, tail: int = 7) -> None:
        from _collections import deque  # collections.deque, without collections (DESIGN.md)

        self._what = what  # "earlier attempt(s)", for the line that stands for the dropped ones
        self._head: list[str] = []
        self._tail: deque[str] = deque(maxlen=tail)
        self._head_size = head
        self.dropped = 0

    def add(self, line: str) -> None:
        if len(self._head) < self._head_size:
            self._head.append(line)
            return
        if len(self._tail) == self._tail.maxlen:
            self.dropped += 1
        self._tail.append(line)

    def __bool__(self) -> bool:
        return bool(self._head)

    def lines(self) -> list[str]:
        """The kept lines in order, one line in place of those dropped."""
        gap = [f"... {self.dropped} more {self._what} not listed here"] if self.dropped else []
        return [*self._head, *gap, *self._tail]


class Job:
    """The attempts of one launch: one loop (:meth:`run`) over :meth:`run_attempt`.

    torchrun's semantics: a failed attempt (a worker failed, or the supervisor was stopped
    for any reason but this node's rendezvous) is followed by another, with
    TORCHELASTIC_RESTART_COUNT one higher, while ``--max-restarts`` allows; a node joining
    (or leaving) the rendezvous re-forms the group without using a restart; a teardown signal
    ends the job. Every attempt keeps its own directory; the end report lists each attempt's
    root cause. What a job keeps of its past attempts is bounded (:class:`_Bounded`): the last
    attempt whole, and of the earlier ones the first 3 and the last 7 root causes and a count,
    so a job with ``--max-restarts 100000`` does not grow with every restart.
    """

    def __init__(
        self,
        config: LaunchConfig,
        plan: Plan | None,
        base: Mapping[str, str],
        binary_path: str | None,
        mem_policies: list,
        outputs: tuple[dict[int, int], dict[int, int], set[int]],
        dirs: RunDirs,
    ) -> None:
        self.config = config
        self.plan = plan
        self.base = base
        self.binary_path = binary_path
        self.mem_policies = mem_policies
        self.outputs = outputs
        self.dirs = dirs  # opened by the caller: the first attempt's directory made
        self.said_start = False  # the start line: once the first attempt's files are set up
        self.started = False  # once workers ran: the log directory may hold their output
        self.last: _Attempt | None = None  # the attempt that ran last, whole
        self.earlier = _Bounded("earlier attempts")  # the root causes of those before it
        self.lost = _Bounded("log files")  # log files that lost bytes, all attempts'
        self.node: ElasticNode | None = None
        self.job_view: JobNotices | None = None  # the whole-job view, under a torch rendezvous
        self.waiting_for = "between attempts"  # what a signal interrupts, for its line
        self.warm: Warm | None = None  # --preload: the standbys for the attempts to come
        self.preload_off: str | None = None  # why --preload cannot work (the launcher's check)
        self._running: Supervisor | None = None  # the supervisor of the attempt that runs
        self.pending: PendingRecord | None = None  # where `numarun stacks` reads a wait
        self.resume_collector = False  # turn the cyclic collector on as the first workers start
        self.main_code: MainCode | None = None  # the attempt's script, compiled once for all

    def run(self, port: int) -> int:
        """Run attempts until one succeeds, fails with no restart left, or a signal or the
        rendezvous ends the job; print the report; return the exit status. The first attempt
        runs in ``dirs.first`` (closed here), later ones in directories ``dirs`` makes. With
        ``--preload`` the first standbys start first thing, before any rendezvous (and, when
        another attempt may follow, the next attempt's beside them), and whatever standbys
        wait when the job ends are torn down, however it ends.

        The caller's :class:`SignalGuard` covers the whole job: a teardown signal while no
        supervisor runs raises :class:`Interrupted` out of here (under a torch rendezvous the
        other nodes were told first); :attr:`waiting_for` says what it interrupted."""
        try:
            if self.config.preload:
                self._start_warm()
            return self._run(port)
        finally:
            if self.warm is not None:
                self.warm.close()

    def _run(self, port: int) -> int:
        config = self.config
        first = self.dirs.first
        assert first is not None
        if not config.elastic and not config.max_restarts:
            # One attempt, as numarun has always run it: nothing imported.
            self.waiting_for = "setting up the workers"
            attempt = self.run_attempt(None, port, "attempt_0", first, 0)
            self._preload_failed()
            self.waiting_for = "reporting the run's end"
            return self.report(attempt)
        self.waiting_for = "between attempts"
        try:
            return self._loop(first, port)
        except Interrupted as stop:
            if self.node is not None:
                self.node.announce_and_linger(f"stopped on {signal_text(stop.signum)}")
            raise
        finally:
            if self.pending is not None:
                self.pending.remove()
            if self.node is not None:
                self.node.close()

    def _loop(self, first: Directory, port: int) -> int:
        config = self.config
        if config.elastic:
            from numarun.jobwide.notices import JobNotices
            from numarun.rendezvous.torchrdzv import ElasticNode, NotAdmitted

            self.node = ElasticNode(config)
            self.job_view = JobNotices(self.node)
            self.node.diagnostics = self.job_view
            self.waiting_for = f"waiting for the {self.node.where}"
            self.pending = _pending_record(config)
            if self.pending is not None:  # `numarun stacks` says the job waits (issue 32)
                self.node.waiting.on_change = self.pending.update
            self.node.connect()
        restart_count = 0
        reforms = 0
        directory = first
        group: Round | None = None  # the static rendezvous: config and port
        while True:
            name = f"attempt_{restart_count}" + (f".{reforms}" if reforms else "")
            if self.last is not None:
                try:
                    directory = self.dirs.next_attempt(name)
                except OSError as error:
                    raise setup_error(error, config) from None
            if self.node is not None:
                try:
                    group = self.node.next_round()
                except NotAdmitted as done:
                    sys.stderr.write(str(done) + "\n")
                    return 0
                if self.last is None and self.dirs.renamed_after_round:
                    self.dirs.after_first_round(group.group_rank)
            try:
                attempt = self.run_attempt(group, port, name, directory, restart_count)
                self._preload_failed()
            except NumarunError as error:
                if self.node is not None and self.warm is not None and self.warm.fatal:
                    self._announce(f"stopped: {error}")  # the others end too, knowing why
                    self.node.finish(succeeded=False)
                raise
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
                    sys.stderr.write(
                        f"numarun: {attempt.line}\n" + _notice_stacks(attempt, self.node)
                    )
                reforms += 1
                continue
            if ours and change is not None:
                attempt.line = f"{name}: stopped: {change.message}"
                sys.stderr.write(
                    _notice_stacks(attempt, self.node)
                    + f"numarun: {change.message}; this node stops\n"
                )
                return 1
            if exit_code_for(result) == 0:
                if self.node is not None:
                    self.waiting_for = f"waiting for the other nodes to finish ({self.node.where})"
                    warning = self.node.finish(succeeded=True)
                    if self.node.verdict is not None:  # the job hung while this node waited
                        _hung_after(attempt, *self.node.verdict)
                    elif self.node.ended_elsewhere is not None:
                        return self._failed_elsewhere(attempt, self.node.ended_elsewhere)
                    elif warning and not config.quiet:
                        sys.stderr.write(f"numarun: warning: {warning}\n")
                return self.report(attempt)
            _describe_failure(attempt, self.outputs)
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

    def _failed_elsewhere(self, attempt: _Attempt, why: str) -> int:
        """This node's ranks all finished, and the job failed on another node (``why``: its
        notice, or the rendezvous closed): one line, exit status 1 (docs/differences.md: the
        job's outcome, whichever node's status a scheduler reads)."""
        line = f"the job failed after this node's ranks finished: {why}"
        attempt.line = f"{attempt.name}: {line}"
        self.report(attempt)
        sys.stderr.write(f"numarun: {line}\n")
        sys.stderr.flush()
        return 1

    def _preload_failed(self) -> None:
        """``--preload-required`` and a preload failed: the job ends here (its workers torn
        down already), with that one line and exit status 1."""
        if self.warm is not None and self.warm.fatal is not None:
            from numarun.launch.warm import PreloadFailed

            raise PreloadFailed(self.warm.fatal)

    def _announce(self, message: str) -> None:
        # Fire-and-forget from a helper thread, waited for at most a second: a store that
        # stopped answering must not hold the exit.
        assert self.node is not None
        self.node.announce_and_linger(message)

    def run_attempt(
        self, group: Round | None, port: int, name: str, directory: Directory, restart_count: int
    ) -> _Attempt:
        """Start this node's workers for ``group`` (a round of a torch rendezvous; None: the
        static rendezvous with the store on ``port``) with their files under ``directory``
        (made by :func:`numarun.files.logdir.make_attempt`, without the ranks' own: those
        are made as their log files are opened, or by each rank's process as it starts;
        closed here once the files are open), wait for the supervisor's end, return the
        attempt. Raises :class:`UsageError` (one line, nothing started) when the workers'
        files cannot be set up (out of fds, say)."""
        import gc

        specs, stacks, duplicates = self._worker_specs(group, port, directory, restart_count)
        if stacks is not None and self.config.log_dir is not None:  # the directory stays
            stacks.flight_dir = os.path.join(directory.path, "flight_recorder")
        taken: Standbys | None = None
        try:
            taken = self.warm.take(specs) if self.warm is not None else None
            if self.warm is not None and self.warm.fatal is not None:
                close_sinks(specs)
                self._preload_failed()  # nothing of this attempt started
            self._say_start(name, group, port, taken is not None)
            supervisor = self._supervisor(specs, stacks, taken, restart_count)
            # What the first attempt starts with lives until exit; freezing it keeps the
            # collector from walking it again, which on a slow machine costs 10+ ms at
            # interpreter exit. Only then: what a later attempt allocates is left to the
            # collector (frozen, its reference cycles would stay for good, one more at every
            # restart), and a collection of the whole heap between a failure and the next
            # attempt's start would delay the restart (3 ms here).
            if self.last is None:
                gc.freeze()
                if self.resume_collector:
                    gc.enable()  # off for the launcher's start-up (launcher.main)
            more = self.config.elastic or restart_count < self.config.max_restarts
            running, taken = taken, None  # from here the run owns its standbys
            result = self._supervise(supervisor, specs, stacks, running, more)
        finally:
            if taken is not None and self.warm is not None:
                self.warm.discard(taken)  # taken, never run (a signal, say): torn down
            _close_attempt_files(stacks, duplicates)
            if self.main_code is not None:
                self.main_code.close()
        attempt = _Attempt(name, directory.path, result, lost_logs(specs), stacks)
        if self.last is not None and self.last.line:
            self.earlier.add(self.last.line)
        self.last = attempt  # the attempt before it (its result, its stacks) is let go
        for line in attempt.lost:
            self.lost.add(line)
        return attempt

    def _worker_specs(
        self, group: Round | None, port: int, directory: Directory, restart_count: int
    ) -> tuple[list[WorkerSpec], JobStacks | None, tuple]:
        """The attempt's specs (their output files open), its stacks and its line filters;
        ``directory`` closed. On an error nothing stays open: :class:`UsageError` for a file
        that cannot be set up (out of fds, an unwritable log file)."""
        from numarun.process.spec import WorkerSpec

        config, plan, base = self.config, self.plan, self.base
        duplicates: tuple = (None, None)
        stacks = None
        specs: list[WorkerSpec] = []
        try:
            duplicates = line_filters(config, directory)
            self.main_code = MainCode.open(config)
            setups = rank_setups(
                config, plan, base, self.binary_path, attempt_dir=directory.path, port=port,
                group=group, restart_count=restart_count, mem_policies=self.mem_policies,
            )  # fmt: skip
            # This attempt's ranks (under a torch rendezvous they come from the round); with
            # --preload the dump files its standbys were armed on at birth.
            made = self.warm.dumps_for_next() if self.warm is not None else None
            stacks = _job_stacks(
                config, [(s.local_rank, s.rank) for s in setups], self.job_view, made
            )
            for setup in setups:
                local_rank, env = setup.local_rank, setup.env
                if stacks is not None:
                    env.update(stacks.worker_env(local_rank))
                if self.main_code is not None:
                    env.update(self.main_code.worker_env())
                stdout, stderr = worker_sinks(
                    config, self.outputs, local_rank, directory, base, duplicates, rank=setup.rank
                )
                if stacks is not None:
                    stacks.count_output((stdout, stderr))
                # Without log files the rank's directory (its error file's) is made by its own
                # process as it starts: none for a rank never started.
                made = has_log_files(self.outputs, local_rank)
                specs.append(WorkerSpec(
                    local_rank=local_rank, rank=setup.rank, env=env, argv=setup.argv,
                    cpus=setup.cpus, mem=setup.mem, stdout=stdout, stderr=stderr,  # type: ignore[arg-type]
                    make_dir=None if made else os.path.join(directory.path, str(local_rank)),
                    pass_fds=() if self.main_code is None else (self.main_code.fd,),
                ))  # fmt: skip
        except BaseException as error:  # nothing started
            close_sinks(specs)
            _close_attempt_files(stacks, duplicates)
            if self.main_code is not None:
                self.main_code.close()
            if isinstance(error, OSError):
                raise setup_error(error, config) from None
            raise
        finally:
            directory.close()  # the files are open: nothing more is made in it here
        return specs, stacks, duplicates

    def _supervisor(
        self,
        specs: list[WorkerSpec],
        stacks: JobStacks | None,
        taken: Standbys | None,
        restart_count: int,
    ) -> Supervisor:
        """The attempt's supervisor (the standbys' when ``taken``), watched by this node's
        rendezvous and its stacks."""
        from numarun.process.supervisor import Supervisor

        # The failure path is imported before a worker's end is acted on (module docstring).
        elastic = self.node is not None
        restarts = self.node is None and restart_count < self.config.max_restarts
        on_failure = after_import(_failure_calls(stacks, self.job_view, restarts), elastic)
        on_exit = stacks.on_exit if stacks is not None else None
        if taken is not None:
            supervisor: Supervisor = taken.adopt(specs, on_failure, on_exit)
        else:
            supervisor = Supervisor(
                specs, on_failure=on_failure, on_exit=on_exit, on_forked=self._write_main_code,
                **self._supervisor_options(),
            )
        if self.node is not None:
            self.node.begin_watch(supervisor)  # the store thread
        if self.job_view is not None:
            self.job_view.attach(stacks)  # the whole job's stacks and hang verdict
        if stacks is not None:
            stacks.attach(supervisor)  # stacks on demand, at a failure, and --hang-timeout
        return supervisor

    def _supervise(
        self,
        supervisor: Supervisor,
        specs: list[WorkerSpec],
        stacks: JobStacks | None,
        running: Standbys | None,
        more: bool,
    ) -> RunResult:
        """Run the attempt's workers to their end (``more``: another attempt may follow, so
        the next standbys start as this one's workers do)."""

        def started() -> None:
            if running is not None:
                running.hand_over(specs)  # the workers run from here
            if self.warm is not None:
                if more:
                    self.warm.start()  # the next attempt's standbys, unless they wait
                self.warm.watch(supervisor, running)
            _on_started(supervisor, stacks, self.node is not None)

        self._running = supervisor
        try:
            result = supervisor.run(on_started=started)
        except (NumarunError, Interrupted):
            raise  # a worker could not start (one line), or a signal came before any did
        except BaseException:
            self.started = True
            raise
        finally:
            self._running = None
            close_sinks(specs)  # closed already when the run ended; not when start failed
            if self.node is not None:
                self.node.unwatch()
            if self.warm is not None:
                if running is not None:
                    self.warm.release(running)
                self.warm.unwatch()
        self.started = True
        import_failure_path(self.node is not None)  # a run that ended before the timer
        return result

    def _write_main_code(self) -> None:
        """The supervisor's ``on_forked``: the script compiled for the workers (and the fd
        closed) as the watchdog forks them, well before they get to it."""
        if self.main_code is not None:
            self.main_code.write(self.config.entrypoint, self.base)
            self.main_code.close()

    def _supervisor_options(self) -> dict:
        """What every supervisor of this job is made with, cold or standby."""
        config = self.config
        return {
            "grace_period": config.grace_period,
            "teardown_signals": config.teardown_signals,
            "forward_signals": config.forward_signals,
            # torchrun's semantics: the workers get the signal numarun got (Ctrl-C: SIGINT,
            # so `except KeyboardInterrupt` runs); only a nohup'd SIGHUP stays ignored, so a
            # background job (started with SIGINT and SIGQUIT ignored) still stops on kill -INT.
            "relay_signal": True,
            "keep_ignored": (signal.SIGHUP,),
            "remove_if_killed": self.dirs.remove_if_killed(),
        }

    def _start_warm(self) -> None:
        """``--preload``: :class:`numarun.launch.warm.Warm` for this job, and its first
        standbys, now: the first attempt's and, when another attempt may follow (a restart
        left, or a torch rendezvous) and not ``--preload-late``, the next one's beside them,
        so that a failure soon after the start restarts warm too. With
        ``--preload-required`` a failed preload stops the attempt that runs."""
        from numarun.launch import warm
        from numarun.process.standby import StandbySupervisor

        config = self.config
        self.warm = warm.Warm(
            config,
            lambda: warm.birth_specs(
                self.config, self.plan, self.base, self.binary_path, self.mem_policies,
                self.outputs,
            ),
            lambda specs: StandbySupervisor(specs, **self._supervisor_options()),
            (lambda line: None) if config.quiet else warm.say,
        )
        self.warm.on_fatal = self._stop_running
        if self.preload_off is not None:
            self.warm.turn_off(self.preload_off)
            return
        more = config.elastic or config.max_restarts > 0
        self.warm.start(2 if more and not config.preload_late else 1)

    def _stop_running(self, reason: str) -> None:
        if self._running is not None:
            self._running.request_stop(reason)

    def _say_start(self, name: str, group: Round | None, port: int, warm: bool) -> None:
        """The start line for the first attempt (:mod:`numarun.launch.startline`; what
        ``--preload`` did in it); for a later one that runs cold although standbys waited,
        one line saying why."""
        config = self.config
        note = None
        if self.warm is not None:
            modules = ", ".join(config.preload)
            reason = self.warm.note or self.warm.off
            note = f"preload: {modules} ({'on standbys' if warm else f'cold: {reason}'})"
        if not self.said_start:
            self.said_start = True
            if config.quiet:
                return
            from numarun.launch.startline import start_lines

            logs = self.dirs.logs_note()
            sys.stderr.write(start_lines(config, self.plan, port, logs, group, note))
            sys.stderr.flush()
        elif self.warm is not None and self.warm.note is not None and not config.quiet:
            sys.stderr.write(f"numarun: {name}: cold start: {self.warm.note}\n")

    def report(self, last: _Attempt) -> int:
        """The end of the job: the failure summary of the last attempt (naming every earlier
        attempt's root cause) when it failed, else a short note of the earlier attempts' root
        causes, if any; returns the exit status."""
        code = exit_code_for(last.result)
        lost = self.lost.lines()
        earlier = self.earlier.lines() if last is self.last else []
        if code != 0:
            sys.stdout.flush()
            summary = failure_summary(
                self.config,
                last.result,
                last.directory,
                self.outputs,
                self.dirs.shown_log_dir(),
                lost,
                earlier=earlier,
                stacks=last.stacks,
            )
            sys.stderr.write(summary + "\n")
            sys.stderr.flush()
            return code
        if earlier or lost:
            from numarun.launch import summary as end_summary

            if earlier and not self.config.quiet:
                sys.stderr.write(end_summary.format_attempts(earlier) + "\n")
            if lost:
                sys.stderr.write(end_summary.format_lost_logs(lost) + "\n")
        return code


def _failure_calls(
    stacks: object, job_view: object, restarts: bool
) -> Callable[[WorkerExit], None] | None:
    """What runs at a local worker's failure, before the others are stopped: the other
    ranks' stacks (at most ~1 s, typically milliseconds), then the notice to the other
    nodes with them (``job_view``'s, posted by a helper thread; the teardown does not wait
    for it).

    Without a torch rendezvous, an attempt that a restart will follow (``restarts``) takes no
    stacks: only the last attempt's summary shows them (the earlier ones get a line each), and
    taking them (every other rank dumps, the launcher waits for the dumps) would delay the
    restart. Under a torch rendezvous they go to the other nodes with the notice."""
    calls = []
    if stacks is not None and not restarts:
        calls.append(stacks.on_failure)  # type: ignore[attr-defined]
    if job_view is not None:
        calls.append(job_view.on_worker_failure)  # type: ignore[attr-defined]
    if not calls:
        return None

    def on_failure(ended: WorkerExit) -> None:
        for call in calls:
            call(ended)

    return on_failure


def _describe_failure(
    attempt: _Attempt, outputs: tuple[dict[int, int], dict[int, int], set[int]]
) -> None:
    """Set ``attempt.line``: its root cause in one line (rank, exit or signal, error)."""
    from numarun.launch import summary as end_summary

    reports = rank_reports(attempt.result, attempt.directory, outputs)
    stopped = attempt.result.stop_reason
    attempt.line = end_summary.attempt_line(attempt.name, reports, stopped_by=stopped)


def _notice_stacks(attempt: _Attempt, node: ElasticNode | None) -> str:
    """Where every rank of the job was when another node's failure stopped this attempt (the
    notice's classes and this node's ranks, merged), as lines for stderr; empty without
    them."""
    stacks = attempt.stacks
    if getattr(stacks, "at_notice", None) is None or node is None or node.round is None:
        return ""
    from numarun.launch.summary import format_job_view

    workers = node.round.workers
    world = workers[0].world_size if workers else None
    view = stacks.notice_view(node.round.group_rank, node.host, world)  # type: ignore[attr-defined]
    if view is None or not view.classes:
        return ""
    return format_job_view("numarun: where every rank of the job was:", view, flight=True) + "\n"


def _hung_after(attempt: _Attempt, view: object, by: str) -> None:
    """This node's ranks had all ended when the other nodes found the job hung: the attempt
    ends as a hang (exit status 124, the hang's summary)."""
    from numarun.stacks.dumps import HANG_REASON

    if attempt.stacks is not None:
        attempt.stacks.note_verdict(view, by)  # type: ignore[attr-defined]
    reason = f"{HANG_REASON}the job hung while this node's ranks had ended (verdict of {by})"
    attempt.result = attempt.result.replace(stop_reason=reason)


def _job_stacks(
    config: LaunchConfig,
    ranks: Sequence[tuple[int, int]],
    job_view: JobNotices | None,
    made: str | None = None,
) -> JobStacks | None:
    """One attempt's stack dumps and ``numarun stacks`` socket (:mod:`numarun.stacks.jobstacks`)
    for its ``(local rank, global rank)`` pairs; under a torch rendezvous (``job_view``) the
    whole job's stacks and hang verdict; ``made``: the dump directory its standbys were
    armed on (:meth:`numarun.launch.warm.Warm.dumps_for_next`).

    Where they cannot be set up (the per-user runtime directory is refused), the job runs
    without them after one warning line; with ``--hang-timeout`` that is an error instead."""
    from numarun.stacks.jobstacks import JobStacks

    try:
        return JobStacks(
            ranks,
            python=config.entrypoint_kind != "binary",
            describe=_describe(config),
            hang_timeout=config.hang_timeout,
            hang_job=job_view.hang_job() if job_view is not None else None,
            scope="job" if job_view is not None else ("node" if config.max_nodes > 1 else "all"),
            made=made,
        )  # fmt: skip
    except (NumarunError, OSError) as error:
        if isinstance(error, OSError) and error.errno in (errno.EMFILE, errno.ENFILE):
            raise setup_error(error, config) from None  # the workers cannot start either
        if config.hang_timeout is not None:
            raise UsageError(f"--hang-timeout needs numarun's stack dumps: {error}") from None
        if not config.quiet:
            print(f"numarun: warning: `numarun stacks` will not reach this job: {error}",
                  file=sys.stderr)  # fmt: skip
        return None


def _describe(config: LaunchConfig) -> dict:
    """What ``numarun stacks`` lists of this job."""
    entrypoint = " ".join([config.entrypoint, *config.args])
    return {"run_id": config.run_id, "host": os.uname().nodename, "entrypoint": entrypoint[:200],
            "nnodes": config.max_nodes, "backend": config.rdzv_backend}  # fmt: skip


def _pending_record(config: LaunchConfig) -> PendingRecord | None:
    """The record ``numarun stacks`` reads while this job waits in its rendezvous; None where
    the per-user runtime directory is refused (the job's stacks say why when its ranks run)."""
    from numarun.stacks.channel import runtime_dir
    from numarun.stacks.pending import PendingRecord

    try:
        return PendingRecord(runtime_dir(create=True), _describe(config))
    except (NumarunError, OSError):
        return None


def _close_attempt_files(stacks: JobStacks | None, duplicates: tuple) -> None:
    """An attempt's stacks (what the summary needs stays in memory) and line filters."""
    if stacks is not None:
        stacks.close()
    for line_filter in duplicates:
        if line_filter is not None:
            line_filter.close()


def _on_started(supervisor: Supervisor, stacks: JobStacks | None, elastic: bool) -> None:
    if stacks is not None:
        try:
            stacks.listen()
        except OSError as error:  # out of fds, say: the job runs on without the socket
            print(f"numarun: warning: `numarun stacks` will not reach this job: {error}",
                  file=sys.stderr)  # fmt: skip
    if elastic:
        import_failure_path(elastic)
    else:
        supervisor.call_later(FAILURE_PATH_DELAY, lambda: import_failure_path(elastic))

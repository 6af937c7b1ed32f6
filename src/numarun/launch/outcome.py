"""How a finished attempt is told: the launcher's exit status and the failure summary's inputs.

:func:`exit_code_for` is a run's exit status (its docstring states the rule).
:func:`rank_reports` and :func:`failure_summary` join a run's result with its attempt directory
(each rank's error file and, for a rank whose output went to files, its log directory) for
:mod:`numarun.launch.summary`; :func:`lost_logs` names the log files that lost bytes for good (a
full disk); :func:`signal_text` names a signal. :mod:`numarun.launch.summary` and the sinks are
imported only where a report needs them: a failed run, output that went to files.
"""

from __future__ import annotations

import os

from numarun.files.logdir import error_file

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from numarun.cmdline.config import LaunchConfig
    from numarun.process.spec import RunResult, WorkerSpec


def exit_code_for(result: RunResult) -> int:
    """The launcher's exit status for a finished run.

    128+N when the launcher itself received signal N (130 for Ctrl-C); else 124 when
    ``--hang-timeout`` stopped the run (``stop_reason`` ``"hang: ..."``, as timeout(1)); else
    the first failing worker's status: its exit code, 128+N when signal N killed it, 1 when it
    is unaccounted for (unkillable); else 1 when the run was stopped through
    ``Supervisor.request_stop`` for another reason (the rendezvous); else 0.
    """
    if result.received_signal:
        return 128 + int(result.received_signal)
    if result.stop_reason is not None and result.stop_reason.startswith("hang: "):
        return 124  # numarun.stacks.dumps.HANG_EXIT_CODE
    failure = result.first_failure
    if failure is None:
        return 1 if result.stop_reason else 0
    if failure.exit_code is None:
        return 1
    if failure.exit_code < 0:
        return 128 - failure.exit_code
    return failure.exit_code or 1


def lost_logs(specs: Sequence[WorkerSpec]) -> list[str]:
    """One line per log file that lost bytes for good (a full disk): rank, file, how many."""
    if not any(spec.stdout or spec.stderr for spec in specs):
        return []
    from numarun.process import sinks

    lines = []
    for spec in specs:
        for sink in (spec.stdout, spec.stderr):
            loss = sinks.log_loss(sink)
            if loss is not None:
                path, count, reason = loss
                lines.append(
                    f"rank {spec.rank} (local_rank {spec.local_rank}) {path.name}: "
                    f"{count:,} bytes lost ({reason}): {path}"
                )
    return lines


def rank_reports(
    result: RunResult,
    attempt_dir: str,
    outputs: tuple[dict[int, int], dict[int, int], set[int]],
) -> list:
    """Each worker's end with its error file and (redirected) log directory."""
    from numarun.launch import summary as end_summary

    redirects, tee, _ = outputs
    reports = []
    for worker in result.workers:
        to_files = redirects[worker.local_rank] or tee[worker.local_rank]
        reports.append(
            end_summary.rank_report(
                worker,
                error_file=error_file(attempt_dir, worker.local_rank),
                log_dir=os.path.join(attempt_dir, str(worker.local_rank)) if to_files else None,
            )
        )
    return reports


def failure_summary(
    config: LaunchConfig,
    result: RunResult,
    attempt_dir: str,
    outputs: tuple[dict[int, int], dict[int, int], set[int]],
    log_dir: str | None,
    lost_logs: Sequence[str] = (),
    *,
    earlier: Sequence[str] = (),
    stacks: object = None,
) -> str:
    """The summary of a failed run (``result``, its attempt in ``attempt_dir``), as
    :func:`numarun.launch.summary.format_summary` writes it: each rank's end, the entry point
    (cut to 200 characters), the host, ``log_dir`` when it stays, ``lost_logs``, what stopped
    the run, the ``earlier`` attempts' root causes and, from ``stacks``
    (:class:`numarun.stacks.jobstacks.JobStacks`, closed), where the other ranks were."""
    from numarun.launch import summary as end_summary

    reports = rank_reports(result, attempt_dir, outputs)
    entrypoint = " ".join([config.entrypoint, *config.args])
    if len(entrypoint) > 200:
        entrypoint = entrypoint[:197] + "..."
    return end_summary.format_summary(
        reports,
        entrypoint=entrypoint,
        host=os.uname().nodename,
        log_dir=log_dir,
        lost_logs=lost_logs,
        stopped_by=signal_text(result.received_signal) or result.stop_reason,
        earlier_attempts=earlier,
        **(stacks.summary_fields(attempt_dir if log_dir else None) if stacks is not None else {}),  # type: ignore[attr-defined]
    )


def signal_text(signum: int | None) -> str | None:
    """``"SIGTERM"`` for 15, ``"signal N"`` for a number no signal has; None for None."""
    if signum is None:
        return None
    from numarun.process.spec import signal_numbers

    names = [name for name, number in signal_numbers().items() if number == signum]
    return min(names) if names else f"signal {signum}"  # min: signal.Signals' choice

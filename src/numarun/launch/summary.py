"""The summary printed when a run fails, from each rank's end and error file
(:mod:`numarun.worker.errorfile`).

Root cause (torchrun's rule, ``ChildFailedError.get_first_failure``): of the workers that failed
on their own, the one whose failure time is smallest -- the error file's timestamp when it has
one, else the time numarun observed the death. Error-file times are whole seconds, so failures
within the same second are ordered by the observed death time.

With stacks (:mod:`numarun.stacks.dumps`) the summary also shows where the other ranks were when
the first one failed ("Other ranks when rank N failed:", grouped by identical stacks), or, after
``--hang-timeout``, a hang block naming the ranks whose stacks differ from the rest.

The launcher imports this module in its main thread before any failure is acted on
(:mod:`numarun.launch.attempts`), so it stays cheap to import: no
:mod:`dataclasses`, :mod:`pathlib` or :mod:`typing`.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable, Sequence

from numarun.machine.model import Value
from numarun.stacks.parse import format_ranks
from numarun.worker.errorfile import WorkerError, read_error_file

TYPE_CHECKING = False  # typing and pathlib are not imported at run time (module docstring)
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "RankReport",
    "attempt_line",
    "describe_exit",
    "format_attempts",
    "format_job_view",
    "format_lost_logs",
    "format_summary",
    "rank_report",
    "root_cause",
]

_RULE = "=" * 72
_THIN = "-" * 72
# Bounds on what the summary quotes, so one bad rank cannot flood the screen.
_STDERR_TAIL_LINES = 20
_STDERR_TAIL_BYTES = 64 * 1024
_MAX_PIDS_LISTED = 8
_set = object.__setattr__  # how a Value's __init__ fills its slots


class RankReport(Value):
    """One worker's end, as the summary needs it.

    ``exit_code`` follows Popen: >= 0 exit status, -N killed by signal N, None unknown
    (unkillable). ``state`` is the supervisor's: ``"succeeded"``, ``"failed"`` (ended on its own
    with a non-zero status or a signal), ``"terminated"`` (stopped by numarun's teardown) or
    ``"unkillable"``. ``log_dir`` is the rank's directory holding ``stdout.log`` /
    ``stderr.log`` when its output was redirected, else None. ``ended_at`` is ``time.time()``
    when the death was observed. ``proc_state`` is the ``/proc`` state letter of an unkillable
    worker (``"D"``).
    """

    _fields = (
        "local_rank", "rank", "pid", "exit_code", "signal_name", "state", "error", "log_dir",
        "ended_at", "proc_state",
    )  # fmt: skip
    __slots__ = _fields
    local_rank: int
    rank: int
    pid: int | None
    exit_code: int | None
    signal_name: str | None
    state: str
    error: WorkerError | None
    log_dir: str | os.PathLike[str] | None
    ended_at: float | None
    proc_state: str | None

    def __init__(
        self,
        local_rank: int,
        rank: int,
        pid: int | None,
        exit_code: int | None,
        signal_name: str | None,
        state: str,
        error: WorkerError | None,
        log_dir: str | os.PathLike[str] | None,
        ended_at: float | None,
        proc_state: str | None = None,
    ) -> None:
        _set(self, "local_rank", local_rank)
        _set(self, "rank", rank)
        _set(self, "pid", pid)
        _set(self, "exit_code", exit_code)
        _set(self, "signal_name", signal_name)
        _set(self, "state", state)
        _set(self, "error", error)
        _set(self, "log_dir", log_dir)
        _set(self, "ended_at", ended_at)
        _set(self, "proc_state", proc_state)


def rank_report(
    worker_exit: Any,
    *,
    error_file: str | os.PathLike[str] | None,
    log_dir: str | os.PathLike[str] | None,
) -> RankReport:
    """Build a :class:`RankReport` from a supervisor ``WorkerExit`` and the rank's files.

    ``worker_exit`` needs ``local_rank``, ``rank``, ``pid``, ``exit_code``, ``signal_name``,
    ``state``, ``ended_at`` and may have ``proc_state``. The error file is read with
    :func:`read_error_file` (missing or bad: ``error=None``).
    """
    return RankReport(
        local_rank=worker_exit.local_rank,
        rank=worker_exit.rank,
        pid=worker_exit.pid,
        exit_code=worker_exit.exit_code,
        signal_name=worker_exit.signal_name,
        state=worker_exit.state,
        error=read_error_file(error_file),
        log_dir=log_dir,
        ended_at=worker_exit.ended_at,
        proc_state=getattr(worker_exit, "proc_state", None),
    )


def root_cause(reports: Iterable[RankReport]) -> RankReport | None:
    """The failure that came first, by torchrun's rule (see the module docstring), with one
    refinement torchrun cannot make.

    Only ``state == "failed"`` workers count. Ordering key: the failure second (error-file
    timestamp, else ``floor(ended_at)``), then ``ended_at``, then global rank; an unknown time
    sorts last. None when no worker failed on its own.

    The refinement: a worker numarun stopped (``"terminated"``) whose own error file says it
    raised (``WorkerError.raised_at``, numarun's exact time) before the failure chosen above
    raised -- or, without that time, before its death was observed -- failed first. A rank
    whose uncaught exception closed its connections as its interpreter exited makes its peers
    fail at once (gloo's "Connection closed by peer", NCCL's abort), and under load they can be
    reaped before the rank that raised; it is then stopped mid-exit, and the first death seen is
    not the cause. Of several such workers, the one that raised first.
    """
    reports = list(reports)
    failed = [report for report in reports if report.state == "failed"]
    if not failed:
        return None
    first = min(failed, key=_failure_key)
    if first.error is not None and first.error.raised_at is not None:
        limit = first.error.raised_at
    elif first.ended_at is not None:
        limit = first.ended_at
    else:
        return first
    earlier = [
        report
        for report in reports
        if report.state == "terminated"
        and report.error is not None
        and report.error.raised_at is not None
        and report.error.raised_at < limit
    ]
    if not earlier:
        return first
    return min(earlier, key=lambda report: (report.error.raised_at, report.rank))  # type: ignore[union-attr]


def raised_first(report: RankReport) -> bool:
    """Whether ``report``, a root cause, is a worker numarun stopped while it exited after
    raising (:func:`root_cause`'s refinement), not one that failed on its own."""
    return report.state == "terminated"


def _cause_verb(cause: RankReport) -> str:
    how = describe_exit(cause.exit_code, cause.signal_name)
    if raised_first(cause):
        return f"raised first (stopped by numarun while it exited: {how})"
    return f"failed with {how}"


def _failure_key(report: RankReport) -> tuple[float, float, int]:
    ended = math.inf if report.ended_at is None else report.ended_at
    if report.error is not None and report.error.timestamp is not None:
        second: float = report.error.timestamp
    else:
        second = math.floor(ended) if math.isfinite(ended) else math.inf
    return (second, ended, report.rank)


def describe_exit(exit_code: int | None, signal_name: str | None = None) -> str:
    """``"exit code 3"``, ``"signal SIGSEGV (-11)"`` or ``"no exit status"`` (None)."""
    if exit_code is None:
        return "no exit status"
    if exit_code >= 0:
        return f"exit code {exit_code}"
    if signal_name is None:
        from numarun.process.spec import signal_name as name_of

        signal_name = name_of(exit_code)
    return f"signal {signal_name} ({exit_code})"


def format_summary(
    reports: Sequence[RankReport],
    *,
    entrypoint: str,
    host: str,
    log_dir: str | os.PathLike[str] | None,
    lost_logs: Sequence[str] = (),
    stopped_by: str | None = None,
    stacks_at_failure: tuple[int, Sequence[Any]] | None = None,
    hang: Any = None,
    stacks_logs: str | None = None,
    earlier_attempts: Sequence[str] = (),
    flight: Any = None,
) -> str:
    """The report of a failed run, meant to be the last thing printed (on stderr).

    ``reports`` holds every worker of the run (any order). The text (no trailing newline) has:
    a header naming ``entrypoint``, ``host`` and the count of workers per state; the root cause
    (:func:`root_cause`) with global and local rank, pid, :func:`describe_exit`, its time, error
    file message and traceback -- or ``no traceback (worker did not write an error file)`` plus
    the last lines of its ``stderr.log`` when that was redirected -- and its log directory; then
    one line per group of other ranks sharing a state (``ranks 2-255: terminated by numarun
    after rank 1 failed``), so 512 ranks stay a screenful; then ``lost_logs`` (one line per
    log file that lost bytes, see :func:`format_lost_logs`) and ``log_dir`` when given. With no
    worker failed on its own (e.g. numarun was interrupted) the root-cause block says so.
    ``stopped_by`` (a signal name such as ``"SIGINT"``, or the reason numarun stopped the
    workers): named in the root-cause line (or above the root cause, when a worker failed too).
    ``earlier_attempts``: one line per earlier attempt of the job (see :func:`attempt_line`),
    listed under ``Earlier attempts:`` after the other ranks.

    ``stacks_at_failure`` (the failed global rank, the other ranks'
    :class:`numarun.stacks.parse.RankStacks`): a section "Other ranks when rank N failed:" after the
    other ranks' states, grouped by identical stacks, each group's main thread cut to its
    innermost frames; no section when there are no stacks (every other rank had ended).
    ``hang`` (a :class:`numarun.stacks.hang.HangReport`): the header says HUNG and a hang
    block replaces the root cause: how long nothing moved, the likely culprits
    (:func:`numarun.stacks.parse.odd_ones_out`: the ranks whose stacks differ from the majority)
    with file:line and function, then every rank's stacks grouped. ``stacks_logs``: where the full
    stacks were written, named after either section. ``flight`` (a
    :class:`numarun.stacks.flightreport.FlightReport`): the ranks' flight recorders then, under
    either section (and, in a hang, the ranks it finds behind or mismatched are the likely
    culprits), with where the dumps were kept.
    """
    ordered = sorted(reports, key=lambda report: (report.rank, report.local_rank))
    cause = None if hang is not None else root_cause(ordered)
    verdict = "HUNG" if hang is not None else "FAILED"
    lines = [
        _RULE,
        f"numarun: {_printable(entrypoint)} {verdict} on {_printable(host)} "
        f"({_state_counts(ordered)})",
        _THIN,
    ]
    if hang is not None:
        lines.extend(_hang_block(hang, stacks_logs, flight))
    elif cause is None:
        why = f" on {stopped_by}" if stopped_by else ""
        lines.append(f"Root cause: no worker failed on its own; numarun stopped the run{why}.")
    else:
        if stopped_by:
            lines.append(f"numarun received {stopped_by} and stopped the run.")
        lines.extend(_cause_block(cause))
    others = [report for report in ordered if report is not cause]
    if others:
        lines.append(_THIN)
        lines.append("Other ranks:" if hang is None else "Ranks:")
        why = "the hang" if hang is not None else None
        lines.extend(f"  {line}" for line in _grouped_states(others, cause, why))
    if stacks_at_failure is not None and stacks_at_failure[1] and hang is None:
        # No heading without stacks under it: the others had all ended before the failure.
        failed_rank, stacks = stacks_at_failure
        lines.append(_THIN)
        lines.append(f"Other ranks when rank {failed_rank} failed:")
        lines.extend(_stacks_lines(stacks))
        if stacks_logs is not None:
            lines.append(f"  full stacks: {_printable(stacks_logs)}")
        lines.extend(_flight_lines(flight, f"their collectives when rank {failed_rank} failed"))
    if earlier_attempts:
        lines.append(_THIN)
        lines.append("Earlier attempts:")
        lines.extend(f"  {_printable(line)}" for line in earlier_attempts)
    if lost_logs:
        lines.append(_THIN)
        lines.extend(format_lost_logs(lost_logs).split("\n"))
    if log_dir is not None:
        lines.append(_THIN)
        lines.append(f"Logs: {_printable(str(log_dir))}")
    lines.append(_RULE)
    return "\n".join(lines)


def attempt_line(name: str, reports: Sequence[RankReport], *, stopped_by: str | None = None) -> str:
    """One attempt's root cause in one line, for the report of a job with several attempts:
    ``attempt_0: rank 1 (local_rank 1, pid 4242) failed with exit code 1: RuntimeError:
    boom`` (:func:`root_cause`; the error file's first line when there is one, shortened to
    200 characters). Without a worker failed on its own: ``attempt_0: stopped by numarun:
    <stopped_by>`` (a hang, say), else ``attempt_0: no worker failed on its own``. Control
    characters are shown escaped."""
    cause = root_cause(reports)
    if cause is None:
        if stopped_by:
            return _printable(f"{name}: stopped by numarun: {stopped_by}")
        return f"{_printable(name)}: no worker failed on its own"
    pid = "" if cause.pid is None else f", pid {cause.pid}"
    line = f"{name}: rank {cause.rank} (local_rank {cause.local_rank}{pid}) {_cause_verb(cause)}"
    if cause.error is not None and cause.error.message:
        message = _first_line(cause.error.message)
        line = f"{_printable(line)}: {message[:197] + '...' if len(message) > 200 else message}"
        return line
    return _printable(line)


def format_attempts(lines: Sequence[str]) -> str:
    """The report printed when a job succeeded after earlier attempts did not: a heading,
    then one :func:`attempt_line` per earlier attempt."""
    heading = "numarun: the job succeeded; its earlier attempts:"
    return "\n".join([heading, *(f"  {_printable(line)}" for line in lines)])


def format_lost_logs(lost_logs: Sequence[str]) -> str:
    """The note that log files lost bytes for good (a full disk), one line per file, printed
    at the end of every run that lost some, failed or not."""
    lines = ["Log data lost (the disk was full or failing; each gap is marked in the file):"]
    lines.extend(f"  {_printable(line)}" for line in lost_logs)
    return "\n".join(lines)


def _state_counts(reports: Sequence[RankReport]) -> str:
    counts: dict[str, int] = {}
    for report in reports:
        counts[report.state] = counts.get(report.state, 0) + 1
    total = len(reports)
    parts = [f"{count} {state}" for state, count in counts.items()]
    return f"{total} worker{'s' if total != 1 else ''}: " + ", ".join(parts)


def _cause_block(cause: RankReport) -> list[str]:
    pid = "" if cause.pid is None else f", pid {cause.pid}"
    lines = [
        f"Root cause: rank {cause.rank} (local_rank {cause.local_rank}{pid}) {_cause_verb(cause)}",
    ]
    when = _failure_time(cause)
    if when is not None:
        lines.append(f"  time     : {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(when))}")
    error = cause.error
    if error is not None and error.message:
        lines.append(f"  error    : {_first_line(error.message)}")
    if cause.log_dir is not None:
        lines.append(f"  logs     : {_printable(str(cause.log_dir))}")
    if error is not None and error.traceback:
        lines.append("  traceback:")
        lines.extend(_indented(error.traceback))
    else:
        lines.append("  traceback: no traceback (worker did not write an error file)")
        tail = _stderr_tail(cause.log_dir)
        if tail:
            where = _printable(os.path.join(os.fspath(cause.log_dir or ""), "stderr.log"))
            lines.append(f"  last lines of {where}:")
            lines.extend(_indented(tail))
    return lines


def _failure_time(report: RankReport) -> float | None:
    if report.error is not None and report.error.raised_at is not None:
        return report.error.raised_at
    if report.error is not None and report.error.timestamp is not None:
        return float(report.error.timestamp)
    return report.ended_at


def _first_line(text: str) -> str:
    stripped = text.strip()
    # Only "\n" ends a line: "\r", "\x85" or "\u2028" in a message are shown escaped.
    return _printable(stripped.split("\n", 1)[0].strip()) if stripped else ""


def _indented(text: str) -> list[str]:
    return ["    " + _printable(line) for line in text.rstrip("\n").split("\n")]


def _escape(code: int) -> str:
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


# What a worker writes reaches the user's terminal through the summary: control characters
# (ESC sequences can retitle the window, hide text, move the cursor; C1 controls act as ESC on
# some terminals) and the bidirectional overrides that make text read in another order than
# it runs (CVE-2021-42574) are shown as escapes. Tabs stay; lines are split before this.
_UNPRINTABLE = {
    code: _escape(code)
    for code in (
        *range(0x00, 0x09),
        *range(0x0A, 0x20),
        *range(0x7F, 0xA0),
        0x061C,
        0x200E,
        0x200F,
        *range(0x202A, 0x202F),
        *range(0x2066, 0x206A),
    )
}


def _printable(text: str) -> str:
    """``text`` with every control character (tab excepted) and bidi control escaped
    (``\\x1b``, ``\\u202e``), so a worker's message cannot act on the terminal."""
    return text.translate(_UNPRINTABLE)


def _stderr_tail(log_dir: str | os.PathLike[str] | None) -> str:
    if log_dir is None:
        return ""
    try:
        with open(os.path.join(log_dir, "stderr.log"), "rb") as file:
            file.seek(0, os.SEEK_END)
            size = file.tell()
            file.seek(max(0, size - _STDERR_TAIL_BYTES))
            raw = file.read()
    except OSError:
        return ""
    lines = raw.decode("utf-8", "replace").rstrip("\n").splitlines()
    if size > _STDERR_TAIL_BYTES:
        lines = lines[1:]  # the first line read is probably cut
    return "\n".join(lines[-_STDERR_TAIL_LINES:])


def _grouped_states(
    others: Sequence[RankReport], cause: RankReport | None, why: str | None = None
) -> list[str]:
    # Group by description (not by adjacency), so 0,2-255 collapse into one line.
    groups: dict[str, list[RankReport]] = {}
    for report in others:
        groups.setdefault(_short_state(report, cause, why), []).append(report)
    lines = []
    for description, members in groups.items():
        ranks = [member.rank for member in members]
        label = "rank" if len(ranks) == 1 else "ranks"
        detail = description
        if members[0].state == "unkillable":
            detail = _unkillable_detail(members)
        lines.append(f"{label} {format_ranks(ranks)}: {detail}")
    return lines


def _short_state(report: RankReport, cause: RankReport | None, why: str | None = None) -> str:
    if report.state == "succeeded":
        return "succeeded"
    if report.state == "failed":
        return f"failed with {describe_exit(report.exit_code, report.signal_name)}"
    if report.state == "terminated":
        if why is not None:
            return f"terminated by numarun after {why}"
        if cause is None:
            return "terminated by numarun"
        return f"terminated by numarun after rank {cause.rank} failed"
    if report.state == "unkillable":
        state = f" state {report.proc_state}" if report.proc_state else ""
        return f"unkillable{state}"
    return report.state


def _unkillable_detail(members: Sequence[RankReport]) -> str:
    # "unkillable pid 123 state D": the pid is what the user needs to investigate.
    pids = [str(member.pid) for member in members if member.pid is not None]
    shown = ",".join(pids[:_MAX_PIDS_LISTED])
    if len(pids) > _MAX_PIDS_LISTED:
        shown += f",... ({len(pids) - _MAX_PIDS_LISTED} more)"
    state = f" state {members[0].proc_state}" if members[0].proc_state else ""
    if not pids:
        return f"unkillable{state}"
    return f"unkillable pid{'s' if len(pids) > 1 else ''} {shown}{state}"


def _stacks_lines(stacks: Sequence[Any], indent: str = "  ") -> list[str]:
    """Grouped stacks, each group's main thread cut to its innermost frames, escaped."""
    from numarun.stacks.parse import SUMMARY_FRAMES, format_groups, group_ranks

    lines = format_groups(group_ranks(stacks), max_frames=SUMMARY_FRAMES, other_threads=False)
    return [indent + _printable(line) for line in lines]


def format_job_view(heading: str, view: Any, *, flight: bool = False) -> str:
    """``heading``, then a whole job's classes (a :class:`numarun.stacks.merge.JobView`): odd
    ones first, each with its ranks and nodes as ranges and its main thread's innermost
    frames; escaped (other nodes' posts are shown). ``flight``: then the view's flight
    recorder verdict, when it has one."""
    from numarun.stacks.merge import format_view, summary_lines
    from numarun.stacks.parse import SUMMARY_FRAMES

    lines = [*summary_lines(view),
             *format_view(view, max_frames=SUMMARY_FRAMES, other_threads=False)]  # fmt: skip
    shown = [heading, *(f"  {_printable(line)}" for line in lines)]
    if flight and view.flight is not None:
        shown.extend(_job_flight_lines(view, None, "the collectives of the ranks above"))
    return "\n".join(shown)


def _job_flight_lines(view: Any, mine: Any, heading: str) -> list[str]:
    """The flight recorders of every node, as the merging node found them (``view.flight``, a
    :class:`numarun.stacks.flightjob.JobFlight`), where this node's dumps are (``mine``, its
    :class:`numarun.stacks.flightreport.FlightReport`, or None) and the culprits with their
    nodes and stacks."""
    found = view.flight
    lines = [f"Flight recorder ({heading}, as torch recorded them on every node):",
             *(f"  {line}" for line in found.shown_lines())]  # fmt: skip
    if mine is not None:
        # One node's directory never holds every rank's dump.
        lines.extend(f"  this node's {line}" for line in mine.where_lines(partial=True))
    lines.append("  (each node keeps its own ranks' dumps in its log directory's attempt's "
                 "flight_recorder/; copied into one directory, torch's analyzer reads them all)")
    if found.culprits:
        from numarun.stacks.merge import heading as class_heading
        from numarun.stacks.merge import nodes_text, ordered

        shown, _ = ordered(view)
        label = "Likely culprit" if len(found.culprits) == 1 else "Likely culprits"
        lines.append(f"{label} (flight recorder: behind, or calling something else, where the "
                     "others wait):")  # fmt: skip
        for rank in found.culprits[:8]:
            item = next((c for c in shown if rank in c.ranks), None)
            if item is None:
                lines.append(f"  rank {rank}: no stacks")
                continue
            node = nodes_text(item) if item.node_count == 1 else next(
                (f"on node {n} ({host})" for n, (host, r) in item.per_node.items() if rank in r),
                "",
            )  # fmt: skip
            where = class_heading(item).partition(": ")[2]
            lines.append(f"  rank {rank}{f' ({node})' if node else ''}: {where}")
        if len(found.culprits) > 8 or found.more_culprits:
            lines.append("  ... (more culprits: see the verdict above)")
    return [_printable(line) for line in lines]


def _job_hang_lines(hang: Any) -> list[str]:
    """A hang over several nodes: who declared it, the culprits, what the others did."""
    from numarun.stacks.merge import heading, nodes_text, ordered

    view = hang.view
    shown, majority = ordered(view)
    odd = [item for item in shown if item.problem is None and item is not majority]
    lines = [f"Declared by {hang.by}." if hang.by else ""]
    if odd:
        label = "Likely culprit" if len(odd) == 1 and odd[0].count == 1 else "Likely culprits"
        why = "stacks differ from the other ranks'" if majority is not None else (
            "still running while the other ranks had ended"
        )
        lines.append(f"{label} ({why}):")
        for item in odd:
            label_text, _, where = heading(item).partition(": ")
            details = [nodes_text(item)] if item.nodes else []
            pid = item.pids.get(item.ranks[0]) if item.count == 1 else None
            if pid:
                details.append(f"pid {pid}")
            lines.append(f"  {label_text} ({', '.join(details)}): {where}")
        others = [majority] if majority is not None else [c for c in shown if c.problem]
        lines.extend(f"  while {heading(item)}" for item in others)
    elif majority is not None:
        lines.append(f"Every rank with stacks is in the same place: {heading(majority)}")
    return [_printable(line) for line in lines if line]


def _flight_lines(flight: Any, heading: str = "each rank's collectives") -> list[str]:
    """The flight recorders' section: the verdict (its lines are escaped already) and where the
    dumps are."""
    if flight is None:
        return []
    return [
        f"Flight recorder ({heading}, as torch recorded them):",
        *(f"  {line}" for line in [*flight.lines(), *flight.where_lines()]),
    ]


def _flight_culprits(groups: Sequence[Any], culprits: set[int], hang: Any) -> list[str]:
    """The ranks the flight recorder finds behind or mismatched, each with where its stacks
    are, and where the others are."""
    from numarun.stacks.parse import format_ranks, heading

    by_rank = {item.rank: item for item in hang.stacks}
    label = "Likely culprit" if len(culprits) == 1 else "Likely culprits"
    lines = [f"{label} (flight recorder: behind, or calling something else, where the "
             "others wait):"]  # fmt: skip
    for group in groups:
        blamed = [rank for rank in group.ranks if rank in culprits]
        if not blamed:
            continue
        item = by_rank.get(blamed[0]) if len(blamed) == 1 else None
        pid = f" (pid {item.pid})" if item is not None and item.pid else ""
        where = heading(group).partition(": ")[2]
        lines.append(_printable(f"  rank{'s' if len(blamed) > 1 else ''} "
                                f"{format_ranks(blamed)}{pid}: {where}"))  # fmt: skip
    unknown = sorted(culprits - set(by_rank))
    if unknown:
        lines.append(f"  rank{'s' if len(unknown) > 1 else ''} {format_ranks(unknown)}: "
                     "no stacks on this node")  # fmt: skip
    return lines


def _hang_block(hang: Any, stacks_logs: str | None, flight: Any = None) -> list[str]:
    """What the summary says about a hang: the rule that fired, what the flight recorders
    show, the likely culprits, the stacks of every rank grouped (the culprits first)."""
    from numarun.stacks.parse import (
        SUMMARY_FRAMES,
        format_groups,
        group_ranks,
        heading,
        odd_ones_out,
    )

    counted = "stacks unchanged and no output" if hang.output_watched else (
        "stacks unchanged; their output is not read by numarun (no --redirects/--tee), "
        "so only stacks counted"
    )
    nodes = getattr(hang, "nodes", 1)
    who = f"no rank on any of the {nodes} nodes" if nodes > 1 else "no rank"
    lines = [
        f"Hang: {who} made progress for {hang.idle:.1f} s (--hang-timeout {hang.timeout:g}): "
        f"{counted}.",
    ]
    if getattr(hang, "view", None) is not None:
        lines.extend(_job_hang_lines(hang))
        if hang.view.flight is not None:
            lines.extend(_job_flight_lines(hang.view, flight, "each rank's collectives"))
        lines.append(_THIN)
        lines.append("Stacks when the hang was declared:")
        lines.extend(format_job_view("", hang.view).split("\n")[1:])
        if stacks_logs is not None:
            lines.append(f"  full stacks of this node's ranks: {_printable(stacks_logs)}")
        return lines
    lines.extend(_flight_lines(flight))
    groups = group_ranks(hang.stacks)
    majority, odd = odd_ones_out(groups)
    by_rank = {item.rank: item for item in hang.stacks}
    culprits = flight.culprits if flight is not None else set()
    named = {rank for group in odd for rank in group.ranks} if majority is not None else set()
    if culprits and culprits != named:  # the recorder knows better than the stacks
        lines.extend(_flight_culprits(groups, culprits, hang))
        blamed = [group for group in groups if set(group.ranks) & culprits]
        odd = blamed
        majority = next((g for g in groups if g.has_stacks and g not in blamed), None)
        if majority is not None:
            lines.append(f"  while {_printable(heading(majority))}")
    elif odd and majority is not None:
        label = "Likely culprit" if len(odd) == 1 and len(odd[0].ranks) == 1 else "Likely culprits"
        why = "stacks differ from the other ranks'"
        if all(len(group.ranks) == len(majority.ranks) for group in odd):
            why = "in its own code while the others wait inside torch for it"
        lines.append(f"{label} ({why}):")
        for group in odd:
            item = by_rank.get(group.ranks[0]) if len(group.ranks) == 1 else None
            text = heading(group)
            details = [f"pid {item.pid}"] if item is not None and item.pid else []
            if item is not None and item.node is not None:
                details.insert(0, f"on {item.node}")
            if details:
                label, _, where = text.partition(": ")
                text = f"{label} ({', '.join(details)}): {where}"
            lines.append(f"  {_printable(text)}")
        lines.append(f"  while {_printable(heading(majority))}")
    elif odd:
        lines.append("No single culprit: the ranks split into groups of the same size:")
        lines.extend(f"  {_printable(heading(group))}" for group in odd)
    elif majority is not None:
        lines.append(
            f"Every rank with stacks is in the same place: {_printable(heading(majority))}"
        )
    lines.append(_THIN)
    lines.append("Stacks when the hang was declared:")
    first = [*odd, *([majority] if majority is not None else [])]
    ordered = first + [group for group in groups if all(group is not f for f in first)]
    lines.extend(
        "  " + _printable(line)
        for line in format_groups(ordered, max_frames=SUMMARY_FRAMES, other_threads=False)
    )
    if stacks_logs is not None:
        lines.append(f"  full stacks: {_printable(stacks_logs)}")
    return lines


"""numarun.launch.summary: the root cause of a failed run (the smallest error timestamp, else
the first death observed) and the summary printed when a run fails, built from each rank's
report; then the error file and the summary through the real supervisor."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

from numarun.launch.summary import (
    RankReport,
    describe_exit,
    format_summary,
    rank_report,
    root_cause,
)
from numarun.worker.errorfile import WorkerError

# ---------------------------------------------------------------- root cause and summary


def _report(
    rank: int,
    state: str,
    exit_code: int | None = None,
    *,
    error: WorkerError | None = None,
    ended_at: float | None = 1000.0,
    signal_name: str | None = None,
    log_dir: Path | None = None,
    pid: int | None = None,
    proc_state: str | None = None,
) -> RankReport:
    return RankReport(
        local_rank=rank % 8,
        rank=rank,
        pid=4000 + rank if pid is None else pid,
        exit_code=exit_code,
        signal_name=signal_name,
        state=state,
        error=error,
        log_dir=log_dir,
        ended_at=ended_at,
        proc_state=proc_state,
    )


def test_describe_exit() -> None:
    assert describe_exit(3) == "exit code 3"
    assert describe_exit(0) == "exit code 0"
    assert describe_exit(-11) == "signal SIGSEGV (-11)"
    assert describe_exit(-9, "SIGKILL") == "signal SIGKILL (-9)"
    assert describe_exit(-200) == "signal SIG200 (-200)"
    assert describe_exit(None) == "no exit status"


def test_root_cause_is_the_smallest_error_timestamp() -> None:
    late = _report(0, "failed", 1, error=WorkerError("late", "tb", 2000), ended_at=1000.5)
    early = _report(1, "failed", 1, error=WorkerError("early", "tb", 1000), ended_at=2000.5)
    assert root_cause([late, early]) is early


def test_root_cause_without_error_files_is_the_first_observed_death() -> None:
    reports = [
        _report(0, "failed", 1, ended_at=1000.9),
        _report(1, "failed", -11, ended_at=1000.2),
        _report(2, "terminated", -15, ended_at=999.0),  # killed by us: never the cause
        _report(3, "succeeded", 0, ended_at=900.0),
    ]
    assert root_cause(reports) is reports[1]


def test_root_cause_same_second_is_decided_by_the_observed_death() -> None:
    # Rank 1 segfaulted at 1000.2 (no file); rank 0 raised later in the same second.
    raised = _report(0, "failed", 1, error=WorkerError("peer gone", "tb", 1000), ended_at=1000.9)
    crashed = _report(1, "failed", -11, ended_at=1000.2)
    assert root_cause([raised, crashed]) is crashed
    earlier_second = _report(2, "failed", 1, error=WorkerError("m", "tb", 999), ended_at=1001.0)
    assert root_cause([raised, crashed, earlier_second]) is earlier_second


def test_a_rank_stopped_while_it_exited_after_raising_first_is_the_root_cause() -> None:
    # Rank 1 raised at 1000.10 and was still exiting when rank 0 (failing on its closed
    # connections) died at 1000.30; numarun then stopped rank 1.
    raiser = _report(
        1, "terminated", -15, error=WorkerError("RuntimeError: out of data", "tb", 1000, 1000.10),
        ended_at=1000.60,
    )  # fmt: skip
    peer = _report(0, "failed", -6, ended_at=1000.30)
    bystander = _report(2, "terminated", -15, ended_at=1000.50)
    assert root_cause([peer, raiser, bystander]) is raiser
    # The peer's own exception, when it has an exact time, is what the raiser must precede.
    peer_raised = _report(
        0, "failed", 1, error=WorkerError("RuntimeError: peer closed", "tb", 1000, 1000.05),
        ended_at=1000.30,
    )  # fmt: skip
    assert root_cause([peer_raised, raiser]) is peer_raised
    # An exception raised after the first failure (numarun's SIGINT, say) is a consequence.
    late = _report(
        1, "terminated", -2, error=WorkerError("KeyboardInterrupt: ", "tb", 1000, 1000.40),
        ended_at=1000.60,
    )  # fmt: skip
    assert root_cause([peer, late]) is peer
    # Of two ranks that raised before the first death seen, the one that raised first.
    second = _report(
        3, "terminated", -15, error=WorkerError("RuntimeError: too", "tb", 1000, 1000.20),
        ended_at=1000.60,
    )  # fmt: skip
    assert root_cause([peer, second, raiser]) is raiser
    # torch's @record files carry whole seconds only: torchrun's rule, unchanged.
    recorded = _report(1, "terminated", -15, error=WorkerError("x", "tb", 999), ended_at=1000.6)
    assert root_cause([peer, recorded]) is peer


def test_the_summary_says_a_stopped_root_cause_raised_first() -> None:
    raiser = _report(
        1, "terminated", -15, error=WorkerError("RuntimeError: out of data", "tb", 1000, 1000.1),
        ended_at=1000.6, signal_name="SIGTERM",
    )  # fmt: skip
    peer = _report(0, "failed", 3, ended_at=1000.3)
    text = format_summary([peer, raiser], entrypoint="train.py", host="h", log_dir=None)
    assert (
        "Root cause: rank 1 (local_rank 1, pid 4001) raised first (stopped by numarun while it "
        "exited: signal SIGTERM (-15))" in text
    )
    assert "  error    : RuntimeError: out of data" in text
    assert "  rank 0: failed with exit code 3" in text


def test_root_cause_none_when_nothing_failed_on_its_own() -> None:
    assert root_cause([_report(0, "terminated", -15), _report(1, "succeeded", 0)]) is None
    assert root_cause([]) is None


def test_summary_shows_the_root_cause_with_traceback_then_the_others(tmp_path: Path) -> None:
    traceback_text = (
        'Traceback (most recent call last):\n  File "train.py", line 9\nValueError: boom\n'
    )
    reports = [
        _report(0, "succeeded", 0),
        _report(2, "terminated", -15, signal_name="SIGTERM"),
        _report(
            1,
            "failed",
            3,
            error=WorkerError("ValueError: boom", traceback_text, 1712345678),
            log_dir=tmp_path / "1",
        ),
    ]
    text = format_summary(reports, entrypoint="train.py", host="node7", log_dir=tmp_path)
    lines = text.splitlines()
    assert lines[0] == lines[-1] == "=" * 72
    assert "train.py FAILED on node7" in lines[1] and "3 workers" in lines[1]
    cause = text.index("Root cause: rank 1 (local_rank 1, pid 4001) failed with exit code 3")
    assert text.index("ValueError: boom", cause) > cause
    assert "    Traceback (most recent call last):" in lines
    assert f"  logs     : {tmp_path / '1'}" in lines
    assert "  error    : ValueError: boom" in lines
    others = text.index("Other ranks:")
    assert others > text.index("    ValueError: boom")
    assert lines.index("  rank 0: succeeded") < lines.index(
        "  rank 2: terminated by numarun after rank 1 failed"
    )
    assert f"Logs: {tmp_path}" in lines
    assert not text.endswith("\n")


def test_summary_for_a_signal_death_without_error_file_shows_stderr_tail(tmp_path: Path) -> None:
    (tmp_path / "stderr.log").write_text(
        "".join(f"noise {i}\n" for i in range(100))
        + 'Fatal Python error: Segmentation fault\n  File "train.py", line 3 in <module>\n'
    )
    reports = [_report(0, "failed", -11, signal_name="SIGSEGV", log_dir=tmp_path)]
    text = format_summary(reports, entrypoint="train.py", host="h", log_dir=None)
    assert "failed with signal SIGSEGV (-11)" in text
    assert "traceback: no traceback (worker did not write an error file)" in text
    assert "    Fatal Python error: Segmentation fault" in text.splitlines()
    assert "noise 80" not in text and "noise 85" in text  # the last 20 lines only
    assert "Other ranks" not in text and "Logs:" not in text


def test_summary_without_logs_says_there_is_no_traceback() -> None:
    text = format_summary([_report(0, "failed", 1)], entrypoint="x", host="h", log_dir=None)
    assert "traceback: no traceback (worker did not write an error file)" in text
    assert "last lines" not in text


def test_summary_collapses_512_ranks() -> None:
    reports = [_report(0, "succeeded", 0)]
    reports.append(_report(1, "failed", 1, ended_at=10.0))
    reports += [_report(r, "terminated", -15, ended_at=20.0) for r in range(2, 256)]
    reports += [_report(r, "failed", 1, ended_at=30.0 + r) for r in range(256, 510)]
    reports.append(_report(510, "unkillable", None, pid=123, proc_state="D"))
    reports.append(_report(511, "terminated", -15))
    text = format_summary(reports[::-1], entrypoint="train.py", host="h", log_dir="/logs")
    lines = text.splitlines()
    assert len(lines) < 20
    assert "Root cause: rank 1 (local_rank 1, pid 4001) failed with exit code 1" in text
    assert "  ranks 2-255,511: terminated by numarun after rank 1 failed" in lines
    assert "  ranks 256-509: failed with exit code 1" in lines
    assert "  rank 510: unkillable pid 123 state D" in lines
    assert "  rank 0: succeeded" in lines
    assert "512 workers: " in lines[1]


def test_summary_lists_many_unkillable_pids_bounded() -> None:
    reports = [_report(0, "failed", 1)]
    reports += [_report(r, "unkillable", None, proc_state="D") for r in range(1, 21)]
    text = format_summary(reports, entrypoint="x", host="h", log_dir=None)
    pids = ",".join(str(4000 + rank) for rank in range(1, 9))
    assert f"  ranks 1-20: unkillable pids {pids},... (12 more) state D" in text.splitlines()


def test_summary_when_numarun_stopped_the_run() -> None:
    reports = [_report(0, "terminated", -15), _report(1, "terminated", -15)]
    text = format_summary(reports, entrypoint="x", host="h", log_dir=None)
    assert "no worker failed on its own" in text
    assert "  ranks 0-1: terminated by numarun" in text.splitlines()


def test_rank_report_reads_the_error_file(tmp_path: Path) -> None:
    class Exit:  # the shape of supervisor.WorkerExit
        local_rank, rank, pid, exit_code, signal_name = 1, 9, 77, 1, None
        state, ended_at, proc_state = "failed", 5.0, None

    path = tmp_path / "e.json"
    path.write_text(json.dumps({"message": "boom", "timestamp": "4"}))
    report = rank_report(Exit(), error_file=path, log_dir=tmp_path)
    assert report == RankReport(
        1, 9, 77, 1, None, "failed", WorkerError("boom", None, 4), tmp_path, 5.0
    )
    assert rank_report(Exit(), error_file=None, log_dir=None).error is None


# ---------------------------------------------------------------- with the real supervisor


_RANKED_WORKER = textwrap.dedent(
    """
    import os, sys
    rank = int(os.environ["RANK"])
    for i in range(20000):
        print(f"r{rank} line {i}")
    print(f"r{rank} to stderr", file=sys.stderr)
    if rank == 1:
        raise ValueError("rank 1 gave up")
    """
)


def test_tee_error_file_and_summary_through_the_supervisor(tmp_path: Path) -> None:
    from numarun.files.logdir import error_file_path, make_log_dirs
    from numarun.launch.output import sinks_for
    from numarun.launch.workersetup import SCRIPT_BOOTSTRAP
    from numarun.process.spec import WorkerSpec
    from numarun.process.supervisor import Supervisor

    (tmp_path / "worker.py").write_text(_RANKED_WORKER)
    attempt = make_log_dirs(tmp_path / "logs", "run1", 2)
    console_out = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT)
    console_err = os.open(tmp_path / "err", os.O_WRONLY | os.O_CREAT)
    specs = []
    for rank in range(2):
        out, err = sinks_for(rank, rank, 0, 3, attempt / str(rank), True, console_out, console_err)
        env = {**os.environ, "RANK": str(rank)}
        env["TORCHELASTIC_ERROR_FILE"] = str(error_file_path(attempt, rank))
        argv = [sys.executable, "-u", "-c", SCRIPT_BOOTSTRAP, "--", "worker.py"]
        specs.append(WorkerSpec(rank, rank, env, argv, stdout=out, stderr=err, cwd=str(tmp_path)))
    supervisor = Supervisor(specs, grace_period=5.0, use_watchdog=False)
    supervisor.start()
    result = supervisor.wait(timeout=60)
    os.close(console_out)
    os.close(console_err)
    assert result is not None

    # Rank 1 raised; rank 0 either finished first or was torn down: its output up to then is
    # whole lines, in order, and exactly what its stdout.log holds.
    out_lines = (tmp_path / "out").read_text().splitlines()
    for rank in range(2):
        mine = [line for line in out_lines if line.startswith(f"[default{rank}]:")]
        assert mine == [f"[default{rank}]:r{rank} line {i}" for i in range(len(mine))]
        logged = (attempt / str(rank) / "stdout.log").read_text().splitlines()
        assert logged == [line.removeprefix(f"[default{rank}]:") for line in mine]
    assert len([line for line in out_lines if line.startswith("[default1]:")]) == 20000
    assert len(out_lines) == len([line for line in out_lines if line.startswith("[default")])
    assert "[default1]:ValueError: rank 1 gave up" in (tmp_path / "err").read_text().splitlines()

    reports = [
        rank_report(
            worker,
            error_file=error_file_path(attempt, worker.local_rank),
            log_dir=attempt / str(worker.local_rank),
        )
        for worker in result.workers
    ]
    text = format_summary(reports, entrypoint="worker.py", host="h", log_dir=attempt)
    assert "Root cause: rank 1 (local_rank 1" in text and "exit code 1" in text
    assert "    ValueError: rank 1 gave up" in text.splitlines()
    assert 'worker.py", line 8, in <module>' in text


def test_no_empty_stacks_heading_when_the_other_ranks_had_all_ended() -> None:
    # Rank 0 finished, then rank 1 called sys.exit(3): nobody was left to take stacks from.
    reports = [_report(0, "succeeded", 0), _report(1, "failed", 3)]
    text = format_summary(
        reports, entrypoint="x", host="h", log_dir=None, stacks_at_failure=(1, [])
    )
    assert "Other ranks when rank 1 failed:" not in text
    assert "Root cause: rank 1 (local_rank 1, pid 4001) failed with exit code 3" in text


def test_a_rank_still_starting_is_described_in_the_users_words() -> None:
    from numarun.stacks.dumps import NOT_ARMED
    from numarun.stacks.parse import RankStacks

    # A syntax error in the script: another rank had not reached the program yet.
    still_starting = RankStacks(rank=1, local_rank=1, pid=4001, problem=NOT_ARMED)
    reports = [_report(0, "failed", 1), _report(1, "terminated", -15)]
    text = format_summary(
        reports, entrypoint="x", host="h", log_dir=None, stacks_at_failure=(0, [still_starting])
    )
    (line,) = [line for line in text.splitlines() if line.startswith("  rank 1: no stacks")]
    assert "had not started the program's code" in line
    assert "signal" not in line and "handler" not in line  # numarun's internals stay inside

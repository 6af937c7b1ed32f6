"""numarun.launch.launcher: ``python -m numarun`` run as a user runs it, with tiny workers from
``tests/programs/``: environment and arguments, entry points, binding, logs, exit status,
signals, the dry run. The pure parts are tested by module: ``test_config.py`` (flags),
``test_clusterenv_facts.py`` (Slurm, Open MPI), ``test_workersetup.py`` (each worker's argv and
environment), ``test_outcome.py`` (exit status).
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from numarun.launch import launcher
from numarun.launch.launcher import LaunchConfig, parse_args

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
REPORT = str(PROGRAMS / "rank_report.py")
EXIT = str(PROGRAMS / "rank_exit.py")
WAIT = str(PROGRAMS / "signal_forward_wait.py")
SLOW_RAISER = str(PROGRAMS / "raiser_slow_to_exit.py")
CLEAN_ENV: dict[str, str] = {"PATH": os.environ.get("PATH", os.defpath)}


def parse(*argv: str, **environ: str) -> LaunchConfig:
    return parse_args(list(argv), {**CLEAN_ENV, **environ})


def test_help_prints_usage_and_returns_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert launcher.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: numarun [options]")
    assert "--nproc-per-node" in out and "--mem-binding" in out


def test_main_turns_bad_input_into_one_line_and_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert launcher.main(["--nproc-per-node", "two", "t.py"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("numarun: error: --nproc-per-node must be a positive integer")
    assert err.endswith("not 'two'\n") and err.count("\n") == 1


# --- real runs through ``python -m numarun`` ------------------------------------------------


def _child_env(**extra: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PET_", "SLURM_", "OMPI_", "TORCHELASTIC_"))
        and key not in ("OMP_NUM_THREADS", "MASTER_ADDR", "MASTER_PORT", "PYTHON_EXEC")
    }
    env.update(extra)
    return env


def launch(
    *argv: str, cwd: Path | None = None, timeout: float = 60, **extra: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "numarun", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=_child_env(**extra),
    )


def reports(stdout: str) -> dict[int, dict]:
    """The rank_report.py lines of a run, by global rank (prefixed tee lines included)."""
    found = {}
    for line in stdout.splitlines():
        start = line.find("{")
        if start >= 0:
            report = json.loads(line[start:])
            found[report["rank"]] = report
    return found


def test_workers_get_the_environment_and_their_arguments(tmp_path: Path) -> None:
    odd = ["--node", "1", "a b", "$HOME", "it's", "two\nlines", ""]
    done = launch("--nproc-per-node", "2", "--rdzv-id", "envtest", REPORT, *odd, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    found = reports(done.stdout)
    assert sorted(found) == [0, 1]
    ports = {found[rank]["env"]["MASTER_PORT"] for rank in found}
    assert len(ports) == 1 and int(ports.pop()) > 0
    for rank, report in found.items():
        env = report["env"]
        assert report["argv"] == odd
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == (str(rank), str(rank), "2")
        assert env["LOCAL_WORLD_SIZE"] == "2" and env["GROUP_RANK"] == "0"
        assert env["TORCHELASTIC_RUN_ID"] == "envtest"
        assert env["TORCHELASTIC_USE_AGENT_STORE"] == "False"
        assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
        assert int(env["OMP_NUM_THREADS"]) >= 1
        error_file = env["TORCHELASTIC_ERROR_FILE"]
        assert error_file.endswith(f"/envtest/attempt_0/{rank}/error.json")
        # No --log-dir: the temporary directory is gone after the run.
        assert not Path(error_file).parent.exists()


def test_a_slurm_job_step_sets_node_facts_from_the_environment(tmp_path: Path) -> None:
    slurm = {"SLURM_JOB_ID": "77", "SLURM_NODEID": "0", "SLURM_NNODES": "1"}
    done = launch(REPORT, cwd=tmp_path, SLURM_JOB_NODELIST="localhost,n[1-2]", **slurm)
    assert done.returncode == 0, done.stderr
    env = reports(done.stdout)[0]["env"]
    assert (env["MASTER_ADDR"], env["GROUP_WORLD_SIZE"], env["WORLD_SIZE"]) == (
        "localhost",
        "1",
        "1",
    )


def test_user_omp_num_threads_is_kept(tmp_path: Path) -> None:
    done = launch(REPORT, cwd=tmp_path, OMP_NUM_THREADS="5")
    assert done.returncode == 0, done.stderr
    assert reports(done.stdout)[0]["env"]["OMP_NUM_THREADS"] == "5"


def test_module_and_binary_entry_points(tmp_path: Path) -> None:
    done = launch("--nproc-per-node", "2", "-m", "rank_report", "x", cwd=PROGRAMS)
    assert done.returncode == 0, done.stderr
    assert sorted(reports(done.stdout)) == [0, 1]
    assert reports(done.stdout)[1]["argv"] == ["x"]
    shell = launch(
        "--nproc-per-node", "2", "--no-python", "sh", "-c", 'echo "r=$RANK"', cwd=tmp_path
    )
    assert shell.returncode == 0, shell.stderr
    assert sorted(shell.stdout.split()) == ["r=0", "r=1"]


def test_each_worker_is_bound_as_planned(tmp_path: Path) -> None:
    done = launch("--rank-cpus", "1", "--rank-cpus", "0", REPORT, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    found = reports(done.stdout)
    assert (found[0]["cpus"], found[1]["cpus"]) == ("1", "0")
    assert found[0]["env"]["OMP_NUM_THREADS"] == "1"


def test_cpu_mode_splits_the_cores_and_applies_the_memory_policy(tmp_path: Path) -> None:
    done = launch(
        "--nproc-per-node", "2", "--numa-binding", "cpu", "--mem-binding", "bind", REPORT,
        cwd=tmp_path, NUMARUN_TEST_MEMPOLICY="1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = reports(done.stdout)
    assert sorted(report["cpus"] for report in found.values()) == ["0", "1"]
    assert all(report["mem"] == ["bind", [0]] for report in found.values())
    unbound = launch(REPORT, cwd=tmp_path, NUMARUN_TEST_MEMPOLICY="1")
    assert reports(unbound.stdout)[0]["mem"] == ["default", []]


def test_redirects_write_files_in_torchruns_layout(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    done = launch(
        "--nproc-per-node",
        "2",
        "--log-dir",
        str(logs),
        "--rdzv-id",
        "job1",
        "-r",
        "0:1,1:3",
        REPORT,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert reports(done.stdout) == {}  # both ranks' stdout went to files
    for rank in (0, 1):
        stdout = (logs / "job1/attempt_0" / str(rank) / "stdout.log").read_text()
        assert reports(stdout)[rank]["env"]["TORCHELASTIC_ERROR_FILE"] == str(
            logs / "job1/attempt_0" / str(rank) / "error.json"
        )
    assert (logs / "job1/attempt_0/1/stderr.log").exists()
    assert not (logs / "job1/attempt_0/0/stderr.log").exists()


def test_tee_prefixes_console_lines_and_filter_hides_ranks(tmp_path: Path) -> None:
    done = launch("--nproc-per-node", "2", "--tee", "3", REPORT, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if "{" in line]
    assert sorted(line.split("{", 1)[0] for line in lines) == ["[default0]:", "[default1]:"]
    # tee'd files live in a temporary dir, kept after a failure: the start line says where
    (start,) = done.stderr.splitlines()
    assert re.search(r", logs in \S+/numarun_\w+ \(removed if the run succeeds", start), start
    shown = launch("--nproc-per-node", "2", "--local-ranks-filter", "1", REPORT, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert sorted(reports(shown.stdout)) == [1]


def test_a_ranks_filter_beyond_the_local_ranks_runs_with_one_warning(tmp_path: Path) -> None:
    # torchrun accepts --local-ranks-filter 0,1,2,3 with 2 processes (torchchat's scripts pass
    # it on machines with fewer GPUs); numarun used to refuse it.
    config = parse("--nproc-per-node", "2", "--local-ranks-filter", "0,1,2,3", "t.py")
    assert len(config.warnings) == 1 and "local ranks 2, 3" in config.warnings[0]
    done = launch(
        "--nproc-per-node", "2", "--local-ranks-filter", "1,2,3", REPORT, cwd=tmp_path
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(reports(done.stdout)) == [1]
    warnings = [line for line in done.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1, done.stderr
    assert warnings[0].startswith("numarun: warning: --local-ranks-filter '1,2,3' names local")


def _last_block(stderr: str) -> str:
    """The failure summary: from the last '====' rule that opens a block to the end."""
    lines = stderr.rstrip("\n").splitlines()
    assert lines and lines[-1].startswith("====="), stderr
    start = max(i for i, line in enumerate(lines[:-1]) if line.startswith("====="))
    return "\n".join(lines[start:])


def test_worker_exit_code_becomes_the_launchers_and_summary_comes_last(tmp_path: Path) -> None:
    done = launch("--nproc-per-node", "2", EXIT, "1", "code", "3", cwd=tmp_path)
    assert done.returncode == 3
    summary = _last_block(done.stderr)
    assert "rank 1" in summary and "exit code 3" in summary


def test_worker_killed_by_signal_gives_128_plus_n(tmp_path: Path) -> None:
    done = launch("--nproc-per-node", "2", EXIT, "0", "signal", "9", cwd=tmp_path)
    assert done.returncode == 137
    assert "SIGKILL" in _last_block(done.stderr)


def test_raising_worker_summary_has_rank_and_traceback(tmp_path: Path) -> None:
    done = launch("--nproc-per-node", "2", EXIT, "1", "raise", "boom-from-rank-one", cwd=tmp_path)
    assert done.returncode == 1
    summary = _last_block(done.stderr)
    assert "rank 1" in summary
    assert "RuntimeError: boom-from-rank-one" in summary
    assert "Traceback" in summary and "rank_exit.py" in summary


def test_a_rank_that_raised_first_is_the_root_cause_though_a_peer_died_first(
    tmp_path: Path,
) -> None:
    # Rank 1 raises and is slow to exit (a mark, then 60 s in an atexit handler); rank 0 dies
    # with exit 3 on seeing the mark, so numarun sees rank 0's death first and stops rank 1.
    done = launch(
        "--nproc-per-node", "2", "--grace-period", "2", SLOW_RAISER, str(tmp_path), cwd=tmp_path,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr  # the first failure seen, as documented
    summary = _last_block(done.stderr)
    cause = next(line for line in summary.splitlines() if line.startswith("Root cause:"))
    assert cause.startswith("Root cause: rank 1 (local_rank 1, pid "), summary
    assert "raised first (stopped by numarun while it exited: signal SIGTERM (-15))" in cause
    assert "RuntimeError: rank 1 ran out of data" in summary
    assert "  rank 0: failed with exit code 3" in summary


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["missing.py"], "not found"),
        (["-m", "no_such_module_here"], "module 'no_such_module_here' not found"),
        (["--no-python", "./not-executable.txt"], "not executable"),
        (["--nproc-per-node", "0", REPORT], "at least 1"),
        (["--redirects", "0:9", REPORT], "--redirects"),
        (["-m", "--no-python", REPORT], "cannot be combined"),
        (["--nproc-per-node", "2", "--rank-cpus", "0", REPORT], "one per local rank"),
        (["--rank-cpus", "0", "--rank-cpus", "64", REPORT], "64"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_starts_nothing(
    tmp_path: Path, argv: list[str], message: str
) -> None:
    (tmp_path / "not-executable.txt").write_text("echo hi\n")
    done = launch(*argv, cwd=tmp_path, NUMARUN_TEST_REPORT_DIR=str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("numarun: error: ")
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert list(tmp_path.glob("*.json")) == []  # no worker ran
    assert done.stdout == ""


def test_dry_run_prints_plan_env_and_argv_and_starts_nothing(tmp_path: Path) -> None:
    done = launch(
        "--dry-run",
        "--rank-cpus",
        "1",
        "--rank-cpus",
        "0",
        REPORT,
        "--lr",
        "a b",
        cwd=tmp_path,
        NUMARUN_TEST_REPORT_DIR=str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    assert "explicit" in done.stdout
    assert "local rank 1 (rank 1, cpus 0):" in done.stdout
    bootstrap = "-c 'from numarun.worker.bootstrap import main; main()'"
    assert f"{bootstrap} -- {REPORT} --lr 'a b'" in done.stdout
    assert "env:  RANK=1" in done.stdout and "env:  WORLD_SIZE=2" in done.stdout
    assert list(tmp_path.glob("*.json")) == []


def test_dry_run_plans_for_a_fake_machine(tmp_path: Path, gpu_root: Path) -> None:
    root = gpu_root
    done = launch(
        "--dry-run",
        "--sysfs-root",
        str(root),
        "--nproc-per-node",
        "gpu",
        "--numa-binding",
        "exclusive",
        REPORT,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "local rank 3 (rank 3, cpus 24-31):" in done.stdout
    assert "local rank 0 (rank 0, cpus 0-7):" in done.stdout
    assert "env:  CUDA_DEVICE_ORDER=PCI_BUS_ID" in done.stdout
    assert "env:  OMP_NUM_THREADS=8" in done.stdout


def _complete(path: Path) -> bool:
    """The file exists and ends a line: the worker appends a whole line, but not atomically."""
    return path.exists() and path.read_text().endswith("\n")


def _wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _start_waiting_job(
    tmp_path: Path, nproc: int = 2, **popen: object
) -> tuple[subprocess.Popen[str], list[int]]:
    job = subprocess.Popen(
        [sys.executable, "-m", "numarun", "--nproc-per-node", str(nproc), WAIT, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_child_env(),
        **popen,
    )
    pid_files = [tmp_path / f"{rank}.pid" for rank in range(nproc)]
    try:
        _wait_for(lambda: all(path.exists() for path in pid_files) or job.poll() is not None)
        assert job.poll() is None, job.communicate()
    except BaseException:
        _end_job(job, tmp_path)
        raise
    return job, [int(path.read_text()) for path in pid_files]


def _end_job(job: subprocess.Popen[str], tmp_path: Path) -> str:
    """Let the workers finish; kill the launcher if it does not end (no test leaves one)."""
    (tmp_path / "stop").touch()
    try:
        return job.communicate(timeout=30)[1]
    except subprocess.TimeoutExpired:
        job.kill()
        return job.communicate()[1]


@pytest.mark.parametrize(("signum", "expected"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_to_launcher_tears_down_and_exits_128_plus_n(
    tmp_path: Path, signum: int, expected: int
) -> None:
    job, pids = _start_waiting_job(tmp_path)
    try:
        job.send_signal(signum)
        _, stderr = job.communicate(timeout=30)
    finally:
        _end_job(job, tmp_path)
    assert job.returncode == expected, stderr
    assert not any(_alive(pid) for pid in pids)


def test_sigusr1_is_forwarded_and_the_job_keeps_running(tmp_path: Path) -> None:
    job, _ = _start_waiting_job(tmp_path)
    try:
        job.send_signal(signal.SIGUSR1)
        marks = [tmp_path / f"{rank}.signals" for rank in (0, 1)]
        _wait_for(lambda: all(_complete(path) for path in marks))
        assert job.poll() is None
        assert all(path.read_text() == "SIGUSR1\n" for path in marks)
    finally:
        stderr = _end_job(job, tmp_path)
    assert job.returncode == 0, stderr


def _ignore_sighup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def test_a_hangup_ignored_as_under_nohup_leaves_the_job_running(tmp_path: Path) -> None:
    # pytorch/pytorch#76894: under nohup, torchrun's workers "Received 1 death signal".
    job, pids = _start_waiting_job(tmp_path, preexec_fn=_ignore_sighup)
    try:
        job.send_signal(signal.SIGHUP)
        time.sleep(0.5)  # a teardown would have begun by now
        assert job.poll() is None
        assert all(_alive(pid) for pid in pids)
    finally:
        stderr = _end_job(job, tmp_path)
    assert job.returncode == 0, stderr


def test_tee_through_the_launcher_loses_nothing(tmp_path: Path) -> None:
    # 1,000,000 lines across 4 ranks, each line written in two halves.
    per_rank = 250_000
    console = tmp_path / "console.txt"
    with console.open("wb") as out:
        job = subprocess.run(
            [sys.executable, "-m", "numarun", "--nproc-per-node", "4", "--tee", "3",
             "--log-dir", str(tmp_path / "logs"), str(PROGRAMS / "half_line_writer.py"),
             str(per_rank)],
            stdout=out, stderr=subprocess.PIPE, env=_child_env(), timeout=300,
        )  # fmt: skip
    assert job.returncode == 0, job.stderr
    lines = console.read_bytes().split(b"\n")
    assert lines.pop() == b""
    assert len(lines) == 4 * per_rank
    next_line = [0, 0, 0, 0]
    for line in lines:
        prefix, _, text = line.partition(b"]:")
        rank = int(prefix.removeprefix(b"[default"))
        assert text == b"r%d line %d" % (rank, next_line[rank]), line[:200]
        next_line[rank] += 1
    assert next_line == [per_rank] * 4
    logs = sorted((tmp_path / "logs").glob("*/attempt_0/*/stdout.log"))
    assert len(logs) == 4
    for rank, log in enumerate(logs):
        assert log.read_bytes() == b"".join(b"r%d line %d\n" % (rank, i) for i in range(per_rank))


def test_tee_shows_a_line_while_its_worker_still_runs(tmp_path: Path) -> None:
    # Live, not at exit: the worker waits for the test to have seen its line on the console.
    worker = tmp_path / "live.py"
    worker.write_text(
        "import os, sys, time\n"
        "print('hello', flush=True)\n"
        "while not os.path.exists(sys.argv[1]):\n"
        "    time.sleep(0.01)\n"
    )
    go = tmp_path / "go"
    job = subprocess.Popen(
        [sys.executable, "-m", "numarun", "--tee", "3", str(worker), str(go)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_child_env(),
    )
    try:
        assert job.stdout is not None
        ready, _, _ = select.select([job.stdout], [], [], 30)
        assert ready, "the tee'd line did not reach the console while the worker ran"
        assert job.stdout.readline() == b"[default0]:hello\n"
        assert job.poll() is None
    finally:
        go.touch()
        _, stderr = job.communicate(timeout=30)
    assert job.returncode == 0, stderr

"""Starting at the machine's limits: out of file descriptors, absurd worker counts, a SIGTERM
while thousands of workers start. Each ends in one line (or 128+N for the signal), with nothing
left behind: no process, no temporary directory.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from job_processes import processes_with_env

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
SRC = Path(__file__).resolve().parents[2] / "src"
LIMIT = 120.0


def _env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "NUMARUN_RUN_ID"}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    env.pop("PET_NPROC_PER_NODE", None)
    env.update(extra)
    return env


# --- issue 16, item 3: out of file descriptors at start ------------------------------------------


def _with_fd_limit(limit: int):  # type: ignore[no-untyped-def]
    def preexec() -> None:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))

    return preexec


def _launch_with_fd_limit(
    limit: int, workers: int, flags: list[str], tmp: Path, script: Path
) -> tuple[int, str, list[int]]:
    """(exit status, stderr, processes of the job left) of one launch under ``ulimit -n``."""
    token = f"SL_TOKEN={uuid.uuid4().hex}"
    done = subprocess.run(
        [sys.executable, "-m", "numarun", "--nproc-per-node", str(workers), *flags, str(script)],
        capture_output=True,
        text=True,
        env=_env(TMPDIR=str(tmp), SL_TOKEN=token.split("=", 1)[1]),
        preexec_fn=_with_fd_limit(limit),
        timeout=LIMIT,
    )
    return done.returncode, done.stderr, processes_with_env(token)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [3, 5, 8])
@pytest.mark.parametrize("flags", [[], ["--tee", "3"], ["--redirects", "3"]], ids=str)
def test_out_of_file_descriptors_at_start_is_one_line_and_leaves_nothing(
    flags: list[str], workers: int, tmp_path: Path
) -> None:
    """``ulimit -n`` from a few fds up to enough, 3, 5 and 8 workers: every launch either runs
    or ends with exit 2 and one error line (no traceback, no warning), and leaves no process
    and, when it did not run, no temporary directory. The sweep stops two limits after the
    first success."""
    script = tmp_path / "hello.py"
    script.write_text("print('hello')\n")
    seen_failure = False
    successes = 0
    # Each rank costs the launcher about 13 fds with --tee (pipes, log files, its stacks files,
    # its helper's FIFO and answer files): 8 workers start from about 110.
    for limit in range(6, 160):
        tmp = tmp_path / f"tmp-{workers}-{limit}"
        tmp.mkdir()
        code, stderr, left = _launch_with_fd_limit(limit, workers, flags, tmp, script)
        case = f"ulimit -n {limit}, {workers} workers {flags}: exit {code}\n{stderr}"
        assert "Traceback" not in stderr, case
        assert left == [], case
        if code == 0:
            successes += 1
            if successes >= 2:
                break
            continue
        seen_failure = True
        assert code == 2, case
        errors = [line for line in stderr.splitlines() if line.startswith("numarun: error:")]
        assert len(errors) == 1, case
        assert "numarun: warning:" not in stderr, case
        assert list(tmp.iterdir()) == [], case
    assert successes >= 2, f"{workers} workers never ran under ulimit -n < 160 {flags}"
    assert seen_failure  # the sweep did reach limits too low to start


# --- issue 16, item 4: absurd counts, a SIGTERM while thousands start ----------------------------


def test_an_absurd_worker_count_is_one_line_before_anything_is_made(tmp_path: Path) -> None:
    """``--nproc-per-node 1000000000`` used to build a billion environments until the OOM
    killer came: it is bounded by what the machine can start (kernel.pid_max here)."""
    script = tmp_path / "hello.py"
    script.write_text("print('hello')\n")
    done = subprocess.run(
        [sys.executable, "-m", "numarun", "--nproc-per-node", "1000000000", str(script)],
        capture_output=True,
        text=True,
        env=_env(TMPDIR=str(tmp_path)),
        timeout=LIMIT,
    )
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("numarun: error:")]
    assert len(errors) == 1, done.stderr
    assert "--nproc-per-node 1000000000: more workers than this machine can start" in errors[0]
    assert "Traceback" not in done.stderr
    assert [path.name for path in tmp_path.iterdir()] == ["hello.py"]


def test_spawn_refuses_an_absurd_nprocs_naming_the_keyword() -> None:
    import numarun
    from numarun.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match=r"^nprocs=1000000000: more workers than"):
        numarun.spawn(print, nprocs=1_000_000_000)


def test_the_launcher_and_spawn_share_one_bound() -> None:
    """Both ask numarun.process.capacity; the bound is the smallest of the machine's limits."""
    from numarun.process import capacity

    limit, reason = capacity.worker_limit()
    with open("/proc/sys/kernel/pid_max") as pid_max:
        assert limit < int(pid_max.read())
    assert reason
    assert capacity.worker_count_problem(limit) is None
    assert capacity.worker_count_problem(limit + 1) is not None
    assert capacity.worker_count_problem(capacity.ALWAYS_FINE) is None


def _unshare() -> list[str]:
    unshare = shutil.which("unshare")
    assert unshare is not None, "util-linux's unshare builds the pid namespace fixture"
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return [unshare, *user, "--pid", "--fork", "--mount-proc"]


def test_sigterm_while_1500_workers_start_ends_the_launch_at_once(tmp_path: Path) -> None:
    """A SIGTERM soon after the first workers exist, while 1,500 are being started (in a pid
    namespace: whatever happens stays in it). The launch ends with 143 well within the
    issue's 3 s (asserted: 15 s, on a loaded machine; measured: benchmarks/bench_start_signal.py),
    the workers not yet started are never started, nothing of the job is left. Before: the
    start went on to the end (a watchdog unable to watch more than 1,023 fds died), exit 2."""
    count = 1500
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < count + 200:
        pytest.skip(f"the hard open-file limit ({hard}) is too low for {count} workers")
    sleep = shutil.which("sleep")
    assert sleep is not None
    # The temporary log directory on tmpfs where there is one: creating and removing 1,500
    # rank directories on a slow disk is not what this test measures.
    tmp = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp_path
    tmp = Path(shutil.os.path.realpath(tmp)) / f"numarun-test-{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        done = subprocess.run(
            [
                *_unshare(),
                sys.executable,
                str(PROGRAMS / "pidns_sigterm_mid_start.py"),
                str(count),
                sleep,
            ],
            capture_output=True,
            text=True,
            env=_env(TMPDIR=str(tmp)),
            preexec_fn=_with_fd_limit(hard if hard != resource.RLIM_INFINITY else 65536),
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout.splitlines()[-1])
        assert list(tmp.iterdir()) == [], result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert result["at_signal"] < count, result  # the signal came while they started
    assert result["code"] == 143, result["stderr"]
    assert result["seconds"] < 15.0, result
    assert result["left"] == [], result
    assert "not started" in result["stderr"], result["stderr"]
    assert "Traceback" not in result["stderr"]


PRE_EXEC_SIGNAL = """
import os, signal, sys, time
from numarun.process import forkexec
from numarun.process.spec import WorkerSpec

signal.signal(signal.SIGTERM, lambda signum, frame: None)  # as the supervisor's handler
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # as the watchdog forks
error_r, error_w = os.pipe()
pid = os.fork()
if pid == 0:
    os.kill(os.getpid(), signal.SIGTERM)  # a teardown signal, before exec
    spec = WorkerSpec(local_rank=0, rank=0, env={}, argv=[sys.argv[1], "30"])
    forkexec.exec_child(error_w, os.getppid(), spec, sys.argv[1], {}, [], None, None,
                        [signal.SIGTERM])
os.close(error_w)
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        print(os.waitstatus_to_exitcode(status))
        break
    time.sleep(0.05)
else:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    print("survived")
"""


def test_a_teardown_signal_before_exec_is_not_swallowed_by_the_supervisors_handler() -> None:
    """A worker forked while the supervisor's no-op handler is installed, and sent SIGTERM
    before it execs (a teardown while thousands start), must die of it: exec would reset the
    handler, but the signal would already be gone, and the worker would run until SIGKILL at
    the end of the grace period. The watchdog forks with every signal blocked; the child sets
    the handled signals to their defaults first, then unblocks."""
    sleep = shutil.which("sleep")
    assert sleep is not None
    done = subprocess.run(
        [sys.executable, "-c", PRE_EXEC_SIGNAL, sleep],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=LIMIT,
    )
    assert done.stdout.strip() == str(-signal.SIGTERM), done.stdout + done.stderr

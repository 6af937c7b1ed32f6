"""The launcher's files: error files that a planted symbolic link cannot redirect, log
directories of other users refused, what becomes of the temporary directory, and running out of
file descriptors. Each job runs as ``python -m numarun`` in a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from job_processes import processes_with_env
from numarun.launch import errorfile

PY = sys.executable
ENV = {key: value for key, value in os.environ.items() if key != "NUMARUN_RUN_ID"}
LIMIT = 120.0

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="a directory of another user needs root (chown)"
)


def launcher_env(**extra: str) -> dict[str, str]:
    env = dict(ENV)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("PET_NPROC_PER_NODE", None)
    env.update(extra)
    return env


def script(tmp_path: Path, name: str, code: str) -> str:
    path = tmp_path / name
    path.write_text(code)
    return str(path)


def numarun(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "numarun", *args],
        env=launcher_env(**env),
        capture_output=True,
        text=True,
        timeout=LIMIT,
    )


def carrying(token: str) -> list[int]:
    """The live processes whose environment holds ``TD_TOKEN=<token>``."""
    return processes_with_env(f"TD_TOKEN={token}")


# --- item 2: error files and log directories -----------------------------------------------------


def test_error_file_never_follows_a_link_planted_at_its_temporary_name(tmp_path: Path) -> None:
    """Whoever controls the directory can plant a symbolic link at the name the temporary file
    used to get (``.error.json.<pid>.tmp``): the link's target stays untouched."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    planted = tmp_path / f".error.json.{os.getpid()}.tmp"
    planted.symlink_to(victim)
    target = tmp_path / "error.json"
    try:
        raise ValueError("boom")
    except ValueError as exc:
        errorfile.write_error_file(target, exc)
    assert victim.read_text() == "precious"
    assert json.loads(target.read_text())["message"]["message"] == "ValueError: boom"
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        [planted.name, "error.json", "victim"]
    )


@needs_root
@pytest.mark.parametrize("where", ["--log-dir", "TMPDIR"])
def test_a_directory_of_another_user_is_refused_and_nothing_starts(
    where: str, tmp_path: Path
) -> None:
    """As root, a --log-dir (or, without it, a TMPDIR) owned by uid 65534 is refused in one
    line, exit status 2: its owner could swap our directories for links and make root write
    anywhere."""
    logs = tmp_path / "logs"
    logs.mkdir()
    os.chown(logs, 65534, 65534)
    started = tmp_path / "started"
    worker = script(tmp_path, "w.py", f"open({str(started)!r}, 'w').close()\n")
    flags = ["--log-dir", str(logs)] if where == "--log-dir" else []
    job = numarun(*flags, "--nproc-per-node", "1", worker, TMPDIR=str(logs))
    assert job.returncode == 2
    (line,) = job.stderr.splitlines()
    assert line.startswith("numarun: error: ") and "belongs to another user (uid 65534)" in line
    assert not started.exists() and list(logs.iterdir()) == []


# --- item 12: out of file descriptors ------------------------------------------------------------

LOW_FD_LIMIT = (
    "import resource, sys\n"
    "resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))\n"
    "from numarun.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


@pytest.mark.parametrize("flags", [["--tee", "3"], ["--local-ranks-filter", "0"]])
def test_running_out_of_fds_is_one_line_and_leaves_nothing(
    flags: list[str], tmp_path: Path
) -> None:
    """ulimit -n 64 and 40 ranks: with --tee the log files run out, with hidden ranks the
    pipes (inside the supervisor). Either way: one line naming the limit, exit status 2, no
    traceback, no temporary directory, no process."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    token = os.urandom(8).hex()
    worker = script(tmp_path, "w.py", "import time; time.sleep(30)\n")
    job = subprocess.run(
        # -q: the start line (printed before the supervisor runs out of fds) is not the point
        [PY, "-c", LOW_FD_LIMIT, "-q", "--nproc-per-node", "40", *flags, worker],
        env=launcher_env(TMPDIR=str(temp), TD_TOKEN=token),
        capture_output=True,
        text=True,
        timeout=LIMIT,
    )
    assert job.returncode == 2, job.stderr
    (line,) = job.stderr.splitlines()
    assert line.startswith("numarun: error: ") and "limit is 64" in line and "ulimit -n" in line
    assert list(temp.iterdir()) == []
    assert carrying(token) == []


# --- item 17: the temporary log directory --------------------------------------------------------

OK = "print('hello from', __import__('os').environ['RANK'])\n"
FAIL = "import os, sys\nprint('bye'); sys.exit(3 if os.environ['RANK'] == '1' else 0)\n"


def test_tee_copies_are_removed_after_success_and_kept_and_named_after_failure(
    tmp_path: Path,
) -> None:
    """--tee without --log-dir: the console showed every line, so the files go when the run
    succeeds; after a failure they stay, and the summary says where."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    ok = numarun(
        "--nproc-per-node", "2", "--tee", "3", script(tmp_path, "ok.py", OK), TMPDIR=str(temp)
    )
    assert ok.returncode == 0 and "[default1]:hello from 1" in ok.stdout
    assert list(temp.iterdir()) == []
    assert "removed if the run succeeds" in ok.stderr
    bad = numarun(
        "--nproc-per-node", "2", "--tee", "3", script(tmp_path, "bad.py", FAIL), TMPDIR=str(temp)
    )
    assert bad.returncode == 3
    (kept,) = temp.iterdir()
    assert str(kept) in bad.stderr.split("Root cause")[1]  # named by the summary, too
    assert next(kept.glob("*/attempt_0/1/stdout.log")).read_text() == "bye\n"


def test_output_only_in_files_is_kept_and_announced(tmp_path: Path) -> None:
    """--redirects without --log-dir: the files hold the only copy; they stay, announced."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    job = numarun(
        "--nproc-per-node", "2", "--redirects", "3", script(tmp_path, "ok.py", OK), TMPDIR=str(temp)
    )
    assert job.returncode == 0 and job.stdout == ""
    (kept,) = temp.iterdir()
    (start,) = job.stderr.splitlines()
    assert start.startswith("numarun: run ") and start.endswith(f", logs in {kept}")
    assert (next(kept.glob("*/attempt_0/1/stdout.log"))).read_text() == "hello from 1\n"


def test_a_directory_of_error_files_goes_even_when_numarun_is_killed(tmp_path: Path) -> None:
    """No --tee/--redirects: the directory only holds the workers' error files. SIGKILL the
    launcher: its watchdog removes the directory after killing the workers."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    running = tmp_path / "running"
    worker = script(
        tmp_path,
        "w.py",
        f"import time\nopen({str(running)!r} + __import__('os').environ['RANK'], 'w').close()\n"
        "time.sleep(60)\n",
    )
    job = subprocess.Popen(
        [PY, "-m", "numarun", "--nproc-per-node", "2", worker],
        env=launcher_env(TMPDIR=str(temp)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + LIMIT
        while not all(Path(f"{running}{rank}").exists() for rank in (0, 1)):
            assert time.monotonic() < deadline and job.poll() is None
            time.sleep(0.02)
        assert len(list(temp.iterdir())) == 1
        job.send_signal(signal.SIGKILL)
        job.wait()
        deadline = time.monotonic() + 10
        while list(temp.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(temp.iterdir()) == []
    finally:
        job.kill()
        job.wait()

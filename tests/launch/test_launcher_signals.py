"""Signals to the launcher, side by side with torchrun: what the workers receive first, the
exit status, the summary, and nothing left behind.

Each test runs a real 2-worker job (``tests/programs/first_signal_record.py``) under ``python -m
numarun`` and, where torchrun's behaviour is the claim, the same job under ``python -m
torch.distributed.run``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
INTERRUPT = str(PROGRAMS / "first_signal_record.py")
LAUNCHERS = {
    "numarun": [sys.executable, "-m", "numarun"],
    "torchrun": [sys.executable, "-m", "torch.distributed.run"],
}
START_LIMIT = 120.0  # torchrun imports torch before any worker starts; the machine is shared


def _env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("PET_NPROC_PER_NODE", None)
    return env


def _wait_for(condition: Callable[[], bool], limit: float = START_LIMIT) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _ignore(*signums: int) -> Callable[[], None]:
    """A preexec_fn: start the launcher as a non-interactive shell starts an `&` job."""

    def preexec() -> None:
        for signum in signums:
            signal.signal(signum, signal.SIG_IGN)

    return preexec


def _run_and_signal(
    launcher: str, out: Path, signum: int, *flags: str, ignored: tuple[int, ...] = ()
) -> tuple[int, str, list[int]]:
    """Start a 2-worker job, send ``signum`` to the launcher once both workers wait; return
    (exit status, stderr, worker pids). The launcher is killed if it does not end."""
    job = subprocess.Popen(
        [*LAUNCHERS[launcher], "--nproc-per-node", "2", *flags, INTERRUPT, str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        preexec_fn=_ignore(*ignored) if ignored else None,
    )
    pids: list[int] = []
    try:
        pid_files = [out / f"{rank}.pid" for rank in (0, 1)]
        _wait_for(lambda: all(path.exists() for path in pid_files) or job.poll() is not None)
        assert job.poll() is None, job.communicate()
        pids = [int(path.read_text()) for path in pid_files]
        job.send_signal(signum)
        _, stderr = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
        for pid in pids:  # never leave a worker behind, even when the test fails
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    return job.returncode, stderr, pids


def _saved(out: Path) -> list[str]:
    return [
        (out / f"{rank}.saved").read_text() if (out / f"{rank}.saved").exists() else ""
        for rank in (0, 1)
    ]


@pytest.mark.slow
@pytest.mark.parametrize("ignored", [(), (signal.SIGINT, signal.SIGQUIT)], ids=["fg", "bg"])
def test_ctrl_c_runs_every_workers_keyboard_interrupt_handler_like_torchrun(
    tmp_path: Path, ignored: tuple[int, ...]
) -> None:
    # "bg": started as `numarun ... &` from a script (SIGINT and SIGQUIT ignored); an explicit
    # kill -INT must still stop the job, and the workers must still see KeyboardInterrupt.
    outcomes = {}
    for launcher in LAUNCHERS:
        out = tmp_path / launcher
        out.mkdir()
        code, stderr, pids = _run_and_signal(launcher, out, signal.SIGINT, ignored=ignored)
        outcomes[launcher] = code
        assert _saved(out) == ["KeyboardInterrupt"] * 2, (launcher, stderr)
        assert not any(_alive(pid) for pid in pids), launcher
        if launcher == "numarun":
            assert code == 130, stderr
            assert "numarun stopped the run on SIGINT" in stderr
    assert outcomes["torchrun"] != 0  # torchrun exits 1 with a SignalException traceback


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGQUIT, 131)])
def test_sigterm_and_sigquit_reach_the_workers_first_and_the_summary_names_them(
    tmp_path: Path, signum: int, code: int
) -> None:
    name = signal.Signals(signum).name
    for launcher in LAUNCHERS:
        out = tmp_path / launcher
        out.mkdir()
        status, stderr, pids = _run_and_signal(launcher, out, signum)
        assert _saved(out) == [name, name], (launcher, stderr)
        assert not any(_alive(pid) for pid in pids), launcher
        if launcher == "numarun":
            assert status == code, stderr
            assert stderr.rstrip().endswith("=" * 72), stderr  # the summary comes last
            assert f"numarun stopped the run on {name}" in stderr
            assert "terminated by numarun" in stderr


def test_signals_to_handle_sigusr1_stops_the_job_with_sigusr1_first(tmp_path: Path) -> None:
    # torchrun's meaning: a listed signal is sent to the workers, SIGKILL after the timeout.
    # first_signal_record.py does not handle SIGUSR1, so its default action ends the workers.
    for launcher in LAUNCHERS:
        out = tmp_path / launcher
        out.mkdir()
        status, stderr, pids = _run_and_signal(
            launcher, out, signal.SIGUSR1, "--signals-to-handle", "SIGUSR1,SIGTERM"
        )
        assert status != 0, launcher
        assert not any(_alive(pid) for pid in pids), launcher
        if launcher == "numarun":
            assert status == 128 + signal.SIGUSR1, stderr
            assert "rank 0: terminated by numarun" in stderr or "ranks 0-1: terminated" in stderr
            assert "on SIGUSR1" in stderr


def test_a_failing_worker_still_tears_the_others_down_with_sigterm(tmp_path: Path) -> None:
    # Not a signal to the launcher: rank 1 fails, rank 0 must get SIGTERM (not SIGINT).
    worker = tmp_path / "fail.py"
    worker.write_text(
        "import os, runpy, sys\n"
        "if os.environ['RANK'] == '1':\n"
        "    import time\n"
        "    while not os.path.exists(os.path.join(sys.argv[1], '0.pid')):\n"
        "        time.sleep(0.05)\n"
        "    sys.exit(3)\n"
        f"runpy.run_path({INTERRUPT!r}, run_name='__main__')\n"
    )
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run(
        [*LAUNCHERS["numarun"], "--nproc-per-node", "2", str(worker), str(out)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert done.returncode == 3, done.stderr
    assert (out / "0.saved").read_text() == "SIGTERM"
    assert "numarun received" not in done.stderr


def test_sigterm_while_a_failure_tears_down_ends_the_job_with_no_restart(tmp_path: Path) -> None:
    """Rank 1 fails with restarts left; rank 0 is slow to end (its SIGTERM handler holds on);
    meanwhile the launcher gets SIGTERM (Slurm's scancel, a user giving up). The signal was
    taken only as a second request: the next attempt started and the job ran on. Now the
    job ends on it: 128+15, one attempt started."""
    worker = tmp_path / "fail_slowly.py"
    worker.write_text(
        "import os, signal, sys, time\n"
        "out = sys.argv[1]\n"
        "with open(os.path.join(out, 'starts'), 'a') as starts:\n"
        "    starts.write(os.environ['RANK'] + '\\n')\n"
        "if os.environ['RANK'] == '1':\n"
        "    while not os.path.exists(os.path.join(out, 'holding')):\n"
        "        time.sleep(0.05)\n"
        "    sys.exit(3)\n"
        "def asked(*args):\n"
        "    open(os.path.join(out, 'asked'), 'w').close()\n"
        "signal.signal(signal.SIGTERM, asked)\n"
        "open(os.path.join(out, 'holding'), 'w').close()\n"
        "time.sleep(120)\n"
    )
    out = tmp_path / "out"
    out.mkdir()
    launcher = subprocess.Popen(
        [*LAUNCHERS["numarun"], "--nproc-per-node", "2", "--max-restarts", "2", str(worker),
         str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
    )  # fmt: skip
    try:
        _wait_for(lambda: (out / "asked").exists())  # the failure's teardown has begun
        launcher.send_signal(signal.SIGTERM)
        _, stderr = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
    assert launcher.returncode == 128 + signal.SIGTERM, stderr
    assert sorted((out / "starts").read_text().split()) == ["0", "1"], stderr  # no restart
    assert "exit code 3" in stderr, stderr  # the failure is still named

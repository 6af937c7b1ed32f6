"""Issue 20, item 8: forking without touching the process's warning filters, sweeps that never
read a process that could block them, and waits that are all bounded.

Each blocking hazard is made real: a FIFO in place of a fake process's ``environ`` (opening it
blocks forever, as reading a real one does behind a process stuck in uninterruptible sleep),
a child whose SIGKILL is never delivered (the kill calls replaced). A call that would block is
run in a thread with a generous join limit, so that the test fails instead of hanging.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest

from numarun.process import children, proctable, watchdog
from numarun.process.spec import WorkerSpec
from numarun.process.supervisor import Supervisor

SRC = Path(__file__).resolve().parents[2] / "src"
LIMIT = 30.0  # what a bounded call gets before the test calls it blocked (a loaded machine)

# --- forking: no catch_warnings, native threads count ---------------------------------------


def test_starting_a_run_beside_other_threads_never_swaps_the_warning_filters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """warnings.catch_warnings() replaces the process-wide filter list for as long as it is
    entered: another thread's warnings meanwhile see numarun's filters, and two threads that
    overlap restore each other's lists. numarun must not enter it around its fork, threads or
    not (the standard library's own uses, such as os.get_exec_path's, are not numarun's)."""
    entered = []

    class Recording(warnings.catch_warnings):
        def __enter__(self):  # type: ignore[no-untyped-def]
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if caller.startswith("numarun"):
                entered.append(caller)
            return super().__enter__()

    monkeypatch.setattr(warnings, "catch_warnings", Recording)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, args=(LIMIT,), name="other")
    other.start()
    before = list(warnings.filters)
    try:
        spec = WorkerSpec(local_rank=0, rank=0, env={"PATH": os.defpath}, argv=["true"])
        result = Supervisor([spec]).run()
    finally:
        stop.set()
        other.join(LIMIT)
    assert result.workers[0].exit_code == 0
    assert entered == []
    added = [entry for entry in warnings.filters if entry not in before]
    # At most the one filter for numarun's own fork (Python 3.12+), nothing else changed.
    assert all(entry[0] == "ignore" and entry[2] is DeprecationWarning for entry in added)
    assert [entry for entry in before if entry not in warnings.filters] == []


NATIVE_THREAD_FORK = """
import faulthandler, os, warnings
faulthandler.dump_traceback_later(600)  # a native thread: threading never sees it
from numarun.process.spec import WorkerSpec
from numarun.process.supervisor import Supervisor
spec = WorkerSpec(local_rank=0, rank=0, env={"PATH": os.defpath}, argv=["true"])
print(Supervisor([spec]).run().workers[0].exit_code, flush=True)
"""


def _interpreter(version: str) -> str | None:
    """A working ``python<version>`` on this machine (PATH, or a pyenv build), else None."""
    candidates = [shutil.which(f"python{version}")]
    candidates += sorted(
        glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python3"))
    )
    for candidate in candidates:
        if candidate is None:
            continue
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            check = subprocess.run(
                [candidate, "-c", "import sys; print(sys.version_info[:2])"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            if check.returncode == 0 and check.stdout.strip() == str(
                tuple(map(int, version.split(".")))
            ):
                return candidate
    return None


@pytest.mark.parametrize("version", ["3.12", "3.13"])
def test_a_native_thread_does_not_make_the_fork_warn(version: str) -> None:
    """Python 3.12+ counts the kernel's threads (faulthandler's watchdog thread here) and warns
    at every os.fork(); threading.active_count() is 1 all the same. Run with -W always under
    each such interpreter found on this machine (numarun is pure Python)."""
    interpreter = _interpreter(version)
    if interpreter is None:
        pytest.skip(f"no Python {version} here; the warning exists from 3.12 on")
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run(
        [interpreter, "-W", "always::DeprecationWarning", "-c", NATIVE_THREAD_FORK],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.stdout.strip() == "0", done.stderr
    assert "multi-threaded" not in done.stderr, done.stderr


# --- sweeps never read what could block them -----------------------------------------------------


def _fake_process(root: Path, pid: int, state: str, uid: int, started: int) -> Path:
    """A /proc entry whose ``environ`` is a FIFO: opening it blocks until a writer comes."""
    entry = root / str(pid)
    entry.mkdir()
    # Fields after the name: state ppid pgrp session tty tpgid flags minflt cminflt majflt
    # cmajflt utime stime cutime cstime priority nice threads itrealvalue starttime.
    fields = [state, "1", str(pid), str(pid), *["0"] * 15, str(started)]
    (entry / "stat").write_text(f"{pid} (p) {' '.join(fields)}\n")
    (entry / "status").write_text(f"Name:\tp\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    os.mkfifo(entry / "environ")
    return entry / "environ"


def test_a_marker_sweep_never_reads_a_process_that_could_block_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading /proc/<pid>/environ takes the process's memory-map lock and blocks, unkillably,
    behind a process stuck in uninterruptible sleep. A forkserver run's sweep looks for the run
    marker in every process: it must skip processes in state D, other users' processes and
    processes older than the run before it reads any environment."""
    monkeypatch.setattr(proctable, "_pidfds_work", False)  # fake pids: nothing to pin
    since = 1000
    fifos = [
        _fake_process(tmp_path, 40, "D", os.getuid(), since + 5),  # stuck
        _fake_process(tmp_path, 41, "S", os.getuid() + 1, since + 5),  # another user's
        _fake_process(tmp_path, 42, "S", os.getuid(), since - 5),  # older than the run
    ]
    table = proctable.read_proc_table(str(tmp_path))
    found: list[dict[int, proctable.ProcInfo]] = []

    def sweep() -> None:
        found.append(
            proctable.find_run_processes(
                table,
                roots={},
                pins={},
                marker=b"NUMARUN_RUN_ID=run-1",
                uid=os.getuid(),
                since=since,
                proc=str(tmp_path),
            )
        )

    call = threading.Thread(target=sweep, daemon=True)
    call.start()
    call.join(LIMIT)
    blocked = call.is_alive()
    for fifo in fifos:  # let a blocked open() return, whatever happened
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    call.join(LIMIT)
    assert not blocked, "the sweep opened the environ of a process that can block it"
    assert found == [{}]


def test_the_marker_still_finds_a_marked_process_of_the_run(tmp_path: Path) -> None:
    """The checks skip only what cannot belong: a live process of ours, started since the
    run, whose environment holds the marker, is found."""
    entry = tmp_path / "50"
    entry.mkdir()
    fields = ["S", "1", "50", "50", *["0"] * 15, "2000"]
    (entry / "stat").write_text(f"50 (p) {' '.join(fields)}\n")
    (entry / "status").write_text(f"Name:\tp\nUid:\t{os.getuid()}\t0\t0\t0\n")
    (entry / "environ").write_bytes(b"A=1\0NUMARUN_RUN_ID=run-1\0")
    info = proctable.read_proc_stat(50, str(tmp_path))
    assert info is not None
    marker = b"NUMARUN_RUN_ID=run-1"
    assert proctable.carries_marker(50, info, marker, os.getuid(), 1000, str(tmp_path))
    assert not proctable.carries_marker(50, info, marker, os.getuid(), 3000, str(tmp_path))


# --- reaping the watchdog is bounded -------------------------------------------------------------


def test_ending_the_watchdog_link_is_bounded_when_its_process_does_not_die(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The supervisor's last step reaps the watchdog: it waits, SIGKILLs it, and must not then
    wait forever for a process stuck in the kernel. Here the SIGKILL never arrives (both ways
    of sending it replaced): ``Link.end`` still returns, and the child is reaped once it does
    end."""
    monkeypatch.setattr(watchdog, "_END_WAIT", 0.2)
    child = os.posix_spawn("/bin/sleep", ["sleep", "120"], dict(os.environ))
    pin = os.pidfd_open(child)
    real_kill, real_pidfd_send = os.kill, signal.pidfd_send_signal
    command_r, command_w = os.pipe()
    status_r, status_w = os.pipe()
    link = watchdog.Link()
    try:
        link.attach(child, children.track(command_w), children.track(status_r))
        monkeypatch.setattr(os, "kill", lambda pid, signum: None)
        monkeypatch.setattr(signal, "pidfd_send_signal", lambda fd, signum, *rest: None)
        call = threading.Thread(target=link.end, daemon=True)
        started = time.monotonic()
        call.start()
        call.join(LIMIT)
        returned = not call.is_alive()
        waited = time.monotonic() - started
    finally:
        monkeypatch.undo()
        real_pidfd_send(pin, signal.SIGKILL)
        for fd in (command_r, status_w):
            os.close(fd)
    assert returned, "Link.end() waited for an unkillable watchdog without bound"
    assert waited < LIMIT
    # Reaped when it finally ends (a daemon thread took it over): no zombie is left.
    deadline = time.monotonic() + LIMIT
    while time.monotonic() < deadline:
        if not Path(f"/proc/{child}").exists():
            break
        time.sleep(0.05)
    os.close(pin)
    assert not Path(f"/proc/{child}").exists()
    assert real_kill is os.kill


def test_the_fork_warning_filter_matches_only_numarun_s_own_fork() -> None:
    """The filter added on Python 3.12+ ignores the fork warning raised from numarun's own
    fork() only: the same warning raised from the caller's code is untouched."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        children._filter_fork_warning()
        message = f"This process (pid={os.getpid()}) is multi-threaded, use of fork() may lead"
        warnings.warn_explicit(
            message, DeprecationWarning, "children.py", 1, module="numarun.process.children"
        )
        warnings.warn_explicit(message, DeprecationWarning, "user.py", 1, module="user_code")
    assert [str(w.message) for w in seen] == [message]
    assert sys.modules["numarun.process.children"] is children

"""numarun.process.proctable: a sweep for the run's marked processes never reads a process that
could block it (a FIFO in place of a fake process's ``environ``: opening it blocks forever, as
reading a real one does behind a process stuck in uninterruptible sleep), and still finds a
marked process of the run. A call that would block runs in a thread with a generous join limit,
so that the test fails instead of hanging."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import pytest

from numarun.process import proctable

SRC = Path(__file__).resolve().parents[2] / "src"
LIMIT = 30.0  # what a bounded call gets before the test calls it blocked (a loaded machine)


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

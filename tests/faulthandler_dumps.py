"""Real faulthandler dumps of a parked worker started through numarun's bootstrap, for the
tests of parsing, arming and the completeness rule (``tests/stacks/``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from numarun.launch.workersetup import SCRIPT_BOOTSTRAP
from numarun.stacks.dumps import _signal_state, _structurally_complete
from numarun.worker.dumphandler import STACKS_FILE_ENV, STACKS_SIGNAL

# A worker that parks its main thread in a function named on its command line, with a helper
# thread parked elsewhere; it prints what it sees of numarun's variable and its dump fd.
PARKED = textwrap.dedent(
    """
    import os, sys, threading, time

    def helper_thread_loop():
        while True:
            time.sleep(60)

    def recurse(n):
        if n == 0:
            park_main_here()
        recurse(n - 1)

    def park_main_here():
        time.sleep(60)

    def park_elsewhere():
        time.sleep(60)

    mode = sys.argv[1]
    threading.Thread(target=helper_thread_loop, daemon=True).start()
    if mode == "many-threads":
        for _ in range(105):
            threading.Thread(target=helper_thread_loop, daemon=True).start()
    fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
    print(repr(os.environ.get("NUMARUN_STACKS_FILE")), max(fds), flush=True)
    if mode == "deep":
        recurse(150)
    elif mode == "elsewhere":
        park_elsewhere()
    else:
        park_main_here()
    """
)


def body_line(function: str) -> int:
    """The line number, in PARKED, of the first line of ``function``'s body."""
    return PARKED.split("\n").index(f"def {function}():") + 2


def armed(pid: int, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        state = _signal_state(pid)
        if state is not None and state[0]:
            return
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} never installed the dump handler")


def real_dump(tmp_path: Path, mode: str, name: str) -> tuple[str, bytes]:
    """(what the worker printed, its dump) for PARKED started through numarun's bootstrap."""
    script = tmp_path / "parked.py"
    script.write_text(PARKED)
    dump = tmp_path / f"{name}.dump"
    dump.write_bytes(b"")
    env = {**os.environ, STACKS_FILE_ENV: str(dump)}
    proc = subprocess.Popen(
        [sys.executable, "-u", "-c", SCRIPT_BOOTSTRAP, str(script), mode],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        seen = proc.stdout.readline()
        armed(proc.pid)
        # What the main thread's part of the dump holds once it is parked (deep: truncated,
        # and parked: while it still recurses past faulthandler's 100 frames, it is truncated
        # with recurse innermost).
        where = {"elsewhere": (b"park_elsewhere",), "deep": (b"park_main_here", b"  ..."),
                 "many-threads": (b"\n...\n",)}  # fmt: skip
        markers = where.get(mode, (b"park_main_here",))
        deadline = time.monotonic() + 20
        while True:  # until the main thread has reached its parking place
            dump.write_bytes(b"")
            os.kill(proc.pid, STACKS_SIGNAL)
            data = b""
            while time.monotonic() < deadline:
                data = dump.read_bytes()
                if _structurally_complete(data) or data.endswith(b"  ...\n"):
                    break
                time.sleep(0.01)
            time.sleep(0.1)  # nothing more comes
            assert dump.read_bytes() == data
            main = data.rsplit(b"(most recent call first):", 1)[-1]
            if all(marker in main for marker in markers):
                return seen, data
            assert time.monotonic() < deadline, data
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()

"""numarun.worker.dumphandler: inside a worker, the dump handler armed by the bootstrap before user
code, out of the program's way (its variable gone, its fd moved high)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from numarun.worker.dumphandler import STACKS_FILE_ENV, STACKS_SIGNAL


def test_the_bootstrap_arms_the_dump_invisibly(dumps: dict[str, tuple[str, bytes]]) -> None:
    seen, data = dumps["a"]
    variable, highest_fd = seen.split()
    assert variable == "None"  # the program never sees numarun's variable
    assert int(highest_fd) >= 1000  # the dump fd moved out of the program's way
    text = data.decode()
    assert text.startswith(("Thread 0x", "Current thread 0x"))
    assert "park_main_here" in text and "helper_thread_loop" in text


def test_signal_42_is_what_the_ranks_register() -> None:
    assert STACKS_SIGNAL == 42 and signal.SIGRTMIN <= 42 <= signal.SIGRTMAX


# arm() in a fresh interpreter whose helper thread cannot run until the program lets it: arm()
# must return all the same, the answer file already naming the helper's thread (not the main
# one), and the handler registered; once let go, the helper serves a stacks request.
ARM_WITHOUT_WAITING = r"""
import _thread, os, sys, time
from numarun.worker import dumphandler

path = sys.argv[1]
gate = _thread.allocate_lock()
gate.acquire()
start = _thread.start_new_thread


def held_helper(function, args):
    def run(*args):
        gate.acquire()  # the helper's first turn waits for the program
        function(*args)

    return start(run, args)


_thread.start_new_thread = held_helper
armed = dumphandler.arm(path)
_thread.start_new_thread = start
with open(path + ".fr", "rb") as answers:
    header = answers.readline().split()
tasks = sorted(int(name) for name in os.listdir("/proc/self/task"))
print(armed is not None, header[:2] == [b"numarun-fr", b"0"], header[3:] == [b"ready", b"0"])
print(int(header[2]) in tasks, int(header[2]) != os.getpid(), len(tasks))
gate.release()
with open(path + ".req", "wb", buffering=0) as requests:
    requests.write(b"7 s\n")
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    with open(path, "rb") as dump:
        if b"numarun-stacks 7\n" in dump.read():
            print("answered")
            break
    time.sleep(0.01)
"""


def test_arm_does_not_wait_for_the_helper_to_run(tmp_path: Path) -> None:
    from numarun.stacks.rankhelper import make_helper_files

    base = str(tmp_path / "rank0")
    Path(base).touch()
    make_helper_files(base)
    env = {k: v for k, v in os.environ.items() if k != STACKS_FILE_ENV}
    done = subprocess.run(
        [sys.executable, "-c", ARM_WITHOUT_WAITING, base],
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n") == ["True True True", "True True 2", "answered", ""]


def test_arm_waits_for_the_helpers_word_where_proc_cannot_tell(tmp_path: Path) -> None:
    from numarun.stacks.rankhelper import make_helper_files

    base = str(tmp_path / "rank0")
    Path(base).touch()
    make_helper_files(base)
    program = (
        "import os, sys\n"
        "from numarun.worker import dumphandler\n"
        "dumphandler._threads = lambda: None  # /proc unreadable\n"
        "armed = dumphandler.arm(sys.argv[1])\n"
        "header = open(sys.argv[1] + '.fr', 'rb').readline().split()\n"
        "tasks = [int(n) for n in os.listdir('/proc/self/task')]\n"
        "print(armed is not None, int(header[2]) in tasks, int(header[2]) != os.getpid())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != STACKS_FILE_ENV}
    done = subprocess.run(
        [sys.executable, "-c", program, base], capture_output=True, text=True, timeout=240,
        env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "True True True\n"

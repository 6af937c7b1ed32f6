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


# The helper's signal mask and the main thread's, read from /proc before and after arm(): the
# program's own mask (SIGUSR2 blocked) must be back in the main thread, and the helper must
# block every signal the program may be sent, not the faults a thread raises on itself.
MASKS = r"""
import json, os, signal, sys, time
from numarun.worker import dumphandler


def blocked(tid):
    with open(f"/proc/self/task/{tid}/status") as status:
        line = next(line for line in status if line.startswith("SigBlk:"))
    mask = int(line.split()[1], 16)
    return sorted(number for number in range(1, 65) if mask >> (number - 1) & 1)


signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
before = blocked(os.getpid())
armed = dumphandler.arm(sys.argv[1])
with open(sys.argv[1] + ".fr", "rb") as answers:
    helper = int(answers.readline().split()[2])
# Once the helper answered, it runs with its own mask: a new thread starts with every signal
# blocked (glibc) until its first turn.
with open(sys.argv[1] + ".req", "wb", buffering=0) as requests:
    requests.write(b"7 s\n")
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    with open(sys.argv[1], "rb") as dump:
        if b"numarun-stacks 7\n" in dump.read():
            break
    time.sleep(0.01)
masks = {"armed": armed is not None, "helper_is_another": helper != os.getpid(),
         "main_before": before, "main_after": blocked(os.getpid()), "helper": blocked(helper)}
print(json.dumps(masks))
"""


def _helper_files(tmp_path: Path) -> str:
    from numarun.stacks.rankhelper import make_helper_files

    base = str(tmp_path / "rank0")
    Path(base).touch()
    make_helper_files(base)
    return base


def test_the_helper_blocks_the_signals_sent_to_the_rank(tmp_path: Path) -> None:
    """A signal sent to a process goes to any thread that does not block it, and Python runs
    its handler only in the main thread: one the helper took waited for the main thread's next
    turn with the GIL (a rank asleep slept through a teardown's SIGTERM)."""
    import json

    base = _helper_files(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != STACKS_FILE_ENV}
    done = subprocess.run(
        [sys.executable, "-c", MASKS, base], capture_output=True, text=True, timeout=240, env=env
    )
    assert done.returncode == 0, done.stderr
    masks = json.loads(done.stdout)
    assert masks["armed"] and masks["helper_is_another"]
    assert masks["main_before"] == masks["main_after"] == [signal.SIGUSR2]
    sent = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2}
    sent |= {signal.SIGALRM, signal.SIGCHLD, signal.SIGQUIT, signal.SIGABRT, STACKS_SIGNAL}
    assert sent <= set(masks["helper"])
    faults = {signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL}
    assert faults.isdisjoint(masks["helper"])


# A signal sent to the process while the program's main thread blocks it waits for that thread:
# faulthandler, registered for the current thread only, says which thread took it.
WHO_TAKES_IT = r"""
import faulthandler, os, signal, sys, time
from numarun.worker import dumphandler

assert dumphandler.arm(sys.argv[1]) is not None
dump = open(sys.argv[2], "wb")
faulthandler.register(signal.SIGUSR1, file=dump, all_threads=False, chain=False)


def park_main_here():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    print("ready", flush=True)
    sys.stdin.readline()  # the test sent SIGUSR1 to the process meanwhile
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})


park_main_here()
deadline = time.monotonic() + 120
while os.path.getsize(sys.argv[2]) == 0 and time.monotonic() < deadline:
    time.sleep(0.01)
with open(sys.argv[2]) as written:
    print(written.read())
"""


def test_a_signal_the_main_thread_blocks_waits_for_it_not_for_the_helper(tmp_path: Path) -> None:
    from numarun.worker.dumphandler import HELPER_FUNCTION

    base = _helper_files(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != STACKS_FILE_ENV}
    program = subprocess.Popen(
        [sys.executable, "-c", WHO_TAKES_IT, base, str(tmp_path / "dump")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert program.stdout is not None and program.stdin is not None
        assert program.stdout.readline() == "ready\n"
        os.kill(program.pid, signal.SIGUSR1)
        out, _ = program.communicate("go\n", timeout=240)
    finally:
        if program.poll() is None:
            program.kill()
            program.wait()
    assert program.returncode == 0
    assert "park_main_here" in out and HELPER_FUNCTION not in out, out

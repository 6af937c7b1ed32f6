"""numarun.stacks.dumps: a dump is complete only at its end (read from real faulthandler
output), dumps compared whichever thread ran the handler, a process's signal state read from
/proc."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from numarun.stacks.dumps import _signal_state, _structurally_complete, normalized
from numarun.worker.dumphandler import STACKS_SIGNAL


def test_complete_only_at_the_end_of_a_real_dump(dumps: dict[str, tuple[str, bytes]]) -> None:
    for name in ("a", "c", "deep", "many"):
        data = dumps[name][1]
        # The main thread's bottom (the bootstrap's -c code) is known; a stack cut after 100
        # frames is not, and waits for the dump to be quiet instead.
        assert _structurally_complete(data) == (name != "deep"), name
        cuts = [i + 1 for i, byte in enumerate(data[:-1]) if byte == ord("\n")]
        assert not any(_structurally_complete(data[:cut]) for cut in cuts), name


def test_normalized_ignores_which_thread_ran_the_handler() -> None:
    one = b"Current thread 0x1 (most recent call first):\n  File \"x\", line 1 in f\n"
    two = b"Thread 0x1 (most recent call first):\n  File \"x\", line 1 in f\n"
    assert normalized(one) == normalized(two)
    assert normalized(one) != normalized(one.replace(b"line 1", b"line 2"))


def test_signal_state_reads_proc(tmp_path: Path) -> None:
    # A process with a Python handler for the signal shows it caught; before, not.
    proc = subprocess.Popen(
        [sys.executable, "-c",
         "import signal, sys, time\n"
         f"print('go', flush=True); sys.stdin.readline()\n"
         f"signal.signal({STACKS_SIGNAL}, lambda *a: None)\n"
         "print('set', flush=True); time.sleep(60)"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdin is not None
        proc.stdout.readline()
        assert _signal_state(proc.pid) == (False, False)
        proc.stdin.write("\n")
        proc.stdin.flush()
        proc.stdout.readline()
        assert _signal_state(proc.pid) == (True, False)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert _signal_state(proc.pid) is None

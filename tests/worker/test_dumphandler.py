"""numarun.worker.dumphandler: inside a worker, the dump handler armed by the bootstrap before user
code, out of the program's way (its variable gone, its fd moved high)."""

from __future__ import annotations

import signal

from numarun.worker.dumphandler import STACKS_SIGNAL


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

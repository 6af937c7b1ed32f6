"""Worker functions for tests/spawning/test_api.py: module-level, so every start method can pickle
them.

Kept free of pytest and numarun imports so that a spawned worker loads it quickly.
"""

from __future__ import annotations

import faulthandler
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

ENV_NAMES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMP_NUM_THREADS",
    "SP_EXTRA",
)


def first_line_cpus(local_rank: int) -> tuple[int, str, str]:
    """Reads its allowed CPUs as its very first statement; returns (rank, CPUs, pid)."""
    with open("/proc/self/status") as status:
        cpus = next(line for line in status if line.startswith("Cpus_allowed_list:"))
    return local_rank, cpus.split(":", 1)[1].strip(), str(os.getpid())


def echo(local_rank: int, *args: object) -> tuple[int, tuple[object, ...]]:
    return local_rank, args


def big_bytes(local_rank: int, size: int) -> bytes:
    return bytes([local_rank]) * size


def environment(local_rank: int) -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in ENV_NAMES}


def raise_value_error(local_rank: int, failing_rank: int = 0) -> None:
    if local_rank == failing_rank:
        raise ValueError(f"rank {local_rank} was told to fail")
    time.sleep(60)


def exit_with(local_rank: int, code: int, failing_rank: int = 0) -> None:
    if local_rank == failing_rank:
        sys.exit(code)
    time.sleep(60)


def hard_exit(local_rank: int, code: int) -> None:
    if local_rank == 0:
        os._exit(code)
    time.sleep(60)


def kill_self(local_rank: int, signum: int) -> None:
    if local_rank == 0:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file from SIGSEGV
        faulthandler.disable()  # a forked pytest's handler would print pytest's whole stack
        os.kill(os.getpid(), signum)
    time.sleep(60)


def write_pid_then_sleep(local_rank: int, directory: str, seconds: float = 60) -> None:
    _write_atomic(Path(directory) / f"worker{local_rank}", str(os.getpid()))
    time.sleep(seconds)


def ignore_sigterm_or_fail(local_rank: int, directory: str) -> None:
    """Rank 1 ignores SIGTERM and says so; rank 0 raises once rank 1 is ready."""
    ready = Path(directory) / "ready"
    if local_rank == 1:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _write_atomic(ready, str(os.getpid()))
        time.sleep(60)
        return
    _wait_for(ready)
    raise RuntimeError("rank 0 fails while rank 1 ignores SIGTERM")


def grandchildren_then_fail(local_rank: int, directory: str) -> None:
    """Every rank starts a sleeping child and one in its own session; rank 0 then raises."""
    plain = subprocess.Popen(["sleep", "60"])
    detached = subprocess.Popen(["sleep", "60"], start_new_session=True)
    _write_atomic(Path(directory) / f"grandchildren{local_rank}", f"{plain.pid} {detached.pid}")
    if local_rank == 0:
        _wait_for(*(Path(directory) / f"grandchildren{rank}" for rank in (0, 1)))
        raise RuntimeError("rank 0 fails with grandchildren around")
    time.sleep(60)


def _write_atomic(path: Path, text: str) -> None:
    # A hidden name: tests glob for the final names ("worker*"), and a worker killed between
    # the write and the rename leaves this one behind.
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    partial.rename(path)


def _wait_for(*paths: Path) -> None:
    deadline = time.monotonic() + 30
    while not all(path.exists() for path in paths):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{paths} never appeared")
        time.sleep(0.005)


def fail_one_after_another(local_rank: int, directory: str) -> None:
    """Rank 1 raises first; rank 0 survives the teardown's SIGTERM and raises once it got it.

    The SIGTERM proves the supervisor saw rank 1's failure first: waiting only for rank 1 to
    be dead left a window, under load, where the watchdog found both ended at once."""
    rank1 = Path(directory) / "worker1"
    if local_rank == 0:
        terminated: list[int] = []
        signal.signal(signal.SIGTERM, lambda signum, frame: terminated.append(signum))
        _write_atomic(Path(directory) / "worker0", str(os.getpid()))
        deadline = time.monotonic() + 30
        while not terminated and time.monotonic() < deadline:
            time.sleep(0.005)
        raise ValueError("rank 0 fails second")
    _wait_for(Path(directory) / "worker0")
    _write_atomic(rank1, str(os.getpid()))
    raise ValueError("rank 1 fails first")


def memory_policy(local_rank: int) -> tuple[str, tuple[int, ...]]:
    from numarun.placement.binding import get_mem_policy

    return get_mem_policy()


def exit_zero(local_rank: int) -> str:
    if local_rank == 0:
        sys.exit(0)
    return "value"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def slow_sigterm_cleanup(local_rank: int, directory: str) -> None:
    """Rank 1 takes 0.3 s to clean up after SIGTERM; rank 0 raises once rank 1 is ready."""
    ready = Path(directory) / "ready"
    if local_rank == 1:

        def clean_up(signum: int, frame: object) -> None:
            time.sleep(0.3)
            _write_atomic(Path(directory) / "cleaned", "yes")
            os._exit(0)

        signal.signal(signal.SIGTERM, clean_up)
        _write_atomic(ready, str(os.getpid()))
        time.sleep(60)
        return
    _wait_for(ready)
    raise RuntimeError("rank 0 fails while rank 1 would clean up slowly")


def return_unpicklable(local_rank: int) -> object:
    return lambda: local_rank

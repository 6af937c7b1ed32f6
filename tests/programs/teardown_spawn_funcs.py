"""Functions for numarun.spawn in tests/process/test_teardown.py (importable by spawned workers)."""

import os
import time

from programs import escaping_daemons


def escape_then_return(local_rank: int, directory: str) -> int:
    """Leave two escapees behind (see escaping_daemons) and return."""
    escaping_daemons.start_escapees(directory)
    return os.getpid()


def escape_then_stay(local_rank: int, directory: str) -> None:
    """Leave two escapees, say so, and sleep until torn down."""
    escaping_daemons.note(directory, f"worker.{os.getpid()}")
    escaping_daemons.start_escapees(directory)
    escaping_daemons.note(directory, f"spawned.{local_rank}")
    time.sleep(120)


def sleep_target(payload_fd: int, result_fd: int) -> int:
    """A forkserver worker's fork_target: say so, then sleep until torn down."""
    print("W", os.getpid(), flush=True)
    time.sleep(120)
    return 0


def process_state(local_rank: int) -> tuple[bool, bool, bool]:
    """(garbage collection on, a child subreaper, in a session of its own) in a worker."""
    import gc

    from numarun.placement import binding

    return gc.isenabled(), binding.is_child_subreaper(), os.getsid(0) == os.getpid()

"""fork_target functions for tests/programs/pidns_pid_reuse.py (a forkserver worker's target must be
importable by module and name); nothing but the standard library."""

import time


def exit_at_once(payload_fd: int, result_fd: int) -> int:
    """Fail at once: the fork server reaps it before the supervisor can pin it."""
    return 1


def sleep_long(payload_fd: int, result_fd: int) -> int:
    """Sleep until torn down."""
    time.sleep(120)
    return 0

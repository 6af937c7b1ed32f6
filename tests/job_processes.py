"""Finding a job's processes from outside it, for tests that check nothing is left running."""

from __future__ import annotations

import os
import time


def processes_with_env(entry: str) -> list[int]:
    """Live processes other than this one whose environment holds ``entry``
    (``NAME=value``); zombies are not counted: they run nothing."""
    wanted = entry.encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as environ:
                variables = environ.read().split(b"\0")
            with open(f"/proc/{name}/stat") as stat:
                state = stat.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if wanted in variables and state != "Z":
            found.append(int(name))
    return found


def processes_with_run_id(run_id: str) -> list[int]:
    """A job's workers: the live processes carrying ``TORCHELASTIC_RUN_ID=run_id``."""
    return processes_with_env(f"TORCHELASTIC_RUN_ID={run_id}")


def nothing_left(run_id: str, limit: float = 10.0) -> bool:
    """No process of the job (workers and standbys carry TORCHELASTIC_RUN_ID) is left within
    ``limit`` seconds; the teardown ends them before the launcher exits, but give the kernel a
    moment to reap."""
    deadline = time.monotonic() + limit
    while processes_with_run_id(run_id):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True

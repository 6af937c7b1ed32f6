"""Finding a job's processes from outside it, for tests that check nothing is left running."""

from __future__ import annotations

import os


def processes_with_run_id(run_id: str) -> list[int]:
    """Live processes whose environment carries ``TORCHELASTIC_RUN_ID=run_id``: the job's
    workers (zombies are not counted: they run nothing)."""
    marker = f"TORCHELASTIC_RUN_ID={run_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as environ:
                variables = environ.read().split(b"\0")
            with open(f"/proc/{entry}/stat") as stat:
                state = stat.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in variables and state != "Z":
            found.append(int(entry))
    return found

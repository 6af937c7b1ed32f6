"""pid 1 of a new pid namespace, for tests/process/test_starting_limits.py: a SIGTERM to the
launcher while it starts a large job; prints how it ended.

``unshare --pid --fork --mount-proc python pidns_sigterm_mid_start.py COUNT PROGRAM [FLAGS...]``:
``numarun --nproc-per-node COUNT [FLAGS...] --no-python PROGRAM 120`` is started; once some
of its workers exist (the start is under way, far from done), the launcher gets SIGTERM.
Prints one JSON line: ``{"code": exit status, "seconds": from the signal to its exit,
"at_signal": processes of the job then, "left": processes left 10 s after its exit, "stderr":
its stderr}``. Whatever is
left is killed with the namespace, when this process ends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

LIMIT = 120.0


def others(launcher: int) -> list[int]:
    """The job's live processes: all but pid 1 and the launcher (zombies are gone)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in (1, launcher):
            continue
        try:
            with open(f"/proc/{name}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] not in "ZX":
                    found.append(int(name))
        except OSError:
            pass
    return found


def main(count: int, program: str, flags: list[str]) -> None:
    with tempfile.TemporaryFile() as err:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "numarun", "--nproc-per-node", str(count), *flags,
             "--no-python", program, "120"],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )  # fmt: skip
        deadline = time.monotonic() + LIMIT
        while len(others(launcher.pid)) < 20 and launcher.poll() is None:
            if time.monotonic() > deadline:
                break
            time.sleep(0.005)
        at_signal = len(others(launcher.pid))
        launcher.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        try:
            code = launcher.wait(LIMIT)
        except subprocess.TimeoutExpired:
            code = None
        seconds = time.monotonic() - signalled
        gone = time.monotonic() + 10
        while others(launcher.pid) and time.monotonic() < gone:
            time.sleep(0.05)
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    line = {
        "code": code,
        "seconds": seconds,
        "at_signal": at_signal,
        "left": others(launcher.pid),
        "stderr": stderr[-3000:],
    }
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3:])

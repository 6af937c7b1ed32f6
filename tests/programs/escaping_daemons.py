"""Processes that try to outlive numarun, for tests/process/test_teardown.py.

``python escaping_daemons.py DIR MODE``, as a launcher worker: writes ``DIR/worker.<pid>``, starts
two escapees, waits until both have written ``DIR/escapee.<pid>``, writes ``DIR/ready.<rank>``, then
by MODE: ``stay`` sleeps; ``exit`` exits 0; ``fail``: rank 0 exits 1 once every rank is
ready, the others sleep.

The escapees (:func:`start_escapees`) carry nothing numarun could recognise them by: a daemon
that double-forks, calls ``setsid``, closes its fds and execs a sleeper with an empty
environment (so no ``NUMARUN_RUN_ID``), and ``subprocess.Popen(start_new_session=True,
env={})`` of a sleeper.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

SLEEPER = (
    "import os, sys, time\n"
    "path = os.path.join(sys.argv[1], 'escapee.%d.%s' % (os.getpid(), sys.argv[2]))\n"
    "open(path + '.tmp', 'w').close(); os.rename(path + '.tmp', path)\n"
    "time.sleep(120)\n"
)


def note(directory: str, name: str) -> None:
    """Create ``directory/name`` atomically (readers never see a half-made file)."""
    path = os.path.join(directory, name)
    with open(path + ".tmp", "w") as file:
        file.write(str(os.getpid()))
    os.rename(path + ".tmp", path)


def start_escapees(directory: str) -> None:
    """Start the daemon and the new-session child; return once both run (each writes
    ``DIR/escapee.<its pid>.<our pid>``)."""
    tag = str(os.getpid())
    sleeper = [sys.executable, "-c", SLEEPER, directory, tag]
    middle = os.fork()
    if middle == 0:
        try:
            os.setsid()
            if os.fork() == 0:
                os.closerange(3, 65536)  # as daemons do: it holds none of its parent's pipes
                os.execve(sys.executable, sleeper, {})
        finally:
            os._exit(0)
    os.waitpid(middle, 0)
    subprocess.Popen(sleeper, start_new_session=True, env={})
    deadline = time.monotonic() + 60
    while len(list(Path(directory).glob(f"escapee.*.{tag}"))) < 2:
        if time.monotonic() > deadline:
            raise SystemExit("escapees did not start")
        time.sleep(0.02)


def main(directory: str, mode: str) -> int:
    rank = int(os.environ.get("RANK", "0"))
    note(directory, f"worker.{os.getpid()}")
    start_escapees(directory)
    note(directory, f"ready.{rank}")
    if mode == "exit":
        return 0
    if mode == "fail" and rank == 0:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        while len(list(Path(directory).glob("ready.*[0-9]"))) < world:
            time.sleep(0.02)  # the others have left their escapees too
        return 1
    time.sleep(120)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))

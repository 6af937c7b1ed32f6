"""Test worker: announce readiness, record forwarded SIGUSR1/SIGUSR2, run until told to stop.

Writes its pid to <dir>/<RANK>.pid (dir = argv[1]) once its handlers are installed. On SIGUSR1
or SIGUSR2 appends the signal name to <dir>/<RANK>.signals. Exits 0 when <dir>/stop exists;
never exits otherwise (the launcher's teardown must end it). SIGTERM keeps its default action.
"""

import os
import signal
import sys
import time

out_dir = sys.argv[1]
rank = os.environ["RANK"]


def record(signum: int, frame: object) -> None:
    with open(os.path.join(out_dir, f"{rank}.signals"), "a") as out:
        out.write(signal.Signals(signum).name + "\n")


signal.signal(signal.SIGUSR1, record)
signal.signal(signal.SIGUSR2, record)
with open(os.path.join(out_dir, f"{rank}.pid.tmp"), "w") as out:
    out.write(str(os.getpid()))
os.rename(os.path.join(out_dir, f"{rank}.pid.tmp"), os.path.join(out_dir, f"{rank}.pid"))
while not os.path.exists(os.path.join(out_dir, "stop")):
    time.sleep(0.02)

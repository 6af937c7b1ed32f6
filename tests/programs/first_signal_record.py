"""Test worker: wait for the launcher's signal and record which one reached it first.

Writes its pid to <dir>/<RANK>.pid (dir = argv[1]) once its handlers are in place, then waits.
SIGINT: the ``except KeyboardInterrupt`` block writes "KeyboardInterrupt" to <dir>/<RANK>.saved
(a training script's save_checkpoint()) and re-raises. SIGTERM or SIGQUIT: a handler writes the
signal's name there and exits 128+N. Never exits otherwise.
"""

import os
import signal
import sys
import time

out_dir = sys.argv[1]
rank = os.environ["RANK"]


def save(what: str) -> None:
    path = os.path.join(out_dir, f"{rank}.saved")
    with open(path + ".tmp", "w") as out:
        out.write(what)
    os.rename(path + ".tmp", path)


def on_signal(signum: int, frame: object) -> None:
    save(signal.Signals(signum).name)
    os._exit(128 + signum)


signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGQUIT, on_signal)
try:
    with open(os.path.join(out_dir, f"{rank}.pid.tmp"), "w") as out:
        out.write(str(os.getpid()))
    os.rename(os.path.join(out_dir, f"{rank}.pid.tmp"), os.path.join(out_dir, f"{rank}.pid"))
    while True:
        time.sleep(0.05)
except KeyboardInterrupt:
    save("KeyboardInterrupt")
    raise

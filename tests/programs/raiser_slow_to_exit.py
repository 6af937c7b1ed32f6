"""Rank 1 raises and then takes long to exit (an atexit handler that first marks the file
`raised` and then sleeps, as torch's teardown can); rank 0 fails with exit 3 as soon as it
sees the mark: the first death numarun observes is rank 0's, the first failure is rank 1's."""

import atexit
import os
import sys
import time

mark = os.path.join(sys.argv[1], "raised")
if os.environ["RANK"] == "1":

    def slow_exit() -> None:
        with open(mark + ".tmp", "w"):
            pass
        os.replace(mark + ".tmp", mark)
        time.sleep(60)

    atexit.register(slow_exit)
    raise RuntimeError("rank 1 ran out of data")
deadline = time.monotonic() + 120
while not os.path.exists(mark) and time.monotonic() < deadline:
    time.sleep(0.01)
sys.exit(3)

"""Test worker: rank R ends as argv says; the other ranks exit 0 at once.

``rank_exit.py R code N``: rank R exits with status N. ``rank_exit.py R signal N``: rank R kills
itself with signal N. ``rank_exit.py R raise TEXT``: rank R raises RuntimeError(TEXT).
Other ranks print "rank K ok" and exit 0.
"""

import os
import signal
import sys

rank = int(os.environ["RANK"])
target, how, what = int(sys.argv[1]), sys.argv[2], sys.argv[3]
if rank != target:
    print(f"rank {rank} ok", flush=True)
    sys.exit(0)
if how == "code":
    sys.exit(int(what))
if how == "signal":
    os.kill(os.getpid(), int(what))
    signal.pause()
raise RuntimeError(what)

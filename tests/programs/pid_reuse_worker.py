"""Worker for tests/programs/pidns_teardown_strangers.py: ``python pid_reuse_worker.py DIR``.

Writes ``DIR/worker.<rank>`` (its pid). Ranks 1 and 2 end at once (so that their pids can be
reused); rank 0 waits for ``DIR/go`` and fails (exit 1).
"""

import os
import sys
import time

directory = sys.argv[1]
rank = os.environ["RANK"]
with open(os.path.join(directory, f"worker.{rank}.tmp"), "w") as file:
    file.write(str(os.getpid()))
os.rename(os.path.join(directory, f"worker.{rank}.tmp"), os.path.join(directory, f"worker.{rank}"))
if rank != "0":
    sys.exit(0)
while not os.path.exists(os.path.join(directory, "go")):
    time.sleep(0.02)
sys.exit(1)

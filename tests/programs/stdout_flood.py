"""Test worker: rank 0 floods stdout, the others wait; for stalled-console tests.

``stdout_flood.py DIR LINES MODE``: every rank writes its pid to DIR/<RANK>.pid. Rank 0 writes
LINES numbered lines to stdout in one go, then creates DIR/printed and sleeps until killed.
Other ranks: MODE ``fail`` waits for DIR/printed and exits 3; MODE ``sleep`` sleeps until
killed; MODE ``done`` waits for DIR/printed and exits 0 (rank 0 then exits 0 too).
"""

import os
import sys
import time

out_dir, lines, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rank = int(os.environ["RANK"])
with open(os.path.join(out_dir, f"{rank}.pid"), "w") as out:
    out.write(str(os.getpid()))
printed = os.path.join(out_dir, "printed")
if rank == 0:
    sys.stdout.buffer.write(b"".join(b"line %07d %s\n" % (i, b"x" * 100) for i in range(lines)))
    sys.stdout.buffer.flush()
    open(printed, "w").close()
    if mode == "done":
        sys.exit(0)
    time.sleep(600)
    sys.exit(0)
while mode in ("fail", "done") and not os.path.exists(printed):
    time.sleep(0.02)
if mode == "fail":
    sys.exit(3)
if mode == "sleep":
    time.sleep(600)

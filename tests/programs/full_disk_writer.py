"""Test worker for a full disk: ``full_disk_writer.py DIR``.

Prints "first line", waits for DIR/go, prints 4 lines of 10 KB, creates DIR/wrote, waits for
DIR/go_on, prints "last line" and exits 0.
"""

import os
import sys
import time

out_dir = sys.argv[1]


def wait_for(name: str) -> None:
    while not os.path.exists(os.path.join(out_dir, name)):
        time.sleep(0.02)


print("first line", flush=True)
wait_for("go")
for i in range(4):
    sys.stdout.write(f"{i}" * 10_000 + "\n")
sys.stdout.flush()
open(os.path.join(out_dir, "wrote"), "w").close()
wait_for("go_on")
print("last line", flush=True)

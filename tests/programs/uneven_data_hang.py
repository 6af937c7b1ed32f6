"""Test worker for whole-job tests, no torch: each rank writes ``ready <rank> <pid>``, then

* ``uneven``: global rank 0 waits for data that never comes, in a function of its own; every
  other rank has run out of data and exits 0 (the classic uneven-data hang);
* ``parked R``: every rank waits in ``parked_until_killed``, rank R in ``somewhere_else``.
"""

import os
import sys
import time

rank = int(os.environ["RANK"])
os.write(1, f"ready {rank} {os.getpid()}\n".encode())


def wait_for_data_that_never_comes() -> None:
    while True:
        time.sleep(1)


def parked_until_killed() -> None:
    while True:
        time.sleep(1)


def somewhere_else() -> None:
    while True:
        time.sleep(1)


if sys.argv[1] == "uneven":
    if rank == 0:
        wait_for_data_that_never_comes()
elif rank == int(sys.argv[2]):
    somewhere_else()
else:
    parked_until_killed()

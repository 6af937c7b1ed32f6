"""Test worker for a failure cascade (tests/e2e/test_jobwide_faults.py), no torch: every rank
writes ``ready <rank> <pid>``, waits (at most 60 s) for the file argv[1], then raises: every
rank of every node fails within a second, as when a collective times out across the job."""

import os
import sys
import time

rank = int(os.environ["RANK"])
os.write(1, f"ready {rank} {os.getpid()}\n".encode())
deadline = time.monotonic() + 60
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.01)
raise RuntimeError(f"rank {rank}: the collective timed out")

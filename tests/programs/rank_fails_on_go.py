"""A rank for tests/launch/test_launcher_failure_imports.py: ``rank_fails_on_go.py GO fail|ok|sleep
SECONDS``.

Waits (at most 60 s) for the file GO, then rank 0 fails (``fail``: ``raise RuntimeError``) or
every rank ends (``ok``); the other ranks of a failing job, and every rank with ``sleep``,
sleep SECONDS first."""

import os
import sys
import time

go, mode, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
deadline = time.monotonic() + 60
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.01)
if mode == "fail" and os.environ["RANK"] == "0":
    raise RuntimeError("rank 0 fails on purpose")
if mode != "ok":
    time.sleep(seconds)

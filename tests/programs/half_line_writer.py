"""Test worker: write COUNT numbered lines, each in two writes (text, then newline), the way
``print`` does under ``python -u``: the case where two ranks' half-lines merge on a shared
stream unless the launcher frames lines."""

import os
import sys

count = int(sys.argv[1])
rank = os.environ["RANK"]
for i in range(count):
    os.write(1, f"r{rank} line {i}".encode())
    os.write(1, b"\n")

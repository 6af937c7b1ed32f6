"""Test worker for spare nodes: a gloo group that loops on ``all_reduce`` until told to stop.

``python gloo_spare.py OUT``: each rank writes ``OUT/ready.<pid>`` (JSON: its rank, group
size, node marker ``SPARE_NODE``, restart count, and whether torch was imported before its
first line, i.e. by a ``--preload`` standby) once past its group's first collective, then
all_reduces every 50 ms; once ``OUT/stop`` exists every rank of the group leaves on the same
step (the flag itself is all_reduced) and exits 0.
"""

import json
import os
import sys
import time

warm = "torch" in sys.modules

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

out = sys.argv[1]
dist.init_process_group("gloo")
value = torch.ones(1)
dist.all_reduce(value)
with open(os.path.join(out, f".ready.{os.getpid()}"), "w") as file:
    json.dump({"rank": dist.get_rank(), "world": dist.get_world_size(), "warm": warm,
               "node": os.environ.get("SPARE_NODE"), "pid": os.getpid(),
               "attempt": os.environ["TORCHELASTIC_RESTART_COUNT"]}, file)
os.replace(os.path.join(out, f".ready.{os.getpid()}"), os.path.join(out, f"ready.{os.getpid()}"))
while True:
    stop = torch.tensor([1.0 if os.path.exists(os.path.join(out, "stop")) else 0.0])
    dist.all_reduce(stop, op=dist.ReduceOp.MAX)
    if stop.item():
        break
    time.sleep(0.05)
dist.destroy_process_group()

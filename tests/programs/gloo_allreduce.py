"""Test worker: a gloo all_reduce through env:// (torchrun's contract), reported as JSON.

Each rank contributes rank + 1; the sum over WORLD_SIZE ranks must be W * (W + 1) / 2. Prints
{"rank", "world_size", "sum", "cpus"} on stdout. With ``--raise-at R`` rank R raises
RuntimeError after the process group is up, and the others wait on the store for a key nobody
sets until the launcher tears them down. Not in the collective: a raising rank's interpreter
closes its gloo connections at exit before its process ends, and a peer blocked in an
all_reduce fails on that at once -- under load sooner than the raising rank is reaped, which
makes the peer the first failure by torchrun's rule (numarun's too).
"""

import argparse
import json
import os
from datetime import timedelta

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--raise-at", type=int, default=-1)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == args.raise_at:
    raise RuntimeError(f"rank {rank} gave up mid-job")
if args.raise_at >= 0:
    dist.distributed_c10d._get_default_store().wait(["never-set"], timedelta(hours=1))
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
with open("/proc/self/status") as status:
    cpus = next(
        line.split(":", 1)[1].strip() for line in status if line.startswith("Cpus_allowed_list")
    )
result = {
    "rank": rank,
    "world_size": dist.get_world_size(),
    "sum": value.item(),
    "cpus": cpus,
    "pid": os.getpid(),
}
# One write per line, so ranks sharing the launcher's stdout never merge their lines.
os.write(1, (json.dumps(result) + "\n").encode())
dist.destroy_process_group()

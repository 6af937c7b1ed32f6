"""Test worker for whole-job tests: a gloo job of several nodes, each rank somewhere known.

``MODE``:

* ``flag PATH``: every rank writes ``ready <rank> <pid>``, waits in ``parked_until_the_flag``
  until PATH exists, then all_reduces and exits 0.
* ``compute R SECONDS``: rank R computes silently (its stacks change all the time, it prints
  nothing) for SECONDS, the others wait for it in ``all_reduce``; then every rank exits 0.
"""

import os
import sys
import time

import torch
import torch.distributed as dist

mode = sys.argv[1]


def parked_until_the_flag(path: str) -> None:
    while not os.path.exists(path):
        time.sleep(0.05)


def compute(depth: int) -> int:
    if depth:
        return compute(depth - 1) + 1
    return sum(i * i for i in range(20000))


def compute_silently(seconds: float) -> None:
    end = time.monotonic() + seconds
    step = 0
    while time.monotonic() < end:
        compute(step % 40)
        step += 1


dist.init_process_group("gloo")
rank = dist.get_rank()
os.write(1, f"ready {rank} {os.getpid()}\n".encode())
if mode == "flag":
    parked_until_the_flag(sys.argv[2])
elif mode == "compute" and rank == int(sys.argv[2]):
    compute_silently(float(sys.argv[3]))
value = torch.ones(1)
dist.all_reduce(value)
dist.barrier()
os.write(1, f"done {rank} {value.item():g}\n".encode())
dist.destroy_process_group()

"""Test worker for stacks: a gloo job where one rank is somewhere else while the others wait.

``--stuck-rank R --stuck-in NAME``: after the process group is up, rank R calls the function
NAME (defined below), which sleeps; the other ranks block in ``all_reduce``, waiting for it.
``--raise-at R``: rank R raises instead, while the others wait for a store key that rank R
never sets (in C, as in a collective, but without a connection to R that its death would
close). Every rank writes ``ready <rank> <pid>`` to stdout (one write) before it goes there.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--stuck-rank", type=int, default=-1)
parser.add_argument("--stuck-in", default="sleep_in_the_named_function")
parser.add_argument("--raise-at", type=int, default=-1)
parser.add_argument("--sleep", type=float, default=120.0)
args = parser.parse_args()


def sleep_in_the_named_function(seconds: float) -> None:
    time.sleep(seconds)


def blocked_here_by_the_test(seconds: float) -> None:
    time.sleep(seconds)


def wait_for_the_others() -> None:
    value = torch.ones(1)
    dist.all_reduce(value)


def wait_for_the_failing_rank() -> None:
    dist.distributed_c10d._get_default_store().get("never-set")


dist.init_process_group("gloo")
rank = dist.get_rank()
os.write(1, f"ready {rank} {os.getpid()}\n".encode())
if rank == args.raise_at:
    time.sleep(1.0)  # the others are waiting by then
    raise RuntimeError(f"rank {rank} gave up mid-job")
if args.raise_at >= 0:
    wait_for_the_failing_rank()
if rank == args.stuck_rank:
    globals()[args.stuck_in](args.sleep)
wait_for_the_others()
dist.destroy_process_group()

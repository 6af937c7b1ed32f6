"""Test worker for rendezvous and restart tests: ``rdzv_restart_modes.py MODE DIR [N]``.

Every mode first writes its environment to DIR/env.<RANK>.<TORCHELASTIC_RESTART_COUNT>.json.

* ``flaky``: no torch; rank 1 exits 3 on the first attempt (restart count 0); the others
  print their JSON report and exit 0.
* ``flaky-gloo``: the same, but inside a gloo job: init_process_group, rank 1 raises on the
  first attempt, every rank of a later attempt all_reduces (rank + 1) and reports the sum.
* ``grow N``: while WORLD_SIZE < N, write DIR/small.<RANK> and wait to be stopped; with
  WORLD_SIZE == N, all_reduce and report.
* ``shrink N``: with WORLD_SIZE == N, write DIR/full.<RANK> ("pid ppid") and wait to be
  stopped; in a smaller world after a full one, report and exit 0 (no collective); in a
  smaller world before any full one (under load, a node's first round may form before the
  other node joined), wait to be stopped (the group re-forms when it joins).
* ``fail-after``: all_reduce and report, then a worker whose environment has EL_FAIL=1
  writes DIR/failed (its time.time()) and exits 3; every other worker waits forever, as one
  blocked in a collective whose peer is gone.
* ``finish-or-fail``: no torch; a worker whose environment has EL_FAIL=1 waits until another
  worker wrote DIR/finished, two seconds more (its launcher is in the exit barrier), then
  writes DIR/failed ("<time.time()> <RANK>") and exits 3; every other worker reports, writes
  DIR/finished and exits 0.

The report is one JSON line on stdout: {"rank", "world_size", "sum", "restart", "pid"}.
"""

import json
import os
import sys
import time

mode, out_dir = sys.argv[1], sys.argv[2]
size = int(sys.argv[3]) if len(sys.argv) > 3 else 0
rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]


def write(name: str, text: str) -> None:
    path = os.path.join(out_dir, name)
    with open(path + ".tmp", "w") as out:
        out.write(text)
    os.rename(path + ".tmp", path)


def report(total: float | None) -> None:
    line = {"rank": rank, "world_size": world, "sum": total, "restart": restart,
            "pid": os.getpid()}  # fmt: skip
    os.write(1, (json.dumps(line) + "\n").encode())


def all_reduce() -> float:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    dist.barrier()  # nobody leaves while a peer still reads from it
    if mode != "fail-after":
        dist.destroy_process_group()
    return value.item()


def wait_forever() -> None:
    while True:
        time.sleep(0.1)


write(f"env.{rank}.{restart}.json", json.dumps(dict(os.environ)))
if mode == "flaky":
    if rank == 1 and restart == "0":
        sys.exit(3)
    report(None)
elif mode == "flaky-gloo":
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if rank == 1 and restart == "0":
        raise RuntimeError("rank 1 fails on the first attempt")
    import torch

    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    report(value.item())
    dist.destroy_process_group()
elif mode == "grow":
    if world < size:
        write(f"small.{rank}", str(os.getpid()))
        wait_forever()
    report(all_reduce())
elif mode == "shrink":
    if world == size:
        write(f"full.{rank}", f"{os.getpid()} {os.getppid()}")
        wait_forever()
    if not any(name.startswith("full.") for name in os.listdir(out_dir)):
        wait_forever()
    report(None)
elif mode == "fail-after":
    report(all_reduce())
    if os.environ.get("EL_FAIL") == "1":
        time.sleep(1.0)  # the others are past the collective: only this failure remains
        write("failed", repr(time.time()))
        os._exit(3)
    wait_forever()
elif mode == "finish-or-fail":
    if os.environ.get("EL_FAIL") == "1":
        while not os.path.exists(os.path.join(out_dir, "finished")):
            time.sleep(0.05)
        time.sleep(2.0)
        write("failed", f"{time.time()!r} {rank}")
        os._exit(3)
    report(None)
    write("finished", "")
else:
    raise SystemExit(f"unknown mode {mode!r}")

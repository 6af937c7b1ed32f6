"""Test worker for the flight recorder: gloo jobs that hang (or fail) in ways only the
collectives show. ``--case``:

* ``skip``: the last rank (``--skip-rank``) skips one ``all_reduce`` of a ``[4]`` tensor in a
  loop, then every rank calls ``all_reduce`` on an ``[8]`` tensor: every stack is at the same
  line (gloo hangs with 4 ranks, the tests' count; with 2, and in the runs here with 3, it
  aborts at the size mismatch: torch 2.13.0 and 2.14.1 alike);
* ``type``: rank 1 calls ``broadcast`` where the others call ``all_reduce``;
* ``dtype``: the last rank calls ``all_reduce`` on an ``int64`` tensor where the others pass
  ``float64`` (same shape and bytes: gloo aborts on a size that differs, and does not check the
  dtype), then sleeps in its own code while the others wait in the next ``all_reduce``;
* ``subgroup``: rank 0 calls ``all_reduce`` on the group of ranks 0 and 1 (``--pair``: other
  ranks) while the others call it on the default group;
* ``raise``: rank 0 waits in an ``all_reduce`` of the group of ranks 0 and 1 (``--pair``), which
  the pair's other rank (asleep) never joins, when the last rank raises (its death closes no
  connection of that group, so rank 0 stays where it is);
* ``noinit``: ``torch.distributed`` imported, no process group: every rank sleeps;
* ``held``: the last rank holds back until the file ``--until`` exists while the others wait in
  the next ``all_reduce``; then it joins them and every rank ends (exit status 0);
* ``idle``: every rank sleeps in its own code after its collectives (none in flight);
* ``ddp``: two ranks training a DDP model; at step 3 rank 1 sleeps in its data loader while
  rank 0 waits inside ``loss.backward()``;
* ``late-store``: rank 0 sleeps ``--sleep`` seconds before ``init_process_group``, so rank 1
  waits for rank 0's store (torch's TCPStore client retrying its connection), then both pass a
  barrier and end.

Every rank writes ``ready <rank> <pid>`` (one write) before it goes where it stays.
``--backend nccl`` runs ``skip``, ``type`` and ``subgroup`` on NCCL, each rank on the GPU of its
local rank (CUDA_VISIBLE_DEVICES as given), waiting for the device after its last collective
(NCCL's calls return once enqueued): ``benchmarks/check_on_gpu_machine.py`` runs it.
"""

import argparse
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--case", required=True)
parser.add_argument("--sleep", type=float, default=600.0)
parser.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
parser.add_argument("--skip-rank", type=int, default=-1)
parser.add_argument("--until", default="", help="the file the held rank waits for")
parser.add_argument("--pair", default="0,1", help="the subgroup's two ranks, rank 0 first")
args = parser.parse_args()
rank = int(os.environ["RANK"])
last = int(os.environ["WORLD_SIZE"]) - 1
skipping = args.skip_rank if args.skip_rank >= 0 else last


def ready() -> None:
    os.write(1, f"ready {rank} {os.getpid()}\n".encode())


def sleep_in_the_data_loader(step: int) -> None:
    if rank == 1 and step == 3:
        ready()
        time.sleep(args.sleep)


def main() -> None:
    if args.case == "late-store" and rank == 0:
        time.sleep(args.sleep)
    import torch
    import torch.distributed as dist

    if args.case == "noinit":
        ready()
        time.sleep(args.sleep)
        return

    device = "cpu"
    if args.backend == "nccl":
        device = f"cuda:{int(os.environ['LOCAL_RANK']) % torch.cuda.device_count()}"
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=torch.device(device))
    else:
        dist.init_process_group("gloo")

    def ones(size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.ones(size, dtype=dtype, device=device)

    if args.case == "late-store":
        dist.barrier()
        ready()
        dist.destroy_process_group()
        return
    members = [int(member) for member in args.pair.split(",")]
    pair = dist.new_group(members) if args.case in ("subgroup", "raise") else None
    if args.case == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(torch.nn.Linear(4, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(6):
            sleep_in_the_data_loader(step)
            batch = torch.randn(8, 4)
            loss = model(batch).sum()
            if rank == 0 and step == 3:
                ready()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        return
    for step in range(3):
        if args.case == "skip" and rank == skipping and step == 1:
            continue
        dist.all_reduce(ones(4))
    ready()
    if args.case == "skip":
        dist.all_reduce(ones(8))
    elif args.case == "type":
        if rank == 1:
            dist.broadcast(ones(4), src=0)
        else:
            dist.all_reduce(ones(4))
    elif args.case == "dtype":
        dist.all_reduce(ones(4, torch.int64 if rank == last else torch.float64))
        if rank == last:
            time.sleep(args.sleep)
        dist.all_reduce(ones(4))
    elif args.case == "subgroup":
        if rank == 0:
            dist.all_reduce(ones(2, torch.float64), group=pair)
        else:
            dist.all_reduce(ones(4))
    elif args.case == "held":
        while rank == last and not os.path.exists(args.until):
            time.sleep(0.1)
        dist.all_reduce(ones(4))
    elif args.case == "idle":
        if device != "cpu":
            torch.cuda.synchronize()
        time.sleep(args.sleep)
    elif args.case == "raise":
        if rank == last:
            time.sleep(1.0)  # rank 0 is in its all_reduce by then
            raise RuntimeError(f"rank {rank} gave up mid-job")
        if rank == 0:
            dist.all_reduce(ones(4), group=pair)
        time.sleep(args.sleep)
    if device != "cpu":
        torch.cuda.synchronize()  # NCCL's collectives return once enqueued: wait here
    dist.destroy_process_group()


main()

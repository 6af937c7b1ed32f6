"""A training program written the way PyTorch's DDP tutorial and many repositories write one:
``mp.spawn(train, args=(world_size, ...), nprocs=world_size, join=True)``, a gloo process group
from MASTER_ADDR/MASTER_PORT set by the parent, DDP over a small model, a DataLoader with its
own worker processes, a shared tensor the ranks write their result into, and a Queue for
per-rank reports. ``python ddp_spawn_program.py torch|numarun START_METHOD OUT.json`` runs it with
``torch.multiprocessing`` or with numarun swapped in by its import line alone."""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

if sys.argv[1] == "numarun":
    import numarun as mp
else:
    import torch.multiprocessing as mp


class ToyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net2(self.relu(self.net1(x)))


def train(rank: int, world_size: int, shared: torch.Tensor, reports) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    model = DDP(ToyModel())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(rank)
    inputs = torch.randn(32, 10, generator=generator)
    data = TensorDataset(inputs, torch.randn(32, 5, generator=generator))
    loader = DataLoader(data, batch_size=8, num_workers=2)
    for inputs, targets in loader:
        optimizer.zero_grad()
        nn.functional.mse_loss(model(inputs), targets).backward()
        optimizer.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    shared[rank].copy_(flat)  # in place, in shared memory: the parent sees it
    reports.put((rank, os.getpid(), float(flat.sum())))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    world_size = 2
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = sys.argv[4] if len(sys.argv) > 4 else "29531"
    size = sum(p.numel() for p in ToyModel().parameters())
    shared = torch.zeros(world_size, size).share_memory_()
    context = torch.multiprocessing.get_context(sys.argv[2])
    reports = context.Queue()
    mp.spawn(train, args=(world_size, shared, reports), nprocs=world_size, join=True,
             start_method=sys.argv[2])  # fmt: skip
    got = sorted(reports.get(timeout=30) for _ in range(world_size))
    result = {"params": shared.tolist(), "ranks": [r for r, _, _ in got],
              "sums": [s for _, _, s in got]}  # fmt: skip
    with open(sys.argv[3], "w") as out:
        json.dump(result, out)


if __name__ == "__main__":
    main()

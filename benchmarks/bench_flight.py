"""What the flight recorder costs: torch's recording in a training step, numarun's taking of a
rank's recorder, and the merge of a whole job's.

    python benchmarks/bench_flight.py [--rounds 5] [--steps 2000]

* Recording (torch's, on by default for gloo in torch 2.13: numarun sets no variable): a
  two-rank gloo job (numarun, this checkout) times ``--steps`` steps of ``all_reduce`` on a
  ``[256]`` tensor (the smallest collectives, where the recorder's share is largest) and of a
  small DDP model (``Linear(64, 64)``, batch 32: forward, backward, step); with the recorder at
  its default and with ``TORCH_FR_BUFFER_SIZE=0`` (off), interleaved rounds, medians of each
  round's median step time, the ratio.
* Taking (numarun's): inside a rank that ran the steps (2,000 entries in its ring buffer), the
  helper's answer to a flight-recorder request, from the request written to the answer
  complete; the dump's size.
* Reading and merging (the launcher's): the dump read (the data-only unpickler) into a record,
  and 1,024 nodes x 8 ranks of summaries read back and merged into the verdict.

Prints a markdown table and the load average before and after (the machine is shared: compare
the ratio, not the times, and re-measure on a quiet machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))

PROGRAM = textwrap.dedent(
    """
    import os, statistics, sys, time
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    steps, mode = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo")
    if mode == "all_reduce":
        tensor = torch.ones(256)
        def step():
            dist.all_reduce(tensor)
    else:
        model = DistributedDataParallel(torch.nn.Linear(64, 64))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        batch = torch.randn(32, 64)
        def step():
            model(batch).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    for _ in range(50):
        step()
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    if dist.get_rank() == 0:
        print("median", statistics.median(times), flush=True)
        if len(sys.argv) > 3:  # the launcher's taking of this rank's recorder, measured here
            sys.path.insert(0, sys.argv[3])
            from numarun.worker import dumphandler
            started = time.perf_counter()
            status, body = dumphandler._flight_record()
            print("take", time.perf_counter() - started, len(body), status.decode(), flush=True)
            open(sys.argv[4], "wb").write(body)
    dist.barrier()
    dist.destroy_process_group()
    """
)


def job(program: Path, steps: int, mode: str, recorder: bool, extra: list[str]) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_FR", "TORCH_NCCL"))}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    if not recorder:
        env["TORCH_FR_BUFFER_SIZE"] = "0"
    done = subprocess.run(
        [sys.executable, "-m", "numarun", "--nproc-per-node", "2", str(program), str(steps), mode,
         *extra],
        env=env, capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    return done.stdout.splitlines()


def merge_cost() -> tuple[float, float]:
    """(seconds to read 1,024 node summaries back, seconds to merge them), 8 ranks each."""
    from numarun.stacks import flight
    from numarun.stacks.flightverdict import merge

    summaries = []
    for node in range(1024):
        records = []
        for local in range(8):
            rank = node * 8 + local
            top = 119 if rank == 8191 else 120
            recent = tuple(
                flight.Entry(seq, "all_reduce", ((1024,),), ("BFloat16",), ((1024,),),
                             ("BFloat16",), "scheduled" if seq == top else "completed")
                for seq in range(top - 5, top + 1)
            )  # fmt: skip
            group = flight.GroupFrontier("0", "default_pg", (), top, -1, top - 1, recent)
            records.append(flight.RankRecord(rank, "2.10", "nccl", (group,)))
        summaries.append(json.dumps(flight.node_summary(records, {})).encode())
    started = time.process_time()
    records = [record for data in summaries for record in flight.read_summary(data)[0]]
    read = time.process_time() - started
    started = time.process_time()
    merge(records, world=range(8192)).lines()
    return read, time.process_time() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench_flight_") as tmp:
        program = Path(tmp) / "steps.py"
        program.write_text(PROGRAM)
        results: dict[tuple[str, bool], list[float]] = {}
        for _ in range(args.rounds):
            for mode in ("all_reduce", "ddp"):
                for recorder in (True, False):
                    lines = job(program, args.steps, mode, recorder, [])
                    median = float(next(x for x in lines if x.startswith("median")).split()[1])
                    results.setdefault((mode, recorder), []).append(median)
        dump = Path(tmp) / "dump"
        lines = job(program, args.steps, "all_reduce", True, [str(SRC), str(dump)])
        _, take, size, status = next(x for x in lines if x.startswith("take")).split()
        from numarun.stacks import flight

        data = dump.read_bytes()
        started = time.process_time()
        for _ in range(10):
            flight.read_record(flight.load_dump(data), 0)
        read_one = (time.process_time() - started) / 10
    read_all, merged = merge_cost()
    print(f"## flight recorder ({len(os.sched_getaffinity(0))} CPUs, torch "
          f"{__import__('torch').__version__}, {args.rounds} interleaved rounds of "
          f"{args.steps} steps, load {before:.1f} before)\n")  # fmt: skip
    print("| step | recorder on (default) | off (TORCH_FR_BUFFER_SIZE=0) | ratio on/off |")
    print("|---|---|---|---|")
    for mode, label in (("all_reduce", "all_reduce [256], 2 ranks"),
                        ("ddp", "DDP Linear(64, 64), batch 32, 2 ranks")):  # fmt: skip
        on = statistics.median(results[(mode, True)])
        off = statistics.median(results[(mode, False)])
        print(f"| {label} | {on * 1e6:.0f} us | {off * 1e6:.0f} us | {on / off:.3f}x |")
    print()
    print(f"- the helper's answer to a request, in the rank ({status}): {float(take) * 1e3:.1f} "
          f"ms for {int(size):,} bytes (2,000 entries, no stack traces)")
    print(f"- the launcher's reading of one such dump: {read_one * 1e3:.1f} ms of CPU")
    print(f"- 1,024 nodes x 8 ranks: summaries read back {read_all:.2f} s, merged "
          f"{merged:.2f} s of CPU")
    print(f"\nload average after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

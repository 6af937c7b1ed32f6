"""Exit-time aborts of gloo workers that never call ``destroy_process_group``, numarun next to
torchrun, side by side in one run.

Such workers sometimes die at exit with SIGABRT ("terminate called without an active
exception", a gloo thread ended while the interpreter finalizes) under both launchers. The
question is whether numarun's static rendezvous, where global rank 0's worker hosts the
``TCPStore`` (``TORCHELASTIC_USE_AGENT_STORE=False``), makes it more frequent than torchrun,
whose launcher hosts the store, and whether the order in which the workers exit matters.

Every run: 2 workers on one node, gloo, one ``all_reduce``, then the script ends without
``destroy_process_group``. Variants, interleaved run by run so that load falls on all alike:

* ``numarun``: ``numarun --nproc-per-node 2 worker.py`` (rank 0's worker hosts the store);
* ``torchrun``: ``torchrun --nproc-per-node 2 --master-port P worker.py`` (torchrun's default
  static rendezvous; its agent hosts the store);
* ``numarun-host-last``: as ``numarun``, rank 0 waits 1 s before it ends, so the
  other rank exits first -- what a launcher holding the store's host back would do;
* ``numarun-host-first``: rank 1 waits 1 s, rank 0 exits first;
* ``numarun-settle``: each rank waits 0.5 s after its last collective;
* ``numarun-destroy``, ``torchrun-destroy``: the script calls ``destroy_process_group()``.

A run counts as aborted when a worker died of SIGABRT (the launcher's report names it, or the
C++ runtime printed "terminate called without an active exception"); any other failure is
counted apart. The table gives the count, the rate and its 95 % Wilson interval.

Usage: ``python benchmarks/bench_exit_abort.py [--runs 50] [--variants numarun,torchrun,...]``
(torch must be importable: torch==2.13.0 CPU here).
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKER = """\
import sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
tensor = torch.ones(4)
dist.all_reduce(tensor)
assert tensor[0].item() == dist.get_world_size()
wait_rank, seconds = int(sys.argv[1]), float(sys.argv[2])
if wait_rank == -1 or dist.get_rank() == wait_rank:
    time.sleep(seconds)
if wait_rank == -3:
    dist.destroy_process_group()  # the fix on the user's side
# Otherwise no destroy_process_group(): the interpreter's exit tears gloo down.
"""

# name -> (launcher, rank that waits before ending (-1: every rank; -2: none; -3: none, and
# destroy_process_group() is called), seconds)
VARIANTS = {
    "numarun": ("numarun", -2, 0.0),
    "torchrun": ("torchrun", -2, 0.0),
    "numarun-host-last": ("numarun", 0, 1.0),
    "numarun-host-first": ("numarun", 1, 1.0),
    "numarun-settle": ("numarun", -1, 0.5),
    "numarun-destroy": ("numarun", -3, 0.0),
    "torchrun-destroy": ("torchrun", -3, 0.0),
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _command(launcher: str, script: Path, wait_rank: int, seconds: float) -> list[str]:
    args = [str(script), str(wait_rank), str(seconds)]
    if launcher == "numarun":
        return [sys.executable, "-m", "numarun", "--nproc-per-node", "2", *args]
    return [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "--master-port", str(_free_port()), *args,
    ]  # fmt: skip


OTHERS: list[str] = []  # what the first other failures said, shown after the table


def _outcome(command: list[str]) -> str:
    """"ok", "abort" (a worker died of SIGABRT) or "other" (any other failure)."""
    try:
        done = subprocess.run(
            command, env=_env(), capture_output=True, text=True, errors="replace", timeout=120
        )
    except subprocess.TimeoutExpired:
        return "other"
    if done.returncode == 0:
        return "ok"
    text = done.stdout + done.stderr
    if "SIGABRT" in text or "terminate called without an active exception" in text:
        return "abort"
    if len(OTHERS) < 5:
        said = [line for line in text.splitlines() if "Root cause" in line or "error" in line]
        OTHERS.append(f"exit {done.returncode}: " + " / ".join(said[:2])[:300])
    return "other"


def _wilson(hits: int, total: int, z: float = 1.96) -> tuple[float, float]:
    if not total:
        return 0.0, 0.0
    p = hits / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return max(0.0, centre - half), min(1.0, centre + half)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    options = parser.parse_args()
    chosen = [name.strip() for name in options.variants.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    counts = {name: {"ok": 0, "abort": 0, "other": 0} for name in chosen}
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "worker.py"
        script.write_text(WORKER)
        for run in range(options.runs):
            for name in chosen:
                launcher, wait_rank, seconds = VARIANTS[name]
                counts[name][_outcome(_command(launcher, script, wait_rank, seconds))] += 1
            print(
                f"after {run + 1} runs each: "
                + ", ".join(f"{name} {counts[name]['abort']}" for name in chosen),
                file=sys.stderr,
                flush=True,
            )
    print(f"\n{options.runs} runs per variant, interleaved, {time.monotonic() - started:.0f} s\n")
    print("| variant | aborted (SIGABRT) | rate | 95% interval | other failures |")
    print("|---|---|---|---|---|")
    for name in chosen:
        aborts, total = counts[name]["abort"], options.runs
        low, high = _wilson(aborts, total)
        print(
            f"| {name} | {aborts}/{total} | {aborts / total:.0%} | {low:.0%}-{high:.0%} "
            f"| {counts[name]['other']} |"
        )
    for line in OTHERS:
        print(f"\nother failure: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A one-node c10d job's start: from launching to the first worker's first line, numarun against
torchrun, and against numarun's code before a change (issue 32, item 6).

Each contender runs ``--nnodes 1 --nproc-per-node N --rdzv-backend c10d --rdzv-endpoint
localhost:0`` with a trivial worker that writes ``CLOCK_MONOTONIC`` first thing; the figure is
the first worker's stamp minus the moment the launcher was started. The contenders run
interleaved, round after round, so load from elsewhere on the machine hits them alike; medians
and the interquartile range, and each one's ratio to torchrun. Most of the time is the
launcher's ``import torch`` (the same for both launchers); numarun's own part is the round after
it.

Usage: ``python benchmarks/bench_c10d_first_round.py [--runs 10] [--nproc 2] [--base OLD_SRC]``;
``--base`` adds numarun from another tree (e.g. ``git worktree add /tmp/old main``, then
``--base /tmp/old/src``) as a third contender.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
STARTED = """\
import os, sys, time
stamp = time.clock_gettime(time.CLOCK_MONOTONIC)
with open(os.path.join(sys.argv[1], os.environ["RANK"] + ".t"), "w") as f:
    f.write(repr(stamp))
"""


def _env(src: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PET_", "TORCHELASTIC_", "NUMARUN_"))}  # fmt: skip
    env["OMP_NUM_THREADS"] = "1"
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if src is not None:
        env["PYTHONPATH"] = str(src) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def first_line(command: list[str], env: dict[str, str], folder: Path) -> float:
    """Seconds from starting ``command`` to its first worker's first line."""
    for path in folder.glob("*.t"):
        path.unlink()
    started = time.clock_gettime(time.CLOCK_MONOTONIC)
    done = subprocess.run(command, env=env, capture_output=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"{command[:4]} failed: {done.stderr.decode()[-2000:]}")
    stamps = [float(path.read_text()) for path in folder.glob("*.t")]
    return min(stamps) - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--base", type=Path, help="another tree's src/ (numarun before a change)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_c10d_") as tmp:
        folder = Path(tmp)
        worker = folder / "worker.py"
        worker.write_text(STARTED)
        flags = ["--nnodes", "1", "--nproc-per-node", str(args.nproc), "--rdzv-backend", "c10d",
                 "--rdzv-endpoint", "localhost:0"]  # fmt: skip
        contenders = {
            "torchrun": ([sys.executable, "-m", "torch.distributed.run", *flags], _env(None)),
            "numarun": ([sys.executable, "-m", "numarun", *flags], _env(SRC)),
        }
        if args.base is not None:
            contenders["numarun (base)"] = (
                [sys.executable, "-m", "numarun", *flags], _env(args.base.resolve())
            )
        samples: dict[str, list[float]] = {name: [] for name in contenders}
        for run in range(args.runs + 1):  # the first round warms the caches, not counted
            for name, (command, env) in contenders.items():
                took = first_line([*command, str(worker), tmp], env, folder)
                if run:
                    samples[name].append(took)
    load = os.getloadavg()
    print(f"## one-node c10d: launch -> first worker's first line ({args.nproc} workers, "
          f"{args.runs} runs, load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f})\n")  # fmt: skip
    print("| launcher | median ms | IQR ms | vs torchrun |")
    print("|---|---|---|---|")
    anchor = statistics.median(samples["torchrun"])
    for name, values in samples.items():
        q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
        median = statistics.median(values)
        print(f"| {name} | {median * 1e3:.0f} | {q[0] * 1e3:.0f}-{q[2] * 1e3:.0f} | "
              f"{median / anchor:.2f}x |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

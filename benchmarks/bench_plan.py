"""How long reading a DGX H100 and planning 8 ranks takes, per binding mode.

    python benchmarks/bench_plan.py [--runs 200]

Builds the fake DGX H100 sysfs tree (tests/sysfs_fixtures.py) in a temporary directory, then for
each mode times ``read_topology`` + ``make_plan`` for 8 ranks and prints the median against the
5 ms target. The anchor, measured side by side in the same run on the same tree, is PyTorch
2.13's ``torch.numa.binding`` computing the same 8 CPU sets (its sysfs reads redirected to the
tree); ratios below 1 mean numarun is faster. Without torch the anchor column says "n/a".
It also counts the files opened during one read + plan and prints the most opens of any one file
(the reader promises 1).
"""

from __future__ import annotations

import argparse
import builtins
import io
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from numarun.machine.topology import read_topology  # noqa: E402
from numarun.placement.plan import GPU_MODES, make_plan  # noqa: E402
from sysfs_fixtures import FakeMachine, dgx_h100, write_sysfs  # noqa: E402

MODES = (*GPU_MODES, "cpu")
NPROCS = 8
TARGET_MS = 5.0


def median_ms(action: Callable[[], object], runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        action()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000


def read_and_plan(root: Path, mode: str) -> Callable[[], object]:
    return lambda: make_plan(read_topology(str(root), environ={}), NPROCS, mode)


@contextmanager
def counting_opens(root: Path) -> Iterator[Counter[str]]:
    """Count opens of files under ``root`` through open(), io.open() and os.open()."""
    counts: Counter[str] = Counter()
    prefix = str(root)
    real_builtin, real_io, real_os = builtins.open, io.open, os.open

    def note(path: object) -> None:
        text = os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else ""
        if text.startswith(prefix):
            counts[text[len(prefix) :]] += 1

    def builtin_open(file, *args, **kwargs):  # type: ignore[no-untyped-def]
        note(file)
        return real_builtin(file, *args, **kwargs)

    def os_open(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        note(path)
        return real_os(path, *args, **kwargs)

    builtins.open, io.open, os.open = builtin_open, builtin_open, os_open
    try:
        yield counts
    finally:
        builtins.open, io.open, os.open = real_builtin, real_io, real_os


def torch_anchor(root: Path, machine: FakeMachine, mode: str) -> Callable[[], object] | None:
    """PyTorch's per-rank CPU computation for 8 ranks on the tree, or None without torch."""
    try:
        import torch.numa.binding as reference
    except ImportError:
        return None
    if mode not in GPU_MODES:
        return None
    real_open, real_listdir = open, os.listdir
    prefix = str(root)

    def under(path: str) -> str:
        return prefix + path if path.startswith("/sys/") else path

    # Module globals shadow the builtins for torch's own functions only.
    reference.open = lambda path, *a, **k: real_open(under(path), *a, **k)  # type: ignore[attr-defined]
    allowed = set(machine.online_cpus)
    reference._get_allowed_cpu_indices_for_current_thread = allowed.copy
    reference._get_gpu_count = lambda: len(machine.gpus)
    reference._get_numa_node_index_for_gpu_index = lambda *, gpu_index: max(
        machine.gpus[gpu_index].numa_node, 0
    )
    options = reference.NumaOptions(affinity_mode=reference.AffinityMode(mode))

    def compute() -> object:
        os.listdir = lambda path: real_listdir(under(os.fspath(path)))
        try:
            return [
                reference._get_logical_cpus_to_bind_to(gpu_index=i, numa_options=options)
                for i in range(NPROCS)
            ]
        finally:
            os.listdir = real_listdir

    return compute


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="timed runs per mode (median)")
    args = parser.parse_args()
    machine = dgx_h100()
    with tempfile.TemporaryDirectory(prefix="numarun-bench-") as tmp:
        root = write_sysfs(machine, Path(tmp))
        read_and_plan(root, "node")()  # warm the page cache and imports
        with counting_opens(root) as counts:
            read_and_plan(root, "exclusive")()
        read_ms = median_ms(lambda: read_topology(str(root), environ={}), args.runs)
        topology = read_topology(str(root), environ={})
        print(f"DGX H100 fake tree, {NPROCS} ranks, median of {args.runs} runs")
        print(f"read_topology alone: {read_ms:.2f} ms")
        header = f"{'mode':<13} | {'median ms':>9} | {'plan only ms':>12} | {'target':>6} | "
        print(header + f"{'torch ms':>8} | {'ratio':>5}")
        print("-" * (len(header) + 16))
        worst = 0.0
        for mode in MODES:
            total = median_ms(read_and_plan(root, mode), args.runs)
            plan_only = median_ms(lambda mode=mode: make_plan(topology, NPROCS, mode), args.runs)
            worst = max(worst, total)
            anchor = torch_anchor(root, machine, mode)
            if anchor is None:
                anchor_text, ratio_text = "n/a", "n/a"
            else:
                anchor_ms = median_ms(anchor, max(args.runs // 10, 5))
                anchor_text, ratio_text = f"{anchor_ms:.2f}", f"{total / anchor_ms:.2f}"
            print(
                f"{mode:<13} | {total:>9.2f} | {plan_only:>12.3f} | {TARGET_MS:>4.0f} ms | "
                f"{anchor_text:>8} | {ratio_text:>5}"
            )
        print(
            f"sysfs files opened in one read + plan: {len(counts)}, "
            f"max opens of one file: {max(counts.values(), default=0)}"
        )
        print(f"worst mode: {worst:.2f} ms ({'meets' if worst < TARGET_MS else 'MISSES'} target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

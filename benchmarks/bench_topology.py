"""How long ``read_topology`` takes on a DGX H100 tree, next to the raw cost of its files.

    python benchmarks/bench_topology.py [--runs 200] [--shape dgx_h100] [--root DIR]

Writes the fake sysfs tree of ``--shape`` (tests/sysfs_fixtures.py) to tmpfs when there is one
(sysfs lives in memory too), or reads ``--root`` (``/`` for this machine). Measured side by
side, interleaved run by run, medians over ``--runs``:

* ``read_topology``: the full reader (NVML off, empty environment);
* anchor "raw files": open + read + close of exactly the files the reader opens, nothing else:
  the floor any reader of that information pays;
* anchor "naive walk": every file of every CPU's ``topology/`` and ``cache/index*/`` directory
  plus the node and PCI files, read once each: what a reader that does not deduplicate
  through sibling and shared-cache lists pays.

Prints how many files the reader opened and that none was opened twice. Target: read (and,
once added, plan) under 5 ms on the 2-core CI box for a DGX H100.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # sysfs_fixtures

from numarun.machine import topology  # noqa: E402
from numarun.machine.topology import read_topology  # noqa: E402


def time_read(root: str | Path, runs: int = 100) -> float:
    """Median seconds of ``read_topology(root, environ={})`` over ``runs`` calls."""
    return _median(lambda: read_topology(root, environ={}), runs)


def files_opened(root: str | Path) -> Counter[str]:
    """How many times each file was opened by one ``read_topology`` call."""
    opened: Counter[str] = Counter()
    real = topology._read_text

    def counting(path: str) -> str | None:
        opened[path] += 1
        return real(path)

    topology._read_text = counting
    try:
        read_topology(root, environ={})
    finally:
        topology._read_text = real
    return opened


def _median(action: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _read_all(paths: list[str]) -> None:
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.read(fd, 65536)
        finally:
            os.close(fd)


def _naive_paths(root: str) -> list[str]:
    """Every per-CPU topology and cache file, and every node and PCI attribute file."""
    cpu_dir = os.path.join(root, "sys/devices/system/cpu")
    paths = []
    for name in os.listdir(cpu_dir):
        if not (name.startswith("cpu") and name[3:].isdigit()):
            continue
        topo = os.path.join(cpu_dir, name, "topology")
        if os.path.isdir(topo):
            paths += [os.path.join(topo, f) for f in os.listdir(topo)]
        cache = os.path.join(cpu_dir, name, "cache")
        if os.path.isdir(cache):
            for index in os.listdir(cache):
                d = os.path.join(cache, index)
                if index.startswith("index"):
                    paths += [os.path.join(d, f) for f in ("level", "type", "shared_cpu_list")]
    node_dir = os.path.join(root, "sys/devices/system/node")
    for name in os.listdir(node_dir):
        if name.startswith("node"):
            paths += [os.path.join(node_dir, name, f) for f in ("cpulist", "meminfo", "distance")]
    pci = os.path.join(root, "sys/bus/pci/devices")
    for addr in os.listdir(pci):
        paths += [os.path.join(pci, addr, f) for f in ("class", "vendor", "numa_node")]
    return paths


def _interleaved(contenders: dict[str, Callable[[], object]], runs: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(runs):
        for name, action in contenders.items():
            start = time.perf_counter()
            action()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--shape", default="dgx_h100")
    parser.add_argument("--root", help="read this tree instead of writing a fake one")
    args = parser.parse_args()

    import sysfs_fixtures

    scratch = None
    if args.root:
        root = args.root
    else:
        scratch = sysfs_fixtures.scratch_dir()
        root = str(sysfs_fixtures.write_sysfs(sysfs_fixtures.SHAPES[args.shape](), Path(scratch)))
    try:
        opened = files_opened(root)
        raw = sorted(opened)
        naive = _naive_paths(root)
        read_topology(root, environ={})  # warm the page and dentry caches
        medians = _interleaved(
            {
                "read_topology": lambda: read_topology(root, environ={}),
                "raw files": lambda: _read_all(raw),
                "naive walk": lambda: _read_all(naive),
            },
            args.runs,
        )
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    label = args.root or args.shape
    print(
        f"{label}: read_topology opened {len(opened)} files, "
        f"max opens of one file = {max(opened.values())}; naive walk reads {len(naive)} files"
    )
    reader = medians["read_topology"]
    print("| contender | median ms | read_topology / contender |\n|---|---|---|")
    for name, value in medians.items():
        print(f"| {name} | {value * 1e3:.3f} | {reader / value:.2f}x |")
    print(f"target: read_topology < 5 ms -> {'met' if reader < 0.005 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

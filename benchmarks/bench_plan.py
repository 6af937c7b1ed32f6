"""How long reading a DGX H100 and planning 8 ranks takes, per binding mode.

    python benchmarks/bench_plan.py [--runs 200]

Builds the fake DGX H100 sysfs tree (tests/sysfs_fixtures.py) in a temporary directory, then for
each mode times ``read_topology`` + ``make_plan`` for 8 ranks and prints the median against the
5 ms target. The anchor, measured side by side in the same run on the same tree, is PyTorch
2.13's ``torch.numa.binding`` computing the same 8 CPU sets (its sysfs reads redirected to the
tree); ratios below 1 mean numarun is faster. Without torch the anchor column says "n/a".
It also counts the files opened during one read + plan and prints the most opens of any one file
(the reader promises 1).

The command, as a user runs it: ``numarun plan`` for the same tree and 8 ranks (exclusive) over
``numarun plan --help`` (the interpreter, ``site`` and the command line: the anchor), each a
fresh process from bytecode, run in turn ``--command-runs`` times; the figure is the median of
the paired differences (target: under 5 ms). ``--base OLD/src`` runs another numarun tree the
same way, interleaved, for a before/after in one run.
"""

from __future__ import annotations

import argparse
import builtins
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
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


def command_ms(src: Path, argv: list[str]) -> float:
    """Milliseconds of one ``python -m numarun ARGV`` from ``src``, from bytecode."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(src)
    env["PYTHONPYCACHEPREFIX"] = str(Path(tempfile.gettempdir()) / "bench_plan_pycache")
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "numarun", *argv], env=env, check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    return (time.perf_counter() - started) * 1000


def command_rows(root: Path, trees: list[tuple[str, Path]], runs: int) -> list[str]:
    """``numarun plan`` over ``numarun plan --help`` for each tree, interleaved."""
    plan = ["plan", "--sysfs-root", str(root), "--nproc-per-node", str(NPROCS),
            "--numa-binding", "exclusive"]  # fmt: skip
    for _, src in trees:  # bytecode written, page cache warm
        command_ms(src, plan)
        command_ms(src, ["plan", "--help"])
    samples: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name, _ in trees}
    for _ in range(runs):
        for name, src in trees:
            helped, planned = samples[name]
            helped.append(command_ms(src, ["plan", "--help"]))
            planned.append(command_ms(src, plan))
    rows = []
    for name, (helped, planned) in samples.items():
        over = statistics.median(p - h for p, h in zip(planned, helped, strict=True))
        rows.append(
            f"| {name} | {statistics.median(helped):.1f} ms | {statistics.median(planned):.1f} ms "
            f"| {over:.1f} ms | < {TARGET_MS:.0f} ms |"
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="timed runs per mode (median)")
    parser.add_argument("--command-runs", type=int, default=30, help="command pairs (median)")
    parser.add_argument("--base", type=Path, help="another numarun's src, run alongside")
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
        trees = [("numarun", SRC)] + ([("base", args.base)] if args.base else [])
        print(f"\nThe command, {args.command_runs} pairs in turn (load {os.getloadavg()[0]:.1f}):")
        print("| tree | `plan --help` | `plan` (DGX H100, 8 ranks) | `plan` over `--help` "
              "| target |")  # fmt: skip
        print("|---|---|---|---|---|")
        for row in command_rows(root, trees, args.command_runs):
            print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())

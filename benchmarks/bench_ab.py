"""Two versions of numarun side by side: measurement by measurement, alternating.

The other benchmarks compare numarun with its anchors; this one compares a change with the code
before it, on the figures that change could move: the ``numarun`` command's start-up and
failure-to-exit (``bench_launch.py``'s two rows), ``numarun.spawn``'s start-up and
failure-to-teardown (``bench_spawn.py``'s, from a parent with or without torch) and, with
``--restart``, the static restart of 4 workers (``bench_restart.py``'s, both kinds of
worker). Each sample runs the two versions back to back, in alternating order, so that load
from elsewhere on a shared machine hits both alike; the figure to read is the median of the
paired differences.

Usage: ``python benchmarks/bench_ab.py --base OLD_SRC [--new src] [--rounds 40] [--torch]
[--restart]``,
where OLD_SRC holds the old ``numarun`` package, e.g. made with ``git worktree add /tmp/old
<commit>`` (then ``--base /tmp/old/src``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_launch  # noqa: E402

# One per version: imports that version's numarun (and torch, if asked), then runs the
# measurement named on each stdin line and prints its result in seconds.
SPAWN_HELPER = r"""
import json, sys
sys.path.insert(0, sys.argv[2])
if sys.argv[1] == "torch":
    import torch  # noqa: F401
import bench_spawn, numarun
from numarun import ProcessRaisedException
for line in sys.stdin:
    what, n = line.split()
    if what == "start":
        value = bench_spawn.start_numarun(int(n), "spawn")
    else:
        value = bench_spawn.teardown(numarun.spawn, ProcessRaisedException, int(n))
    print(json.dumps(value), flush=True)
"""


def paired(call: Callable[[str], float], rounds: int) -> list[tuple[float, float]]:
    """``rounds`` (base, new) pairs, the order alternating from one pair to the next."""
    pairs = []
    for round_ in range(rounds):
        order = ("base", "new") if round_ % 2 == 0 else ("new", "base")
        got = {name: call(name) for name in order}
        pairs.append((got["base"], got["new"]))
    return pairs


def row(label: str, pairs: list[tuple[float, float]]) -> str:
    base = statistics.median(b for b, _ in pairs) * 1e3
    new = statistics.median(n for _, n in pairs) * 1e3
    diff = statistics.median(n - b for b, n in pairs) * 1e3
    return f"| {label} | {base:.1f} ms | {new:.1f} ms | {diff:+.2f} ms |"


def launcher_rows(trees: dict[str, str], rounds: int) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="bench_ab_") as directory:
        return _launcher_rows(trees, rounds, Path(directory))


def _launcher_rows(trees: dict[str, str], rounds: int, folder: Path) -> list[str]:
    started = folder / "started.py"
    started.write_text(bench_launch.STARTED)
    failing = folder / "failing.py"
    failing.write_text(bench_launch.FAILING)

    def with_tree(name: str) -> None:
        os.environ["PYTHONPATH"] = trees[name]  # bench_launch's _quiet_env reads os.environ

    def start(name: str) -> float:
        with_tree(name)
        command = bench_launch._numarun(4, str(started), str(folder))
        return bench_launch.startup_launcher(command, 4, folder)

    def fail(name: str) -> float:
        with_tree(name)
        command = bench_launch._numarun(4, str(failing), str(folder), "0.3")
        return bench_launch.failure_latency(command, folder)

    start("base")  # warm the bytecode caches of both
    start("new")
    return [
        row("`numarun`: start to the last of 4 workers' first line", paired(start, rounds)),
        row("`numarun`: a worker's failure to the launcher's exit", paired(fail, rounds)),
    ]


def restart_rows(trees: dict[str, str], rounds: int) -> list[str]:
    """A worker's failure to every worker of the next attempt running, static rendezvous, 4
    workers (``bench_restart.restart_latency``), ``-S`` and script workers."""
    import bench_restart

    rows = []
    own_src = bench_restart.SRC
    with tempfile.TemporaryDirectory(prefix="bench_ab_") as directory:
        folder = Path(directory)
        (folder / "worker_script.py").write_text(bench_restart.WORKER.format(imports=""))
        launcher = bench_restart.Row("numarun", "static")
        for kind, label in (("fast", "`python3 -S -c`"), ("script", "script")):

            def restart(name: str, kind: str = kind) -> float:
                # bench_restart puts its own src first on PYTHONPATH: the tree under test instead
                bench_restart.SRC = Path(trees[name])
                try:
                    return bench_restart.restart_latency(launcher, kind, folder, 4)
                finally:
                    bench_restart.SRC = own_src

            restart("base")  # warm the bytecode caches of both
            restart("new")
            label = f"`numarun`: static restart, 4 {label} workers"
            rows.append(row(label, paired(restart, rounds)))
    return rows


def spawn_rows(trees: dict[str, str], rounds: int, torch: bool) -> list[str]:
    mode = "torch" if torch else "none"
    helpers = {
        name: subprocess.Popen(
            [sys.executable, "-c", SPAWN_HELPER, mode, str(HERE)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONPATH": tree},
        )
        for name, tree in trees.items()
    }

    def ask(name: str, what: str, n: int) -> float:
        helper = helpers[name]
        assert helper.stdin is not None and helper.stdout is not None
        helper.stdin.write(f"{what} {n}\n")
        helper.stdin.flush()
        return float(json.loads(helper.stdout.readline()))

    parent = "torch imported" if torch else "no torch"
    try:
        for name in helpers:
            ask(name, "start", 1)  # warm up
        rows = [
            row(
                f"`numarun.spawn` ({parent}): start to the last of {n} workers' first line",
                paired(lambda name, n=n: ask(name, "start", n), rounds),
            )
            for n in (1, 2, 4)
        ]
        rows.append(
            row(
                f"`numarun.spawn` ({parent}): failure to full teardown, 4 workers",
                paired(lambda name: ask(name, "teardown", 4), rounds),
            )
        )
        return rows
    finally:
        for helper in helpers.values():
            assert helper.stdin is not None
            helper.stdin.close()
            helper.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the old numarun's src directory")
    parser.add_argument("--new", default=str(HERE.parent / "src"), help="the new one's")
    parser.add_argument("--rounds", type=int, default=40, help="pairs per figure")
    parser.add_argument("--torch", action="store_true", help="also spawn from a torch parent")
    parser.add_argument("--restart", action="store_true", help="also the static restart")
    args = parser.parse_args()
    trees = {"base": os.path.abspath(args.base), "new": os.path.abspath(args.new)}
    print(f"Machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}; {args.rounds} pairs")
    print("\n| measurement | base (median) | new (median) | median of paired differences |")
    print("|---|---|---|---|")
    for line in launcher_rows(trees, args.rounds):
        print(line, flush=True)
    for torch in (False, True) if args.torch else (False,):
        for line in spawn_rows(trees, args.rounds, torch):
            print(line, flush=True)
    for line in restart_rows(trees, args.rounds) if args.restart else ():
        print(line, flush=True)


if __name__ == "__main__":
    main()

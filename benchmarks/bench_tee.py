"""Benchmark the ``--tee`` path: wall time and lost / duplicated / broken console lines.

Three measurements, side by side in one run, each the median of ``--repeat`` runs:

* ``sinks``: numarun.process.sinks.TeeSink fed from real pipes by a small select loop (the
  supervisor's job), N worker processes each printing ``--lines`` lines under ``python -u``
  (so every ``print`` is two writes: the text, then the newline -- the pattern that merges lines).
* ``numarun``: ``python -m numarun --nproc-per-node N --tee 3 worker.py`` (skipped with a note
  when the launcher is not importable).
* ``torchrun``: ``python -m torch.distributed.run --standalone --nproc-per-node N --tee 3``.
* ``anchor``: the same N workers started directly, output to files, no launcher.

Every console line must read ``<prefix>r<rank> line <i>``; a line is *broken* if it does not,
*duplicated* if seen twice, *lost* if never seen, *out of order* if a rank's lines are not in
order. Prints a markdown table and the numarun/torchrun wall-time ratio (target: no damage,
at most 0.5).

Usage: ``python benchmarks/bench_tee.py [--workers 2] [--lines 200000] [--repeat 3]``
"""

from __future__ import annotations

import argparse
import os
import re
import selectors
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from numarun.launch.output import make_prefix
from numarun.process.sinks import TeeSink

WORKER = """\
import os, sys
rank = int(os.environ.get("RANK", sys.argv[2] if len(sys.argv) > 2 else 0))
for i in range(int(sys.argv[1])):
    print(f"r{rank} line {i}")
"""

LINE = re.compile(rb"\[(?:rank|default)(\d+)\]: ?r(\d+) line (\d+)")


@dataclass(frozen=True)
class Damage:
    lines: int
    lost: int
    duplicated: int
    broken: int
    out_of_order: int

    @property
    def clean(self) -> bool:
        return not (self.lost or self.duplicated or self.broken or self.out_of_order)


def check_console(text: bytes, workers: int, lines: int) -> Damage:
    seen: list[set[int]] = [set() for _ in range(workers)]
    last = [-1] * workers
    broken = duplicated = out_of_order = total = 0
    for line in text.split(b"\n"):
        if not line or line.startswith(b"numarun:") or not line.startswith(b"["):
            continue  # launcher chatter on the same stream
        total += 1
        match = LINE.fullmatch(line)
        if match is None or match[1] != match[2] or int(match[1]) >= workers:
            broken += 1
            continue
        rank, index = int(match[1]), int(match[3])
        if index in seen[rank]:
            duplicated += 1
        seen[rank].add(index)
        if index < last[rank]:
            out_of_order += 1
        last[rank] = index
    lost = sum(lines - len(indices) for indices in seen)
    return Damage(total, lost, duplicated, broken, out_of_order)


def run_sinks(workdir: Path, workers: int, lines: int) -> tuple[float, Damage]:
    console_path = workdir / "console_sinks"
    console = os.open(console_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    selector = selectors.DefaultSelector()
    started = time.perf_counter()
    procs = []
    for rank in range(workers):
        read_end, write_end = os.pipe()
        command = [sys.executable, "-u", str(workdir / "worker.py"), str(lines), str(rank)]
        procs.append(subprocess.Popen(command, stdout=write_end))
        os.close(write_end)
        sink = TeeSink(workdir / f"sinks_{rank}.log", console, make_prefix(rank, rank, environ={}))
        selector.register(read_end, selectors.EVENT_READ, sink)
    remaining = workers
    while remaining:
        for key, _ in selector.select():
            chunk = os.read(key.fd, 1 << 16)
            if chunk:
                key.data.feed(chunk)
            else:
                key.data.close()
                selector.unregister(key.fd)
                os.close(key.fd)
                remaining -= 1
    for proc in procs:
        proc.wait()
    elapsed = time.perf_counter() - started
    selector.close()
    os.close(console)
    return elapsed, check_console(console_path.read_bytes(), workers, lines)


def run_command(command: list[str], workdir: Path, name: str, workers: int, lines: int):
    out_path = workdir / f"console_{name}"
    with open(out_path, "wb") as out, open(workdir / f"stderr_{name}", "wb") as err:
        started = time.perf_counter()
        code = subprocess.run(command, stdout=out, stderr=err, cwd=workdir, timeout=600).returncode
        elapsed = time.perf_counter() - started
    if code != 0:
        tail = (workdir / f"stderr_{name}").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"{name} exited {code}:\n{tail}")
    return elapsed, check_console(out_path.read_bytes(), workers, lines)


def run_anchor(workdir: Path, workers: int, lines: int) -> tuple[float, Damage]:
    started = time.perf_counter()
    procs = []
    for rank in range(workers):
        with open(workdir / f"anchor_{rank}.log", "wb") as out:
            command = [sys.executable, "-u", str(workdir / "worker.py"), str(lines), str(rank)]
            procs.append(subprocess.Popen(command, stdout=out))
    for proc in procs:
        proc.wait()
    elapsed = time.perf_counter() - started
    text = b"".join(
        b"".join(b"[rank%d]: " % rank + line + b"\n" for line in path.read_bytes().splitlines())
        for rank, path in ((r, workdir / f"anchor_{r}.log") for r in range(workers))
    )
    return elapsed, check_console(text, workers, lines)


def launcher_available() -> bool:
    try:
        import numarun.launch.launcher  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-torchrun", action="store_true")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench_tee_") as tmp:
        workdir = Path(tmp)
        (workdir / "worker.py").write_text(WORKER)
        env_args = [str(args.lines)]
        runners = {"anchor (no launcher)": lambda: run_anchor(workdir, args.workers, args.lines)}
        runners["numarun TeeSink + select loop"] = lambda: run_sinks(
            workdir, args.workers, args.lines
        )
        if launcher_available():
            numarun_cmd = [sys.executable, "-m", "numarun", "--nproc-per-node", str(args.workers)]
            numarun_cmd += ["--tee", "3", "--log-dir", str(workdir / "nr_logs"), "worker.py"]
            runners["numarun --tee 3"] = lambda: run_command(
                numarun_cmd + env_args, workdir, "numarun", args.workers, args.lines
            )
        else:
            print("note: numarun.launch.launcher not importable; benchmarking the sinks only")
        if not args.no_torchrun:
            torch_cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
            torch_cmd += ["--nproc-per-node", str(args.workers), "--tee", "3"]
            torch_cmd += ["--log-dir", str(workdir / "tr_logs"), "worker.py"]
            runners["torchrun --tee 3"] = lambda: run_command(
                torch_cmd + env_args, workdir, "torchrun", args.workers, args.lines
            )

        results: dict[str, tuple[float, Damage]] = {}
        for name, runner in runners.items():
            times, damage = [], None
            for _ in range(args.repeat):
                elapsed, damage = runner()
                times.append(elapsed)
            results[name] = (statistics.median(times), damage)

    print(
        f"\n{args.workers} workers x {args.lines} lines (print under -u), "
        f"median of {args.repeat} runs\n"
    )
    print("| path | wall s | console lines | lost | duplicated | broken | out of order |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, (wall, d) in results.items():
        print(
            f"| {name} | {wall:.2f} | {d.lines} | {d.lost} | {d.duplicated} | {d.broken} "
            f"| {d.out_of_order} |"
        )
    anchor = results["anchor (no launcher)"][0]
    for name, (wall, _) in results.items():
        print(f"{name}: {wall / anchor:.2f}x the anchor")
    if "numarun --tee 3" in results and "torchrun --tee 3" in results:
        ratio = results["numarun --tee 3"][0] / results["torchrun --tee 3"][0]
        print(f"numarun / torchrun wall time: {ratio:.2f} (target <= 0.5)")
    damaged = [name for name, (_, d) in results.items() if not d.clean]
    print("damage: none" if not damaged else f"damage in: {', '.join(damaged)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

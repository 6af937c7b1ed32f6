"""Restart latency and launcher CPU of ``numarun`` next to torchrun, side by side in one run.

Two figures, printed as markdown tables:

* restart: one node, N workers, ``--max-restarts 1``. On the first attempt rank 0 records
  ``CLOCK_MONOTONIC`` and exits 1 while the others sleep; every worker records the moment it
  starts. The figure is from rank 0's exit to the last worker of the second attempt running
  its first line. Each launcher with each backend, and each numarun row compared with
  torchrun's row of the same backend, workers and run: the static rendezvous (numarun's is
  torch-free and picks a free port; torchrun's, ``--rdzv-backend static --master-port P``,
  hosts its store in the agent) and c10d (``--rdzv-backend c10d --rdzv-endpoint
  localhost:0``, torchrun's own default for one node). Target: numarun at most one fifth of
  torchrun's time. Two kinds of worker: ``python3
  -S -c CODE`` started with ``--no-python`` (an interpreter without ``site``, about 10 ms to
  start: the figure is mostly the launchers' own restart machinery), and a plain script
  (``python -u worker.py`` through each launcher's usual path: N interpreters starting on
  this machine's cores are part of the figure).
* launcher CPU while workers run: one node, c10d, N workers that sleep; the launcher
  process's CPU time over ``--cpu-seconds`` of wall time, from one second after every worker
  started (every thread, from the scheduler's nanosecond counters in
  ``/proc/<pid>/task/*/schedstat``). numarun looks at the rendezvous every 2 s (its default
  ``--monitor-interval``) and torch's rendezvous handler sends a keep-alive every 5 s;
  torchrun polls its workers every 0.1 s. Target: numarun <= 1 ms of CPU per second.

The workers do not import torch: the figures are the launchers' own. Bytecode is cached under
``$TMPDIR/bench_launch_pycache``, as in ``bench_launch.py``.

Usage: ``python benchmarks/bench_restart.py [--runs 7] [--nproc 4] [--cpu-seconds 20]``.
Medians; the spread is the interquartile range.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

WORKER = """\
import os, sys, time
stamp = time.clock_gettime(time.CLOCK_MONOTONIC)
folder, mode = sys.argv[1], sys.argv[2]
rank, attempt = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
with open(os.path.join(folder, f"start.{attempt}.{rank}"), "w") as out:
    out.write(repr(stamp))
if mode == "sleep":
    time.sleep(3600)
if attempt == "0":
    if rank == "0":
        time.sleep(0.5)
        with open(os.path.join(folder, "failed"), "w") as out:
            out.write(repr(time.clock_gettime(time.CLOCK_MONOTONIC)))
        os._exit(1)
    time.sleep(3600)
"""

PYCACHE = Path(tempfile.gettempdir()) / "bench_launch_pycache"
C10D = ["--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0"]


def _quiet_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env["OMP_NUM_THREADS"] = "1"  # torchrun would warn about it on every run otherwise
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    return env


# (launcher, backend) in table order; each numarun row is compared with torchrun's row of the
# same backend.
ROWS = (
    ("numarun", "static"),
    ("torchrun", "static"),
    ("numarun", "c10d"),
    ("torchrun", "c10d"),
)


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _launcher(name: str, backend: str, nproc: int) -> list[str]:
    """The command line of ``name`` with ``backend`` on one node (a fresh port for torchrun's
    static rendezvous on every call: its agent hosts the store there)."""
    module = "numarun" if name == "numarun" else "torch.distributed.run"
    command = [sys.executable, "-m", module, "--nproc-per-node", str(nproc)]
    if backend == "c10d":
        return [*command, *C10D]
    if name == "torchrun":  # without a port, torchrun's one node would use c10d on localhost:0
        return [*command, "--rdzv-backend", "static", "--master-addr", "127.0.0.1",
                "--master-port", str(_free_port())]  # fmt: skip
    return command  # numarun's static rendezvous picks a free port itself


def _label(name: str, backend: str) -> str:
    return f"{name} ({backend})"


def _worker(kind: str, script: str) -> list[str]:
    """The entry point (and its first arguments) of a worker of ``kind``."""
    if kind == "fast":
        return ["--no-python", sys.executable, "-S", "-c", WORKER]
    return [script]


def restart_latency(
    launcher: Callable[[], list[str]], worker: list[str], folder: Path, nproc: int
) -> float:
    """Seconds from the failing worker's exit to the last worker of attempt 1 starting."""
    for path in folder.glob("start.*"):
        path.unlink()
    (folder / "failed").unlink(missing_ok=True)
    command = launcher()
    done = subprocess.run(
        [*command, "--max-restarts", "1", *worker, str(folder), "fail"],
        env=_quiet_env(),
        capture_output=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise SystemExit(f"{command[2:]} failed: {done.stderr.decode()[-2000:]}")
    second = [float(path.read_text()) for path in folder.glob("start.1.*")]
    if len(second) != nproc:
        raise SystemExit(f"expected {nproc} workers in attempt 1, saw {len(second)}")
    return max(second) - float((folder / "failed").read_text())


def _cpu_seconds(pid: int) -> float:
    """CPU time of every live thread of ``pid``, in nanosecond resolution (the scheduler's
    ``/proc/<pid>/task/<tid>/schedstat``; ``/proc/<pid>/stat`` counts 10 ms ticks)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as schedstat:
                total += int(schedstat.read().split()[0])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


def launcher_cpu(launcher: list[str], script: str, folder: Path, nproc: int, span: float) -> float:
    """Milliseconds of the launcher's CPU per second of wall time while workers sleep."""
    for path in folder.glob("start.*"):
        path.unlink()
    proc = subprocess.Popen(
        [*launcher, script, str(folder), "sleep"],
        env=_quiet_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while len(list(folder.glob("start.0.*"))) < nproc:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"{launcher[2:]}: workers did not start")
            time.sleep(0.05)
        time.sleep(1.0)
        cpu0, wall0 = _cpu_seconds(proc.pid), time.monotonic()
        time.sleep(span)
        cpu1, wall1 = _cpu_seconds(proc.pid), time.monotonic()
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return (cpu1 - cpu0) / (wall1 - wall0) * 1e3


def _stats(samples: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(samples, n=4) if len(samples) > 1 else [samples[0]] * 3
    return statistics.median(samples), q[0], q[2]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="restarts measured per launcher")
    parser.add_argument("--nproc", type=int, default=4, help="workers per run")
    parser.add_argument("--cpu-seconds", type=float, default=20.0, help="CPU measuring span")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench_restart_") as tmp:
        folder = Path(tmp)
        script = folder / "worker.py"
        script.write_text(WORKER)
        calls: dict[tuple[str, str, str], Callable[[], float]] = {
            (kind, name, backend): (
                lambda name=name, backend=backend, kind=kind: restart_latency(
                    lambda: _launcher(name, backend, args.nproc),
                    _worker(kind, str(script)),
                    folder,
                    args.nproc,
                )
            )
            for kind in ("fast", "script")
            for name, backend in ROWS
        }
        for call in calls.values():  # warm-up: bytecode caches, page cache
            call()
        restart: dict[tuple[str, str, str], list[float]] = {key: [] for key in calls}
        for _ in range(args.runs):  # interleaved, so load from elsewhere hits all alike
            for key, call in calls.items():
                restart[key].append(call())
        cpu = {
            _label(name, "c10d"): launcher_cpu(
                _launcher(name, "c10d", args.nproc), str(script), folder, args.nproc,
                args.cpu_seconds,
            )
            for name in ("numarun", "torchrun")
        }  # fmt: skip

    cpus = len(os.sched_getaffinity(0))
    print(
        f"## numarun restart benchmark ({args.nproc} workers, {cpus} CPUs, "
        f"Python {sys.version.split()[0]})"
    )
    print()
    print("| a worker's failure -> every worker of the next attempt running | workers | "
          "median ms | IQR ms | vs torchrun, same backend |")  # fmt: skip
    print("|---|---|---|---|---|")
    for kind, label in (("fast", "`python3 -S -c`"), ("script", "`python -u` script")):
        for name, backend in ROWS:
            anchor = statistics.median(restart[(kind, "torchrun", backend)])
            median, low, high = _stats(restart[(kind, name, backend)])
            print(
                f"| {_label(name, backend)} | {label} | {median * 1e3:.1f} | "
                f"{low * 1e3:.1f}-{high * 1e3:.1f} | {median / anchor:.2f}x |"
            )
    print()
    print(f"| launcher CPU while {args.nproc} workers run ({args.cpu_seconds:g} s) | ms per s |")
    print("|---|---|")
    for name, value in cpu.items():
        print(f"| {name} | {value:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The whole job across nodes: a failure's reach, ``numarun stacks`` over nodes, the launcher's CPU.

    python benchmarks/bench_jobwide.py [--runs 5] [--nproc 4] [--cpu-seconds 20]

Two c10d nodes on this machine (each its own launcher and ``NUMARUN_RUNTIME_DIR``, meeting on
127.0.0.1), side by side with the anchor in one run:

1. cross-node failure: one worker per node, ``--max-restarts 1``; on the first attempt node 1's
   worker records ``CLOCK_MONOTONIC`` and exits 1 while node 0's sleeps (as in a collective whose
   peer died). The figure is from that exit to the last worker of the next attempt running its
   first line, on every node (node 1 restarts; node 0 re-forms the group without using a
   restart, under both launchers). numarun's nodes against torchrun's nodes, interleaved run by run
   (medians). Target: numarun at most 0.25x torchrun.
2. ``numarun stacks`` asked on node 0 of 2 nodes x ``--nproc`` ranks: wall time from starting the
   command to its exit with every rank of both nodes printed (median of ``--runs``); anchor: the
   same command on a one-node job of ``--nproc`` ranks. Target: under 2 s.
3. the launcher's CPU per second of wall time while workers sleep, one c10d node with
   ``--hang-timeout 30`` and without (and torchrun's, for scale), over ``--cpu-seconds`` each
   after a 3 s settling time (every thread, ``/proc/<pid>/task/*/schedstat``). Target: at most
   1 ms/s with ``--hang-timeout``.

The workers do not import torch (the figures are the launchers'); bytecode is cached under
``$TMPDIR/bench_jobwide_pycache``.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

WORKER = textwrap.dedent(
    """
    import os, sys, time
    stamp = time.clock_gettime(time.CLOCK_MONOTONIC)
    folder, mode = sys.argv[1], sys.argv[2]
    # The healthy node re-forms without using a restart (its restart count stays 0, as under
    # torchrun): "after the failure" is told by the failed file, not by the restart count.
    after = os.path.exists(os.path.join(folder, "failed"))
    rank = os.environ["RANK"]
    with open(os.path.join(folder, f"start.{int(after)}.{rank}"), "w") as out:
        out.write(repr(stamp))

    def sleeping_rank():
        time.sleep(3600)

    os.write(1, f"ready {rank} {os.getpid()}\\n".encode())
    if mode == "fail" and after:
        sys.exit(0)
    if mode == "fail" and os.environ["GROUP_RANK"] == "1":
        time.sleep(0.5)
        with open(os.path.join(folder, "failed.tmp"), "w") as out:
            out.write(repr(time.clock_gettime(time.CLOCK_MONOTONIC)))
        os.rename(os.path.join(folder, "failed.tmp"), os.path.join(folder, "failed"))
        os._exit(1)
    sleeping_rank()
    """
)
PYCACHE = Path(tempfile.gettempdir()) / "bench_jobwide_pycache"
NUMARUN = [sys.executable, "-m", "numarun"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def _env(runtime: Path | None = None) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items()
        if not k.startswith(("PET_", "TORCHELASTIC_", "NUMARUN_", "MASTER_"))
    }  # fmt: skip
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    env["OMP_NUM_THREADS"] = "1"
    if runtime is not None:
        env["NUMARUN_RUNTIME_DIR"] = str(runtime)
    return env


def _port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _worker(folder: Path, mode: str, script: bool) -> list[str]:
    """The workers' command: ``python3 -S -c`` with ``--no-python`` (fast), or the same code
    as a script through the launcher's Python path (armed for stacks)."""
    if not script:
        return ["--no-python", sys.executable, "-S", "-c", WORKER, str(folder), mode]
    path = folder / "worker.py"
    path.write_text(WORKER)
    return [str(path), str(folder), mode]


def _nodes(
    launcher: list[str], folder: Path, nproc: int, mode: str, *more: str, script: bool = False
) -> list:
    port = _port()
    procs = []
    for node in (0, 1):
        runtime = folder / f"rt{node}"
        runtime.mkdir(mode=0o700, exist_ok=True)
        procs.append(
            subprocess.Popen(
                [*launcher, "--nnodes", "2", "--nproc-per-node", str(nproc), "--rdzv-backend",
                 "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"b{port}",
                 "--rdzv-conf", f"is_host={1 - node}", *more, *_worker(folder, mode, script)],
                env=_env(runtime), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            )
        )  # fmt: skip
    return procs


def cross_node(launcher: list[str], folder: Path) -> float:
    for path in folder.glob("start.*"):
        path.unlink()
    (folder / "failed").unlink(missing_ok=True)
    procs = _nodes(launcher, folder, 1, "fail", "--max-restarts", "1")
    for proc in procs:
        proc.communicate(timeout=300)
    second = [float(path.read_text()) for path in folder.glob("start.1.*")]
    if len(second) != 2:
        raise SystemExit(f"{launcher[2:]}: expected 2 workers in attempt 1, saw {len(second)}")
    return max(second) - float((folder / "failed").read_text())


def _wait_started(folder: Path, count: int, procs: list) -> None:
    deadline = time.monotonic() + 120
    while len(list(folder.glob("start.0.*"))) < count:
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise SystemExit("workers did not start")
        time.sleep(0.05)


def stacks_time(folder: Path, runtime: Path) -> float:
    started = time.monotonic()
    done = subprocess.run([*NUMARUN, "stacks"], env=_env(runtime), capture_output=True,
                          timeout=60)  # fmt: skip
    took = time.monotonic() - started
    if done.returncode != 0 or b"sleeping_rank" not in done.stdout:
        raise SystemExit(f"numarun stacks failed: {done.stderr.decode()[-2000:]}")
    return took


def _cpu(pid: int) -> float:
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as schedstat:
                total += int(schedstat.read().split()[0])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


def launcher_cpu(launcher: list[str], folder: Path, nproc: int, span: float, *more: str) -> float:
    for path in folder.glob("start.*"):
        path.unlink()
    runtime = folder / "rt-cpu"
    runtime.mkdir(mode=0o700, exist_ok=True)
    proc = subprocess.Popen(
        [*launcher, "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d", "--rdzv-endpoint",
         "localhost:0", *more, *_worker(folder, "sleep", True)],
        env=_env(runtime), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait_started(folder, nproc, [proc])
        time.sleep(3.0)
        cpu0, wall0 = _cpu(proc.pid), time.monotonic()
        time.sleep(span)
        cpu1, wall1 = _cpu(proc.pid), time.monotonic()
    finally:
        proc.terminate()
        proc.wait(60)
    return (cpu1 - cpu0) / (wall1 - wall0) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--cpu-seconds", type=float, default=20.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_jobwide_") as tmp:
        folder = Path(tmp)
        (folder / "one").mkdir()
        reach: dict[str, list[float]] = {"numarun": [], "torchrun": []}
        cross_node(NUMARUN, folder)  # warm-up: bytecode, page cache
        cross_node(TORCHRUN, folder)
        for _ in range(args.runs):
            reach["numarun"].append(cross_node(NUMARUN, folder))
            reach["torchrun"].append(cross_node(TORCHRUN, folder))

        for path in folder.glob("start.*"):
            path.unlink()
        (folder / "failed").unlink(missing_ok=True)
        two = _nodes(NUMARUN, folder, args.nproc, "sleep", script=True)
        one_runtime = folder / "rt-one"
        one_runtime.mkdir(mode=0o700)
        one = subprocess.Popen(
            [*NUMARUN, "--nproc-per-node", str(args.nproc), "--rdzv-id", "one",
             *_worker(folder / "one", "sleep", True)],
            env=_env(one_runtime), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            _wait_started(folder, 2 * args.nproc, [*two, one])
            _wait_started(folder / "one", args.nproc, [one])
            time.sleep(2.0)
            asked: dict[str, list[float]] = {"2 nodes": [], "1 node": []}
            for _ in range(args.runs):
                asked["2 nodes"].append(stacks_time(folder, folder / "rt0"))
                asked["1 node"].append(stacks_time(folder, one_runtime))
        finally:
            for proc in [*two, one]:
                proc.terminate()
                proc.wait(60)

        cpu = {
            "numarun c10d --hang-timeout 30": launcher_cpu(
                NUMARUN, folder, args.nproc, args.cpu_seconds, "--hang-timeout", "30"
            ),
            "numarun c10d": launcher_cpu(NUMARUN, folder, args.nproc, args.cpu_seconds),
            "torchrun c10d": launcher_cpu(TORCHRUN, folder, args.nproc, args.cpu_seconds),
        }

    print(f"## numarun whole-job benchmark ({len(os.sched_getaffinity(0))} CPUs, "
          f"Python {sys.version.split()[0]})\n")  # fmt: skip
    anchor = statistics.median(reach["torchrun"])
    print("| cross-node failure -> every node's next attempt running | median ms | vs torchrun |")
    print("|---|---|---|")
    for name, samples in reach.items():
        median = statistics.median(samples)
        print(f"| {name} (2 c10d nodes, 1 worker each) | {median * 1e3:.0f} | "
              f"{median / anchor:.2f}x |")  # fmt: skip
    print()
    print(f"| `numarun stacks` ({args.nproc} ranks per node) | median ms |")
    print("|---|---|")
    for name, samples in asked.items():
        print(f"| {name} | {statistics.median(samples) * 1e3:.0f} |")
    print()
    print(f"| launcher CPU, {args.nproc} sleeping workers | ms per s |")
    print("|---|---|")
    for name, value in cpu.items():
        print(f"| {name} | {value:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

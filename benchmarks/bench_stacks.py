"""What stacks cost: ``numarun stacks`` latency and the launcher's CPU with ``--hang-timeout``.

    python benchmarks/bench_stacks.py [--nproc 8] [--runs 20] [--seconds 20]

Two measurements, each side by side with its anchor in one run:

1. ``numarun stacks`` on a job of ``--nproc`` ranks: wall time from starting the command to
   its exit with every rank's stacks printed (median of ``--runs``), once while the ranks
   sleep and once while they all compute (busy CPUs: the dumps compete for them). Anchor: a
   bare ``python -c pass`` started the same way, interleaved. Target: under 1 s.
2. The launcher's CPU per second of wall time while ``--nproc`` ranks sleep, with
   ``--hang-timeout 30`` (the densest sampling for 8 ranks: every 1 s) and without (the anchor), the
   two launchers running one after the other for ``--seconds`` each after a 3 s settling time.
   CPU is the sum over the launcher's threads of ``/proc/<pid>/task/<tid>/schedstat`` (time on
   CPU, in nanoseconds). Also the ranks' own CPU, summed the same way, to show what the dumps
   cost them. Target: at most 1 ms of launcher CPU per second more than the anchor.

Each job gets its own ``NUMARUN_RUNTIME_DIR``. Bytecode is cached under
``$TMPDIR/bench_stacks_pycache``.
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

WORKER = textwrap.dedent(
    """
    import os, sys, time

    def sleeping_rank():
        time.sleep(3600)

    def computing_rank():
        while True:
            sum(i * i for i in range(10000))

    os.write(1, f"ready {os.environ['RANK']} {os.getpid()}\\n".encode())
    computing_rank() if sys.argv[1] == "busy" else sleeping_rank()
    """
)
PYCACHE = Path(tempfile.gettempdir()) / "bench_stacks_pycache"


def _env(runtime: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    env["NUMARUN_RUNTIME_DIR"] = str(runtime)
    return env


def _start(
    runtime: Path, script: Path, nproc: int, mode: str, *extra: str
) -> tuple[subprocess.Popen, list[int]]:
    """The launcher and its ranks' pids, once every rank runs."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "numarun", "--nproc-per-node", str(nproc), *extra,
         str(script), mode],
        env=_env(runtime), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stdout is not None
    pids = []
    for _ in range(nproc):
        line = proc.stdout.readline().split()
        if line[:1] != [b"ready"]:
            raise SystemExit("a rank did not start")
        pids.append(int(line[2]))
    return proc, pids


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.communicate(timeout=60)


def _timed(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{command[:4]} failed: {done.stderr.decode()[-500:]}")
    return took


def stacks_latency(folder: Path, script: Path, nproc: int, mode: str, runs: int) -> tuple:
    runtime = folder / f"rt-{mode}"
    runtime.mkdir(mode=0o700)
    proc, _ = _start(runtime, script, nproc, mode)
    env = _env(runtime)
    try:
        time.sleep(1.0)
        command = [sys.executable, "-m", "numarun", "stacks"]
        document = json.loads(subprocess.run([*command, "--json"], env=env,
                                             capture_output=True, text=True).stdout)
        shown = sum(1 for rank in document["ranks"] if rank["threads"])
        bare, ours = [], []
        for _ in range(runs):  # interleaved with the anchor
            bare.append(_timed([sys.executable, "-c", "pass"], env))
            ours.append(_timed(command, env))
        return statistics.median(bare), statistics.median(ours), max(ours), shown
    finally:
        _stop(proc)


def _cpu_ns(pid: int) -> int:
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as file:
                total += int(file.read().split()[0])
        except OSError:
            pass
    return total


def launcher_cpu(folder: Path, script: Path, nproc: int, seconds: float, *extra: str) -> tuple:
    """(launcher CPU ms per s, ranks' CPU ms per s) over ``seconds`` of a sleeping job."""
    runtime = folder / f"rt-cpu{len(extra)}"
    runtime.mkdir(mode=0o700, exist_ok=True)
    proc, ranks = _start(runtime, script, nproc, "sleep", *extra)
    try:
        time.sleep(3.0)  # start-up and the first samples are over
        t0, c0 = time.monotonic(), _cpu_ns(proc.pid)
        r0 = sum(_cpu_ns(p) for p in ranks)
        time.sleep(seconds)
        t1, c1 = time.monotonic(), _cpu_ns(proc.pid)
        r1 = sum(_cpu_ns(p) for p in ranks)
        return (c1 - c0) / 1e6 / (t1 - t0), (r1 - r0) / 1e6 / (t1 - t0), len(ranks)
    finally:
        _stop(proc)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=8)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    if not 0 < args.seconds < 27:
        parser.error("--seconds must be between 0 and 27 (the job would be declared hung)")
    with tempfile.TemporaryDirectory(prefix="bench_stacks_") as tmp:
        folder = Path(tmp)
        script = folder / "worker.py"
        script.write_text(WORKER)
        n = args.nproc
        print(f"## stacks ({n} ranks, {len(os.sched_getaffinity(0))} CPUs, "
              f"Python {sys.version.split()[0]})\n")  # fmt: skip
        print("| `numarun stacks`, command to output | bare `python -c pass` | numarun stacks "
              "| worst | ranks shown | target |")
        print("|---|---|---|---|---|---|")
        for mode in ("sleep", "busy"):
            bare, ours, worst, shown = stacks_latency(folder, script, n, mode, args.runs)
            print(f"| ranks {'sleeping' if mode == 'sleep' else 'computing'} | "
                  f"{bare * 1e3:.0f} ms | {ours * 1e3:.0f} ms ({ours / bare:.1f}x) | "
                  f"{worst * 1e3:.0f} ms | {shown} of {n} | < 1 s |")  # fmt: skip
        print()
        off, ranks_off, count = launcher_cpu(folder, script, n, args.seconds)
        # 30 s: the densest sampling (every 1 s for up to 8 ranks), and the sleeping job is not
        # yet "hung" within the measurement (--seconds must stay below 27).
        on, ranks_on, _ = launcher_cpu(folder, script, n, args.seconds, "--hang-timeout", "30")
        print("| CPU per second of wall time, ranks sleeping | launcher | all ranks together |")
        print("|---|---|---|")
        print(f"| without --hang-timeout (anchor) | {off:.3f} ms/s | {ranks_off:.3f} ms/s |")
        print(f"| --hang-timeout 30 (sampling every 1 s) | {on:.3f} ms/s | {ranks_on:.3f} ms/s |")
        print(f"| difference (target: launcher <= 1 ms/s) | {on - off:+.3f} ms/s | "
              f"{ranks_on - ranks_off:+.3f} ms/s |")  # fmt: skip
        if count != n:
            print(f"\n(warning: {count} of {n} ranks measured)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

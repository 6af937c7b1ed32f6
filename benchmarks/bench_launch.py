"""Launch and failure latency of ``numarun`` next to torchrun and bare interpreters.

Two figures, measured side by side in one run and printed as markdown tables with ratios (the
first with a floor beside it):

* start-up: from just before the launcher is started to the moment the last of N trivial
  workers runs its first line (each writes ``CLOCK_MONOTONIC`` to a file first thing). The
  anchor is N bare ``python -u worker.py`` started in parallel by this script. Issue 32 asks
  for 2x the anchor. Where the workers share the CPUs (4 on 2 cores, the default here) that is
  within reach; with a core per worker (``--nproc 1`` here, a GPU server's case) the floor
  below is about 2.3x by itself, and the launcher's own work before the fork counts in full
  (docs/measurements.md). The output says which case it measured. numarun is started twice:
  as ``python -m numarun`` (which loads :mod:`runpy` and its imports first, about 3 ms) and,
  when this environment has it, as the ``numarun`` command next to the interpreter, as users
  start it.
* the floor of any launcher written in Python, measured beside them: a script of a dozen lines
  (:data:`FLOOR`) whose interpreter forks and execs N workers exactly as numarun starts them
  (through ``numarun.worker.bootstrap``) and waits for them, nothing else: no options, no
  pipes, no watchdog, no binding, and no script compiled once for all (each worker compiles
  it, about 0.85 ms of CPU more per worker than under numarun). What numarun adds to it is
  numarun's own start-up work; what the floor adds to the anchor is the launcher's
  interpreter and the bootstrap, which no change inside numarun's launcher removes.
* failure: from the moment one worker exits 1 (it records ``CLOCK_MONOTONIC`` just before) to
  the launcher's exit being seen here, while the other workers sleep and honour SIGTERM.
  Target for numarun: < 50 ms (torchrun: about 0.7 s).

torchrun runs twice: with its static rendezvous (``--rdzv-backend static --master-port P``,
numarun's default path on one node) and ``--standalone`` (c10d on ``localhost:0``, torchrun's
own default on one node), so that each ratio can name the same backend on both sides.

Also prints what the ``numarun.worker.bootstrap`` bootstrap costs a worker, started as the launcher
starts it (``python -u -c "from numarun.worker.bootstrap import main; main()" -- worker.py``)
against ``python -u worker.py``, one at a time (``benchmarks/bench_bootstrap.py`` measures it
closely).

Bytecode is cached under ``$TMPDIR/bench_launch_pycache`` for every interpreter started (the
warm-up run fills it), as an installed package would have it.

Usage: ``python benchmarks/bench_launch.py [--runs 10] [--failure-runs 15] [--nproc 4]
[--no-torchrun]``. Medians; the spread is the interquartile range.
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

from numarun.launch.workersetup import SCRIPT_BOOTSTRAP

STARTED = """\
import time, os, sys
stamp = time.clock_gettime(time.CLOCK_MONOTONIC)
with open(os.path.join(sys.argv[1], f"{os.environ.get('RANK', os.getpid())}.t"), "w") as f:
    f.write(repr(stamp))
"""

FAILING = """\
import time, os, sys
if os.environ["RANK"] == "0":
    time.sleep(float(sys.argv[2]))
    with open(os.path.join(sys.argv[1], "failed.t"), "w") as f:
        f.write(repr(time.clock_gettime(time.CLOCK_MONOTONIC)))
    os._exit(1)
time.sleep(60)
"""

# The floor: a launcher's interpreter, then one fork and exec per worker through numarun's
# bootstrap (as numarun's launcher starts them), then a wait for each. argv: N, the bootstrap's
# -c code (SCRIPT_BOOTSTRAP), SCRIPT, ARGS...
FLOOR = """\
import os, sys
n, command = int(sys.argv[1]), [sys.executable, "-u", "-c", sys.argv[2], "--", *sys.argv[3:]]
pids = []
for rank in range(n):
    env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(n))
    pid = os.fork()
    if pid == 0:
        try:
            os.execve(sys.executable, command, env)
        finally:
            os._exit(127)
    pids.append(pid)
for pid in pids:
    os.waitpid(pid, 0)
"""

PYCACHE = Path(tempfile.gettempdir()) / "bench_launch_pycache"


def _quiet_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env["OMP_NUM_THREADS"] = "1"  # torchrun would warn about it on every run otherwise
    # Installed packages run from bytecode; without it (PYTHONDONTWRITEBYTECODE in CI images)
    # every start would compile numarun, the workers' bootstrap and torch's sources again.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    return env


def _numarun(nproc: int, script: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "numarun", "--nproc-per-node", str(nproc), script, *args]


def _numarun_command() -> str | None:
    """The installed ``numarun`` command of this interpreter's environment, if there is one."""
    command = Path(sys.executable).parent / "numarun"
    return str(command) if os.access(command, os.X_OK) else None


def _torchrun(nproc: int, script: str, *args: str, backend: str = "c10d") -> list[str]:
    """torchrun on one node: ``--standalone`` (c10d, its default) or its static rendezvous on
    a port free now (its agent hosts the store there)."""
    if backend == "c10d":
        rendezvous = ["--standalone"]
    else:
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        rendezvous = ["--rdzv-backend", "static", "--master-addr", "127.0.0.1",
                      "--master-port", str(port)]  # fmt: skip
    return [
        sys.executable, "-m", "torch.distributed.run", *rendezvous,
        "--nproc-per-node", str(nproc), script, *args,
    ]  # fmt: skip


TORCHRUNS = {"static": "torchrun (static)", "c10d": "torchrun --standalone (c10d)"}


def _read_stamps(folder: Path) -> list[float]:
    return [float(path.read_text()) for path in folder.glob("*.t")]


def startup_launcher(command: Sequence[str], nproc: int, folder: Path) -> float:
    """Seconds from starting the launcher to the last worker's first line."""
    for path in folder.glob("*.t"):
        path.unlink()
    t0 = time.clock_gettime(time.CLOCK_MONOTONIC)
    done = subprocess.run(command, env=_quiet_env(), capture_output=True, timeout=120)
    if done.returncode != 0:
        raise SystemExit(f"{command[:4]} failed: {done.stderr.decode()[-2000:]}")
    stamps = _read_stamps(folder)
    if len(stamps) != nproc:
        raise SystemExit(f"expected {nproc} workers, saw {len(stamps)}")
    return max(stamps) - t0


def startup_bare(script: str, nproc: int, folder: Path) -> float:
    """Seconds for ``nproc`` bare interpreters started in parallel to run their first line."""
    for path in folder.glob("*.t"):
        path.unlink()
    env = _quiet_env()
    t0 = time.clock_gettime(time.CLOCK_MONOTONIC)
    procs = [
        subprocess.Popen(
            [sys.executable, "-u", script, str(folder)], env={**env, "RANK": str(rank)}
        )
        for rank in range(nproc)
    ]
    for proc in procs:
        proc.wait()
    return max(_read_stamps(folder)) - t0


def failure_latency(command: Sequence[str], folder: Path) -> float:
    """Seconds from the failing worker's exit to the launcher's exit seen here."""
    marker = folder / "failed.t"
    marker.unlink(missing_ok=True)
    proc = subprocess.Popen(
        command, env=_quiet_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _wait_exactly(proc, 120)
    ended = time.clock_gettime(time.CLOCK_MONOTONIC)
    if proc.returncode == 0 or not marker.exists():
        raise SystemExit(f"{command[:4]}: expected a failure, got {proc.returncode}")
    return ended - float(marker.read_text())


def _wait_exactly(proc: subprocess.Popen, limit: float) -> None:
    """Wait for ``proc``'s exit, seen as it happens. Not ``Popen.wait(timeout)``: that polls,
    sleeping up to 50 ms between looks, so the exit was seen up to 50 ms late, by an amount
    that moved with the launcher's start-up time (the failure is a fixed delay after it)."""
    import select

    pidfd = os.pidfd_open(proc.pid)
    try:
        if not select.select([pidfd], [], [], limit)[0]:
            proc.kill()
    finally:
        os.close(pidfd)
    proc.wait()


def bootstrap_cost(script: str, folder: Path, runs: int) -> tuple[float, float]:
    """Median wall time of one ``python -u script`` and of one through numarun.worker.bootstrap."""

    def timed(command: list[str]) -> float:
        t0 = time.perf_counter()
        subprocess.run(command, env={**_quiet_env(), "RANK": "0"}, check=True)
        return time.perf_counter() - t0

    bare = [sys.executable, "-u", script, str(folder)]
    wrapped = [sys.executable, "-u", "-c", SCRIPT_BOOTSTRAP, "--", script, str(folder)]
    plain, through = [], []
    for _ in range(runs):  # interleaved, so drifts hit both alike
        plain.append(timed(bare))
        through.append(timed(wrapped))
    return statistics.median(plain), statistics.median(through)


def _measure(runs: int, calls: dict[str, Callable[[], float]]) -> dict[str, list[float]]:
    """Run each call once to warm caches, then ``runs`` rounds of all calls, interleaved, so
    that load from elsewhere on the machine hits every contender alike."""
    for call in calls.values():
        call()
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(runs):
        for name, call in calls.items():
            samples[name].append(call())
    return samples


def _stats(samples: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(samples, n=4) if len(samples) > 1 else [samples[0]] * 3
    return statistics.median(samples), q[0], q[2]


def _row(name: str, samples: list[float], anchor: float | None) -> str:
    median, low, high = _stats(samples)
    ratio = f"{median / anchor:.2f}x" if anchor else "-"
    return f"| {name} | {median * 1e3:.1f} | {low * 1e3:.1f}-{high * 1e3:.1f} | {ratio} |"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="start-up runs per launcher")
    parser.add_argument("--failure-runs", type=int, default=15, help="failure runs per launcher")
    parser.add_argument("--nproc", type=int, default=4, help="workers per run")
    parser.add_argument("--no-torchrun", action="store_true", help="skip torchrun")
    args = parser.parse_args(argv)
    with_torchrun = not args.no_torchrun
    if with_torchrun:
        try:
            import torch.distributed.run  # noqa: F401
        except ImportError:
            print("torch not importable: torchrun skipped", file=sys.stderr)
            with_torchrun = False

    with tempfile.TemporaryDirectory(prefix="bench_launch_") as tmp:
        folder = Path(tmp)
        started = folder / "started.py"
        started.write_text(STARTED)
        failing = folder / "failing.py"
        failing.write_text(FAILING)
        floor = folder / "floor.py"
        floor.write_text(FLOOR)
        out = str(folder)
        n = args.nproc

        startup_calls: dict[str, Callable[[], float]] = {
            "bare": lambda: startup_bare(str(started), n, folder),
            "numarun": lambda: startup_launcher(_numarun(n, str(started), out), n, folder),
            "floor": lambda: startup_launcher(
                [sys.executable, str(floor), str(n), SCRIPT_BOOTSTRAP, str(started), out],
                n,
                folder,
            ),
        }
        command = _numarun_command()
        if command is not None:
            startup_calls["numarun command"] = lambda: startup_launcher(
                [command, *_numarun(n, str(started), out)[3:]], n, folder
            )
        failure_calls: dict[str, Callable[[], float]] = {
            "numarun": lambda: failure_latency(_numarun(n, str(failing), out, "0.3"), folder),
        }
        for backend, name in TORCHRUNS.items() if with_torchrun else ():
            startup_calls[name] = lambda backend=backend: startup_launcher(
                _torchrun(n, str(started), out, backend=backend), n, folder
            )
            failure_calls[name] = lambda backend=backend: failure_latency(
                _torchrun(n, str(failing), out, "0.3", backend=backend), folder
            )
        startup = _measure(args.runs, startup_calls)
        failure = _measure(args.failure_runs, failure_calls)
        plain, through = bootstrap_cost(str(started), folder, max(args.runs, 10))

    cpus = len(os.sched_getaffinity(0))
    print(
        f"## numarun launch benchmark ({n} workers, {cpus} CPUs, Python {sys.version.split()[0]})"
    )
    if n < cpus:
        print(
            "A core per worker: the launcher's own work before the fork counts in full, and "
            "any launcher's interpreter start comes before the workers'."
        )
    else:
        print(
            f"{n} workers share {cpus} CPUs: work the launcher does after the fork competes "
            "with the starting workers, and counts about 1/CPUs of its time."
        )
    print()
    print("| start-up: launcher start -> last worker's first line | median ms | IQR ms | vs bare |")
    print("|---|---|---|---|")
    anchor = statistics.median(startup["bare"])
    print(_row(f"{n} bare interpreters in parallel (anchor)", startup["bare"], anchor))
    print(_row("the floor: a Python launcher that only forks and execs", startup["floor"], anchor))
    print(_row("python -m numarun (static)", startup["numarun"], anchor))
    if "numarun command" in startup:
        print(_row("the numarun command (static)", startup["numarun command"], anchor))
    for name in TORCHRUNS.values():
        if name in startup:
            print(_row(name, startup[name], anchor))
    print()
    print("| failure: worker exit -> launcher exit | median ms | IQR ms | vs numarun (static) |")
    print("|---|---|---|---|")
    fail_anchor = statistics.median(failure["numarun"])
    print(_row("numarun (static)", failure["numarun"], fail_anchor))
    for name in TORCHRUNS.values():
        if name in failure:
            print(_row(name, failure[name], fail_anchor))
    print()
    print(
        f"numarun.worker.bootstrap bootstrap, one worker alone: {plain * 1e3:.1f} ms bare, "
        f"{through * 1e3:.1f} ms through the bootstrap (+{(through - plain) * 1e3:.1f} ms)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Restart latency, warm workers and launcher CPU of ``numarun`` next to torchrun, side by side.

    python benchmarks/bench_restart.py [--runs 7] [--nproc 4] [--figures restart,late,memory,cpu]
        [--kinds fast,script,torch,slow] [--backends static,c10d] [--json FILE]

Runs from a checkout (``src/`` first on the path, numarun installed or not); torchrun is
``python -m torch.distributed.run`` of the same interpreter. Every figure is a median over
``--runs`` runs (the spread is the interquartile range), every row of a table measured in the
same run, interleaved, after one warm-up of each; ratios are against torchrun's row of the same
backend and workers.

* ``restart``: one node, N workers, ``--max-restarts 1``. On the first attempt rank 0 records
  ``CLOCK_MONOTONIC`` and exits 1 while the others sleep; every worker records when it is past
  its imports. The figure is from rank 0's exit to the last worker of the second attempt past
  its imports. Backends: the static rendezvous (numarun's is torch-free and picks a free port;
  torchrun's, ``--rdzv-backend static --master-port P``, hosts its store in the agent) and c10d
  (``--rdzv-endpoint localhost:0``, torchrun's own default for one node). Kinds of worker:
  ``fast``: ``python3 -S -c`` through ``--no-python`` (about 10 ms to start: the launchers' own
  restart machinery); ``script``: a plain script, no imports; ``torch``: a script whose first
  line is ``import torch``; ``slow``: a script whose first line imports a module that takes
  ``--slow-seconds`` (5) to import, a stand-in for a slow shared file system. The ``torch`` and
  ``slow`` kinds add a row ``numarun --preload <module>``: warm workers. Its rank 0 fails once
  the next attempt's standbys are past their imports (a one-line module preloaded after the
  measured one, ``bench_ready``, leaves a stamp: what a real job, failing minutes in, would
  find); the cold rows fail after 0.5 s, as for the other kinds.
* ``early``: as ``restart`` for ``import torch`` workers, but rank 0 fails ``--fail-after``
  (1) s after its start (past ``import torch``) on every row, whatever standbys are ready
  then: a crash in the first seconds (a bad flag, an out-of-memory at the first step). Rows:
  numarun ``--preload torch``, numarun, torchrun, on each of ``--backends``. numarun starts
  the next attempt's standbys at launch beside the first attempt's, so they are ready one
  import time after the launch whatever the backend. Target: ``--preload torch`` at most
  0.2x torchrun's on each backend.
* ``late``: the first start of two c10d nodes, N/2 workers each, whose second node starts
  ``--late-seconds`` (5) after the first; workers import torch. The figure is from the moment
  the rendezvous round is complete (read from the rendezvous' own store, which this script
  hosts, both nodes joining with ``is_host=0``) to the last worker of both nodes past its
  imports. Rows: torchrun, numarun, numarun ``--preload torch``.
* ``memory``: what ``--preload torch`` costs: the resident and proportional set size of each
  standby waiting with torch imported (``/proc/<pid>/smaps_rollup``), next to a plain
  ``python -c "import torch"``.
* ``cpu``: launcher CPU while workers run: one node, c10d, N workers that sleep; the launcher
  process's CPU time over ``--cpu-seconds`` of wall time, from one second after every worker
  started (every thread, from the scheduler's nanosecond counters in
  ``/proc/<pid>/task/*/schedstat``). numarun looks at the rendezvous every 2 s (its default
  ``--monitor-interval``) and torch's rendezvous handler sends a keep-alive every 5 s;
  torchrun polls its workers every 0.1 s. Target: numarun <= 1 ms of CPU per second.

Targets (on a quiet machine): restart of ``torch`` workers with ``--preload torch`` at most 0.15x
torchrun's on the same backend; the first start after a late join at most 0.1x; the ``slow``
module: a warm restart under 0.5 s. Bytecode is cached under ``$TMPDIR/bench_launch_pycache``,
as in ``bench_launch.py``.

On a lent GPU machine (16 cores, torch with CUDA), about 4 minutes::

    python3 benchmarks/bench_restart.py --runs 3 --nproc 4 --figures restart,late,memory \\
        --kinds torch,slow --slow-backends static --json restart.json
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

WORKER = """\
import os, sys, time
{imports}
stamp = time.clock_gettime(time.CLOCK_MONOTONIC)
folder, mode = sys.argv[1], sys.argv[2]
rank, attempt = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
with open(os.path.join(folder, f"start.{{attempt}}.{{rank}}"), "w") as out:
    out.write(repr(stamp))
with open(os.path.join(folder, f"pid.{{attempt}}.{{rank}}"), "w") as out:
    out.write(str(os.getpid()))
if mode == "done":
    with open(os.path.join(folder, f"node.{{rank}}"), "w") as out:
        out.write(os.environ.get("BENCH_NODE", ""))
    sys.exit(0)
if mode == "sleep":
    time.sleep(3600)
if attempt == "0":
    if rank == "0":
        if mode == "warm":  # until the next attempt's standbys are past their imports too
            wanted, deadline = int(sys.argv[3]), time.monotonic() + 600
            while time.monotonic() < deadline and sum(
                name.startswith("ready.") for name in os.listdir(folder)
            ) < wanted:
                time.sleep(0.02)
        # "early": so many seconds after its start (past its imports), whatever is ready.
        time.sleep(float(sys.argv[3]) if mode == "early" else 0.5)
        with open(os.path.join(folder, "failed"), "w") as out:
            out.write(repr(time.clock_gettime(time.CLOCK_MONOTONIC)))
        os._exit(1)
    time.sleep(3600)
"""

READY_MODULE = """\
import os
with open(os.path.join(os.environ["BENCH_FOLDER"], f"ready.{os.getpid()}"), "w"):
    pass
"""
SLOW_MODULE = "import time\ntime.sleep({seconds})\n"

PYCACHE = Path(tempfile.gettempdir()) / "bench_launch_pycache"
C10D = ["--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0"]
IMPORTS = {"fast": "", "script": "", "torch": "import torch", "slow": "import bench_slow"}
MODULE = {"torch": "torch", "slow": "bench_slow"}
LABELS = {
    "fast": "`python3 -S -c`",
    "script": "`python -u` script",
    "torch": "`import torch` first",
    "slow": "a {slow:g} s import first",
}


def _env(folder: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env["OMP_NUM_THREADS"] = "1"  # torchrun would warn about it on every run otherwise
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    paths = [str(SRC), *([str(folder)] if folder is not None else []), env.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    if folder is not None:
        env["BENCH_FOLDER"] = str(folder)
    env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    return env


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Row:
    """One launcher with one backend, cold or ``--preload`` (warm)."""

    def __init__(self, name: str, backend: str, warm: bool = False) -> None:
        self.name, self.backend, self.warm = name, backend, warm

    @property
    def label(self) -> str:
        return f"{self.name}{' --preload' if self.warm else ''} ({self.backend})"

    def command(self, nproc: int, kind: str) -> list[str]:
        """The command line on one node (a fresh port for torchrun's static rendezvous on
        every call: its agent hosts the store there)."""
        module = "numarun" if self.name == "numarun" else "torch.distributed.run"
        command = [sys.executable, "-m", module, "--nproc-per-node", str(nproc)]
        if self.warm:
            command += ["--preload", f"{MODULE[kind]},bench_ready"]
        if self.backend == "c10d":
            return [*command, *C10D]
        if self.name == "torchrun":  # without a port, torchrun's one node would use c10d
            return [*command, "--rdzv-backend", "static", "--master-addr", "127.0.0.1",
                    "--master-port", str(_free_port())]  # fmt: skip
        return command  # numarun's static rendezvous picks a free port itself


def _rows(kind: str, backends: Sequence[str]) -> list[Row]:
    rows = []
    for backend in backends:
        rows += [Row("numarun", backend), Row("torchrun", backend)]
        if kind in MODULE:
            rows.append(Row("numarun", backend, warm=True))
    return rows


def _clear(folder: Path) -> None:
    for path in folder.iterdir():
        if path.name.startswith(("start.", "pid.", "ready.", "failed")):
            path.unlink()


def restart_latency(
    row: Row, kind: str, folder: Path, nproc: int, early: float | None = None
) -> float:
    """Seconds from the failing worker's exit to the last worker of attempt 1 past its
    imports (``early``: rank 0 fails that many seconds after its start, on every row)."""
    _clear(folder)
    script = folder / f"worker_{kind}.py"
    if kind == "fast":
        worker = ["--no-python", sys.executable, "-S", "-c",
                  WORKER.format(imports="")]  # fmt: skip
    else:
        worker = [str(script)]
    mode = ["warm", str(2 * nproc)] if row.warm else ["fail"]
    if early is not None:
        mode = ["early", str(early)]
    command = row.command(nproc, kind)
    done = subprocess.run(
        [*command, "--max-restarts", "1", *worker, str(folder), *mode],
        env=_env(folder), capture_output=True, timeout=900,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{command[2:]} failed: {done.stderr.decode()[-2000:]}")
    second = [float(path.read_text()) for path in folder.glob("start.1.*")]
    if len(second) != nproc:
        raise SystemExit(f"expected {nproc} workers in attempt 1, saw {len(second)}")
    return max(second) - float((folder / "failed").read_text())


def late_join(
    row: Row, folder: Path, nproc: int, late: float, by_node: dict[str, list[float]]
) -> float:
    """Seconds from the round of two c10d nodes (the second started ``late`` s after the
    first) being complete to the last worker of both nodes past ``import torch``; each
    node's own figure is appended to ``by_node["early"]`` / ``by_node["late"]``."""
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
        C10dRendezvousBackend,
    )

    _clear(folder)
    port, run_id = _free_port(), f"late{os.getpid()}{time.monotonic_ns()}"
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    backend = C10dRendezvousBackend(store, run_id)
    per_node = max(1, nproc // 2)
    command = [
        *row.command(per_node, "torch")[:-4 if row.backend == "c10d" else None],
        "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
        "--rdzv-id", run_id, "--rdzv-conf", "is_host=0", str(folder / "worker_torch.py"),
        str(folder), "done",
    ]  # fmt: skip
    nodes = [subprocess.Popen(command, env={**_env(folder), "BENCH_NODE": "early"},
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)]  # fmt: skip
    second_at = time.monotonic() + late
    formed = None
    try:
        while formed is None:
            if len(nodes) == 1 and time.monotonic() >= second_at:
                nodes.append(subprocess.Popen(command, env={**_env(folder), "BENCH_NODE": "late"},
                                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
            state = backend.get_state()
            if state is not None and getattr(pickle.loads(state[0]), "complete", False):
                formed = time.clock_gettime(time.CLOCK_MONOTONIC)
                break
            if any(node.poll() is not None for node in nodes):
                raise SystemExit(f"{row.label}: a node ended: {nodes[0].communicate()[1][-2000:]}")
            time.sleep(0.005)
        for node in nodes:
            _, err = node.communicate(timeout=600)
            if node.returncode != 0:
                raise SystemExit(f"{row.label} failed: {err.decode()[-2000:]}")
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.communicate()
        del store
    past = {path.name[8:]: float(path.read_text()) for path in folder.glob("start.0.*")}
    if len(past) != 2 * per_node:
        raise SystemExit(f"expected {2 * per_node} workers, saw {len(past)}")
    for node in ("early", "late"):  # which node's workers were last, for the record
        ranks = [r for r in past if (folder / f"node.{r}").read_text() == node]
        by_node.setdefault(node, []).append(max(past[r] for r in ranks) - formed)
    return max(past.values()) - formed


def _smaps(pid: int) -> tuple[float, float]:
    """(Rss, Pss) of ``pid`` in MiB."""
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            name, _, value = line.partition(":")
            if name in ("Rss", "Pss"):
                fields[name] = int(value.split()[0]) / 1024
    return fields["Rss"], fields["Pss"]


def _processes_with(entry: bytes) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/environ", "rb") as environ:
                    if entry in environ.read().split(b"\0"):
                        found.append(int(name))
            except OSError:
                continue
    return found


def standby_memory(folder: Path, nproc: int) -> dict[str, float]:
    """Per standby waiting with torch imported, and for ``python -c "import torch"``: Rss and
    Pss in MiB (medians over the standbys)."""
    _clear(folder)
    tag = f"BENCH_TAG=mem{os.getpid()}".encode()
    env = {**_env(folder), "BENCH_TAG": tag.decode().partition("=")[2]}
    launcher = subprocess.Popen(
        [*Row("numarun", "static", warm=True).command(nproc, "torch"), "--max-restarts", "1",
         str(folder / "worker_torch.py"), str(folder), "sleep"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    plain = subprocess.Popen(
        [sys.executable, "-c", "import torch, sys; print(flush=True); sys.stdin.read()"],
        env=_env(folder), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while sum(p.name.startswith("ready.") for p in folder.iterdir()) < 2 * nproc:
            if time.monotonic() > deadline or launcher.poll() is not None:
                raise SystemExit("memory: the standbys did not get ready")
            time.sleep(0.05)
        assert plain.stdout is not None
        plain.stdout.readline()
        workers = {int(p.read_text()) for p in folder.glob("pid.0.*")}
        standbys = [
            pid for pid in _processes_with(tag)
            if pid not in workers and pid != launcher.pid and _is_python_child(pid)
        ]  # fmt: skip
        sizes = [_smaps(pid) for pid in standbys]
        reference = _smaps(plain.pid)
    finally:
        launcher.terminate()
        launcher.communicate(timeout=120)
        plain.kill()
        plain.communicate()
    return {
        "standbys": len(sizes),
        "standby_rss_mib": statistics.median(s[0] for s in sizes),
        "standby_pss_mib": statistics.median(s[1] for s in sizes),
        "import_torch_rss_mib": reference[0],
        "import_torch_pss_mib": reference[1],
    }


def _is_python_child(pid: int) -> bool:
    """A standby (exec'd: its command line is the bootstrap's), not a forked watchdog."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return b"numarun.worker.bootstrap" in cmdline.read()
    except OSError:
        return False


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


def launcher_cpu(row: Row, script: str, folder: Path, nproc: int, span: float) -> float:
    """Milliseconds of the launcher's CPU per second of wall time while workers sleep."""
    _clear(folder)
    proc = subprocess.Popen(
        [*row.command(nproc, "script"), script, str(folder), "sleep"],
        env=_env(folder), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while len(list(folder.glob("start.0.*"))) < nproc:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"{row.label}: workers did not start")
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


def _interleaved(
    calls: dict[str, Callable[[], float]], runs: int, samples: dict[str, list[float]],
    after_round: Callable[[], None],
) -> None:
    """Each call once to warm up, then ``runs`` rounds of all, interleaved (load from
    elsewhere hits all alike), into ``samples``; ``after_round()`` after each round."""
    for call in calls.values():
        call()
    samples.update({key: [] for key in calls})
    for _ in range(runs):
        for key, call in calls.items():
            samples[key].append(call())
        after_round()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="measurements per row")
    parser.add_argument("--nproc", type=int, default=4, help="workers per run (late: in all)")
    parser.add_argument("--figures", default="restart,early,late,memory,cpu",
                        help="which figures: restart, early, late, memory, cpu")  # fmt: skip
    parser.add_argument("--fail-after", type=float, default=1.0,
                        help="early: seconds from rank 0's start to its failure")
    parser.add_argument("--kinds", default="fast,script,torch,slow",
                        help="restart: kinds of worker (fast, script, torch, slow)")  # fmt: skip
    parser.add_argument("--backends", default="static,c10d", help="restart: backends")
    parser.add_argument("--slow-backends", default=None,
                        help="restart: backends for the slow kind (default: --backends)")
    parser.add_argument("--slow-seconds", type=float, default=5.0)
    parser.add_argument("--late-seconds", type=float, default=5.0)
    parser.add_argument("--cpu-seconds", type=float, default=20.0, help="CPU measuring span")
    parser.add_argument("--json", help="also write every sample to this file")
    args = parser.parse_args(argv)
    figures = set(args.figures.split(","))
    kinds = [kind for kind in args.kinds.split(",") if kind]
    backends = args.backends.split(",")
    slow_backends = (args.slow_backends or args.backends).split(",")
    load = os.getloadavg()
    result: dict[str, object] = {"nproc": args.nproc, "runs": args.runs,
                                 "cpus": len(os.sched_getaffinity(0)),
                                 "python": sys.version.split()[0], "load_before": load}  # fmt: skip
    try:
        import warnings

        warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
        import torch

        result["torch"] = torch.__version__
    except ImportError:
        result["torch"] = None

    def save() -> None:  # after each figure: a run cut short keeps what it measured
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench_restart_") as tmp:
        folder = Path(tmp)
        for kind in ("script", "torch", "slow"):
            (folder / f"worker_{kind}.py").write_text(WORKER.format(imports=IMPORTS[kind]))
        (folder / "bench_ready.py").write_text(READY_MODULE)
        (folder / "bench_slow.py").write_text(SLOW_MODULE.format(seconds=args.slow_seconds))
        if "memory" in figures:
            result["memory"] = standby_memory(folder, args.nproc)
            save()
        if "restart" in figures:
            calls = {
                f"{kind}|{row.label}": (
                    lambda row=row, kind=kind: restart_latency(row, kind, folder, args.nproc)
                )
                for kind in kinds
                for row in _rows(kind, slow_backends if kind == "slow" else backends)
            }
            result["restart"] = {}
            _interleaved(calls, args.runs, result["restart"], save)  # type: ignore[arg-type]
        if "early" in figures:
            calls = {
                row.label: (
                    lambda row=row: restart_latency(row, "torch", folder, args.nproc,
                                                    early=args.fail_after)
                )
                for backend in backends
                for row in (Row("numarun", backend, warm=True), Row("numarun", backend),
                            Row("torchrun", backend))
            }  # fmt: skip
            result["early"] = {}
            _interleaved(calls, args.runs, result["early"], save)  # type: ignore[arg-type]
        if "late" in figures:
            rows = [Row("torchrun", "c10d"), Row("numarun", "c10d"),
                    Row("numarun", "c10d", warm=True)]  # fmt: skip
            nodes: dict[str, dict[str, list[float]]] = {row.label: {} for row in rows}
            result["late_by_node"] = nodes
            calls = {row.label: (lambda row=row: late_join(row, folder, args.nproc,
                                                           args.late_seconds, nodes[row.label]))
                     for row in rows}  # fmt: skip
            result["late"] = {}
            _interleaved(calls, args.runs, result["late"], save)  # type: ignore[arg-type]
        if "cpu" in figures:
            script = str(folder / "worker_script.py")
            result["cpu"] = {
                row.label: launcher_cpu(row, script, folder, args.nproc, args.cpu_seconds)
                for row in (Row("numarun", "c10d"), Row("torchrun", "c10d"))
            }
    result["load_after"] = os.getloadavg()
    result["seconds"] = time.monotonic() - started
    print(_markdown(result, args))
    save()
    return 0


def _markdown(result: dict, args: argparse.Namespace) -> str:
    lines = [
        f"## numarun restart benchmark ({args.nproc} workers, {result['cpus']} CPUs, Python "
        f"{result['python']}, torch {result['torch']}; load average "
        f"{result['load_before'][0]:.1f} before, {result['load_after'][0]:.1f} after; "
        f"{result['seconds']:.0f} s)",
        "",
    ]
    restart = result.get("restart")
    if restart:
        lines += [
            "| a worker's failure -> every worker of the next attempt past its imports | "
            "workers | median ms | IQR ms | vs torchrun, same backend |",
            "|---|---|---|---|---|",
        ]
        for key, samples in restart.items():
            kind, label = key.split("|")
            backend = label.rsplit("(", 1)[1].rstrip(")")
            anchor = statistics.median(restart[f"{kind}|torchrun ({backend})"])
            median, low, high = _stats(samples)
            workers = LABELS[kind].format(slow=args.slow_seconds)
            lines.append(
                f"| {label} | {workers} | {median * 1e3:.1f} | {low * 1e3:.1f}-"
                f"{high * 1e3:.1f} | {median / anchor:.2f}x |"
            )
        lines.append("")
    early = result.get("early")
    if early:
        lines += [
            f"| rank 0 fails {args.fail_after:g} s after its start (`import torch` first) -> "
            "every worker of the next attempt past its imports | median ms | IQR ms | "
            "vs torchrun, same backend |",
            "|---|---|---|---|",
        ]
        for label, samples in early.items():
            backend = label.rsplit("(", 1)[1].rstrip(")")
            anchor = statistics.median(early[f"torchrun ({backend})"])
            median, low, high = _stats(samples)
            lines.append(
                f"| {label} | {median * 1e3:.1f} | {low * 1e3:.1f}-{high * 1e3:.1f} | "
                f"{median / anchor:.2f}x |"
            )
        lines.append("")
    late = result.get("late")
    if late:
        lines += [
            f"| two c10d nodes, the second {args.late_seconds:g} s late: round complete -> "
            "every worker past `import torch` | median ms | IQR ms | vs torchrun |",
            "|---|---|---|---|",
        ]
        anchor = statistics.median(late["torchrun (c10d)"])
        for label, samples in late.items():
            median, low, high = _stats(samples)
            lines.append(
                f"| {label} | {median * 1e3:.1f} | {low * 1e3:.1f}-{high * 1e3:.1f} | "
                f"{median / anchor:.2f}x |"
            )
        lines.append("")
    memory = result.get("memory")
    if memory:
        lines += [
            "| what a standby with torch imported costs | RSS MiB | PSS MiB |",
            "|---|---|---|",
            f"| one standby, waiting (median of {memory['standbys']}) | "
            f"{memory['standby_rss_mib']:.0f} | {memory['standby_pss_mib']:.0f} |",
            f"| `python -c \"import torch\"` (reference) | {memory['import_torch_rss_mib']:.0f} | "
            f"{memory['import_torch_pss_mib']:.0f} |",
            "",
        ]
    cpu = result.get("cpu")
    if cpu:
        lines += [
            f"| launcher CPU while {args.nproc} workers run ({args.cpu_seconds:g} s) | ms per s |",
            "|---|---|",
            *(f"| {label} | {value:.2f} |" for label, value in cpu.items()),
            "",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())

"""numarun.spawn against bare interpreters and torch.multiprocessing, side by side in one run.

    python benchmarks/bench_spawn.py [--repeats 9] [--torch-repeats 3] [--teardown-runs 20]
                                     [--counts 1,2,4,8] [--method spawn] [--no-torch]
                                     [--sections startup,workercpu,teardown,cpu,memory,poll]
                                     [--memory-mib 50] [--memory-methods spawn,fork]
                                     [--poll-runs 5] [--teardown-method fork]
                                     [--main-imports-torch] [--autogroup off]

Six measurements, each taken alternately for every contender so they share the machine's
conditions, and reported as medians and ratios:

1. Start-up, N = 1, 2, 4, 8 workers: from the call to the last worker's first line. Each
   worker's first statement reads ``time.monotonic()`` (CLOCK_MONOTONIC is one clock for the
   whole system on Linux) and writes it to a file. The anchor is N bare interpreters
   (``python -c "import time; print(time.monotonic())"``) started back to back with
   :class:`subprocess.Popen` (each Popen waits for its child's exec). torch.multiprocessing's
   workers import torch before ``fn`` runs, which dominates its figures. Target: numarun
   within 1.5x of the anchor.
1b. CPU per call (``workercpu``), which the load of a shared machine distorts far less than
   wall time: for one worker, the user+system CPU of this process and of the worker
   (``RUSAGE_CHILDREN``: the worker is reaped by the call) per ``numarun.spawn`` call, median of
   ``--repeats`` calls after a warm-up, beside one bare interpreter's CPU.
2. Failure to full teardown: rank 0 records the time and raises while the other ranks sleep
   (default SIGTERM disposition); the time until ``spawn`` raises in the parent, when every
   worker is gone. Target: median < 50 ms.
3. Supervisor CPU: user+system CPU of this process (``getrusage(RUSAGE_SELF)``, all threads)
   per second of wall time during a 1 s ``join(timeout=1)`` while 2 workers sleep (after an
   unmeasured 0.5 s join that absorbs the start-up work); and the CPU
   of the final join (teardown sweep of owned processes, reaping). Target: < 1 ms/s.
4. Memory of return values: in a fresh interpreter (numarun and its imports loaded by a small
   warm-up call first), 4 workers each return ``--memory-mib`` MiB (a ``bytes``); the caller's
   peak resident memory above its resident memory just before the call (``VmHWM`` after
   ``/proc/self/clear_refs`` reset it to ``VmRSS``), against the anchor, the payload itself
   (the values the caller ends up holding). Target: at most 1.5x the payload.
5. ``exitcode`` / ``is_alive()`` of a worker that ended (``fork``, the default
   ``grace_period`` of 30 s) and left a child that ignores SIGTERM: the time the two calls
   take, the worker's end awaited on its sentinel first (nothing of numarun's runs meanwhile).
   The anchor is torch.multiprocessing's (a ``waitpid(WNOHANG)``; torch never looks for the
   child, which this benchmark kills afterwards). Target: non-blocking, under 50 ms (issue
   20.7: it took ``grace_period`` + ``kill_wait``, 35 s).

Scheduler groups (every comparison with torch). numarun's workers each run in a session of
their own (``setsid``), torch.multiprocessing's share the caller's. On a kernel with
``/proc/sys/kernel/sched_autogroup_enabled`` at 1 (the desktop default; also this project's
machine) each session is a scheduling group of its own, so on a busy machine numarun's workers
get more CPU than torch's (4 x ``import torch``: 16.3 s in the caller's session, 8.4 s in new
sessions) and the comparison flatters numarun. ``--autogroup off`` (root) sets it to 0 for the
run and back afterwards, so every task weighs the same, as on a dedicated server with autogroup
off; the first line of the output says which state the figures were measured in.

The worker functions live in this file, which is imported by module name (not as ``__main__``)
so that spawned workers import nothing but it and the standard library.
"""

from __future__ import annotations

# Only what the worker functions need is imported at module level: spawned workers import
# this module to find them, and their imports would count as numarun's start-up time.
import os
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

# --main-imports-torch: this module (the main module, which "spawn" workers import again) imports
# torch, as a training script does, so every spawned worker, numarun's and torch's, imports it.
MAIN_TORCH_ENV = "BENCH_SPAWN_MAIN_IMPORTS_TORCH"
if os.environ.get(MAIN_TORCH_ENV) == "1":
    import torch  # noqa: F401

BARE_CODE = "import time; print(time.monotonic())"


# --- worker functions (module level: every start method can pickle them) ------------------------


def first_line(local_rank: int, directory: str) -> None:
    now = time.monotonic()
    with open(os.path.join(directory, str(local_rank)), "w") as stamp:
        stamp.write(repr(now))


def fail_or_sleep(local_rank: int, directory: str, nprocs: int) -> None:
    """Rank 0 raises once every other rank is up; the others sleep until torn down."""
    if local_rank != 0:
        open(os.path.join(directory, f"up{local_rank}"), "w").close()
        time.sleep(60)
        return
    deadline = time.monotonic() + 60
    while not all(os.path.exists(os.path.join(directory, f"up{r}")) for r in range(1, nprocs)):
        if time.monotonic() > deadline:
            raise TimeoutError("the other ranks never came up")
        time.sleep(0.001)
    with open(os.path.join(directory, "failed_at"), "w") as stamp:
        stamp.write(repr(time.monotonic()))
    raise RuntimeError("planned failure")


def sleep_for(local_rank: int, seconds: float) -> None:
    time.sleep(seconds)


def big_value(local_rank: int, size: int) -> bytes:
    return bytes([local_rank]) * size


_left_running: list[Any] = []


def leave_sigterm_ignoring_child(local_rank: int, pid_file: str) -> None:
    """Starts a child that ignores SIGTERM, writes its pid once it does, and returns."""
    import subprocess

    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(); "
    child = subprocess.Popen(
        [sys.executable, "-c", code + "time.sleep(120)"], stdout=subprocess.PIPE
    )
    assert child.stdout is not None
    child.stdout.readline()
    with open(pid_file + ".partial", "w") as out:
        out.write(str(child.pid))
    os.rename(pid_file + ".partial", pid_file)
    _left_running.append(child)  # no "still running" ResourceWarning when fn returns


# --- contenders ----------------------------------------------------------------------------------


def _torch_mp() -> Any:
    try:
        import torch.multiprocessing as torch_mp
    except ImportError:
        return None
    return torch_mp


def start_bare(nprocs: int) -> float:
    """Seconds from the first Popen to the last interpreter's line."""
    import subprocess

    start = time.monotonic()
    procs = [
        subprocess.Popen([sys.executable, "-c", BARE_CODE], stdout=subprocess.PIPE)
        for _ in range(nprocs)
    ]
    stamps = [float(proc.communicate()[0]) for proc in procs]
    return max(stamps) - start


def _read_stamp(directory: str, name: str) -> float:
    with open(os.path.join(directory, name)) as stamp:
        return float(stamp.read())


def start_with(launch: Callable[[str], None], nprocs: int) -> float:
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        start = time.monotonic()
        launch(directory)
        stamps = [_read_stamp(directory, str(rank)) for rank in range(nprocs)]
    return max(stamps) - start


def start_numarun(nprocs: int, method: str) -> float:
    import numarun

    return start_with(
        lambda d: numarun.spawn(first_line, args=(d,), nprocs=nprocs, start_method=method), nprocs
    )


def start_torch(torch_mp: Any, nprocs: int, method: str) -> float:
    return start_with(
        lambda d: torch_mp.start_processes(
            first_line, args=(d,), nprocs=nprocs, start_method=method
        ),
        nprocs,
    )


def _children_cpu_seconds() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cpu_per_call(call: Callable[[], object]) -> tuple[float, float]:
    """(CPU seconds of this process, CPU seconds of its reaped children) for one ``call()``."""
    own, children = _cpu_seconds(), _children_cpu_seconds()
    call()
    return _cpu_seconds() - own, _children_cpu_seconds() - children


def bench_worker_cpu(repeats: int, method: str) -> list[str]:
    import subprocess
    from statistics import median

    import numarun

    def ours() -> object:
        return numarun.spawn(sleep_for, args=(0,), nprocs=1, start_method=method)

    def bare() -> object:
        return subprocess.run([sys.executable, "-c", BARE_CODE], stdout=subprocess.DEVNULL)

    ours()  # warm-up: imports, the resource tracker, the forkserver
    samples = [(cpu_per_call(ours), cpu_per_call(bare)) for _ in range(repeats)]
    parent = median(s[0][0] for s in samples) * 1000
    worker = median(s[0][1] for s in samples) * 1000
    anchor = median(s[1][1] for s in samples) * 1000
    return [
        f"| CPU per call, 1 worker ({method}, median of {repeats}) | caller {parent:.1f} ms, "
        f"worker {worker:.1f} ms | bare interpreter {anchor:.1f} ms |",
    ]


def teardown(
    spawn: Callable[..., object],
    expected: type[BaseException],
    nprocs: int,
    method: str = "fork",
) -> float:
    """Seconds from rank 0's failure to ``spawn`` raising in the parent."""
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        try:
            spawn(fail_or_sleep, args=(directory, nprocs), nprocs=nprocs, start_method=method)
        except expected:
            raised_at = time.monotonic()
        else:
            raise AssertionError("the failure did not propagate")
        return raised_at - _read_stamp(directory, "failed_at")


def _cpu_seconds() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def supervision_cpu(context: Any, window: float) -> tuple[float, float]:
    """(CPU seconds per wall second during a ``join(timeout=window)`` while the workers sleep,
    CPU seconds of the final join, which includes the teardown and reaping).

    An unmeasured half-second join comes first, so that the one-time start-up work (payload
    writes, exec checks) is not counted as steady-state supervision.
    """
    assert not context.join(timeout=0.5)
    cpu, wall = _cpu_seconds(), time.monotonic()
    finished = context.join(timeout=window)
    idle = (_cpu_seconds() - cpu) / (time.monotonic() - wall)
    assert not finished, "the workers ended inside the measuring window"
    cpu = _cpu_seconds()
    while not context.join():
        pass
    return idle, _cpu_seconds() - cpu


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith(field + ":"))
    return int(line.split()[1])


def memory_child(method: str, nprocs: int, size: int) -> None:
    """Runs in a fresh interpreter: prints the peak bytes above the baseline for one call."""
    import numarun

    numarun.spawn(big_value, args=(1,), nprocs=nprocs, start_method=method)  # imports, tracker
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # VmHWM := VmRSS
    baseline = _status_kib("VmRSS")
    values = numarun.spawn(big_value, args=(size,), nprocs=nprocs, start_method=method)
    peak = _status_kib("VmHWM")
    assert [len(value) for value in values] == [size] * nprocs
    print((peak - baseline) * 1024)


def peak_above_baseline(method: str, nprocs: int, size: int) -> int:
    import subprocess

    done = subprocess.run(
        [sys.executable, __file__, "--memory-child", method, str(nprocs), str(size)],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout.split()[-1])


def bench_memory(mib: int, methods: list[str], repeats: int) -> list[str]:
    from statistics import median

    nprocs, size = 4, mib * 1024 * 1024
    payload = nprocs * size
    rows = [
        f"| start method | payload ({nprocs} x {mib} MiB) | caller's peak above baseline "
        f"(median of {repeats}) | ratio | target |",
        "|---|---|---|---|---|",
    ]
    for method in methods:
        peak = median(peak_above_baseline(method, nprocs, size) for _ in range(repeats))
        rows.append(
            f"| {method} | {payload / 2**20:.0f} MiB | {peak / 2**20:.0f} MiB | "
            f"{peak / payload:.2f}x | <= 1.5x |"
        )
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


# --- report --------------------------------------------------------------------------------------


def _cell(samples: list[float], anchor: list[float] | None = None) -> str:
    """``"123 ms (1.20x)"``: the median, and its ratio to the anchor's median."""
    from statistics import median

    if not samples:
        return "n/a"
    text = f"{median(samples) * 1000:.0f} ms"
    if anchor:
        text += f" ({median(samples) / median(anchor):.2f}x)"
    return text


def bench_startup(
    counts: list[int], repeats: int, torch_repeats: int, method: str, torch_mp: Any
) -> list[str]:
    rows = [
        f"| N | bare interpreters | numarun.spawn ({method}) | torch.mp ({method}) |",
        "|---|---|---|---|",
    ]
    for nprocs in counts:
        bare: list[float] = []
        ours: list[float] = []
        theirs: list[float] = []
        for repeat in range(repeats):
            bare.append(start_bare(nprocs))
            ours.append(start_numarun(nprocs, method))
            if torch_mp is not None and repeat < torch_repeats:
                theirs.append(start_torch(torch_mp, nprocs, method))
        rows.append(f"| {nprocs} | {_cell(bare)} | {_cell(ours, bare)} | {_cell(theirs, bare)} |")
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def bench_teardown(runs: int, nprocs: int, torch_mp: Any, method: str = "fork") -> list[str]:
    import numarun

    ours: list[float] = []
    theirs: list[float] = []
    for _ in range(runs):
        ours.append(teardown(numarun.spawn, numarun.ProcessRaisedException, nprocs, method))
        if torch_mp is not None:
            theirs.append(
                teardown(
                    torch_mp.start_processes, torch_mp.ProcessRaisedException, nprocs, method
                )
            )
    return [
        f"| failure to full teardown, {nprocs} {method} workers (median of {runs}) | "
        f"{_cell(ours)} | {_cell(theirs)} | < 50 ms |"
    ]


def bench_cpu(seconds: float, torch_mp: Any) -> list[str]:
    import numarun

    window = seconds - 2.0
    ours = supervision_cpu(numarun.spawn(sleep_for, args=(seconds,), nprocs=2, join=False), window)
    theirs = None
    if torch_mp is not None:
        context = torch_mp.start_processes(
            sleep_for, args=(seconds,), nprocs=2, join=False, start_method="spawn"
        )
        theirs = supervision_cpu(context, window)
    their_idle = "n/a" if theirs is None else f"{theirs[0] * 1000:.2f} ms/s"
    their_end = "n/a" if theirs is None else f"{theirs[1] * 1000:.1f} ms"
    return [
        f"| parent CPU per second while 2 workers sleep ({window:g} s window) | "
        f"{ours[0] * 1000:.2f} ms/s | {their_idle} | < 1 ms/s |",
        f"| parent CPU of the final join (teardown sweep, reaping) | {ours[1] * 1000:.1f} ms | "
        f"{their_end} | |",
    ]


def poll_latency(start: Callable[..., Any]) -> float:
    """Seconds ``is_alive()`` and ``exitcode`` take for an ended worker with a leftover child
    that ignores SIGTERM (measurement 5); the run and the child are ended afterwards."""
    import contextlib
    import multiprocessing.connection
    import signal
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        pid_file = os.path.join(directory, "leftover")
        context = start(
            leave_sigterm_ignoring_child,
            args=(pid_file,),
            nprocs=1,
            join=False,
            start_method="fork",
        )
        worker = context.processes[0]
        multiprocessing.connection.wait([worker.sentinel], timeout=60)
        began = time.perf_counter()
        worker.is_alive()
        _ = worker.exitcode
        elapsed = time.perf_counter() - began
        with open(pid_file) as written:
            leftover = int(written.read())
        if hasattr(context, "stop"):
            context.stop(grace_period=0)  # numarun: SIGKILL for the leftover
        else:
            context.join()
            with contextlib.suppress(ProcessLookupError):
                os.kill(leftover, signal.SIGKILL)
    return elapsed


def bench_poll(runs: int, torch_mp: Any) -> list[str]:
    import numarun

    ours: list[float] = []
    theirs: list[float] = []
    for _ in range(runs):
        ours.append(poll_latency(numarun.start_processes))
        if torch_mp is not None:
            theirs.append(poll_latency(torch_mp.start_processes))
    from statistics import median

    def cell(samples: list[float]) -> str:
        return f"{median(samples) * 1000:.1f} ms" if samples else "n/a"

    return [
        f"| `is_alive()` + `exitcode` of an ended worker whose child ignores SIGTERM "
        f"(median of {runs}) | {cell(ours)} | {cell(theirs)} | < 50 ms, non-blocking |"
    ]


AUTOGROUP = "/proc/sys/kernel/sched_autogroup_enabled"


def autogroup() -> str | None:
    """The kernel's autogroup switch ("0" or "1"), None where the kernel has none."""
    try:
        with open(AUTOGROUP) as knob:
            return knob.read().strip()
    except OSError:
        return None


def set_autogroup(value: str) -> None:
    with open(AUTOGROUP, "w") as knob:
        knob.write(value)


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9, help="start-up repetitions per N")
    parser.add_argument("--torch-repeats", type=int, default=3, help="of those, with torch")
    parser.add_argument("--teardown-runs", type=int, default=20)
    parser.add_argument("--counts", default="1,2,4,8", help="worker counts for start-up")
    parser.add_argument("--method", default="spawn", choices=("spawn", "fork", "forkserver"))
    parser.add_argument("--no-torch", action="store_true", help="leave torch.mp out")
    parser.add_argument("--sections", default="startup,workercpu,teardown,cpu,memory,poll")
    parser.add_argument("--memory-mib", type=int, default=50, help="MiB returned per worker")
    parser.add_argument("--memory-methods", default="spawn,fork")
    parser.add_argument("--memory-repeats", type=int, default=3)
    parser.add_argument("--poll-runs", type=int, default=5)
    parser.add_argument("--teardown-method", default="fork",
                        choices=("spawn", "fork", "forkserver"), help="start method (teardown)")
    parser.add_argument("--main-imports-torch", action="store_true",
                        help="the main module imports torch, as a training script does: every "
                        "spawned worker, numarun's and torch's, imports it too")
    parser.add_argument("--memory-child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument(
        "--autogroup", choices=("as-is", "off"), default="as-is",
        help="off: turn the kernel's autogroup scheduling off for the run (root), so that "
        "numarun's workers (a session each) and torch's (the caller's session) weigh the same",
    )  # fmt: skip
    args = parser.parse_args()
    if args.memory_child:
        method, nprocs, size = args.memory_child
        memory_child(method, int(nprocs), int(size))
        return
    if args.main_imports_torch:
        os.environ[MAIN_TORCH_ENV] = "1"  # read as the workers import the main module
    before = autogroup()
    if args.autogroup == "off" and before not in (None, "0"):
        try:
            set_autogroup("0")
        except OSError as error:
            parser.error(f"--autogroup off: cannot write {AUTOGROUP}: {error.strerror}")
    try:
        measure(args)
    finally:
        if args.autogroup == "off" and before not in (None, "0"):
            set_autogroup(before)


def measure(args: Any) -> None:
    sections = set(args.sections.split(","))
    # Imported before any measurement, so every numarun and bare figure comes from the same
    # parent: one that has torch loaded, as a training script's parent usually does.
    torch_mp = None if args.no_torch else _torch_mp()
    counts = [int(count) for count in args.counts.split(",")]
    parent = "with torch imported" if torch_mp is not None else "without torch"
    if os.environ.get(MAIN_TORCH_ENV) == "1":
        parent += " by the main module (every spawned worker imports it)"
    state = autogroup()
    if state is None:
        scheduling = "no autogroup in this kernel: every task weighs the same"
    elif state == "0":
        scheduling = "autogroup off: every task weighs the same, as on a dedicated server"
    else:
        scheduling = (
            "autogroup ON: numarun's workers (a session each) outweigh torch's (the caller's "
            "session) on a busy machine; figures against torch flatter numarun "
            "(use --autogroup off)"
        )
    rows = [
        f"Machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, load average "
        f"{os.getloadavg()[0]:.1f}; the parent runs {parent}; {scheduling}.",
        "",
        "### Start-up: call to the last worker's first line (median; ratio vs bare)",
        "",
    ]
    if "startup" in sections:
        rows += bench_startup(counts, args.repeats, args.torch_repeats, args.method, torch_mp)
    if "workercpu" in sections:
        rows += ["", "| measurement | numarun | anchor |", "|---|---|---|"]
        rows += bench_worker_cpu(max(args.repeats, 15), args.method)
    if sections & {"teardown", "cpu", "poll"}:
        rows += ["", "### Teardown and supervision cost", ""]
        rows += ["| measurement | numarun | torch.multiprocessing | target |", "|---|---|---|---|"]
    if "teardown" in sections:
        rows += bench_teardown(args.teardown_runs, 4, torch_mp, args.teardown_method)
    if "cpu" in sections:
        rows += bench_cpu(3.0, torch_mp)
    if "poll" in sections:
        rows += bench_poll(args.poll_runs, torch_mp)
    if "memory" in sections:
        rows += ["", "### Return values: the caller's peak memory", ""]
        methods = args.memory_methods.split(",")
        rows += bench_memory(args.memory_mib, methods, args.memory_repeats)
    print("\n".join(rows))


if __name__ == "__main__":
    # Import this file by module name so that workers do not re-run it as __mp_main__.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_spawn

    bench_spawn.main()

"""A SIGTERM while thousands of workers start, and what each worker costs before it runs, side by
side with their anchors in one run.

Two measurements, each printed as a markdown table:

1. SIGTERM during a large start (issue 16, item 4): ``numarun --nproc-per-node N --no-python
   sleep 120`` is sent SIGTERM ``--delay`` seconds after it was started; the figure is from the
   signal to the launcher's exit (target: 143 within 3 s for N = 3,000, 2 s in), with the
   number of workers it had started and what was left. The anchor does the least any launcher
   must: a Python loop that ``posix_spawn``\\ s ``sleep 120`` processes back to back, gets the
   same SIGTERM at the same moment, SIGTERMs what it started and reaps it. The launcher keeps
   torchrun's log layout, one directory per rank under its temporary directory, made before
   and removed after the run: the launcher is run with ``TMPDIR`` on tmpfs (``/dev/shm``, the
   launcher's own work) and on this machine's default ``TMPDIR`` (that work and the disk's);
   the second anchor is removing an empty tree of the same shape there (``shutil.rmtree``).
2. Bookkeeping per worker, the constant behind numarun.process.capacity's memory bound: the
   launcher's peak resident memory (``VmHWM``) with N workers over that with 10, per worker;
   and the kernel's (``Slab``, ``KernelStack`` and ``PageTables`` of ``/proc/meminfo``) with
   N ``sleep`` workers running over none, per worker (machine-wide: the figure is rough on a
   shared machine).

Every run is in a new pid namespace (``unshare --user --map-root-user --pid --fork
--mount-proc``; as root without ``--user``): whatever it starts ends with it.

Usage: ``python benchmarks/bench_start_signal.py [--nproc 3000] [--delay 2] [--runs 3]``.
Medians of ``--runs``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"

# Runs as pid 1 of the namespace: starts the launcher (or the anchor), signals it, reports.
IN_NAMESPACE = r"""
import json, os, signal, subprocess, sys, time
mode, count, delay, sleep = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]

def live():
    found = 0
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != 1:
            try:
                with open(f"/proc/{name}/stat") as stat:
                    found += stat.read().rsplit(")", 1)[1].split()[0] not in "ZX"
            except OSError:
                pass
    return found

def kernel_bytes():
    fields = {}
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            name, value = line.split(":")
            fields[name] = int(value.split()[0]) * 1024
    return fields["Slab"] + fields["KernelStack"] + fields["PageTables"]

if mode == "memory":
    before = kernel_bytes()
    launcher = subprocess.Popen(
        [sys.executable, "-m", "numarun", "--nproc-per-node", str(count), "--no-python", sleep,
         "600"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while live() < count + 2 and time.monotonic() < deadline:  # the workers and the watchdog
        time.sleep(0.05)
    time.sleep(1.0)  # every exec done
    during = kernel_bytes()
    with open(f"/proc/{launcher.pid}/status") as status:
        hwm = next(int(l.split()[1]) * 1024 for l in status if l.startswith("VmHWM:"))
    launcher.send_signal(signal.SIGTERM)
    launcher.wait()
    print(json.dumps({"kernel": during - before, "hwm": hwm}))
    sys.exit(0)

if mode == "numarun":
    command = [sys.executable, "-m", "numarun", "--nproc-per-node", str(count), "--no-python",
               sleep, "120"]
else:
    command = [sys.executable, "-c", ANCHOR, str(count), sleep]
started = time.monotonic()
job = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
time.sleep(max(0.0, delay - (time.monotonic() - started)))
at_signal = live() - 1  # the launcher (or the anchor) itself is not counted
job.send_signal(signal.SIGTERM)
signalled = time.monotonic()
_, stderr = job.communicate(timeout=600)
seconds = time.monotonic() - signalled
time.sleep(0.5)
print(json.dumps({"code": job.returncode, "seconds": seconds, "at_signal": at_signal,
                  "left": live(), "tail": stderr.decode(errors="replace")[-300:]}))
"""

# The anchor launcher: spawn back to back until SIGTERM, then SIGTERM what started and reap it.
ANCHOR = r"""
import os, signal, sys
count, sleep = int(sys.argv[1]), sys.argv[2]
stop = []
signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
pids = []
for _ in range(count):
    if stop:
        break
    pids.append(os.posix_spawn(sleep, [sleep, "120"], os.environ))
while not stop:
    signal.pause()
for pid in pids:
    os.kill(pid, signal.SIGTERM)
for pid in pids:
    os.waitpid(pid, 0)
sys.exit(128 + stop[0])
"""


def unshare() -> list[str]:
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return ["unshare", *user, "--pid", "--fork", "--mount-proc"]


def in_namespace(mode: str, count: int, delay: float, tmpdir: str) -> dict:
    sleep = shutil.which("sleep")
    assert sleep is not None
    env = {**os.environ, "PYTHONPATH": str(SRC), "TMPDIR": tmpdir}
    code = IN_NAMESPACE.replace("ANCHOR", repr(ANCHOR))
    done = subprocess.run(
        [*unshare(), sys.executable, "-c", code, mode, str(count), str(delay), sleep],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    if done.returncode != 0:
        raise SystemExit(f"{mode} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def rmtree_anchor(count: int, tmpdir: str) -> float:
    """Seconds to remove an empty tree shaped as the launcher's temporary log directory."""
    import time

    base = tempfile.mkdtemp(prefix="bench_tree_", dir=tmpdir)
    attempt = Path(base, "run", "attempt_0")
    for rank in range(count):
        (attempt / str(rank)).mkdir(parents=True)
    started = time.monotonic()
    shutil.rmtree(base)
    return time.monotonic() - started


def signal_rows(count: int, delay: float, runs: int) -> list[str]:
    places = [("tmpfs", "/dev/shm")] if Path("/dev/shm").is_dir() else []
    places.append(("default TMPDIR", tempfile.gettempdir()))
    rows = []
    for label, tmpdir in places:
        numarun, anchor, trees = [], [], []
        for _ in range(runs):
            numarun.append(in_namespace("numarun", count, delay, tmpdir))
            anchor.append(in_namespace("anchor", count, delay, tmpdir))
            trees.append(rmtree_anchor(count, tmpdir))
        ours = statistics.median(run["seconds"] for run in numarun)
        bare = statistics.median(run["seconds"] for run in anchor)
        tree = statistics.median(trees)
        codes = sorted({run["code"] for run in numarun})
        started = statistics.median(run["at_signal"] for run in numarun)
        left = max(run["left"] for run in numarun)
        rows.append(
            f"| {label} ({tmpdir}) | {ours:.2f} s (exit {codes}, {started:.0f} started, "
            f"{left} left) | {bare:.2f} s | {ours / bare:.1f}x | {tree:.2f} s |"
        )
    return rows


def memory_rows(count: int) -> list[str]:
    small = in_namespace("memory", 10, 0, "/dev/shm" if Path("/dev/shm").is_dir() else "/tmp")
    large = in_namespace("memory", count, 0, "/dev/shm" if Path("/dev/shm").is_dir() else "/tmp")
    launcher = (large["hwm"] - small["hwm"]) / (count - 10)
    kernel = large["kernel"] / count
    return [
        f"| launcher peak RSS per worker ({count} vs 10 workers) | {launcher / 1024:.0f} KiB |",
        f"| kernel (Slab, KernelStack, PageTables) per running worker | {kernel / 1024:.0f} KiB |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=3000)
    parser.add_argument("--delay", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(f"Machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}; "
          f"{args.nproc} workers, SIGTERM {args.delay} s in; medians of {args.runs}")  # fmt: skip
    print("\n| temporary directory | numarun: SIGTERM to exit | anchor: spawn loop | ratio "
          "| anchor: removing the rank directories |")  # fmt: skip
    print("|---|---|---|---|---|")
    for line in signal_rows(args.nproc, args.delay, args.runs):
        print(line, flush=True)
    print("\n| bookkeeping | per worker |\n|---|---|")
    for line in memory_rows(min(args.nproc, 2000)):
        print(line, flush=True)


if __name__ == "__main__":
    main()

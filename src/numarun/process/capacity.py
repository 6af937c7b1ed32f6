"""How many workers this machine can start: the one bound that every way of starting workers
checks before anything is planned or started (the launcher's ``--nproc-per-node``,
``numarun.spawn``'s ``nprocs``).

A run of N workers needs N + 1 processes (the watchdog) and, in the supervisor, bookkeeping for
each worker (its record, its environment, its pipes). A count beyond what the machine can hold
used to be found out the hard way: a billion workers had the launcher build a billion
environments until the kernel's OOM killer ended it. :func:`worker_count_problem` compares the
count with the smallest of:

* ``kernel.pid_max`` and ``kernel.threads-max``, less the threads that exist now (the fourth
  field of ``/proc/loadavg``): every worker is at least one pid and one task;
* ``RLIMIT_NPROC`` (``ulimit -u``), the processes this user may have, when it applies (not for
  root, whom the kernel exempts);
* the memory available now (``MemAvailable``) over :data:`BOOKKEEPING_BYTES` per worker.

These are bounds of what can start at all, not of what runs well: a count under them may still
fail to start (each worker's own memory, other limits), with the one-line start errors of
:mod:`numarun.process.starting`. Counts up to :data:`ALWAYS_FINE` are not looked at (no file is
read on the launcher's start-up path for them).
"""

from __future__ import annotations

import os

# What one worker costs before it runs anything, measured with 2,000 ``sleep`` workers
# (benchmarks/bench_start_signal.py): about 5 KiB in the launcher (its record, environment,
# spec) and about 110 KiB in the kernel (slab, kernel stack, page tables of a running
# ``sleep``). Rounded up: the bound must hold where environments are larger.
BOOKKEEPING_BYTES = 256 * 1024
ALWAYS_FINE = 512  # no machine numarun runs on refuses this many processes for this reason


def worker_limit() -> tuple[int, str]:
    """The most workers one run can start on this machine now, and what sets that bound (a
    phrase for the error message)."""
    in_use = _threads_in_use()
    bounds: list[tuple[int, str]] = []
    for name in ("pid_max", "threads-max"):
        value = _read_int(f"/proc/sys/kernel/{name}")
        if value is not None:
            bounds.append((value - in_use - 1, f"kernel.{name} is {value}, {in_use} in use"))
    if os.getuid() != 0:
        try:
            import resource

            soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
        except (ImportError, OSError, ValueError):
            soft = -1
        if soft >= 0:  # RLIM_INFINITY is -1
            bounds.append((soft - 1, f"the process limit (ulimit -u) is {soft}"))
    available = _mem_available()
    if available is not None:
        bounds.append(
            (
                available // BOOKKEEPING_BYTES,
                f"{available // (1 << 20)} MiB of memory is available, "
                f"{BOOKKEEPING_BYTES // 1024} KiB per worker",
            )
        )
    if not bounds:
        return 1 << 31, "nothing bounds it"
    count, reason = min(bounds)
    return max(count, 0), reason


def worker_count_problem(count: int) -> str | None:
    """Why ``count`` workers cannot be started here (``"more workers than this machine can
    start: at most N (kernel.pid_max is ...)"``), or None when they can."""
    if count <= ALWAYS_FINE:
        return None
    limit, reason = worker_limit()
    if count <= limit:
        return None
    return f"more workers than this machine can start: at most {limit} ({reason})"


def _read_int(path: str) -> int | None:
    try:
        with open(path, "rb") as file:
            return int(file.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _threads_in_use() -> int:
    """Every task on the machine now: the ``nr_threads`` of ``/proc/loadavg``."""
    try:
        with open("/proc/loadavg", "rb") as file:
            return int(file.read().split()[3].split(b"/")[1])
    except (OSError, ValueError, IndexError):
        return 0


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo", "rb") as file:
            for line in file:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None

"""Facts every worker's environment is built from, shared by ``numarun.spawn`` and the launcher.

Kept apart from :mod:`numarun.machine.topology` on purpose: these sit on the start-up path of every
launch, and reading the whole machine there would add to every worker's start-up latency.
"""

from __future__ import annotations

import os

from numarun.errors import UsageError


def free_port() -> int:
    """A TCP port free on all interfaces right now.

    Racy by nature (bind, read, release), like every launcher's; the alternative, port 0 inside
    the TCPStore, cannot be told to the other ranks.
    """
    # _socket, not socket: socket.py builds its enums when imported, about 3 ms of every
    # launch's start-up.
    import _socket

    probe = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    try:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])
    finally:
        probe.close()


def allowed_physical_cores(sysfs_root: str = "/", allowed: set[int] | None = None) -> int:
    """Physical cores among ``allowed`` CPUs (default: this process's affinity), at least 1.

    Reads each core's ``thread_siblings_list`` once (a sibling already seen is skipped). A CPU
    whose list cannot be read counts as a core of its own.
    """
    from numarun.machine.cpulist import parse_cpulist

    cpus = os.sched_getaffinity(0) if allowed is None else allowed
    cpu_dir = os.path.join(sysfs_root, "sys/devices/system/cpu")
    seen: set[int] = set()
    cores = 0
    for cpu in sorted(cpus):
        if cpu in seen:
            continue
        cores += 1
        try:
            with open(f"{cpu_dir}/cpu{cpu}/topology/thread_siblings_list") as siblings:
                seen.update(parse_cpulist(siblings.read()))
        except (OSError, UsageError):
            seen.add(cpu)
    return max(1, cores)


def unbound_threads(nprocs: int, sysfs_root: str = "/") -> int:
    """OMP_NUM_THREADS for an unbound rank: allowed physical cores / ``nprocs``, at least 1.

    torchrun forces 1; Lightning and the research behind numarun use this share instead.
    """
    return max(1, allowed_physical_cores(sysfs_root) // max(1, nprocs))

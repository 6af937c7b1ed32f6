"""Inside a rank of ``numarun check``: buffers on chosen NUMA nodes, where pages are, copy speed.

``mmap(2)``/``munmap(2)`` from the C library through :mod:`ctypes` for anonymous buffers whose
address is known; :func:`numarun.placement.binding.bind_range` (``mbind(2)``) to place a buffer
on one node before it is touched (a policy on that range only: the rank's own CPUs and memory
policy are never changed), :func:`numarun.placement.binding.query_pages` (``move_pages(2)`` in
query mode, nothing moves) to ask where each page is, and ``/proc/self/numa_maps`` where that
call is missing.

:func:`copy_bandwidth` is STREAM's "copy" kernel with the C library's ``memmove`` (vectorised, and
ctypes releases the GIL around it), one thread per slice: bytes read plus bytes written per
second, in GB/s (10^9 bytes).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import threading
import time
from collections.abc import Iterable, Sequence

from numarun.placement.binding import bind_range, query_pages

PAGE_SIZE = mmap.PAGESIZE


def _load() -> tuple[object, object]:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None, None
    map_call = libc.mmap
    map_call.restype = ctypes.c_void_p
    map_call.argtypes = (
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    )
    unmap_call = libc.munmap
    unmap_call.restype = ctypes.c_int
    unmap_call.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    return map_call, unmap_call


_MMAP, _MUNMAP = _load()
_MAP_FAILED = ctypes.c_void_p(-1).value


class Buffer:
    """An anonymous private mapping of ``size`` bytes (a multiple of the page size), untouched.

    With ``node`` its pages are bound to that NUMA node (``mbind(MPOL_BIND)``) before any is
    touched, so they are allocated there whatever the rank's own policy says. Raises
    :class:`OSError` when the mapping or the ``mbind`` fails (EINVAL: the node is outside the
    cpuset's Mems_allowed or has no memory; ENOSYS: no syscall number for this architecture).
    :meth:`close` unmaps it; a closed buffer must not be used.
    """

    def __init__(self, size: int, node: int | None = None) -> None:
        if _MMAP is None or _MUNMAP is None:
            raise OSError(errno.ENOSYS, "the C library cannot be loaded")
        size = max(PAGE_SIZE, (size + PAGE_SIZE - 1) // PAGE_SIZE * PAGE_SIZE)
        prot = mmap.PROT_READ | mmap.PROT_WRITE
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
        address = _MMAP(None, size, prot, flags, -1, 0)  # type: ignore[operator]
        if address is None or address == _MAP_FAILED:
            err = ctypes.get_errno()
            raise OSError(err, f"mmap of {size} bytes failed: {os.strerror(err)}")
        self.address: int = address
        self.size = size
        if node is not None:
            try:
                bind_range(address, size, node)
            except OSError:
                self.close()
                raise

    def touch(self) -> None:
        """Write every byte once: the kernel allocates each page now, under the range's policy
        (or, without one, the calling thread's)."""
        ctypes.memset(self.address, 1, self.size)

    def page_nodes(self) -> tuple[dict[int, int], str]:
        """How many of this buffer's pages are on each node, and how that was learnt.

        ``move_pages(2)`` in query mode for every page (``"move_pages"``); where it is missing
        (ENOSYS, or no syscall number here) the buffer's line of ``/proc/self/numa_maps``
        (``"numa_maps"``, counted in the mapping's own page size). A page not present yet (or
        another negative status) counts under key ``-errno``. Raises :class:`OSError` when
        neither source answers.
        """
        try:
            return query_pages(self.address, self.size), "move_pages"
        except OSError as error:
            if error.errno not in (errno.ENOSYS, errno.EPERM):
                raise
        with open("/proc/self/numa_maps", encoding="ascii", errors="replace") as maps:
            counts = numa_maps_nodes(maps, self.address)
        if counts is None:
            raise OSError(errno.ENOENT, "the buffer is not in /proc/self/numa_maps")
        return counts, "numa_maps"

    def close(self) -> None:
        if self.size:
            _MUNMAP(self.address, self.size)  # type: ignore[operator]
            self.size = 0

    def __enter__(self) -> Buffer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def numa_maps_nodes(lines: Iterable[str], address: int) -> dict[int, int] | None:
    """Node -> pages of the mapping starting at ``address`` in ``/proc/<pid>/numa_maps`` text
    (its ``N<node>=<pages>`` fields); None when no line starts at that address. A mapping with
    no page present yet has no ``N`` field: an empty dict."""
    prefix = f"{address:x} "
    for line in lines:
        if not line.startswith(prefix):
            continue
        counts: dict[int, int] = {}
        for field in line.split()[2:]:
            key, sep, value = field.partition("=")
            if sep and key[:1] == "N" and key[1:].isdigit() and value.isdigit():
                counts[int(key[1:])] = int(value)
        return counts
    return None


def copy_bandwidth(src: Buffer, dst: Buffer, seconds: float, threads: int = 1) -> float:
    """Copy ``src`` to ``dst`` for about ``seconds``; the rate in GB/s (10^9 bytes per second),
    counting each byte copied twice, read and written, as STREAM does.

    The buffers are cut into ``threads`` slices, each copied over and over by its own thread
    (``memmove``; the threads run on the rank's CPUs, in parallel since ctypes releases the GIL),
    every slice at least once. The rate is all bytes over the time from the common start to the
    last thread's end.
    """
    size = min(src.size, dst.size)
    threads = max(1, min(threads, size // PAGE_SIZE))
    step = size // threads // PAGE_SIZE * PAGE_SIZE
    slices = [(i * step, size - i * step if i == threads - 1 else step) for i in range(threads)]
    copied = [0] * threads
    ended = [0.0] * threads
    start_gate = threading.Barrier(threads + 1)

    def work(index: int, offset: int, length: int, deadline_box: list[float]) -> None:
        start_gate.wait()
        deadline = deadline_box[0]
        total = 0
        while True:
            ctypes.memmove(dst.address + offset, src.address + offset, length)
            total += length
            if time.perf_counter() >= deadline:
                break
        copied[index] = total
        ended[index] = time.perf_counter()

    deadline_box = [0.0]
    workers = [
        threading.Thread(target=work, args=(i, offset, length, deadline_box), daemon=True)
        for i, (offset, length) in enumerate(slices)
    ]
    for worker in workers:
        worker.start()
    began = time.perf_counter()
    deadline_box[0] = began + seconds
    start_gate.wait()
    for worker in workers:
        worker.join()
    elapsed = max(ended) - began
    return 2 * sum(copied) / elapsed / 1e9 if elapsed > 0 else 0.0


def majority_node(counts: dict[int, int]) -> int | None:
    """The node holding most pages in ``counts`` (lowest id on a tie); None when no page is on
    a node."""
    placed = [(pages, -node) for node, pages in counts.items() if node >= 0 and pages > 0]
    return -max(placed)[1] if placed else None


def nodes_of(counts: dict[int, int]) -> list[int]:
    """The nodes with pages in ``counts``, ascending."""
    return sorted(node for node, pages in counts.items() if node >= 0 and pages > 0)


def mems_allowed(status_lines: Sequence[str] | None = None) -> tuple[int, ...] | None:
    """``Mems_allowed_list`` of ``/proc/self/status`` (the cpuset's memory nodes); None when it
    cannot be read."""
    from numarun.machine.cpulist import parse_cpulist

    try:
        if status_lines is None:
            with open("/proc/self/status", encoding="ascii", errors="replace") as status:
                status_lines = status.readlines()
    except OSError:
        return None
    for line in status_lines:
        key, _, value = line.partition(":")
        if key == "Mems_allowed_list":
            return parse_cpulist(value.strip())
    return None

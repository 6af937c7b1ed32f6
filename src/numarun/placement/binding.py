"""Binding a process to CPUs and NUMA memory, and the prctl calls the supervisor needs.

This is the only module that calls ``sched_setaffinity``, ``set_mempolicy`` and ``prctl``, and the
only one with NUMA system calls at all. Memory policy goes through the raw ``set_mempolicy(2)`` /
``get_mempolicy(2)`` system calls via :mod:`ctypes` (no libnuma, no numactl); :func:`bind_range`
(``mbind(2)``) and :func:`query_pages` (``move_pages(2)`` in query mode) serve ``numarun check``'s
probe, a policy on one buffer and where its pages are. Everything :func:`apply_in_child` touches
(the C library handle, the function pointers, the syscall numbers) is prepared when this module is
imported, because that function runs in a freshly forked child of a possibly multi-threaded parent,
where imports and locks are unsafe.

Nothing here changes the calling thread's affinity, memory policy, environment or signal
handlers, except :func:`apply_in_child` (meant for children) and the prctl setters.
:func:`check_mem_policy` tries policies in short-lived threads: Linux keeps the memory policy
and the CPU affinity per thread, so the caller's threads are untouched.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
from collections.abc import Callable, Sequence

from numarun.errors import BindingError, UsageError
from numarun.machine.cpulist import format_cpulist, parse_cpulist
from numarun.machine.model import Value

MEM_MODES = ("none", "local", "preferred", "bind", "interleave")

# Kernel memory policy modes (include/uapi/linux/mempolicy.h).
MPOL_DEFAULT = 0
MPOL_PREFERRED = 1
MPOL_BIND = 2
MPOL_INTERLEAVE = 3
MPOL_LOCAL = 4
MPOL_PREFERRED_MANY = 5
MPOL_WEIGHTED_INTERLEAVE = 6
# get_mempolicy reports these optional flags or'ed into the mode.
_MPOL_MODE_FLAGS = (1 << 15) | (1 << 14) | (1 << 13)

_MODE_NAMES = {
    MPOL_DEFAULT: "default",
    MPOL_PREFERRED: "preferred",
    MPOL_BIND: "bind",
    MPOL_INTERLEAVE: "interleave",
    MPOL_LOCAL: "local",
    MPOL_PREFERRED_MANY: "preferred_many",
    MPOL_WEIGHTED_INTERLEAVE: "weighted_interleave",
}

PR_SET_PDEATHSIG = 1
PR_GET_PDEATHSIG = 2
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37

# (set_mempolicy, get_mempolicy, mbind, move_pages) by `uname -m`, for 64-bit and for 32-bit
# processes. A 32-bit Python on a 64-bit kernel reports the kernel's machine but must use the
# compat numbers.
_SYSCALLS_64 = {
    "x86_64": (238, 239, 237, 279),
    "aarch64": (237, 236, 235, 239),
    "arm64": (237, 236, 235, 239),
    "riscv64": (237, 236, 235, 239),
    "loongarch64": (237, 236, 235, 239),
    "ppc64le": (261, 260, 259, 301),
    "ppc64": (261, 260, 259, 301),
    "s390x": (270, 269, 268, 310),
}
_SYSCALLS_32 = {
    "i386": (276, 275, 274, 317),
    "i586": (276, 275, 274, 317),
    "i686": (276, 275, 274, 317),
    "x86_64": (276, 275, 274, 317),
    "armv7l": (321, 320, 319, 344),
    "armv8l": (321, 320, 319, 344),
    "aarch64": (321, 320, 319, 344),
}

_PAGE_BITS = 4096 * 8  # the kernel refuses node masks longer than one page
_ULONG_BITS = ctypes.sizeof(ctypes.c_ulong) * 8


def _load_libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _syscall_numbers() -> tuple[int, int, int, int] | None:
    table = _SYSCALLS_64 if ctypes.sizeof(ctypes.c_void_p) == 8 else _SYSCALLS_32
    return table.get(os.uname().machine)


_LIBC = _load_libc()
_SYSCALL = getattr(_LIBC, "syscall", None)
if _SYSCALL is not None:
    _SYSCALL.restype = ctypes.c_long
_PRCTL = getattr(_LIBC, "prctl", None)
if _PRCTL is not None:
    _PRCTL.restype = ctypes.c_int
_NUMBERS = _syscall_numbers()
_NR_SET_MEMPOLICY = _NUMBERS[0] if _NUMBERS else -1
_NR_GET_MEMPOLICY = _NUMBERS[1] if _NUMBERS else -1
_NR_MBIND = _NUMBERS[2] if _NUMBERS else -1
_NR_MOVE_PAGES = _NUMBERS[3] if _NUMBERS else -1
_MEMPOLICY_SUPPORTED = _SYSCALL is not None and _NUMBERS is not None

# Node masks built in the parent (by check_mem_policy) so that the child only looks them up.
_NODEMASKS: dict[tuple[int, ...], tuple[ctypes.Array[ctypes.c_ulong], int]] = {}


class MemPolicy(Value):
    """A memory policy to apply to a worker: what ``numactl --membind`` and friends set.

    ``mode`` is ``"local"`` (allocate on the node of the CPU that touches the page; ``nodes``
    is empty), ``"preferred"`` (try ``nodes`` first, fall back to any node; several nodes use
    ``MPOL_PREFERRED_MANY``), ``"bind"`` (only ``nodes``; allocation fails, and the OOM killer
    may run, when they are full) or ``"interleave"`` (round-robin over ``nodes``). A bad mode or
    node list raises :class:`UsageError`.
    """

    _fields = ("mode", "nodes")
    __slots__ = _fields
    mode: str
    nodes: tuple[int, ...]

    def __init__(self, mode: str, nodes: Sequence[int]) -> None:
        # A list would make the policy unhashable, and check_mem_policy groups ranks by policy.
        nodes = tuple(nodes)
        if mode not in MEM_MODES or mode == "none":
            raise UsageError(
                f"unknown memory policy {mode!r}; choose one of {', '.join(MEM_MODES[1:])}"
            )
        if any(not isinstance(n, int) or n < 0 for n in nodes):
            raise UsageError(f"invalid NUMA node list {nodes!r}: nodes are integers >= 0")
        if mode == "local" and nodes:
            raise UsageError("memory policy 'local' takes no nodes; it follows the CPU")
        if mode != "local" and not nodes:
            raise UsageError(f"memory policy {mode!r} needs at least one NUMA node")
        object.__setattr__(self, "mode", mode)
        object.__setattr__(self, "nodes", nodes)

    def __str__(self) -> str:
        if self.mode == "local":
            return "local"
        return f"{self.mode}:{format_cpulist(self.nodes)}"


def mem_policy_for(mode: str | None, nodes: Sequence[int]) -> MemPolicy | None:
    """The memory policy for ``--mem-binding MODE`` on a rank whose memory nodes are ``nodes``.

    ``None`` and ``"none"`` return ``None`` (the worker inherits the launcher's policy, normally
    the kernel default: first touch on the local node). ``"local"`` ignores ``nodes``.
    ``"preferred"`` with several nodes keeps them all and is applied as ``MPOL_PREFERRED_MANY``;
    on kernels older than 5.15, which lack it, :func:`check_mem_policy` replaces it by
    ``preferred`` on the first node with a warning. Duplicate nodes are dropped, order kept.

    An unknown mode raises :class:`UsageError` listing :data:`MEM_MODES`; a mode that needs
    nodes given an empty ``nodes`` (a rank the plan could not place) raises :class:`UsageError`.
    """
    if mode is None or mode == "none":
        return None
    if mode not in MEM_MODES:
        raise UsageError(f"unknown --mem-binding {mode!r}; choose one of {', '.join(MEM_MODES)}")
    if mode == "local":
        return MemPolicy("local", ())
    unique = tuple(dict.fromkeys(nodes))
    if not unique:
        raise UsageError(
            f"--mem-binding {mode} needs the rank's NUMA nodes, but the plan gave it none; "
            "use --mem-binding local or none"
        )
    return MemPolicy(mode, unique)


# --- raw system calls ------------------------------------------------------------------------

SetMempolicyCall = Callable[[int, Sequence[int]], int]
"""``(kernel mode number, nodes) -> errno`` (0 on success), for the calling thread."""


def _build_nodemask(nodes: Sequence[int]) -> tuple[ctypes.Array[ctypes.c_ulong], int]:
    words = max(nodes) // _ULONG_BITS + 1
    mask = (ctypes.c_ulong * words)()
    for node in nodes:
        mask[node // _ULONG_BITS] |= 1 << (node % _ULONG_BITS)
    # The kernel reads maxnode - 1 bits (a long-standing off-by-one that libnuma also pads for).
    return mask, words * _ULONG_BITS + 1


def _nodemask(nodes: tuple[int, ...]) -> tuple[ctypes.Array[ctypes.c_ulong], int]:
    found = _NODEMASKS.get(nodes)
    if found is None:
        found = _build_nodemask(nodes)
        _NODEMASKS[nodes] = found
    return found


def _raw_set_mempolicy(mode: int, nodes: Sequence[int]) -> int:
    """set_mempolicy(mode, nodes) for the calling thread; returns errno, 0 on success."""
    if not _MEMPOLICY_SUPPORTED or _SYSCALL is None:
        return errno.ENOSYS
    if nodes:
        mask, maxnode = _nodemask(tuple(nodes))
        result = _SYSCALL(
            ctypes.c_long(_NR_SET_MEMPOLICY),
            ctypes.c_long(mode),
            ctypes.byref(mask),
            ctypes.c_ulong(maxnode),
        )
    else:
        result = _SYSCALL(
            ctypes.c_long(_NR_SET_MEMPOLICY),
            ctypes.c_long(mode),
            ctypes.c_void_p(None),
            ctypes.c_ulong(0),
        )
    return ctypes.get_errno() if result != 0 else 0


def _kernel_mode(policy: MemPolicy) -> int:
    if policy.mode == "local":
        return MPOL_LOCAL
    if policy.mode == "preferred":
        return MPOL_PREFERRED_MANY if len(policy.nodes) > 1 else MPOL_PREFERRED
    return MPOL_BIND if policy.mode == "bind" else MPOL_INTERLEAVE


def get_mem_policy() -> tuple[str, tuple[int, ...]]:
    """The calling thread's memory policy as ``(mode name, nodes)``, from ``get_mempolicy(2)``.

    Mode names are ``"default"``, ``"local"``, ``"preferred"``, ``"bind"``, ``"interleave"``,
    ``"preferred_many"``, ``"weighted_interleave"`` (or ``"mode<N>"`` for a newer one); optional
    mode flags are dropped. ``"preferred"`` with no node is reported as ``"local"``, which is
    what the kernel does with it. Raises :class:`BindingError` where memory policy is
    unsupported (unknown architecture) and :class:`OSError` if the call fails.
    """
    if not _MEMPOLICY_SUPPORTED or _SYSCALL is None:
        raise BindingError(
            f"memory policy is not supported on this architecture ({os.uname().machine})"
        )
    bits = 1024
    while True:
        mode = ctypes.c_int(0)
        mask = (ctypes.c_ulong * (bits // _ULONG_BITS))()
        result = _SYSCALL(
            ctypes.c_long(_NR_GET_MEMPOLICY),
            ctypes.byref(mode),
            ctypes.byref(mask),
            ctypes.c_ulong(bits + 1),
            ctypes.c_void_p(None),
            ctypes.c_ulong(0),
        )
        if result == 0:
            break
        err = ctypes.get_errno()
        # EINVAL here means the mask is shorter than the kernel's possible nodes.
        if err != errno.EINVAL or bits >= _PAGE_BITS:
            raise OSError(err, f"get_mempolicy failed: {os.strerror(err)}")
        bits = _PAGE_BITS
    nodes = tuple(
        word_index * _ULONG_BITS + bit
        for word_index, word in enumerate(mask)
        if word
        for bit in range(_ULONG_BITS)
        if word >> bit & 1
    )
    return _policy_name(mode.value, nodes), nodes


def _policy_name(mode: int, nodes: tuple[int, ...]) -> str:
    number = mode & ~_MPOL_MODE_FLAGS
    name = _MODE_NAMES.get(number, f"mode{number}")
    # Kernels before 5.x report MPOL_LOCAL as MPOL_PREFERRED with an empty mask.
    return "local" if name == "preferred" and not nodes else name


# --- one range of memory (numarun check) -----------------------------------------------------

_QUERY_CHUNK = 16384  # move_pages takes arrays of one entry per page: ask in chunks


def bind_range(address: int, size: int, node: int) -> None:
    """``mbind(address, size, MPOL_BIND, {node})``: pages of the range not yet touched will be
    allocated on ``node`` only; the calling thread's own policy is untouched. Raises
    :class:`OSError` with the kernel's errno (ENOSYS: no syscall number for this machine)."""
    if _SYSCALL is None or _NR_MBIND < 0:
        raise OSError(errno.ENOSYS, f"no mbind syscall number for {os.uname().machine}")
    mask, maxnode = _build_nodemask((node,))
    result = _SYSCALL(
        ctypes.c_long(_NR_MBIND),
        ctypes.c_void_p(address),
        ctypes.c_ulong(size),
        ctypes.c_long(MPOL_BIND),
        ctypes.byref(mask),
        ctypes.c_ulong(maxnode),
        ctypes.c_uint(0),
    )
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mbind to node {node} failed: {os.strerror(err)}")


def query_pages(address: int, size: int) -> dict[int, int]:
    """Node -> number of pages of ``[address, address + size)`` found there, by
    ``move_pages(0, count, pages, NULL, status, 0)``: nothing is moved. Negative keys are the
    status of pages without a node (``-ENOENT``: not present). Raises :class:`OSError`."""
    if _SYSCALL is None or _NR_MOVE_PAGES < 0:
        raise OSError(errno.ENOSYS, f"no move_pages syscall number for {os.uname().machine}")
    page = os.sysconf("SC_PAGE_SIZE")
    first = address - address % page
    count = (address + size - first + page - 1) // page
    counts: dict[int, int] = {}
    for start in range(0, count, _QUERY_CHUNK):
        chunk = min(_QUERY_CHUNK, count - start)
        pages = (ctypes.c_void_p * chunk)(*(first + (start + i) * page for i in range(chunk)))
        status = (ctypes.c_int * chunk)()
        result = _SYSCALL(
            ctypes.c_long(_NR_MOVE_PAGES),
            ctypes.c_int(0),
            ctypes.c_ulong(chunk),
            pages,
            ctypes.c_void_p(None),
            status,
            ctypes.c_int(0),
        )
        if result < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"move_pages failed: {os.strerror(err)}")
        for value in status:
            counts[value] = counts.get(value, 0) + 1
    return counts


# --- in the child ------------------------------------------------------------------------------


def apply_in_child(cpus: Sequence[int] | None, mem: MemPolicy | None) -> None:
    """Bind the calling process to ``cpus`` and the calling thread to memory policy ``mem``.

    Meant for a freshly forked child, before exec or user code: the child has one thread, so
    ``sched_setaffinity(0, cpus)`` binds the process and ``set_mempolicy`` binds everything it
    will run; both survive ``execve``. ``None`` leaves that part as inherited. Only ``os`` and
    ctypes objects prepared at import are used: no imports, no logging, no locks (node masks
    are built beforehand by :func:`check_mem_policy` and only looked up here).

    Raises :class:`OSError` (with the kernel's errno) when either call fails, e.g. EINVAL for
    CPUs outside the allowed set or a node the cpuset forbids, EPERM when seccomp blocks
    ``set_mempolicy``, ENOSYS on an architecture without known syscall numbers. Run
    :func:`check_cpus` and :func:`check_mem_policy` in the parent first so this does not happen.
    """
    if cpus is not None:
        os.sched_setaffinity(0, cpus)
    if mem is not None:
        err = _raw_set_mempolicy(_kernel_mode(mem), mem.nodes)
        if err:
            raise OSError(err, f"set_mempolicy({mem}) failed: {os.strerror(err)}")


# --- checks in the parent ----------------------------------------------------------------------


def check_cpus(cpus: Sequence[int], *, rank: int | None = None) -> None:
    """Raise :class:`BindingError` unless ``cpus`` is a non-empty subset of this process's CPUs.

    The allowed set is ``os.sched_getaffinity(0)`` of the calling thread, which a child inherits
    (cgroup cpuset, ``taskset``, Slurm). A CPU outside it cannot be given to a worker: that
    happens when the plan was made for another machine or container. ``rank`` only names the
    rank in the message.
    """
    who = f"local rank {rank}: " if rank is not None else ""
    if not cpus:
        raise BindingError(f"{who}empty CPU list; every bound rank needs at least one CPU")
    if any(not isinstance(cpu, int) or cpu < 0 for cpu in cpus):
        raise BindingError(f"{who}invalid CPU list {list(cpus)!r}: CPUs are integers >= 0")
    allowed = os.sched_getaffinity(0)
    outside = sorted(set(cpus) - allowed)
    if outside:
        noun = "CPU" if len(outside) == 1 else "CPUs"
        verb = "is" if len(outside) == 1 else "are"
        raise BindingError(
            f"{who}{noun} {format_cpulist(outside)} {verb} outside this process's allowed CPUs "
            f"{format_cpulist(allowed)}; the plan was made for another machine or container"
        )


def _read_status_field(name: str, path: str = "/proc/self/status") -> str | None:
    try:
        with open(path, encoding="ascii") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key == name:
                    return value.strip()
    except OSError:
        return None
    return None


def _mems_allowed() -> tuple[int, ...] | None:
    text = _read_status_field("Mems_allowed_list")
    return parse_cpulist(text) if text is not None else None


def _nodes_with_memory() -> tuple[int, ...] | None:
    try:
        with open("/sys/devices/system/node/has_memory", encoding="ascii") as listing:
            return parse_cpulist(listing.read())
    except OSError:
        return None


def _try_in_thread(mode: int, nodes: Sequence[int], call: SetMempolicyCall) -> int:
    """Apply a policy in a new thread, reset that thread to default; the errno of the attempt."""
    outcome: list[int] = []

    def attempt() -> None:
        try:
            outcome.append(call(mode, nodes))
        finally:
            # The thread is about to end, so this only matters if the OS thread were reused.
            call(MPOL_DEFAULT, ())

    worker = threading.Thread(target=attempt, name="numarun-mempolicy-check", daemon=True)
    worker.start()
    worker.join()
    return outcome[0] if outcome else errno.EFAULT


def _precheck(
    policy: MemPolicy, allowed: tuple[int, ...] | None, with_memory: tuple[int, ...] | None
) -> str | None:
    """Why ``policy`` names a node it cannot have, or None."""
    for node in policy.nodes:
        if allowed is not None and node not in allowed:
            return (
                f"node {node} is not in Mems_allowed {format_cpulist(allowed) or '(empty)'} "
                "(cpuset)"
            )
        if with_memory is not None and node not in with_memory:
            return f"node {node} has no memory"
    return None


def _errno_reason(err: int, policy: MemPolicy) -> str:
    if err == errno.EPERM:
        return "set_mempolicy is blocked (seccomp or missing CAP_SYS_NICE in a container)"
    if err == errno.EINVAL:
        if len(policy.nodes) == 1:
            return (
                f"node {policy.nodes[0]} is not in this process's Mems_allowed (cpuset) "
                "or has no memory"
            )
        return (
            f"nodes {format_cpulist(policy.nodes)} are not all in this process's Mems_allowed "
            "(cpuset) or have no memory"
        )
    if err == errno.ENOSYS:
        if not _MEMPOLICY_SUPPORTED:
            return f"memory policy is not supported on this architecture ({os.uname().machine})"
        return "set_mempolicy is not available (kernel built without NUMA support)"
    return f"set_mempolicy failed: {os.strerror(err)}"


def _why_not(
    policy: MemPolicy,
    allowed: tuple[int, ...] | None,
    with_memory: tuple[int, ...] | None,
    call: SetMempolicyCall,
) -> tuple[str, int] | None:
    """Why ``policy`` cannot be applied here and the errno (0: refused before trying), or None."""
    reason = _precheck(policy, allowed, with_memory)
    if reason is not None:
        return reason, 0
    # A policy is only proven by setting it: reading get_mempolicy succeeds under seccomp too.
    err = _try_in_thread(_kernel_mode(policy), policy.nodes, call)
    return (_errno_reason(err, policy), err) if err else None


def _weaker(policy: MemPolicy) -> list[MemPolicy]:
    if policy.mode in ("bind", "interleave"):
        return [MemPolicy("preferred", policy.nodes)]
    return []


def _cannot(policy: MemPolicy) -> str:
    nodes = format_cpulist(policy.nodes)
    noun = "node" if len(policy.nodes) == 1 else "nodes"
    if policy.mode == "bind":
        return f"cannot bind memory to {noun} {nodes}"
    if policy.mode == "interleave":
        return f"cannot interleave memory over {noun} {nodes}"
    if policy.mode == "preferred":
        return f"cannot prefer memory on {noun} {nodes}"
    return "cannot set the local memory policy"


def _resolve(
    policy: MemPolicy,
    allowed: tuple[int, ...] | None,
    with_memory: tuple[int, ...] | None,
    call: SetMempolicyCall,
    allow_fallback: bool,
) -> tuple[MemPolicy | None, str | None]:
    """The policy to apply instead of ``policy`` and a warning, or raise BindingError."""
    failure = _why_not(policy, allowed, with_memory, call)
    if failure is None:
        return policy, None
    reason, err = failure
    if policy.mode == "preferred" and len(policy.nodes) > 1 and err == errno.EINVAL:
        # Every node passed the explicit checks, so EINVAL means no MPOL_PREFERRED_MANY (< 5.15).
        first = MemPolicy("preferred", policy.nodes[:1])
        if _why_not(first, allowed, with_memory, call) is None:
            return first, (
                f"this kernel has no MPOL_PREFERRED_MANY (Linux < 5.15); "
                f"using {first} instead of {policy}"
            )
    working = next(
        (weaker for weaker in _weaker(policy) if not _why_not(weaker, allowed, with_memory, call)),
        None,
    )
    if not allow_fallback:
        suggestion = f"--mem-binding {working.mode}" if working else "--mem-binding none"
        raise BindingError(
            f"{_cannot(policy)}: {reason}; {suggestion} works, or pass --binding-fallback"
        )
    applied = str(working) if working else "none (the kernel default)"
    return working, f"{_cannot(policy)}: {reason}; applying {applied} instead"


def check_mem_policy(
    policies: Sequence[MemPolicy | None],
    *,
    allow_fallback: bool,
    set_mempolicy: SetMempolicyCall | None = None,
) -> tuple[list[MemPolicy | None], list[str]]:
    """Prove that each rank's memory policy can be applied, before any worker starts.

    ``policies[i]`` is local rank ``i``'s policy (``None``: inherit, always fine). Each distinct
    policy is checked against ``Mems_allowed_list`` of ``/proc/self/status`` (the cpuset), against
    ``/sys/devices/system/node/has_memory``, and then really set in a short-lived thread that
    resets itself to ``MPOL_DEFAULT`` before ending; the caller's threads are never changed.
    These explicit checks matter: the kernel silently drops forbidden nodes from a multi-node
    ``bind`` or ``interleave`` mask instead of failing.

    Returns ``(policies to apply, warnings)``, the list indexed like ``policies``. Without
    ``allow_fallback`` a policy that cannot be applied raises :class:`BindingError` with one
    line: why (EPERM: seccomp or missing CAP_SYS_NICE; EINVAL: node outside the cpuset or
    without memory; ENOSYS) and which weaker ``--mem-binding`` works. With ``allow_fallback``
    ``bind`` and ``interleave`` step down to ``preferred`` on the same nodes, then to ``None``
    (no policy); each warning names the local ranks, the reason and what is applied instead.
    A multi-node ``preferred`` on a kernel without ``MPOL_PREFERRED_MANY`` becomes ``preferred``
    on its first node with a warning, whatever ``allow_fallback`` says.

    ``set_mempolicy`` replaces the system call (``(mode, nodes) -> errno``), for tests.
    """
    call = set_mempolicy if set_mempolicy is not None else _raw_set_mempolicy
    distinct = list(dict.fromkeys(p for p in policies if p is not None))
    if not distinct:
        return list(policies), []
    allowed, with_memory = _mems_allowed(), _nodes_with_memory()
    resolved: dict[MemPolicy, tuple[MemPolicy | None, str | None]] = {}
    for policy in distinct:
        resolved[policy] = _resolve(policy, allowed, with_memory, call, allow_fallback)
        applied = resolved[policy][0]
        if applied is not None and applied.nodes:
            _nodemask(applied.nodes)  # built now so the child only looks it up
    warnings = []
    for policy in distinct:
        warning = resolved[policy][1]
        if warning is not None:
            ranks = [rank for rank, p in enumerate(policies) if p == policy]
            noun = "local rank" if len(ranks) == 1 else "local ranks"
            warnings.append(f"{noun} {format_cpulist(ranks)}: {warning}")
    applied_list = [resolved[p][0] if p is not None else None for p in policies]
    return applied_list, warnings


# --- prctl ---------------------------------------------------------------------------------------


def _prctl(option: int, argument: object) -> int:
    """prctl(option, argument, 0, 0, 0); ``argument`` is a ctypes value or ``byref``."""
    if _PRCTL is None:
        raise OSError(errno.ENOSYS, "prctl is not available on this system")
    result = _PRCTL(
        ctypes.c_int(option), argument, ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)
    )
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}) failed: {os.strerror(err)}")
    return result


def set_parent_death_signal(signum: int, *, expected_parent: int | None = None) -> None:
    """Ask the kernel to send ``signum`` to the calling process when its parent dies.

    ``prctl(PR_SET_PDEATHSIG)``; 0 clears it. Caveats of the kernel's semantics: "parent" is
    the parent *thread*, so the process that forks must do so from a thread that lives as long as
    the child should (the supervisor's main thread); the setting survives ``execve`` except of
    set-user-ID or file-capability binaries; it is cleared in children of the caller.

    If the parent died before this call the signal never comes, so pass ``expected_parent``
    (the parent's pid, taken before the fork): when ``os.getppid()`` differs afterwards the
    process sends ``signum`` to itself at once. Raises :class:`OSError` on an invalid signal
    (EINVAL) or where ``prctl`` does not exist (ENOSYS).
    """
    _prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signum))
    if expected_parent is not None and signum and os.getppid() != expected_parent:
        os.kill(os.getpid(), signum)


def get_parent_death_signal() -> int:
    """The calling process's parent-death signal (``PR_GET_PDEATHSIG``); 0 when none is set."""
    value = ctypes.c_int(0)
    _prctl(PR_GET_PDEATHSIG, ctypes.byref(value))
    return value.value


def is_child_subreaper() -> bool:
    """Whether the calling process is a child subreaper (``PR_GET_CHILD_SUBREAPER``)."""
    value = ctypes.c_int(0)
    _prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(value))
    return bool(value.value)


def set_child_subreaper(enabled: bool) -> bool:
    """Make the calling process a child subreaper, or stop; returns the previous setting.

    While set, orphaned descendants are reparented to this process instead of init, so it can
    reap (``os.waitpid(-1, ...)``) and signal workers' grandchildren. ``PR_SET_CHILD_SUBREAPER``;
    the setting is not inherited by children and survives ``execve``. Raises :class:`OSError`
    where ``prctl`` fails or does not exist.
    """
    previous = is_child_subreaper()
    _prctl(PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(1 if enabled else 0))
    return previous


# --- diagnostics ---------------------------------------------------------------------------------


def current_cpus() -> tuple[int, ...]:
    """The calling thread's allowed CPUs, ``os.sched_getaffinity(0)``, sorted."""
    return tuple(sorted(os.sched_getaffinity(0)))


def describe_self() -> str:
    """One line describing the calling thread's binding, e.g. ``cpus=0-3 mems_allowed=0
    policy=bind:0``, for workers' diagnostics.

    ``cpus`` is :func:`current_cpus`, ``mems_allowed`` is ``Mems_allowed_list`` from
    ``/proc/self/status`` (``?`` when unreadable), ``policy`` is :func:`get_mem_policy` written
    ``mode`` or ``mode:nodes`` (``unknown`` when it cannot be read). Never raises for those.
    """
    mems = _read_status_field("Mems_allowed_list")
    try:
        mode, nodes = get_mem_policy()
        policy = f"{mode}:{format_cpulist(nodes)}" if nodes else mode
    except (OSError, BindingError):
        policy = "unknown"
    return f"cpus={format_cpulist(current_cpus())} mems_allowed={mems or '?'} policy={policy}"

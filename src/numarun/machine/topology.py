"""The machine, read once from sysfs under a root directory, into :mod:`numarun.machine.model`.

Reading has no effect beyond reads of files under the root, and reads each file at most once.
Only regular files are read, each bounded in size: a tree may be untrusted (a snapshot from
elsewhere), and a bad one is one line (:class:`numarun.errors.TopologyError`).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping, Sequence

from numarun.errors import TopologyError, UsageError
from numarun.machine.cpulist import format_cpulist, parse_cpulist
from numarun.machine.model import CacheGroup, Core, Cpu, Gpu, Nic, NumaNode, Package, Topology

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path

_CPU = "sys/devices/system/cpu"
_NODE = "sys/devices/system/node"
_PCI = "sys/bus/pci/devices"

# PCI base class + subclass (class >> 8) of display controllers and processing accelerators.
_GPU_CLASSES = frozenset({0x0300, 0x0302, 0x0380, 0x1200})
_GPU_VENDORS = {0x10DE: "nvidia", 0x1002: "amd", 0x8086: "intel"}
_NIC_CLASSES = {0x0200: "ethernet", 0x0207: "infiniband"}


# A --sysfs-root tree may come from anyone (a snapshot attached to a bug report), so what is
# read from it is bounded. Real attributes fit in a page; a cpulist of every other CPU of
# 65536 is about 360 KiB.
_MAX_FILE_BYTES = 1 << 20
# The kernel's MAX_NUMNODES is at most 1 << 10 (CONFIG_NODES_SHIFT <= 10 on every arch).
MAX_NODE = 1023
# CPU ids parsed from all lists of one read: a 8192-CPU machine with a few hundred GPUs and
# NICs stays far below; a tree listing every CPU in every file is stopped before the lists
# (and what is built from them, e.g. one sibling tuple per CPU) exhaust memory or time.
_MAX_LISTED_CPUS = 1 << 21
_MAX_PCI_FUNCTIONS = 1 << 16
_OPEN_FLAGS = (
    os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_NOFOLLOW", 0)
)
_S_IFMT, _S_IFREG = 0o170000, 0o100000


def _read_text(path: str) -> str | None:
    """The whole file, or None when it is missing or unreadable (sysfs raises EIO etc.).

    Only regular files are read: the last path component must not be a symbolic link (sysfs
    attributes never are; a link could lead to /dev/zero or a secret), the file is opened
    non-blocking (a FIFO cannot hang the open), and a FIFO, socket, terminal or device, or a
    file above 1 MiB, raises :class:`TopologyError`. ``pread`` tells pipes, FIFOs and
    terminals apart for free (ESPIPE); a read that comes back empty or full is checked with
    fstat (a device such as /dev/zero), which would cost 10% of a whole read if done for
    every file. os.open/os.pread rather than open(): a DGX tree is a few hundred tiny files
    and the io stack's setup dominates their cost.
    """
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise _bad_file(path, "is a symbolic link (sysfs attributes are plain files)") from None
        return None
    try:
        data = os.pread(fd, 65536, 0)
        if not data or len(data) == 65536:
            if os.fstat(fd).st_mode & _S_IFMT != _S_IFREG:
                raise _bad_file(path, _NOT_REGULAR)
            chunks = [data]  # sysfs attributes fit in a page; other files may not
            offset = len(data)
            while data and (data := os.pread(fd, 65536, offset)):
                chunks.append(data)
                offset += len(data)
                if offset > _MAX_FILE_BYTES:
                    raise _bad_file(path, f"is larger than {_MAX_FILE_BYTES >> 20} MiB")
            data = b"".join(chunks)
    except OSError as err:
        if err.errno == errno.ESPIPE:
            raise _bad_file(path, _NOT_REGULAR) from None
        return None
    finally:
        os.close(fd)
    return data.decode("ascii", "replace")


_NOT_REGULAR = "is not a regular file (a FIFO, socket, terminal or device)"


def _bad_file(path: str, why: str) -> TopologyError:
    return TopologyError(
        f"{_shown(path)} {why}; is this a sysfs tree? (make one with `numarun snapshot`)"
    )


def _shown(text: str, limit: int = 200) -> str:
    """``text`` for a one-line message: control characters escaped, long text cut."""
    quoted = ascii(text)[1:-1]
    return quoted if len(quoted) <= limit else quoted[: limit - 3] + "..."


def printable(text: str) -> str:
    """``text`` safe for a terminal or an XML file: unchanged when every character is
    printable, else each one that is not written as in a Python string literal (``\\x1b``;
    ``\\xff`` for a byte of a file name that is not UTF-8). Directory entries read from a
    tree go through it before they reach the :class:`Topology`; the views apply it again."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _escaped(char) for char in text)


def _escaped(char: str) -> str:
    code = ord(char)
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else ascii(char)[1:-1]


def _list_dir(path: str) -> list[str] | None:
    try:
        return os.listdir(path)
    except OSError:
        return None


def _quoted(data: str) -> str:
    text = data.strip()
    return repr(text if len(text) <= 60 else text[:57] + "...")


class _Reader:
    """Reads files under a root, each at most once, and remembers what it read (for snapshots)."""

    def __init__(self, root: str) -> None:
        self.prefix = root.rstrip("/") + "/"
        self.files: dict[str, str | None] = {}
        self.dirs: dict[str, list[str] | None] = {}
        self.listed = 0  # CPU ids parsed so far (bounded by _MAX_LISTED_CPUS)

    def text(self, rel: str) -> str | None:
        if rel in self.files:
            return self.files[rel]
        data = _read_text(self.prefix + rel)
        self.files[rel] = data
        return data

    def stripped(self, rel: str) -> str | None:
        data = self.text(rel)
        return None if data is None else data.strip()

    def cpus(self, rel: str) -> tuple[int, ...] | None:
        """A CPU (or node) list file; None when missing; TopologyError when garbled."""
        data = self.text(rel)
        if data is None:
            return None
        try:
            cpus = parse_cpulist(data)
        except UsageError:
            raise TopologyError(
                f"{_shown(self.prefix + rel)} holds {_quoted(data)}, not a CPU list; "
                "is this a sysfs tree? (make one with `numarun snapshot`)"
            ) from None
        self.listed += len(cpus)
        if self.listed > _MAX_LISTED_CPUS:
            raise TopologyError(
                f"{_shown(self.prefix)} lists more than {_MAX_LISTED_CPUS} CPU ids in all "
                f"(the last in {_shown(rel)}); no machine has that many: is this a sysfs tree?"
            )
        return cpus

    def integer(self, rel: str, base: int = 10) -> int | None:
        data = self.text(rel)
        if data is None:
            return None
        try:
            return int(data.strip(), base)
        except ValueError:
            raise TopologyError(
                f"{_shown(self.prefix + rel)} holds {_quoted(data)}, not a number; "
                "is this a sysfs tree? (make one with `numarun snapshot`)"
            ) from None

    def listdir(self, rel: str) -> list[str] | None:
        if rel in self.dirs:
            return self.dirs[rel]
        names = _list_dir(self.prefix + rel)
        self.dirs[rel] = names
        return names


def read_topology(
    root: str | Path = "/",
    *,
    cpus_allowed: Sequence[int] | str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Topology:
    """Read the machine from ``root/sys`` (``/`` = this machine).

    Each sysfs file is opened at most once. Only online CPUs appear. ``allowed_cpus`` is
    ``os.sched_getaffinity(0)`` restricted to online CPUs when ``root`` is ``/``, and every online
    CPU of the tree otherwise; ``cpus_allowed`` (a list of ints or a ``"0-3,8"`` string) narrows
    it. GPU visibility follows ``environ`` (default ``os.environ``): ``CUDA_VISIBLE_DEVICES`` for
    NVIDIA; ``ROCR_VISIBLE_DEVICES`` then ``HIP_VISIBLE_DEVICES`` (or, when unset,
    ``CUDA_VISIBLE_DEVICES``, which HIP honours too) for AMD. NVML enriches GPU names and UUIDs
    only when ``root`` is ``/``.

    Raises :class:`TopologyError` when ``root/sys/devices/system/cpu/online`` cannot be read or
    a sysfs file is garbled, or when no CPU is left allowed; :class:`UsageError` when
    ``cpus_allowed`` names CPUs that are not online (or, at ``/``, not in this process's
    affinity) or is malformed, and when a visible-devices variable lists a device twice, names
    a GPU by UUID without NVML, or names a MIG instance.
    """
    return _read(str(root), cpus_allowed, os.environ if environ is None else environ, True)[0]


def _is_host_root(root: str) -> bool:
    return os.path.realpath(root) == "/"


def _read(
    root: str,
    cpus_allowed: Sequence[int] | str | None,
    environ: Mapping[str, str],
    use_nvml: bool,
) -> tuple[Topology, _Reader]:
    reader = _Reader(root)
    online = reader.cpus(f"{_CPU}/online")
    if not online:
        raise TopologyError(
            f"cannot read {reader.prefix}{_CPU}/online: {root!r} is not a Linux sysfs root; "
            "point --sysfs-root at a tree made by `numarun snapshot`"
        )
    host = _is_host_root(root)
    warnings: list[str] = []
    node_ids, node_cpus, node_memory, node_rows, online_nodes = _read_nodes(reader, online)
    if not node_ids:
        warnings.append("the kernel reports no NUMA nodes; treating the machine as one node 0")
        node_ids, node_cpus, online_nodes = [0], {0: online}, [0]
        node_memory, node_rows = {0: 0}, {0: (10,)}
    node_of = {cpu: n for n, cpus in node_cpus.items() for cpu in cpus}
    homeless = [c for c in online if c not in node_of]
    if homeless:
        warnings.append(f"CPUs {format_cpulist(homeless)} belong to no NUMA node")

    siblings_of, package_of, cache_of, cache_info = _read_cpus(reader, online, node_of)
    cpus = tuple(
        Cpu(c, siblings_of[c][0], package_of[c], node_of.get(c), cache_of[c]) for c in online
    )
    cores = tuple(
        Core(c.id, siblings_of[c.id], c.package, c.node, c.cache) for c in cpus if c.core == c.id
    )
    caches = tuple(
        CacheGroup(gid, level, size, members)
        for gid, (level, size, members) in sorted(cache_info.items())
    )
    packages = _packages(cpus)
    nodes = _nodes(node_ids, online_nodes, node_cpus, node_memory, node_rows, package_of)

    allowed = _allowed_cpus(online, cpus_allowed, host)
    all_gpus, nics = _read_pci(reader, online, nodes, warnings)
    if use_nvml and host and any(g.vendor == "nvidia" for g in all_gpus):
        from numarun.machine import nvml

        all_gpus = nvml.enrich(all_gpus)
    visible = select_visible_gpus(all_gpus, environ)
    gpu_env = _gpu_env(all_gpus, environ, warnings)
    topology = Topology(
        root=root,
        online_cpus=online,
        allowed_cpus=allowed,
        cpus=cpus,
        cores=cores,
        caches=caches,
        packages=packages,
        nodes=nodes,
        gpus=visible,
        all_gpus=all_gpus,
        nics=nics,
        gpu_env=gpu_env,
        warnings=tuple(warnings),
    )
    return topology, reader


def _read_nodes(
    reader: _Reader, online: tuple[int, ...]
) -> tuple[
    list[int],
    dict[int, tuple[int, ...]],
    dict[int, int],
    dict[int, tuple[int, ...]],
    list[int],
]:
    """Node ids (possible), online CPUs per node, MemTotal bytes, raw distance rows, online ids."""
    possible = reader.cpus(f"{_NODE}/possible")
    if possible is None:
        return [], {}, {}, {}, []
    online_nodes = reader.cpus(f"{_NODE}/online")
    if online_nodes is None:
        online_nodes = possible
    highest = max((*possible, *online_nodes), default=0)
    if highest > MAX_NODE:
        # Every node gets a distance row as long as the node list: 65536 nodes would be 4
        # billion entries. No kernel allows more than 1024 nodes.
        raise TopologyError(
            f"{_shown(reader.prefix + _NODE)} names NUMA node {highest}, above the kernel's "
            f"limit of {MAX_NODE}; is this a sysfs tree? (make one with `numarun snapshot`)"
        )
    online_set = set(online)
    node_cpus: dict[int, tuple[int, ...]] = {}
    memory: dict[int, int] = {}
    rows: dict[int, tuple[int, ...]] = {}
    for n in online_nodes:
        cpus = reader.cpus(f"{_NODE}/node{n}/cpulist") or ()
        node_cpus[n] = tuple(c for c in cpus if c in online_set)
        memory[n] = _mem_total(reader.text(f"{_NODE}/node{n}/meminfo"))
        row = reader.stripped(f"{_NODE}/node{n}/distance")
        try:
            # One column per online node; anything beyond is never used.
            fields = row.split(None, len(online_nodes))[: len(online_nodes)] if row else ()
            rows[n] = tuple(int(x) for x in fields)
        except ValueError:
            raise TopologyError(
                f"{_shown(reader.prefix + _NODE)}/node{n}/distance holds {_quoted(row or '')}, "
                "not distances; "
                "is this a sysfs tree? (make one with `numarun snapshot`)"
            ) from None
    ids = sorted(set(possible) | set(online_nodes))
    return ids, node_cpus, memory, rows, sorted(online_nodes)


def _mem_total(meminfo: str | None) -> int:
    """MemTotal in bytes from a node's meminfo ("Node 0 MemTotal:  1056677668 kB"); 0 if absent."""
    if not meminfo:
        return 0
    for line in meminfo.splitlines():
        if "MemTotal:" in line:
            fields = line.split("MemTotal:", 1)[1].split()
            if fields and fields[0].isdigit() and len(fields[0]) <= 20:
                scale = 1024 if len(fields) < 2 or fields[1].lower() == "kb" else 1
                return int(fields[0]) * scale
    return 0


def _read_cpus(
    reader: _Reader, online: tuple[int, ...], node_of: Mapping[int, int]
) -> tuple[
    dict[int, tuple[int, ...]],
    dict[int, int],
    dict[int, int],
    dict[int, tuple[int, int | None, tuple[int, ...]]],
]:
    """Per online CPU: its SMT siblings, package and cache group; and each group's facts.

    Files are read for one CPU per core (siblings), per package (package_cpus_list) and per
    cache group (shared_cpu_list); the other members learn their answer from those lists.
    """
    online_set = set(online)
    on_node: dict[int | None, list[int]] = {}  # online CPUs by node, for CPUs without caches
    siblings_of: dict[int, tuple[int, ...]] = {}
    package_of: dict[int, int] = {}
    cache_of: dict[int, int] = {}
    cache_info: dict[int, tuple[int, int | None, tuple[int, ...]]] = {}
    layout: list[tuple[str, tuple[str, ...]]] = []  # (largest index name, cache dir listing)
    for cpu in online:
        base = f"{_CPU}/cpu{cpu}"
        if cpu not in siblings_of:
            listed = reader.cpus(f"{base}/topology/thread_siblings_list")
            if listed and cpu in listed and online_set.issuperset(listed):
                core = listed  # the usual case, already sorted and unique
            else:
                core = tuple(sorted({c for c in listed or () if c in online_set} | {cpu}))
            for c in core:
                siblings_of.setdefault(c, core)
        if cpu not in package_of:
            package = reader.integer(f"{base}/topology/physical_package_id")
            package = package if package is not None and package >= 0 else 0
            members = reader.cpus(f"{base}/topology/package_cpus_list")
            if members is None:
                members = reader.cpus(f"{base}/topology/core_siblings_list")
            for c in (*(members or ()), *siblings_of[cpu]):
                if c in online_set:
                    package_of.setdefault(c, package)
        if cpu not in cache_of:
            found = _largest_cache(reader, base, layout)
            if found is None:
                # No cacheinfo (some VMs and ARM boards): the node stands in for the complex.
                if not on_node:
                    for c in online:
                        on_node.setdefault(node_of.get(c), []).append(c)
                group = tuple(c for c in on_node[node_of.get(cpu)] if c not in cache_of)
                level, size = 0, None
            else:
                level, size, shared = found
                group = tuple(sorted({c for c in shared if c in online_set} | {cpu}))
                group = tuple(c for c in group if c not in cache_of)
            for c in group:
                cache_of[c] = group[0]
            cache_info[group[0]] = (level, size, group)
    return siblings_of, package_of, cache_of, cache_info


def _largest_cache(
    reader: _Reader, base: str, layout: list[tuple[str, tuple[str, ...]]]
) -> tuple[int, int | None, tuple[int, ...]] | None:
    """(level, size in bytes, shared CPUs) of the highest-level data or unified cache.

    ``layout`` remembers the first CPU's answer; a CPU whose cache directory lists the same
    indices reads only that index's level and type to confirm it, not every index.
    """
    names = reader.listdir(f"{base}/cache")
    if names is None:
        return None
    indices = tuple(sorted(n for n in names if n.startswith("index")))
    best: tuple[int, str] | None = None
    if layout and layout[0][1] == indices:
        hint = layout[0][0]
        level = reader.integer(f"{base}/cache/{hint}/level")
        kind = reader.stripped(f"{base}/cache/{hint}/type")
        if level is not None and kind in ("Data", "Unified"):
            best = (level, hint)
    if best is None:
        for index in indices:
            kind = reader.stripped(f"{base}/cache/{index}/type")
            if kind not in ("Data", "Unified"):
                continue
            level = reader.integer(f"{base}/cache/{index}/level")
            if level is not None and (best is None or level > best[0]):
                best = (level, index)
        if best is None:
            return None
        if not layout:
            layout.append((best[1], indices))
    level, index = best
    shared = reader.cpus(f"{base}/cache/{index}/shared_cpu_list") or ()
    return level, _cache_size(reader.stripped(f"{base}/cache/{index}/size")), shared


def _cache_size(text: str | None) -> int | None:
    """Bytes from the kernel's "32768K" (also accepts "M", "G" and plain bytes)."""
    if not text:
        return None
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1].upper(), 1)
    digits = text[:-1] if scale != 1 else text
    return int(digits) * scale if digits.isdigit() and len(digits) <= 20 else None


def _packages(cpus: tuple[Cpu, ...]) -> tuple[Package, ...]:
    by_id: dict[int, list[Cpu]] = {}
    for cpu in cpus:
        by_id.setdefault(cpu.package, []).append(cpu)
    return tuple(
        Package(
            pid,
            tuple(c.id for c in members),
            tuple(sorted({c.node for c in members if c.node is not None})),
        )
        for pid, members in sorted(by_id.items())
    )


def _nodes(
    node_ids: list[int],
    online_nodes: list[int],
    node_cpus: Mapping[int, tuple[int, ...]],
    node_memory: Mapping[int, int],
    node_rows: Mapping[int, tuple[int, ...]],
    package_of: Mapping[int, int],
) -> tuple[NumaNode, ...]:
    column = {n: i for i, n in enumerate(online_nodes)}
    result = []
    for n in node_ids:
        row = node_rows.get(n, ())
        distances = tuple(
            row[column[m]] if m in column and column[m] < len(row) else 0 for m in node_ids
        )
        cpus = node_cpus.get(n, ())
        result.append(
            NumaNode(
                id=n,
                cpus=cpus,
                memory_bytes=node_memory.get(n, 0),
                distances=distances,
                package=package_of[cpus[0]] if cpus else None,
                online=n in column,
            )
        )
    return tuple(result)


def _allowed_cpus(
    online: tuple[int, ...], cpus_allowed: Sequence[int] | str | None, host: bool
) -> tuple[int, ...]:
    online_set = set(online)
    base = online
    if host:
        affinity = os.sched_getaffinity(0)
        base = tuple(c for c in online if c in affinity)
    if cpus_allowed is None:
        allowed = base
    else:
        if isinstance(cpus_allowed, str):
            wanted = parse_cpulist(cpus_allowed)
        else:
            if any(not isinstance(c, int) or isinstance(c, bool) or c < 0 for c in cpus_allowed):
                raise UsageError(f"CPUs allowed {list(cpus_allowed)!r} must be CPU numbers >= 0")
            wanted = tuple(sorted(set(cpus_allowed)))
        outside = [c for c in wanted if c not in online_set]
        if outside:
            raise UsageError(
                f"--cpus-allowed names CPUs {format_cpulist(outside)} that are not online "
                f"(online: {format_cpulist(online)})"
            )
        base_set = set(base)
        outside = [c for c in wanted if c not in base_set]
        if outside:
            raise UsageError(
                f"--cpus-allowed names CPUs {format_cpulist(outside)} outside this process's "
                f"affinity {format_cpulist(base)}; widen it (taskset / cgroup) or drop them"
            )
        allowed = wanted
    if not allowed:
        raise TopologyError(
            "no CPUs allowed: the CPU set to plan for is empty; pass --cpus-allowed with "
            f"some of the online CPUs {format_cpulist(online)}"
        )
    return allowed


def _pci_sort_key(address: str) -> tuple[int, ...]:
    """(domain, bus, device, function) of "0000:18:00.0"; unparsable names sort last."""
    try:
        domain, bus, rest = address.split(":")
        device, function = rest.split(".")
        return (int(domain, 16), int(bus, 16), int(device, 16), int(function, 16))
    except ValueError:
        return (1 << 32,)


def _read_pci(
    reader: _Reader,
    online: tuple[int, ...],
    nodes: tuple[NumaNode, ...],
    warnings: list[str],
) -> tuple[tuple[Gpu, ...], tuple[Nic, ...]]:
    """GPUs in PCI address order (``index == pci_index``, all visible) and NICs."""
    listed = reader.listdir(_PCI) or ()
    if len(listed) > _MAX_PCI_FUNCTIONS:
        raise TopologyError(
            f"{_shown(reader.prefix + _PCI)} lists {len(listed)} PCI functions, more than "
            f"{_MAX_PCI_FUNCTIONS}; is this a sysfs tree? (make one with `numarun snapshot`)"
        )
    addresses = sorted(listed, key=lambda a: (_pci_sort_key(a), a))
    online_set = set(online)
    cpu_nodes = [n for n in nodes if n.cpus]
    gpus: list[Gpu] = []
    nics: list[Nic] = []
    for address in addresses:
        base = f"{_PCI}/{address}"
        pci_class = reader.integer(f"{base}/class", 16)
        if pci_class is None:
            continue
        subclass = pci_class >> 8
        if subclass not in _GPU_CLASSES and subclass not in _NIC_CLASSES:
            continue
        vendor_id = reader.integer(f"{base}/vendor", 16)
        if subclass in _GPU_CLASSES and vendor_id not in _GPU_VENDORS:
            continue
        raw_node = reader.integer(f"{base}/numa_node")
        listed = reader.cpus(f"{base}/local_cpulist")
        if listed is None:
            local = online
        elif online_set.issuperset(listed):
            local = listed
        else:
            local = tuple(c for c in listed if c in online_set)
        node = _device_node(raw_node, local, cpu_nodes)
        address = printable(address.lower())  # a directory entry: any bytes in a hostile tree
        if subclass in _GPU_CLASSES:
            if node is None:
                warnings.append(
                    f"GPU {address} reports no usable NUMA node and its local CPUs "
                    f"{format_cpulist(local)} match no single node; it is treated as local "
                    "to every allowed CPU"
                )
            assert vendor_id is not None
            index = len(gpus)
            gpus.append(Gpu(index, index, address, _GPU_VENDORS[vendor_id], node, local))
        else:
            names = sorted(reader.listdir(f"{base}/net") or ())
            names += sorted(reader.listdir(f"{base}/infiniband") or ())
            if not names:
                # virtio-net hangs its interface below a virtioN child device.
                for child in sorted(reader.listdir(base) or ()):
                    if child.startswith("virtio"):
                        names += sorted(reader.listdir(f"{base}/{child}/net") or ())
            nics.append(
                Nic(address, tuple(map(printable, names)), _NIC_CLASSES[subclass], node)
            )
    return tuple(gpus), tuple(nics)


def _device_node(
    raw_node: int | None, local: tuple[int, ...], cpu_nodes: list[NumaNode]
) -> int | None:
    """The device's NUMA node with CPUs, or None when it cannot be told.

    A node the kernel reports is used when it has CPUs. Otherwise (-1, or a memory-only node):
    the only node with CPUs on a one-node machine; else the one node whose online CPUs equal
    the device's local CPUs; else None.
    """
    if raw_node is not None and raw_node >= 0 and any(n.id == raw_node for n in cpu_nodes):
        return raw_node
    if len(cpu_nodes) == 1:
        return cpu_nodes[0].id
    matches = [n.id for n in cpu_nodes if n.cpus == local]
    return matches[0] if len(matches) == 1 else None


# ---------------------------------------------------------------------------------------------
# Visibility.


def select_visible_gpus(gpus: Sequence[Gpu], environ: Mapping[str, str]) -> tuple[Gpu, ...]:
    """The GPUs a worker sees, in the order it numbers them, re-indexed from 0.

    NVIDIA GPUs follow ``CUDA_VISIBLE_DEVICES`` as the CUDA runtime reads it (indices into PCI
    order, or ``GPU-<uuid prefix>`` resolved through the UUIDs NVML gave): unset means all; ""
    means none; the list stops at the first entry that is not a valid index or known UUID
    (``-1``, ``abc``, out of range), as CUDA stops. AMD GPUs follow ``ROCR_VISIBLE_DEVICES``,
    then ``HIP_VISIBLE_DEVICES`` (or ``CUDA_VISIBLE_DEVICES`` when that is unset) indexing into
    what ROCR left, with the same stopping rule. Intel GPUs are all visible. Visible NVIDIA GPUs
    come first, then AMD, then Intel.

    Raises :class:`UsageError` for a device listed twice, for an NVIDIA UUID entry when no GPU
    has a UUID (NVML missing: install ``numarun[nvidia]``), for AMD UUID entries, and for MIG
    instances.
    """
    nvidia = [g for g in gpus if g.vendor == "nvidia"]
    amd = [g for g in gpus if g.vendor == "amd"]
    intel = [g for g in gpus if g.vendor == "intel"]
    chosen: list[Gpu] = []
    cuda = environ.get("CUDA_VISIBLE_DEVICES")
    if nvidia:
        chosen += nvidia if cuda is None else _select(nvidia, cuda, "CUDA_VISIBLE_DEVICES")
    if amd:
        rocr = environ.get("ROCR_VISIBLE_DEVICES")
        if rocr is not None:
            amd = _select(amd, rocr, "ROCR_VISIBLE_DEVICES")
        hip_name = "HIP_VISIBLE_DEVICES" if "HIP_VISIBLE_DEVICES" in environ else None
        if hip_name is None and cuda is not None:
            hip_name = "CUDA_VISIBLE_DEVICES"
        if hip_name is not None:
            amd = _select(amd, environ[hip_name], hip_name)
        chosen += amd
    chosen += intel
    return tuple(
        Gpu(i, g.pci_index, g.pci_address, g.vendor, g.numa_node, g.local_cpus, g.name, g.uuid)
        for i, g in enumerate(chosen)
    )


def _select(gpus: list[Gpu], value: str, variable: str) -> list[Gpu]:
    chosen: list[Gpu] = []
    for raw in value.split(","):
        entry = raw.strip()
        if entry.upper().startswith("MIG-"):
            raise UsageError(
                f"{variable}={value!r} names a MIG instance; numarun binds whole GPUs, "
                "list GPU indices instead"
            )
        if entry.upper().startswith("GPU-"):
            gpu = _by_uuid(gpus, entry, variable, value)
        else:
            # ASCII digits only ("²" passes isdigit() but not int()), and few of them.
            digits = entry.isascii() and entry.isdigit() and len(entry) <= 9
            index = int(entry) if digits else -1
            gpu = gpus[index] if 0 <= index < len(gpus) else None
        if gpu is None:
            break  # the runtime ignores this entry and everything after it
        if gpu in chosen:
            raise UsageError(f"{variable}={value!r} lists GPU {entry} twice; list each device once")
        chosen.append(gpu)
    return chosen


def _by_uuid(gpus: list[Gpu], entry: str, variable: str, value: str) -> Gpu | None:
    if gpus and gpus[0].vendor != "nvidia":
        raise UsageError(
            f"{variable}={value!r} names AMD GPUs by UUID, which numarun cannot resolve; "
            "list GPU indices instead"
        )
    if not any(g.uuid for g in gpus):
        raise UsageError(
            f"{variable}={value!r} names GPUs by UUID but no UUIDs are known (they come from "
            "NVML on this machine: pip install 'numarun[nvidia]'; a --sysfs-root tree has "
            "none); list GPU indices instead"
        )
    prefix = entry.lower()
    matches = [g for g in gpus if g.uuid and g.uuid.lower().startswith(prefix)]
    return matches[0] if len(matches) == 1 else None


def _gpu_env(
    gpus: Sequence[Gpu], environ: Mapping[str, str], warnings: list[str]
) -> tuple[tuple[str, str], ...]:
    if not any(g.vendor == "nvidia" for g in gpus):
        return ()
    order = environ.get("CUDA_DEVICE_ORDER")
    if order is None:
        return (("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),)
    if order != "PCI_BUS_ID":
        warnings.append(
            f"CUDA_DEVICE_ORDER={order} is set: CUDA may number GPUs differently from PCI "
            "order, so rank i's GPU may not be the one bound near its CPUs; unset it or use "
            "PCI_BUS_ID"
        )
    return ()


def files_read(root: str | Path) -> tuple[dict[str, list[str] | None], dict[str, str | None]]:
    """What :func:`read_topology` reads under ``root`` (NVML not consulted, visibility
    variables ignored): the directories it lists (relative path -> entries, None where it
    found none) and the files it reads (relative path -> text, None where unreadable), for
    :func:`numarun.machine.snapshot.snapshot`. :class:`TopologyError` when ``root`` is not a
    sysfs root."""
    _topology, reader = _read(str(root), None, {}, False)
    return reader.dirs, reader.files


__all__ = [
    "CacheGroup",
    "Core",
    "Cpu",
    "Gpu",
    "Nic",
    "NumaNode",
    "Package",
    "Topology",
    "printable",
    "read_topology",
    "select_visible_gpus",
]

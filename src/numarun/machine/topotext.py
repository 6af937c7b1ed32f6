"""``numarun topo``: the machine as a person wants to see it, and as JSON for programs.

Pure functions of a :class:`~numarun.machine.model.Topology`; nothing here reads files.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from numarun.machine.cpulist import format_cpulist
from numarun.machine.model import CacheGroup, Gpu, Nic, NumaNode, Topology, Value
from numarun.machine.topology import printable

WIDTH = 100  # lines are wrapped to this many columns


def render_topology(topo: Topology) -> str:
    """A multi-line picture of ``topo``, every line at most :data:`WIDTH` columns wide.

    Packages, then their NUMA nodes (memory, CPU ranges, cores and SMT, cache complexes,
    CPUs not allowed, GPUs and NICs); then memory-only nodes, possible-but-offline nodes, GPUs
    and NICs whose node is unknown, and the warnings. GPUs show their visible index (the local
    rank that uses them) and PCI index; GPUs hidden by ``CUDA_VISIBLE_DEVICES`` and friends
    are marked "hidden". The result has no trailing newline.
    """
    visible = {g.pci_address: g.index for g in topo.gpus}
    allowed = set(topo.allowed_cpus)
    lines = [_summary(topo)]
    not_allowed = [c for c in topo.online_cpus if c not in allowed]
    if not_allowed:
        lines += _wrap("allowed CPUs: ", _ranges(topo.allowed_cpus), ",", "  ")
    else:
        lines.append(f"allowed CPUs: all {len(allowed)} online")
    nodes_by_id = {n.id: n for n in topo.nodes}
    for package in topo.packages:
        lines.append("")
        lines.append(
            f"package {package.id}: {len(package.cpus)} CPUs, "
            f"node{'s' if len(package.nodes) != 1 else ''} "
            f"{', '.join(str(n) for n in package.nodes) or 'none'}"
        )
        for node_id in package.nodes:
            lines += _node_lines(topo, nodes_by_id[node_id], allowed, visible)
    lines += _homeless_cpu_lines(topo)
    memory_only = [n for n in topo.nodes if n.online and not n.cpus]
    if memory_only:
        lines += ["", "memory-only nodes (no CPUs):"]
        for node in memory_only:
            lines.append(f"  node {node.id}: {_gib(node.memory_bytes)}{_near(topo, node)}")
            lines += _device_lines(topo, node.id, visible, "    ")
    offline = [n.id for n in topo.nodes if not n.online]
    if offline:
        lines += ["", f"possible but offline nodes (no CPUs, no memory): {format_cpulist(offline)}"]
    lines += _unknown_node_lines(topo, visible)
    matrix = render_matrix(topo)
    if matrix:
        lines += ["", matrix]
    if topo.gpu_env:
        env = printable(" ".join(f"{k}={v}" for k, v in topo.gpu_env))
        lines += ["", f"workers get: {env}"]
    if topo.warnings:
        lines += ["", "warnings:"]
        for warning in topo.warnings:
            lines += _wrap("  - ", printable(warning).split(), "", "    ", joiner=" ")
    return "\n".join(lines)


def render_matrix(topo: Topology) -> str:
    """The visible GPUs' and the NICs' affinity matrix, as ``nvidia-smi topo -m`` prints it,
    from what sysfs says (``""`` without visible GPUs; no trailing newline).

    Rows and columns are ``GPU<visible index>`` and ``NIC<k>`` (NICs in PCI order); a cell is
    ``X`` (itself), ``NODE`` (both on one NUMA node), ``SYS`` (on different nodes: traffic
    crosses the link between them) or ``?`` (a node unknown). nvidia-smi's finer ``PIX``,
    ``PXB``, ``PHB`` (PCIe switches, host bridges) and ``NV#`` (NVLink) are not read. Each row
    ends with the device's NUMA node and CPU affinity (its node's CPUs; its own local CPUs for
    a GPU whose node is unknown). NIC columns are dropped when the table would be wider than
    :data:`WIDTH`, the whole table when even that is too wide; a CPU affinity that does not
    fit is named by its node. NIC names follow the table.
    """
    devices: list[tuple[str, int | None, tuple[int, ...]]] = []
    cpus_of = {node.id: node.cpus for node in topo.nodes}
    for gpu in topo.gpus:
        devices.append((f"GPU{gpu.index}", gpu.numa_node, gpu.local_cpus))
    for k, nic in enumerate(topo.nics):
        node = nic.numa_node
        devices.append((f"NIC{k}", node, cpus_of.get(node, ()) if node is not None else ()))
    if not topo.gpus:
        return ""  # a NIC alone relates to nothing; its node is in its node's block
    label = max(len(name) for name, _, _ in devices) + 2
    cell = max(label, 6)

    def rows(columns: list[tuple[str, int | None, tuple[int, ...]]]) -> list[str] | None:
        head = " " * label + "".join(f"{name:<{cell}}" for name, _, _ in columns)
        lines = [head + "NUMA  CPU affinity"]
        for name, node, cpus in devices:
            cells = "".join(
                f"{_relation(name, node, other, other_node):<{cell}}"
                for other, other_node, _ in columns
            )
            numa = "?" if node is None else str(node)
            line = f"{name:<{label}}{cells}{numa:<6}"
            affinity = format_cpulist(cpus) or "-"
            if len(line + affinity) > WIDTH:
                affinity = "-" if node is None else f"node {node}'s CPUs"
            line += affinity
            if len(line) > WIDTH:
                return None
            lines.append(line.rstrip())
        return lines

    gpus_only = [device for device in devices if device[0].startswith("GPU")]
    table = rows(devices) or (rows(gpus_only) if gpus_only else None)
    if table is None:
        return "GPU/NIC matrix: too many devices to show in 100 columns (see numarun topo --json)"
    legend = (
        "GPU/NIC matrix (as nvidia-smi topo -m): X itself, NODE the same NUMA node, SYS "
        "across NUMA nodes, ? node unknown; PCIe switches and NVLink are not read"
    )
    lines = [*_wrap("", legend.split(), "", "  ", joiner=" "), *table]
    for k, nic in enumerate(topo.nics):
        lines += _wrap(f"  NIC{k}: ", [_nic_names(nic), nic.kind], "", "    ", joiner=" ")
    return "\n".join(lines)


def _relation(name: str, node: int | None, other: str, other_node: int | None) -> str:
    if name == other:
        return "X"
    if node is None or other_node is None:
        return "?"
    return "NODE" if node == other_node else "SYS"


def _summary(topo: Topology) -> str:
    cpu_nodes = [n for n in topo.nodes if n.cpus]
    threads = sorted({len(c.cpus) for c in topo.cores}) or [0]
    smt = f"SMT {threads[0]}" if len(threads) == 1 else f"SMT {threads[0]}-{threads[-1]}"
    gpus = f"{len(topo.gpus)} of {len(topo.all_gpus)} GPUs visible" if topo.all_gpus else "no GPUs"
    return (
        f"{len(topo.packages)} package{_s(topo.packages)}, {len(topo.nodes)} NUMA "
        f"node{_s(topo.nodes)} ({len(cpu_nodes)} with CPUs), {len(topo.online_cpus)} CPUs "
        f"online on {len(topo.cores)} cores ({smt}), {gpus}"
    )


def _node_lines(
    topo: Topology, node: NumaNode, allowed: set[int], visible: dict[str, int]
) -> list[str]:
    # A core counts on every node holding one of its CPUs: a tree whose sibling lists join
    # CPUs of several nodes (hostile, or a broken firmware table) still shows each node.
    members = set(node.cpus)
    cores = [c for c in topo.cores if c.node == node.id or members.intersection(c.cpus)]
    threads = sorted({len(c.cpus) for c in cores})
    if not threads:
        shape = "no cores"
    else:
        per_core = f"{threads[0]}" if len(threads) == 1 else f"{threads[0]}-{threads[-1]}"
        shape = (
            f"{len(cores)} core{'s' if len(cores) != 1 else ''} x {per_core} "
            f"thread{'s' if threads != [1] else ''}"
        )
    lines = [f"  node {node.id}: {_gib(node.memory_bytes)}, {shape}{_near(topo, node)}"]
    lines += _wrap("    CPUs ", _ranges(node.cpus), ",", "         ")
    lines += _cache_lines(topo, node)
    blocked = [c for c in node.cpus if c not in allowed]
    if blocked:
        lines += _wrap("    not allowed: ", _ranges(blocked), ",", "      ")
    lines += _device_lines(topo, node.id, visible, "    ")
    return lines


def _cache_lines(topo: Topology, node: NumaNode) -> list[str]:
    """ "L3: 4 x 4 cores, 8 MiB each: 0-3,128-131 | ..." (or one group, and who shares it)."""
    members = set(node.cpus)
    groups = [g for g in topo.caches if members.intersection(g.cpus)]
    if not groups:
        return []
    level = f"L{groups[0].level}" if groups[0].level else "complex (no cache info)"
    counts = sorted({_core_count(topo, g) for g in groups})
    count = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    sizes = {g.size_bytes for g in groups}
    size = _bytes(next(iter(sizes))) if len(sizes) == 1 else "mixed sizes"
    if len(groups) == 1:
        shared = sorted(
            {c.node for c in topo.cpus if c.id in set(groups[0].cpus)} - {node.id, None}
        )
        also = f", shared with node {format_cpulist(shared)}" if shared else ""
        return [f"    {level}: 1 x {count} cores, {size}{also}"]
    items = [format_cpulist(c for c in g.cpus if c in members) for g in groups]
    head = f"    {level}: {len(groups)} x {count} cores, {size} each: "
    return _wrap(head, items, " |", "      ", joiner=" ")


def _core_count(topo: Topology, group: CacheGroup) -> int:
    cpus = set(group.cpus)
    return len({c.core for c in topo.cpus if c.id in cpus})


def _device_lines(
    topo: Topology, node: int | None, visible: dict[str, int], indent: str
) -> list[str]:
    lines = [indent + _gpu_text(g, visible) for g in topo.all_gpus if g.numa_node == node]
    lines += [indent + _nic_text(n) for n in topo.nics if n.numa_node == node]
    return lines


def _gpu_text(gpu: Gpu, visible: dict[str, int]) -> str:
    index = visible.get(gpu.pci_address)
    label = f"GPU {index}" if index is not None else "GPU hidden"
    extra = f" {printable(gpu.name)}" if gpu.name else ""
    return (
        f"{label:<10} {printable(gpu.pci_address)} {gpu.vendor} (PCI index {gpu.pci_index})"
        f"{extra}"
    )


def _nic_text(nic: Nic) -> str:
    return f"{'NIC':<10} {printable(nic.pci_address)} {nic.kind} {_nic_names(nic)}"


def _nic_names(nic: Nic) -> str:
    return " ".join(printable(name) for name in nic.names) or "(no interface)"


def _homeless_cpu_lines(topo: Topology) -> list[str]:
    homeless = [c.id for c in topo.cpus if c.node is None]
    if not homeless:
        return []
    return ["", *_wrap("CPUs on no NUMA node: ", _ranges(homeless), ",", "  ")]


def _unknown_node_lines(topo: Topology, visible: dict[str, int]) -> list[str]:
    gpus = [g for g in topo.all_gpus if g.numa_node is None]
    nics = [n for n in topo.nics if n.numa_node is None]
    if not gpus and not nics:
        return []
    lines = ["", "unknown node (treated as local to every allowed CPU):"]
    for gpu in gpus:
        lines.append("  " + _gpu_text(gpu, visible))
        lines += _wrap("    local CPUs ", _ranges(gpu.local_cpus), ",", "      ")
    lines += ["  " + _nic_text(n) for n in nics]
    return lines


def _near(topo: Topology, node: NumaNode) -> str:
    """ ", nearest: node 1 (12)" for the closest other online node by SLIT distance."""
    others = [
        (d, other.id)
        for other, d in zip(topo.nodes, node.distances, strict=False)
        if other.id != node.id and other.online and d > 0
    ]
    if not others:
        return ""
    distance, nearest = min(others)
    return f", nearest node {nearest} (distance {distance})"


def _ranges(cpus: Iterable[int]) -> list[str]:
    """CPU-list items ("0-55", "112") so long lists can wrap between items."""
    text = format_cpulist(cpus)
    return text.split(",") if text else ["none"]


def _wrap(first: str, items: Sequence[str], sep: str, indent: str, joiner: str = "") -> list[str]:
    """Join ``items`` with ``sep + joiner`` after ``first``; continue lines with ``indent``."""
    lines: list[str] = []
    current = first
    fresh = True
    for i, item in enumerate(items):
        piece = item + (sep if i < len(items) - 1 else "")
        candidate = current + ("" if fresh else joiner) + piece
        if not fresh and len(candidate.rstrip()) > WIDTH:
            lines.append(current.rstrip())
            current, fresh = indent + piece, False
        else:
            current, fresh = candidate, False
    lines.append(current.rstrip())
    return lines


def _gib(size: int) -> str:
    return f"{size / (1 << 30):.1f} GiB" if size else "no memory"


def _bytes(size: int | None) -> str:
    if size is None:
        return "size unknown"
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} B"


def _s(items: Sequence[Any]) -> str:
    return "" if len(items) == 1 else "s"


def topology_to_json(topo: Topology) -> dict[str, Any]:
    """Everything in ``topo`` as plain JSON types: dicts, lists, ints, strings, None, bools.

    Field names are the values' fields; tuples become lists; ``gpu_env`` becomes an object;
    each node also gets ``cpulist`` (the kernel's string form) and ``has_cpus``. The shape is
    versioned by ``"version": 1``.
    """
    data = _plain(topo)
    data["gpu_env"] = dict(topo.gpu_env)
    for node, raw in zip(data["nodes"], topo.nodes, strict=True):
        node["cpulist"] = format_cpulist(raw.cpus)
        node["has_cpus"] = raw.has_cpus
    data["allowed_cpulist"] = format_cpulist(topo.allowed_cpus)
    return {"version": 1, **data}


def _plain(value: Any) -> Any:
    if isinstance(value, Value):
        return {name: _plain(getattr(value, name)) for name in value._fields}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value

"""``numarun topo``: the machine as a person wants to see it, and as JSON for programs.

Pure functions of a :class:`~numarun.machine.model.Topology`; nothing here reads files.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict
from typing import Any

from numarun.machine.cpulist import format_cpulist
from numarun.machine.model import CacheGroup, Gpu, Nic, NumaNode, Topology

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
    if topo.gpu_env:
        env = " ".join(f"{k}={v}" for k, v in topo.gpu_env)
        lines += ["", f"workers get: {env}"]
    if topo.warnings:
        lines += ["", "warnings:"]
        for warning in topo.warnings:
            lines += _wrap("  - ", warning.split(), "", "    ", joiner=" ")
    return "\n".join(lines)


def _summary(topo: Topology) -> str:
    cpu_nodes = [n for n in topo.nodes if n.cpus]
    threads = sorted({len(c.cpus) for c in topo.cores})
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
    cores = [c for c in topo.cores if c.node == node.id]
    threads = sorted({len(c.cpus) for c in cores})
    per_core = f"{threads[0]}" if len(threads) == 1 else f"{threads[0]}-{threads[-1]}"
    lines = [
        f"  node {node.id}: {_gib(node.memory_bytes)}, {len(cores)} cores x {per_core} "
        f"thread{'s' if threads != [1] else ''}{_near(topo, node)}"
    ]
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
    extra = f" {gpu.name}" if gpu.name else ""
    return f"{label:<10} {gpu.pci_address} {gpu.vendor} (PCI index {gpu.pci_index}){extra}"


def _nic_text(nic: Nic) -> str:
    names = " ".join(nic.names) or "(no interface)"
    return f"{'NIC':<10} {nic.pci_address} {nic.kind} {names}"


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

    Field names are the dataclass fields; tuples become lists; ``gpu_env`` becomes an object;
    each node also gets ``cpulist`` (the kernel's string form) and ``has_cpus``. The shape is
    versioned by ``"version": 1``.
    """
    data = _plain(asdict(topo))
    data["gpu_env"] = dict(topo.gpu_env)
    for node, raw in zip(data["nodes"], topo.nodes, strict=True):
        node["cpulist"] = format_cpulist(raw.cpus)
        node["has_cpus"] = raw.has_cpus
    data["allowed_cpulist"] = format_cpulist(topo.allowed_cpus)
    return {"version": 1, **data}


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value

"""Why each rank got its CPUs: the plan explained to a person (``numarun plan --explain``).

Pure functions of a :class:`~numarun.placement.plan.Plan` and the
:class:`~numarun.machine.model.Topology` it was made for; nothing here plans anything again.
:func:`mode_rule` states the rule of a mode in one sentence; :func:`explain_ranks` gives one
line per rank: its GPU with PCI address and NUMA node, what the rule gave it there, and which
other ranks share its CPUs or its memory nodes.
"""

from __future__ import annotations

from collections.abc import Sequence

from numarun.machine.cpulist import format_cpulist
from numarun.machine.model import Topology
from numarun.placement.plan import Plan, RankBinding

_RULES = {
    "node": "each rank gets every allowed CPU of its GPU's NUMA node",
    "socket": "each rank gets every allowed CPU of the package (socket) its GPU's node is on",
    "exclusive": "the allowed physical cores of each GPU's NUMA node are split evenly among "
    "that node's GPUs (lowest GPUs take the remainder), each core with its SMT siblings",
    "core-complex": "each rank gets one whole L3 complex of its GPU's NUMA node (the node's "
    "GPUs take its complexes in turn, largest first)",
    "cpu": "the allowed physical cores are split evenly among the ranks, node by node, no "
    "rank straddling two NUMA nodes where that can be avoided; GPUs play no part",
    "explicit": "each rank gets exactly the CPUs given for it (--rank-cpus)",
    "none": "no binding: every rank may run on every allowed CPU",
}


def mode_rule(plan: Plan) -> str:
    """The rule of ``plan``'s mode in one sentence (an unbound plan: that nothing is bound)."""
    if not plan.bound:
        return f"{plan.mode}: not bound: every rank may run on every allowed CPU"
    return f"{plan.mode}: {_RULES.get(plan.mode, 'as planned')}"


def explain_ranks(plan: Plan, topology: Topology) -> list[str]:
    """One line per rank, in local rank order: ``rank N: <GPU> ; <what the rule gave it> ;
    <sharing>``. The GPU part names its index, PCI address and NUMA node (or that the node is
    unknown, or that the rank has none); the middle part counts the rank's cores and where
    they are (for ``exclusive``, the node's cores and GPUs they were split among; for ``cpu``,
    whether the rank's GPU is on another node); the last part lists the ranks sharing any of
    its CPUs and those sharing its memory nodes."""
    ranks = sorted(plan.ranks, key=lambda rank: rank.local_rank)
    node_of = {cpu.id: cpu.node for cpu in topology.cpus}
    core_of = {cpu.id: cpu.core for cpu in topology.cpus}
    return [
        f"rank {rank.local_rank}: "
        + "; ".join(
            (
                _gpu_part(rank, topology),
                _cpus_part(plan, rank, topology, node_of, core_of),
                _sharing_part(rank, ranks),
            )
        )
        for rank in ranks
    ]


def explain_json(document: dict, plan: Plan, topology: Topology) -> None:
    """Add the explanation to ``document`` (:func:`numarun.placement.plan.plan_to_json`'s):
    ``"rule"`` (:func:`mode_rule`) and each rank's ``"why"`` (its :func:`explain_ranks` line
    without the rank's name)."""
    document["rule"] = mode_rule(plan)
    for rank, line in zip(document["ranks"], explain_ranks(plan, topology), strict=True):
        rank["why"] = line.partition(": ")[2]


def _gpu_part(rank: RankBinding, topology: Topology) -> str:
    if rank.gpu is None or rank.gpu >= len(topology.gpus):
        return "no GPU"
    gpu = topology.gpus[rank.gpu]
    where = "NUMA node unknown" if gpu.numa_node is None else f"on NUMA node {gpu.numa_node}"
    return f"GPU {gpu.index} ({gpu.pci_address}) {where}"


def _cpus_part(
    plan: Plan,
    rank: RankBinding,
    topology: Topology,
    node_of: dict[int, int | None],
    core_of: dict[int, int],
) -> str:
    cores = len({core_of.get(cpu, cpu) for cpu in rank.cpus})
    nodes = sorted({node for cpu in rank.cpus if (node := node_of.get(cpu)) is not None})
    on = f"on node {nodes[0]}" if len(nodes) == 1 else f"on nodes {format_cpulist(nodes)}"
    size = f"{cores} core{'s' if cores != 1 else ''} ({len(rank.cpus)} CPUs) {on}"
    if not plan.bound:
        return f"not bound: all {len(rank.cpus)} allowed CPUs"
    gpu = topology.gpus[rank.gpu] if rank.gpu is not None else None
    if plan.mode in ("node", "socket", "exclusive", "core-complex") and gpu is not None:
        if gpu.numa_node is None:
            return f"{size}: treated as local to every allowed CPU"
        if plan.mode == "exclusive":
            peers = [g.index for g in topology.gpus if g.numa_node == gpu.numa_node]
            node_cores = len(
                {core_of[cpu] for cpu in topology.allowed_cpus if node_of.get(cpu) == gpu.numa_node}
            )
            return (
                f"{size}: its share of node {gpu.numa_node}'s {node_cores} allowed cores, "
                f"split among GPUs {format_cpulist(peers)}"
            )
        if plan.mode == "core-complex":
            return f"{size}: one L3 complex of node {gpu.numa_node}"
        if plan.mode == "socket":
            package = {cpu.package for cpu in topology.cpus if cpu.id in set(rank.cpus)}
            return f"{size}: package {format_cpulist(package)}, its GPU's"
        return f"{size}: its GPU's node"
    if plan.mode == "cpu" and gpu is not None and gpu.numa_node is not None:
        if gpu.numa_node not in nodes:
            return f"{size}: its GPU is on node {gpu.numa_node}, another node (cpu mode)"
        return f"{size}: its GPU's node too"
    return size


def _sharing_part(rank: RankBinding, ranks: Sequence[RankBinding]) -> str:
    mine = set(rank.cpus)
    cpu_peers = [r.local_rank for r in ranks if r is not rank and mine & set(r.cpus)]
    mem_peers = [
        r.local_rank for r in ranks if r is not rank and set(rank.mems) & set(r.mems)
    ]
    parts = [
        f"shares CPUs with rank{'s' if len(cpu_peers) > 1 else ''} {format_cpulist(cpu_peers)}"
        if cpu_peers
        else "shares no CPU"
    ]
    if rank.mems:
        memory = f"memory node{'s' if len(rank.mems) > 1 else ''} {format_cpulist(rank.mems)}"
        if mem_peers:
            parts.append(f"{memory} with rank{'s' if len(mem_peers) > 1 else ''} "
                         f"{format_cpulist(mem_peers)}")  # fmt: skip
        else:
            parts.append(f"{memory} its own")
    return ", ".join(parts)

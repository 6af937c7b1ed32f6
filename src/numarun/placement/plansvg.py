"""A plan as a picture: the machine's drawing with each rank's CPUs and GPU coloured
(``numarun plan --svg FILE``).

The drawing is :func:`numarun.machine.toposvg.topology_svg`'s; this module only decides the
colours and the legend, ``rank N: GPU k, node m`` per rank. Ranks bound to exactly the same
CPUs (``node`` and ``socket`` modes share a node's or a package's CPUs among its GPUs) share
one colour and one legend line (``ranks 0-3: GPUs 0-3, node 0``); a CPU in two different
ranks' sets takes the first one's colour and names both in its tooltip. Pure.
"""

from __future__ import annotations

from numarun.machine.cpulist import format_cpulist
from numarun.machine.model import Topology
from numarun.machine.toposvg import topology_svg
from numarun.placement.plan import Plan, RankBinding

# Distinct, light enough for black text; beyond them, hues a golden angle apart.
PALETTE = (
    "#8dd3c7", "#fdb462", "#bebada", "#fb8072", "#80b1d3", "#b3de69", "#fccde5", "#ffed6f",
    "#bc80bd", "#ccebc5", "#d9d9d9", "#c49c94", "#9edae5", "#f7b6d2", "#dbdb8d", "#aec7e8",
)  # fmt: skip


def colour(index: int) -> str:
    """The ``index``-th colour: :data:`PALETTE`, then evenly spread light hues."""
    if index < len(PALETTE):
        return PALETTE[index]
    hue = (index * 137.508) % 360
    return f"hsl({hue:.0f}, 70%, 75%)"


def plan_svg(plan: Plan, topology: Topology) -> str:
    """``plan`` drawn on ``topology`` (an SVG document's text): each group of ranks with the
    same CPUs in its own colour, on its CPUs and on its ranks' GPUs, with a legend line per
    group. An unbound plan colours nothing and says so in the legend."""
    ranks = sorted(plan.ranks, key=lambda rank: rank.local_rank)
    title = (
        f"numarun plan: {plan.mode}{'' if plan.bound else ' (NOT bound)'}, "
        f"{len(ranks)} rank{'s' if len(ranks) != 1 else ''}"
    )
    if not plan.bound:
        legend = [("#fafafa", "not bound: every rank may run on every allowed CPU")]
        return topology_svg(topology, title=title, legend=legend)
    groups: dict[tuple[int, ...], list[RankBinding]] = {}
    for rank in ranks:
        groups.setdefault(tuple(sorted(rank.cpus)), []).append(rank)
    cpu_colours: dict[int, str] = {}
    cpu_ranks: dict[int, list[int]] = {}
    gpu_colours: dict[str, str] = {}
    legend = []
    for index, (cpus, members) in enumerate(groups.items()):
        fill = colour(index)
        for cpu in cpus:
            cpu_colours.setdefault(cpu, fill)
            cpu_ranks.setdefault(cpu, []).extend(rank.local_rank for rank in members)
        for rank in members:
            if rank.gpu is not None and rank.gpu < len(topology.gpus):
                gpu_colours[topology.gpus[rank.gpu].pci_address] = fill
        legend.append((fill, legend_text(members)))
    notes = {
        cpu: f"rank{'s' if len(owners) > 1 else ''} {format_cpulist(owners)}"
        for cpu, owners in cpu_ranks.items()
    }
    return topology_svg(
        topology,
        title=title,
        cpu_colours=cpu_colours,
        cpu_notes=notes,
        gpu_colours=gpu_colours,
        legend=legend,
    )


def legend_text(members: list[RankBinding]) -> str:
    """``rank 3: GPU 3, node 1`` (or ``ranks 0-3: GPUs 0-3, node 0``; ``no GPU``; the nodes
    of a rank spread over several)."""
    ids = [rank.local_rank for rank in members]
    gpus = [rank.gpu for rank in members if rank.gpu is not None]
    head = f"rank {ids[0]}" if len(ids) == 1 else f"ranks {format_cpulist(ids)}"
    if not gpus:
        gpu = "no GPU"
    else:
        gpu = f"GPU {gpus[0]}" if len(gpus) == 1 else f"GPUs {format_cpulist(gpus)}"
    nodes = sorted({node for rank in members for node in rank.mems})
    if members[0].numa_node is not None:
        where = f"node {members[0].numa_node}"
    elif nodes:
        where = f"nodes {format_cpulist(nodes)}"
    else:
        where = "node unknown"
    return f"{head}: {gpu}, {where}"

"""numarun.placement.plansvg: a plan as SVG (``numarun plan --svg``): each rank's CPUs and GPU
coloured with the colour its legend line ("rank N: GPU k, node m") shows, read as a structure
(``tests/svg_structure.py``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

import sysfs_fixtures
from numarun.machine.cpulist import parse_cpulist
from numarun.machine.model import Topology
from numarun.machine.topology import read_topology
from numarun.placement.plan import make_plan
from numarun.placement.plansvg import plan_svg
from svg_structure import SVG, cpu_rects, svg_tree, tooltip

shape_root = sysfs_fixtures.shape_root


@pytest.fixture
def h100(shape_root: Callable[[str], Path]) -> Topology:
    return read_topology(shape_root("dgx_h100"), environ={})


@pytest.mark.parametrize("mode", ["exclusive", "node", "cpu"])
def test_a_plan_colours_each_ranks_cpus_and_gpu_as_its_legend_says(
    h100: Topology, mode: str
) -> None:
    plan = make_plan(h100, 8, mode)
    root, parents = svg_tree(plan_svg(plan, h100))
    legend: dict[str, str] = {}  # legend text -> colour
    for text in root.iter(f"{SVG}text"):
        if text.text and re.match(r"ranks? \d", text.text):
            swatch = list(parents[text])[list(parents[text]).index(text) - 1]
            legend[text.text] = swatch.get("fill", "")
    cpus = cpu_rects(root)
    for rank in plan.ranks:
        gpu = h100.gpus[rank.gpu]  # type: ignore[index]
        (entry,) = [
            text for text in legend
            if rank.local_rank in parse_cpulist(re.match(r"ranks? ([\d,-]+):", text)[1])  # type: ignore[index]
        ]  # fmt: skip
        if mode != "node":
            assert entry == f"rank {rank.local_rank}: GPU {gpu.index}, node {rank.numa_node}"
        fill = legend[entry]
        assert {cpus[cpu].get("fill") for cpu in rank.cpus} == {fill}
        owners = re.search(r"; ranks? ([\d,-]+)$", tooltip(cpus[rank.cpus[0]]))
        assert owners and rank.local_rank in parse_cpulist(owners[1])
        (gpu_rect,) = [
            r for r in root.iter(f"{SVG}rect") if tooltip(r).startswith(f"GPU {gpu.index}:")
        ]
        assert gpu_rect.get("fill") == fill
    assert len(set(legend.values())) == len(legend)  # one colour per legend line
    if mode == "node":
        assert set(legend) == {"ranks 0-3: GPUs 0-3, node 0", "ranks 4-7: GPUs 4-7, node 1"}

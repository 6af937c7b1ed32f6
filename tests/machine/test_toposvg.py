"""Pictures of the machine and of a plan (``numarun topo --svg``, ``numarun plan --svg``), and
the GPU/NIC affinity matrix of ``numarun topo``.

The SVG is checked as a structure, not as pixels: every online CPU is a box nested in its
core's, its L3 complex's, its NUMA node's and its package's boxes; every GPU and NIC sits in
its node's box with its PCI address; a plan colours each rank's CPUs and GPU with the colour
its legend line ("rank N: GPU k, node m") shows.
"""

from __future__ import annotations

import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

import sysfs_fixtures
from numarun.machine.cpulist import parse_cpulist
from numarun.machine.drawing import topology_svg
from numarun.machine.model import Nic, Topology
from numarun.machine.topology import read_topology
from numarun.machine.view import render_matrix
from numarun.placement.picture import plan_svg
from numarun.placement.plan import make_plan

SVG = "{http://www.w3.org/2000/svg}"
shape_root = sysfs_fixtures.shape_root


def _tree(text: str) -> tuple[ET.Element, dict[ET.Element, ET.Element]]:
    root = ET.fromstring(text)
    parents = {child: parent for parent in root.iter() for child in parent}
    return root, parents


def _tip(rect: ET.Element) -> str:
    title = rect.find(f"{SVG}title")
    return "" if title is None else title.text or ""


def _boxes_around(rect: ET.Element, parents: dict[ET.Element, ET.Element]) -> list[str]:
    """The tooltips of the boxes enclosing ``rect``, innermost first: each box is a group
    whose first element is its rectangle."""
    found = []
    node = parents.get(rect)
    while node is not None:
        if node.tag == f"{SVG}g":
            first = next(iter(node), None)
            if first is not None and first.tag == f"{SVG}rect" and first is not rect:
                found.append(_tip(first))
        node = parents.get(node)
    return found


def _cpu_rects(root: ET.Element) -> dict[int, ET.Element]:
    rects = {}
    for rect in root.iter(f"{SVG}rect"):
        match = re.match(r"CPU (\d+), ", _tip(rect))
        if match:
            rects[int(match[1])] = rect
    return rects


@pytest.fixture
def h100(shape_root: Callable[[str], Path]) -> Topology:
    return read_topology(shape_root("dgx_h100"), environ={})


def test_the_machine_is_drawn_as_nested_boxes(h100: Topology) -> None:
    text = topology_svg(h100)
    root, parents = _tree(text)
    width, height = float(root.get("width", 0)), float(root.get("height", 0))
    assert 600 < width <= 1600 and 300 < height <= 1600  # a browser window, not a poster
    cpus = _cpu_rects(root)
    assert sorted(cpus) == list(h100.online_cpus)
    core_of = {cpu.id: cpu for cpu in h100.cpus}
    for cpu, rect in cpus.items():
        core, l3, node, package, *_ = _boxes_around(rect, parents)
        info = core_of[cpu]
        assert core.startswith(f"core {info.core}: CPUs ")
        assert l3.startswith("L3 112 MiB: 56 cores")
        assert node.startswith(f"NUMA node {info.node}: 100") and "GiB" in node
        assert package == f"Package {info.package}: 112 CPUs"
    # SMT siblings share their core's box.
    assert _boxes_around(cpus[0], parents)[0] == _boxes_around(cpus[112], parents)[0]
    for gpu in h100.gpus:
        (rect,) = [r for r in root.iter(f"{SVG}rect") if _tip(r).startswith(f"GPU {gpu.index}:")]
        assert gpu.pci_address in _tip(rect)
        assert _boxes_around(rect, parents)[0].startswith(f"NUMA node {gpu.numa_node}: ")
        texts = [t.text for t in parents[rect].iter(f"{SVG}text")]
        assert gpu.pci_address in texts  # shown, not only in the tooltip
    for nic in h100.nics:
        (rect,) = [r for r in root.iter(f"{SVG}rect") if nic.pci_address in _tip(r)]
        assert _boxes_around(rect, parents)[0].startswith(f"NUMA node {nic.numa_node}: ")


def test_memory_only_and_offline_nodes_are_drawn(shape_root: Callable[[str], Path]) -> None:
    topo = read_topology(shape_root("grace_hopper"), environ={})
    root, _ = _tree(topology_svg(topo))
    tips = [_tip(rect) for rect in root.iter(f"{SVG}rect")]
    assert any(tip.startswith("NUMA node 1: 96.0 GiB") for tip in tips)  # the GPU's memory
    texts = " ".join(t.text or "" for t in root.iter(f"{SVG}text"))
    assert "possible but offline NUMA nodes (no CPUs, no memory): 2-8" in texts


def test_names_from_sysfs_are_escaped(h100: Topology) -> None:
    hostile = Nic("0000:99:00.0", ('<script>alert(1)</script>"&',), "ethernet", 0)
    topo = h100.replace(nics=(*h100.nics, hostile))
    text = topology_svg(topo)
    assert "<script>" not in text
    root, _ = _tree(text)  # still well-formed XML
    assert any("<script>" in _tip(rect) for rect in root.iter(f"{SVG}rect"))


@pytest.mark.parametrize("mode", ["exclusive", "node", "cpu"])
def test_a_plan_colours_each_ranks_cpus_and_gpu_as_its_legend_says(
    h100: Topology, mode: str
) -> None:
    plan = make_plan(h100, 8, mode)
    root, parents = _tree(plan_svg(plan, h100))
    legend: dict[str, str] = {}  # legend text -> colour
    for text in root.iter(f"{SVG}text"):
        if text.text and re.match(r"ranks? \d", text.text):
            swatch = list(parents[text])[list(parents[text]).index(text) - 1]
            legend[text.text] = swatch.get("fill", "")
    cpus = _cpu_rects(root)
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
        owners = re.search(r"; ranks? ([\d,-]+)$", _tip(cpus[rank.cpus[0]]))
        assert owners and rank.local_rank in parse_cpulist(owners[1])
        (gpu_rect,) = [
            r for r in root.iter(f"{SVG}rect") if _tip(r).startswith(f"GPU {gpu.index}:")
        ]
        assert gpu_rect.get("fill") == fill
    assert len(set(legend.values())) == len(legend)  # one colour per legend line
    if mode == "node":
        assert set(legend) == {"ranks 0-3: GPUs 0-3, node 0", "ranks 4-7: GPUs 4-7, node 1"}


def test_topo_and_plan_write_svg_files(tmp_path: Path, shape_root: Callable[[str], Path]) -> None:
    root = str(shape_root("dgx_a100"))
    numarun = [sys.executable, "-m", "numarun"]
    topo = subprocess.run(
        [*numarun, "topo", "--sysfs-root", root, "--svg", str(tmp_path / "t.svg")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert topo.returncode == 0, topo.stderr
    assert topo.stdout.startswith("2 packages, 8 NUMA nodes")  # the text comes too
    plan = subprocess.run(
        [*numarun, "plan", "--sysfs-root", root, "--svg", str(tmp_path / "p.svg")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout.splitlines()[-1] == f"picture: {tmp_path / 'p.svg'}"
    for name in ("t.svg", "p.svg"):
        ET.fromstring((tmp_path / name).read_text())
    assert "rank 7: GPU 7, node 5" in (tmp_path / "p.svg").read_text()
    bad = subprocess.run([*numarun, "topo", "--svg", str(tmp_path / "no" / "such" / "x.svg")],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.startswith("numarun: error: --svg ")
    assert f"{tmp_path / 'no'} does not exist" in bad.stderr
    assert bad.stderr.count("\n") == 1


def test_topo_shows_the_gpu_nic_affinity_matrix(shape_root: Callable[[str], Path]) -> None:
    topo = read_topology(shape_root("dgx_a100"), environ={})
    lines = render_matrix(topo).splitlines()
    header = next(line for line in lines if line.lstrip().startswith("GPU0"))
    assert header.split() == [*(f"GPU{i}" for i in range(8)), "NIC0", "NIC1", "NUMA", "CPU",
                              "affinity"]  # fmt: skip
    rows = {line.split()[0]: line.split()[1:] for line in lines if re.match(r"(GPU|NIC)\d", line)}
    # GPU 0 and 1 share node 3 with NIC 0 (mlx5_0); GPU 2 is on node 1.
    assert rows["GPU0"] == ["X", "NODE", "SYS", "SYS", "SYS", "SYS", "SYS", "SYS", "NODE", "SYS",
                            "3", "48-63,176-191"]  # fmt: skip
    assert rows["NIC0"][:2] == ["NODE", "NODE"] and rows["NIC0"][8] == "X"
    assert rows["GPU2"][10] == "1"
    assert "  NIC0: ib0 mlx5_0 infiniband" in lines
    assert render_matrix(read_topology(shape_root("no_gpus"), environ={})) == ""  # a NIC alone
    unknown = render_matrix(read_topology(shape_root("cloud_vm_unknown_numa"), environ={}))
    assert "GPU2  ?     ?     X     ?     ?     ?     0-31" in unknown.splitlines()

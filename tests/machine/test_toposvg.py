"""numarun.machine.toposvg: the picture of the machine (``numarun topo --svg``; ``numarun plan
--svg`` writes its file beside it).

The SVG is checked as a structure, not as pixels (``tests/svg_structure.py``): every online CPU
is a box nested in its core's, its L3 complex's, its NUMA node's and its package's boxes; every
GPU and NIC sits in its node's box with its PCI address. A plan's picture is
``tests/placement/test_plansvg.py``'s; the GPU/NIC affinity matrix ``test_topotext.py``'s.
"""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

import sysfs_fixtures
from numarun.machine.model import Nic, Topology
from numarun.machine.topology import read_topology
from numarun.machine.toposvg import topology_svg
from svg_structure import SVG, boxes_around, cpu_rects, svg_tree, tooltip

shape_root = sysfs_fixtures.shape_root


@pytest.fixture
def h100(shape_root: Callable[[str], Path]) -> Topology:
    return read_topology(shape_root("dgx_h100"), environ={})


def test_the_machine_is_drawn_as_nested_boxes(h100: Topology) -> None:
    text = topology_svg(h100)
    root, parents = svg_tree(text)
    width, height = float(root.get("width", 0)), float(root.get("height", 0))
    assert 600 < width <= 1600 and 300 < height <= 1600  # a browser window, not a poster
    cpus = cpu_rects(root)
    assert sorted(cpus) == list(h100.online_cpus)
    core_of = {cpu.id: cpu for cpu in h100.cpus}
    for cpu, rect in cpus.items():
        core, l3, node, package, *_ = boxes_around(rect, parents)
        info = core_of[cpu]
        assert core.startswith(f"core {info.core}: CPUs ")
        assert l3.startswith("L3 112 MiB: 56 cores")
        assert node.startswith(f"NUMA node {info.node}: 100") and "GiB" in node
        assert package == f"Package {info.package}: 112 CPUs"
    # SMT siblings share their core's box.
    assert boxes_around(cpus[0], parents)[0] == boxes_around(cpus[112], parents)[0]
    for gpu in h100.gpus:
        (rect,) = [r for r in root.iter(f"{SVG}rect") if tooltip(r).startswith(f"GPU {gpu.index}:")]
        assert gpu.pci_address in tooltip(rect)
        assert boxes_around(rect, parents)[0].startswith(f"NUMA node {gpu.numa_node}: ")
        texts = [t.text for t in parents[rect].iter(f"{SVG}text")]
        assert gpu.pci_address in texts  # shown, not only in the tooltip
    for nic in h100.nics:
        (rect,) = [r for r in root.iter(f"{SVG}rect") if nic.pci_address in tooltip(r)]
        assert boxes_around(rect, parents)[0].startswith(f"NUMA node {nic.numa_node}: ")


def test_memory_only_and_offline_nodes_are_drawn(shape_root: Callable[[str], Path]) -> None:
    topo = read_topology(shape_root("grace_hopper"), environ={})
    root, _ = svg_tree(topology_svg(topo))
    tips = [tooltip(rect) for rect in root.iter(f"{SVG}rect")]
    assert any(tip.startswith("NUMA node 1: 96.0 GiB") for tip in tips)  # the GPU's memory
    texts = " ".join(t.text or "" for t in root.iter(f"{SVG}text"))
    assert "possible but offline NUMA nodes (no CPUs, no memory): 2-8" in texts


def test_names_from_sysfs_are_escaped(h100: Topology) -> None:
    hostile = Nic("0000:99:00.0", ('<script>alert(1)</script>"&',), "ethernet", 0)
    topo = h100.replace(nics=(*h100.nics, hostile))
    text = topology_svg(topo)
    assert "<script>" not in text
    root, _ = svg_tree(text)  # still well-formed XML
    assert any("<script>" in tooltip(rect) for rect in root.iter(f"{SVG}rect"))


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

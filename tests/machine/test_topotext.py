"""numarun.machine.topotext: render_topology and topology_to_json on every fake machine, and the
GPU/NIC affinity matrix of ``numarun topo``."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

import sysfs_fixtures
from numarun.machine.cpulist import format_cpulist
from numarun.machine.model import Topology
from numarun.machine.topology import read_topology
from numarun.machine.topotext import WIDTH, render_matrix, render_topology, topology_to_json
from sysfs_fixtures import SHAPES

shape_root = sysfs_fixtures.shape_root


def section(text: str, header: str) -> str:
    """The lines from ``header`` up to the next blank line."""
    start = text.index(header)
    end = text.find("\n\n", start)
    return text[start : end if end >= 0 else len(text)]


def node_block(text: str, node: int) -> str:
    """The lines of one node: from "  node N:" up to the next node, package or blank line."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"  node {node}:"))
    end = start + 1
    while end < len(lines) and lines[end].startswith("    "):
        end += 1
    return "\n".join(lines[start:end])


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_shape_renders_within_width(shape_root: Callable[[str], Path], shape: str) -> None:
    topo = read_topology(shape_root(shape), environ={})
    text = render_topology(topo)
    assert max(len(line) for line in text.splitlines()) <= WIDTH
    assert f"{len(topo.online_cpus)} CPUs online on {len(topo.cores)} cores" in text
    for node in topo.nodes:
        if node.cpus:
            block = node_block(text, node.id)
            for gpu in topo.all_gpus:
                assert (gpu.pci_address in block) == (gpu.numa_node == node.id)
            flattened = block.replace("\n         ", "")
            assert f"CPUs {format_cpulist(node.cpus)}" in flattened
    body = text.split("\nwarnings:")[0]
    for gpu in topo.all_gpus:
        assert body.count(gpu.pci_address) == 1
    data = topology_to_json(topo)
    assert json.loads(json.dumps(data)) == data  # plain JSON types only


def test_dgx_h100_details(shape_root: Callable[[str], Path]) -> None:
    topo = read_topology(shape_root("dgx_h100"), environ={"CUDA_VISIBLE_DEVICES": "3,1"})
    text = render_topology(topo)
    assert "2 of 8 GPUs visible" in text
    node0 = node_block(text, 0)
    assert "1007.7 GiB, 56 cores x 2 threads" in node0
    assert "CPUs 0-55,112-167" in node0
    assert "GPU 0      0000:5d:00.0 nvidia (PCI index 3)" in node0
    assert "GPU 1      0000:2a:00.0" in node0
    assert "GPU hidden 0000:18:00.0" in node0
    assert "NIC        0000:19:00.0 infiniband ib0 mlx5_0" in node0
    assert "0000:9a:00.0" in node_block(text, 1) and "eno1" in node_block(text, 1)
    assert "workers get: CUDA_DEVICE_ORDER=PCI_BUS_ID" in text
    for not_a_gpu in ("0000:05:00.0", "0000:17:00.0", "0000:03:00.0"):
        assert not_a_gpu not in text


def test_dgx_a100_l3_complexes(shape_root: Callable[[str], Path]) -> None:
    text = render_topology(read_topology(shape_root("dgx_a100"), environ={}))
    node3 = node_block(text, 3)
    assert "L3: 4 x 4 cores, 8 MiB each: 48-51,176-179 | 52-55,180-183" in node3
    assert "0000:07:00.0" in node3 and "0000:0f:00.0" in node3
    assert "nearest node 0 (distance 12)" in node3
    assert "package 1: 128 CPUs, nodes 4, 5, 6, 7" in text


def test_memory_only_and_offline_nodes(shape_root: Callable[[str], Path]) -> None:
    text = render_topology(read_topology(shape_root("grace_hopper"), environ={}))
    memory_only = section(text, "memory-only nodes")
    assert "node 1: 96.0 GiB" in memory_only
    assert "possible but offline nodes (no CPUs, no memory): 2-8" in text
    assert "0009:01:00.0" in node_block(text, 0)


def test_unknown_node_section_and_warnings(shape_root: Callable[[str], Path]) -> None:
    topo = read_topology(shape_root("cloud_vm_unknown_numa"), environ={})
    text = render_topology(topo)
    unknown = section(text, "unknown node")
    assert "0000:00:06.0" in unknown and "0000:00:07.0" in unknown
    assert "local CPUs 0-31" in unknown
    assert "0000:00:04.0" in node_block(text, 0) and "0000:00:05.0" in node_block(text, 1)
    warnings = section(text, "warnings:")
    assert warnings.count("  - GPU") == 2
    assert all("  " not in line.strip() for line in warnings.splitlines())
    assert "\n    treated as local" in warnings  # wrapped, continuation indented


def test_not_allowed_cpus_are_marked(shape_root: Callable[[str], Path]) -> None:
    topo = read_topology(shape_root("interleaved"), cpus_allowed="0-20", environ={})
    text = render_topology(topo)
    assert "allowed CPUs: 0-20" in text
    assert "not allowed: 22,24," in node_block(text, 0)
    assert "not allowed: 21,23," in node_block(text, 1)
    full = render_topology(read_topology(shape_root("interleaved"), environ={}))
    assert "not allowed" not in full and "allowed CPUs: all 64 online" in full


def test_json_content(shape_root: Callable[[str], Path]) -> None:
    topo = read_topology(shape_root("grace_hopper"), environ={"CUDA_DEVICE_ORDER": "FASTEST_FIRST"})
    data = topology_to_json(topo)
    assert data["version"] == 1
    assert data["online_cpus"] == list(range(72))
    assert data["nodes"][1] == {
        "id": 1,
        "cpus": [],
        "memory_bytes": 96 << 30,
        "distances": [80, 10, 0, 0, 0, 0, 0, 0, 0],
        "package": None,
        "online": True,
        "cpulist": "",
        "has_cpus": False,
    }
    assert data["gpus"][0]["pci_address"] == "0009:01:00.0"
    assert data["gpus"][0]["numa_node"] == 0
    assert data["gpu_env"] == {}
    assert any("FASTEST_FIRST" in w for w in data["warnings"])
    assert data["caches"][0]["cpus"] == list(range(72))


def test_this_machine_renders() -> None:
    topo: Topology = read_topology("/")
    text = render_topology(topo)
    assert f"{len(topo.online_cpus)} CPUs online" in text
    assert "package 0" in text


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

"""numarun.machine.topology: read_topology on fake sysfs trees (every named shape, hand-checked)
and on this machine. Snapshots are ``test_snapshot.py``'s, NVML ``test_nvml.py``'s."""

from __future__ import annotations

import dataclasses
import os
import shutil
import tarfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numarun.errors import TopologyError, UsageError
from numarun.machine import topology
from numarun.machine.cpulist import parse_cpulist
from numarun.machine.model import Gpu, Topology
from numarun.machine.topology import read_topology, select_visible_gpus
from numarun.placement.plan import make_plan
from sysfs_fixtures import (
    CLASS_3D,
    CLASS_ACCEL,
    GIB,
    INTEL,
    NVIDIA,
    SHAPES,
    FakeGpu,
    FakeMachine,
    FakePci,
    amd_instinct,
    scratch_dir,
    write_sysfs,
)

NO_ENV: dict[str, str] = {}


def read(root: Path, **env: str) -> Topology:
    return read_topology(root, environ=env)


def node(topo: Topology, node_id: int) -> topology.NumaNode:
    (found,) = [n for n in topo.nodes if n.id == node_id]
    return found


def cpu(topo: Topology, cpu_id: int) -> topology.Cpu:
    (found,) = [c for c in topo.cpus if c.id == cpu_id]
    return found


def extract(tar: tarfile.TarFile, dest: Path) -> None:
    if hasattr(tarfile, "data_filter"):  # 3.12+, and 3.10.12+ / 3.11.4+ backports
        tar.extractall(dest, filter="data")
    else:
        tar.extractall(dest)


def addresses(gpus: tuple[Gpu, ...]) -> list[str]:
    return [g.pci_address for g in gpus]


# (shape, CPUs, cores, possible nodes, nodes with CPUs, packages, cache groups, GPUs, NICs)
COUNTS = [
    ("dgx_h100", 224, 112, 2, 2, 2, 2, 8, 5),
    ("dgx_a100", 256, 128, 8, 8, 2, 32, 8, 2),
    ("grace_hopper", 72, 72, 9, 1, 1, 1, 1, 0),
    ("grace_hopper_x2", 144, 144, 18, 2, 2, 2, 2, 0),
    ("cloud_vm_unknown_numa", 32, 16, 2, 2, 2, 2, 4, 1),
    ("smt_off", 32, 32, 2, 2, 2, 2, 4, 0),
    ("interleaved", 64, 32, 2, 2, 2, 2, 4, 0),
    ("offline_cpus", 30, 30, 2, 2, 2, 2, 4, 0),
    ("uneven_cores", 40, 20, 2, 2, 2, 2, 4, 0),
    ("crowded_node", 10, 10, 2, 2, 2, 2, 4, 0),
    ("no_gpus", 32, 16, 2, 2, 2, 2, 0, 1),
    ("one_node_small", 2, 2, 1, 1, 1, 1, 1, 0),
]


def test_counts_cover_every_shape() -> None:
    assert sorted(row[0] for row in COUNTS) == sorted(SHAPES)


@pytest.mark.parametrize(
    (
        "shape",
        "n_cpus",
        "n_cores",
        "n_nodes",
        "n_cpu_nodes",
        "n_pkgs",
        "n_caches",
        "n_gpus",
        "n_nics",
    ),
    COUNTS,
)
def test_every_shape_reads_with_hand_counted_sizes(
    tree: Callable[[str], Path],
    shape: str,
    n_cpus: int,
    n_cores: int,
    n_nodes: int,
    n_cpu_nodes: int,
    n_pkgs: int,
    n_caches: int,
    n_gpus: int,
    n_nics: int,
) -> None:
    topo = read(tree(shape))
    assert len(topo.cpus) == len(topo.online_cpus) == n_cpus
    assert topo.allowed_cpus == topo.online_cpus
    assert len(topo.cores) == n_cores
    assert len(topo.nodes) == n_nodes
    assert len([n for n in topo.nodes if n.has_cpus]) == n_cpu_nodes
    assert len(topo.packages) == n_pkgs
    assert len(topo.caches) == n_caches
    assert len(topo.gpus) == len(topo.all_gpus) == n_gpus
    assert len(topo.nics) == n_nics
    # Cores, cache groups, packages and CPU nodes each partition the online CPUs.
    for groups in (topo.cores, topo.caches, topo.packages, [n for n in topo.nodes if n.cpus]):
        members = sorted(c for g in groups for c in g.cpus)
        assert members == list(topo.online_cpus)
    for row in topo.nodes:
        assert len(row.distances) == n_nodes


def test_dgx_h100(tree: Callable[[str], Path]) -> None:
    topo = read(tree("dgx_h100"))
    assert node(topo, 0).cpus == parse_cpulist("0-55,112-167")
    assert node(topo, 1).cpus == parse_cpulist("56-111,168-223")
    assert node(topo, 0).memory_bytes == 1056677668 * 1024
    assert node(topo, 0).distances == (10, 32)
    assert node(topo, 1).package == 1
    assert cpu(topo, 112) == topology.Cpu(112, core=0, package=0, node=0, cache=0)
    assert cpu(topo, 200) == topology.Cpu(200, core=88, package=1, node=1, cache=56)
    assert topo.cores[0] == topology.Core(0, (0, 112), package=0, node=0, cache=0)
    assert topo.caches[1] == topology.CacheGroup(
        56, 3, 56 * 2048 * 1024, parse_cpulist("56-111,168-223")
    )
    assert [p.nodes for p in topo.packages] == [(0,), (1,)]
    # NVSwitches, the PCIe bridge and the ASPEED BMC VGA are not GPUs.
    assert addresses(topo.gpus) == [
        "0000:18:00.0",
        "0000:2a:00.0",
        "0000:3a:00.0",
        "0000:5d:00.0",
        "0000:9a:00.0",
        "0000:ab:00.0",
        "0000:ba:00.0",
        "0000:db:00.0",
    ]
    assert [g.numa_node for g in topo.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [g.index for g in topo.gpus] == [g.pci_index for g in topo.gpus] == list(range(8))
    assert {g.vendor for g in topo.gpus} == {"nvidia"}
    assert topo.gpus[5].local_cpus == parse_cpulist("56-111,168-223")
    assert topo.gpu_env == (("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),)
    assert topo.warnings == ()
    nics = {n.pci_address: n for n in topo.nics}
    assert nics["0000:19:00.0"] == topology.Nic("0000:19:00.0", ("ib0", "mlx5_0"), "infiniband", 0)
    assert nics["0000:bb:00.0"].names == ("ib3", "mlx5_3")
    assert nics["0000:bb:00.0"].numa_node == 1
    assert nics["0000:a9:00.0"] == topology.Nic("0000:a9:00.0", ("eno1",), "ethernet", 1)


def test_dgx_a100_nps4(tree: Callable[[str], Path]) -> None:
    topo = read(tree("dgx_a100"))
    assert node(topo, 3).cpus == parse_cpulist("48-63,176-191")
    assert node(topo, 7).cpus == parse_cpulist("112-127,240-255")
    assert node(topo, 5).package == 1
    assert node(topo, 0).distances == (10, 12, 12, 12, 32, 32, 32, 32)
    assert node(topo, 6).distances == (32, 32, 32, 32, 12, 12, 10, 12)
    assert [p.nodes for p in topo.packages] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert topo.caches[0] == topology.CacheGroup(
        0, 3, 4 * 2048 * 1024, parse_cpulist("0-3,128-131")
    )
    assert cpu(topo, 133).cache == 4
    assert cpu(topo, 255).cache == 124
    assert [g.numa_node for g in topo.gpus] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert addresses(topo.gpus)[2] == "0000:47:00.0"
    assert len(topo.all_gpus) == 8  # six NVSwitches left out


def test_grace_hopper_memory_only_and_empty_nodes(tree: Callable[[str], Path]) -> None:
    topo = read(tree("grace_hopper"))
    assert [n.id for n in topo.nodes] == list(range(9))
    cpu_node, hbm = node(topo, 0), node(topo, 1)
    assert cpu_node.cpus == tuple(range(72))
    assert cpu_node.memory_bytes == 480 * GIB
    assert hbm.cpus == () and not hbm.has_cpus
    assert hbm.memory_bytes == 96 * GIB and hbm.package is None and hbm.online
    assert cpu_node.distances[:2] == (10, 80)
    for empty in topo.nodes[2:]:
        assert (empty.online, empty.cpus, empty.memory_bytes, empty.package) == (
            False,
            (),
            0,
            None,
        )
        assert set(empty.distances) == {0}
    assert topo.packages[0].nodes == (0,)
    assert [(g.pci_address, g.numa_node) for g in topo.gpus] == [("0009:01:00.0", 0)]


def test_grace_hopper_x2(tree: Callable[[str], Path]) -> None:
    topo = read(tree("grace_hopper_x2"))
    assert [n.id for n in topo.nodes if n.has_cpus] == [0, 1]
    assert [n.id for n in topo.nodes if n.memory_bytes and not n.cpus] == [2, 10]
    assert [n.id for n in topo.nodes if n.online] == [0, 1, 2, 10]
    assert node(topo, 1).cpus == tuple(range(72, 144))
    assert [(g.pci_address, g.numa_node) for g in topo.gpus] == [
        ("0009:01:00.0", 0),
        ("0019:01:00.0", 1),
    ]


def test_unknown_numa_node_resolved_by_local_cpus_or_warned(tree: Callable[[str], Path]) -> None:
    topo = read(tree("cloud_vm_unknown_numa"))
    assert [g.numa_node for g in topo.gpus] == [0, 1, None, None]
    assert topo.gpus[2].local_cpus == tuple(range(32))
    assert len(topo.warnings) == 2
    assert "0000:00:06.0" in topo.warnings[0] and "0000:00:07.0" in topo.warnings[1]
    assert "local to every allowed CPU" in topo.warnings[0]
    assert topo.nics[0].numa_node is None  # virtio NIC, -1 and all CPUs local: unknown


def test_one_node_rule(tree: Callable[[str], Path], tmp_path: Path) -> None:
    topo = read(tree("one_node_small"))
    assert [g.numa_node for g in topo.gpus] == [0]
    assert topo.warnings == ()
    # With one CPU node, -1 means that node even when local_cpulist says something odd; the
    # GH200 HBM node (memory only) does not count as a second node.
    machine = dataclasses.replace(
        SHAPES["grace_hopper"](), gpus=(FakeGpu("0009:01:00.0", -1, local_cpus="0-3"),)
    )
    odd = read(write_sysfs(machine, tmp_path))
    assert [(g.numa_node, g.local_cpus) for g in odd.gpus] == [(0, (0, 1, 2, 3))]
    assert odd.warnings == ()


def test_gpu_reporting_a_memory_only_node_falls_back_to_local_cpus(tmp_path: Path) -> None:
    machine = FakeMachine(
        nodes={0: [(0,), (1,)], 1: [(2,), (3,)]},
        packages={0: [0, 1]},
        l3_cores=None,
        memory_nodes={0: GIB, 1: GIB, 2: 4 * GIB},
        gpus=(FakeGpu("0000:01:00.0", 2, local_cpus="2-3"),),
    )
    topo = read(write_sysfs(machine, tmp_path))
    assert topo.gpus[0].numa_node == 1
    assert node(topo, 2).memory_bytes == 4 * GIB


def test_smt_off_and_audio_functions_excluded(tree: Callable[[str], Path]) -> None:
    topo = read(tree("smt_off"))
    assert all(len(core.cpus) == 1 for core in topo.cores)
    assert node(topo, 1).cpus == tuple(range(16, 32))
    assert addresses(topo.all_gpus) == [
        "0000:1b:00.0",
        "0000:3d:00.0",
        "0000:89:00.0",
        "0000:b1:00.0",
    ]


def test_interleaved_numbering(tree: Callable[[str], Path]) -> None:
    topo = read(tree("interleaved"))
    assert node(topo, 0).cpus == tuple(range(0, 64, 2))
    assert node(topo, 1).cpus == tuple(range(1, 64, 2))
    assert cpu(topo, 32).core == 0 and cpu(topo, 33).core == 1
    assert topology.Core(6, (6, 38), 0, 0, 0) in topo.cores
    assert topo.packages[1].cpus == tuple(range(1, 64, 2))
    assert topo.caches[1].cpus == tuple(range(1, 64, 2))


def test_offline_cpus_excluded(tree: Callable[[str], Path]) -> None:
    topo = read(tree("offline_cpus"))
    assert topo.online_cpus == parse_cpulist("0-2,4-19,21-31")
    assert node(topo, 0).cpus == parse_cpulist("0-2,4-15")
    assert node(topo, 1).cpus == parse_cpulist("16-19,21-31")
    assert 3 not in {c.id for c in topo.cpus} and 20 not in topo.caches[1].cpus
    assert topo.gpus[2].local_cpus == parse_cpulist("16-19,21-31")


def test_uneven_and_crowded(tree: Callable[[str], Path]) -> None:
    uneven = read(tree("uneven_cores"))
    assert [g.numa_node for g in uneven.gpus] == [0, 0, 0, 1]
    assert node(uneven, 0).cpus == parse_cpulist("0-9,20-29")
    crowded = read(tree("crowded_node"))
    assert node(crowded, 0).cpus == (0, 1)
    assert [g.numa_node for g in crowded.gpus] == [0, 0, 0, 0]


def test_no_gpus(tree: Callable[[str], Path]) -> None:
    topo = read(tree("no_gpus"), CUDA_VISIBLE_DEVICES="0")
    assert topo.gpus == topo.all_gpus == ()
    assert topo.gpu_env == ()
    assert topo.nics == (topology.Nic("0000:01:00.0", ("eth0",), "ethernet", 0),)


# --- allowed CPUs ------------------------------------------------------------------------------


def test_cpus_allowed_list_and_string(tree: Callable[[str], Path]) -> None:
    root = tree("dgx_h100")
    assert read_topology(root, cpus_allowed="0-3,112", environ=NO_ENV).allowed_cpus == (
        0,
        1,
        2,
        3,
        112,
    )
    assert read_topology(root, cpus_allowed=[5, 4, 5], environ=NO_ENV).allowed_cpus == (4, 5)


def test_cpus_allowed_not_online_is_a_usage_error(tree: Callable[[str], Path]) -> None:
    with pytest.raises(UsageError, match=r"CPUs 3,20 that are not online"):
        read_topology(tree("offline_cpus"), cpus_allowed="0-3,20", environ=NO_ENV)
    with pytest.raises(UsageError, match=r"'0-' is not a CPU number|not a CPU number"):
        read_topology(tree("offline_cpus"), cpus_allowed="0-", environ=NO_ENV)
    with pytest.raises(UsageError, match="CPU numbers >= 0"):
        read_topology(tree("offline_cpus"), cpus_allowed=[-1], environ=NO_ENV)


def test_empty_cpus_allowed_is_a_topology_error(tree: Callable[[str], Path]) -> None:
    with pytest.raises(TopologyError, match="no CPUs allowed"):
        read_topology(tree("smt_off"), cpus_allowed="", environ=NO_ENV)


def test_host_root_checks_cpus_allowed_against_affinity(monkeypatch: pytest.MonkeyPatch) -> None:
    online = parse_cpulist(Path("/sys/devices/system/cpu/online").read_text())
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {online[0]})
    assert read_topology("/").allowed_cpus == (online[0],)
    if len(online) > 1:
        with pytest.raises(UsageError, match="outside this process's affinity"):
            read_topology("/", cpus_allowed=[online[1]])


def test_real_machine() -> None:
    topo = read_topology("/")
    online = parse_cpulist(Path("/sys/devices/system/cpu/online").read_text())
    assert topo.root == "/"
    assert topo.online_cpus == online
    assert topo.allowed_cpus == tuple(sorted(os.sched_getaffinity(0) & set(online)))
    assert [c.id for c in topo.cpus] == list(online)
    assert all(c.node is not None for c in topo.cpus)
    assert sum(len(n.cpus) for n in topo.nodes) == len(online)
    assert all(n.memory_bytes > 0 for n in topo.nodes if n.cpus)


# --- errors --------------------------------------------------------------------------------------


def test_missing_root(tmp_path: Path) -> None:
    with pytest.raises(TopologyError) as info:
        read_topology(tmp_path / "nowhere")
    message = str(info.value)
    assert "nowhere/sys/devices/system/cpu/online" in message
    assert "numarun snapshot" in message and "\n" not in message


def test_garbled_file_is_a_topology_error(tmp_path: Path) -> None:
    root = write_sysfs(SHAPES["one_node_small"](), tmp_path)
    (root / "sys/devices/system/node/node0/cpulist").write_text("zero\n")
    with pytest.raises(TopologyError, match=r"node0/cpulist holds 'zero'"):
        read(root)


def test_no_numa_directory_means_one_node(tmp_path: Path) -> None:
    root = write_sysfs(SHAPES["one_node_small"](), tmp_path)
    shutil.rmtree(root / "sys/devices/system/node")
    topo = read(root)
    assert [(n.id, n.cpus) for n in topo.nodes] == [(0, (0, 1))]
    assert [c.node for c in topo.cpus] == [0, 0]
    assert "no NUMA nodes" in topo.warnings[0]


def test_missing_cache_and_topology_files(tmp_path: Path) -> None:
    root = write_sysfs(SHAPES["no_gpus"](), tmp_path)
    for c in range(32):
        shutil.rmtree(root / f"sys/devices/system/cpu/cpu{c}/cache")
        shutil.rmtree(root / f"sys/devices/system/cpu/cpu{c}/topology")
    topo = read(root)
    assert len(topo.cores) == 32  # no sibling lists: every CPU its own core
    assert [g.cpus for g in topo.caches] == [node(topo, 0).cpus, node(topo, 1).cpus]
    assert {g.level for g in topo.caches} == {0}


# --- GPU classes and visibility ------------------------------------------------------------------


def test_amd_instinct_and_intel_accelerators(tmp_path: Path) -> None:
    machine = dataclasses.replace(
        amd_instinct(),
        gpus=(
            *amd_instinct().gpus,
            FakeGpu("0000:b0:00.0", 1, INTEL, 0x038000, 0x0BD5),  # Data Center GPU Max
            FakeGpu("0000:c0:00.0", 1, 0x1234, CLASS_3D, 0x1111),  # unknown vendor
        ),
    )
    topo = read(write_sysfs(machine, tmp_path))
    assert [(g.pci_address, g.vendor, g.numa_node) for g in topo.gpus] == [
        ("0000:05:00.0", "amd", 0),
        ("0000:26:00.0", "amd", 0),
        ("0000:85:00.0", "amd", 1),
        ("0000:a6:00.0", "amd", 1),
        ("0000:b0:00.0", "intel", 1),
    ]
    assert topo.gpu_env == ()
    assert topo.caches[0].cpus == parse_cpulist("0-3,16-19")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("3,1", ["0000:5d:00.0", "0000:2a:00.0"]),
        ("7", ["0000:db:00.0"]),
        (  # Ray's shuffled order (sglang #24766): rank i must get the i-th listed GPU's node
            "3,6,5,4,0,7,1,2",
            [
                "0000:5d:00.0",
                "0000:ba:00.0",
                "0000:ab:00.0",
                "0000:9a:00.0",
                "0000:18:00.0",
                "0000:db:00.0",
                "0000:2a:00.0",
                "0000:3a:00.0",
            ],
        ),
        (" 4 , 5 ", ["0000:9a:00.0", "0000:ab:00.0"]),
        ("0,abc,2", ["0000:18:00.0"]),  # CUDA stops at the first invalid entry
        ("1,9,2", ["0000:2a:00.0"]),  # and at an out-of-range index
        ("-1", []),
        ("", []),
    ],
)
def test_cuda_visible_devices(tree: Callable[[str], Path], value: str, expected: list[str]) -> None:
    topo = read(tree("dgx_h100"), CUDA_VISIBLE_DEVICES=value)
    assert addresses(topo.gpus) == expected
    node_of_address = {"0000:18": 0, "0000:2a": 0, "0000:3a": 0, "0000:5d": 0}
    assert [g.numa_node for g in topo.gpus] == [node_of_address.get(a[:7], 1) for a in expected]
    assert [g.index for g in topo.gpus] == list(range(len(expected)))
    by_address = {g.pci_address: g for g in topo.all_gpus}
    for g in topo.gpus:
        assert g.pci_index == by_address[g.pci_address].pci_index
        assert g.numa_node == by_address[g.pci_address].numa_node
    assert len(topo.all_gpus) == 8


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1,1", "lists GPU 1 twice"),
        ("GPU-8932f937", r"no UUIDs are known .*numarun\[nvidia\]"),
        ("MIG-GPU-8932f937/1/0", "MIG instance"),
    ],
)
def test_cuda_visible_devices_errors(tree: Callable[[str], Path], value: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        read(tree("dgx_h100"), CUDA_VISIBLE_DEVICES=value)


def test_visible_by_uuid_prefix() -> None:
    gpus = [
        Gpu(i, i, f"0000:0{i}:00.0", "nvidia", 0, (0,), "H100", f"GPU-{uuid}")
        for i, uuid in enumerate(["aa11", "aa22", "bb33"])
    ]
    chosen = select_visible_gpus(gpus, {"CUDA_VISIBLE_DEVICES": "GPU-bb,0"})
    assert [(g.index, g.pci_index) for g in chosen] == [(0, 2), (1, 0)]
    # an ambiguous prefix is an invalid entry: the list stops there
    assert select_visible_gpus(gpus, {"CUDA_VISIBLE_DEVICES": "1,GPU-aa,2"})[0].pci_index == 1
    assert len(select_visible_gpus(gpus, {"CUDA_VISIBLE_DEVICES": "1,GPU-aa,2"})) == 1


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"ROCR_VISIBLE_DEVICES": "2,3"}, ["0000:85:00.0", "0000:a6:00.0"]),
        ({"ROCR_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "1"}, ["0000:a6:00.0"]),
        ({"HIP_VISIBLE_DEVICES": "3,0"}, ["0000:a6:00.0", "0000:05:00.0"]),
        ({"CUDA_VISIBLE_DEVICES": "1"}, ["0000:26:00.0"]),  # HIP honours it when HIP_* unset
        ({"HIP_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "1"}, ["0000:05:00.0"]),
        ({"ROCR_VISIBLE_DEVICES": ""}, []),
    ],
)
def test_amd_visibility(
    tree: Callable[[str], Path], env: dict[str, str], expected: list[str]
) -> None:
    assert addresses(read(tree("amd_instinct"), **env).gpus) == expected


def test_amd_duplicate_or_uuid_is_an_error(tree: Callable[[str], Path]) -> None:
    with pytest.raises(UsageError, match="ROCR_VISIBLE_DEVICES='0,0' lists GPU 0 twice"):
        read(tree("amd_instinct"), ROCR_VISIBLE_DEVICES="0,0")
    with pytest.raises(UsageError, match="AMD GPUs by UUID"):
        read(tree("amd_instinct"), HIP_VISIBLE_DEVICES="GPU-1234")


def test_cuda_device_order(tree: Callable[[str], Path]) -> None:
    fastest = read(tree("dgx_h100"), CUDA_DEVICE_ORDER="FASTEST_FIRST")
    assert fastest.gpu_env == ()
    assert any("CUDA_DEVICE_ORDER=FASTEST_FIRST" in w for w in fastest.warnings)
    pci = read(tree("dgx_h100"), CUDA_DEVICE_ORDER="PCI_BUS_ID")
    assert (pci.gpu_env, pci.warnings) == ((), ())


def test_environ_defaults_to_os_environ(
    tree: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6")
    assert addresses(read_topology(tree("dgx_h100")).gpus) == ["0000:ba:00.0"]


# --- reading cost --------------------------------------------------------------------------------


def test_each_file_read_once(tree: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    opened: Counter[str] = Counter()
    real = topology._read_text

    def counting(path: str) -> str | None:
        opened[path] += 1
        return real(path)

    monkeypatch.setattr(topology, "_read_text", counting)
    root = tree("dgx_h100")
    read(root)
    assert opened and max(opened.values()) == 1
    siblings = [p for p in opened if p.endswith("thread_siblings_list")]
    assert len(siblings) == 112  # one per core, not per CPU
    assert len([p for p in opened if p.endswith("shared_cpu_list")]) == 2  # one per L3
    assert not any("index1" in p for p in opened if "cpu0/" not in p)  # L1i checked once
    assert len(opened) < 250


# --- random machines -----------------------------------------------------------------------------


@st.composite
def machines(draw: Any) -> FakeMachine:
    n_nodes = draw(st.integers(1, 3))
    cores_per_node = draw(st.lists(st.integers(1, 4), min_size=n_nodes, max_size=n_nodes))
    smt = draw(st.sampled_from([1, 2]))
    total_cores = sum(cores_per_node)
    nodes: dict[int, list[tuple[int, ...]]] = {}
    core = 0
    for n, count in enumerate(cores_per_node):
        nodes[n] = [
            tuple(c + k * total_cores for k in range(smt)) for c in range(core, core + count)
        ]
        core += count
    all_cpus = sorted(c for cores in nodes.values() for cc in cores for c in cc)
    offline = draw(st.lists(st.sampled_from(all_cpus[1:] or [0]), max_size=2, unique=True))
    offline = [c for c in offline if c != 0]
    gpu_nodes = draw(st.lists(st.integers(-1, n_nodes - 1), max_size=3))
    gpus = tuple(FakeGpu(f"0000:{0x10 + i:02x}:00.0", n) for i, n in enumerate(gpu_nodes))
    return FakeMachine(
        nodes=nodes,
        packages={0: list(range(n_nodes))},
        l3_cores=draw(st.sampled_from([None, 1, 2])),
        memory_nodes={n: GIB for n in range(n_nodes)},
        offline_cpus=tuple(offline),
        gpus=gpus,
        other_pci=(FakePci("0000:f0:00.0", CLASS_ACCEL, NVIDIA >> 1, 0),),
    )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(machines())
def test_random_machines_read_back(machine: FakeMachine) -> None:
    tmp = scratch_dir()
    try:
        topo = read(write_sysfs(machine, Path(tmp)))
    finally:
        shutil.rmtree(tmp)
    online = machine.online_cpus
    assert topo.online_cpus == online
    for n in machine.nodes:
        assert node(topo, n).cpus == machine.node_cpus(n)
    offline = set(machine.offline_cpus)
    expected_cores = sorted(
        tuple(c for c in core if c not in offline)
        for cores in machine.nodes.values()
        for core in cores
        if any(c not in offline for c in core)
    )
    assert sorted(c.cpus for c in topo.cores) == expected_cores
    for cpu_ in topo.cpus:
        assert cpu_.core == min(c for c in topo.cores if cpu_.id in c.cpus).id
    assert len(topo.gpus) == len(machine.gpus)  # the 0x1200 device of vendor 0x086f is no GPU
    cpu_nodes = [n for n in machine.nodes if machine.node_cpus(n)]
    for fake, gpu in zip(machine.gpus, topo.gpus, strict=True):
        if fake.numa_node in cpu_nodes:
            assert gpu.numa_node == fake.numa_node
        elif len(cpu_nodes) == 1:
            assert gpu.numa_node == cpu_nodes[0]
        else:
            assert gpu.numa_node is None and any(fake.pci_address in w for w in topo.warnings)


def test_a_real_h100_vm_as_its_snapshot_saved_it(tmp_path: Path) -> None:
    """``numarun snapshot`` as it ran on a lent GPU machine (2026-11-28: one H100 80GB HBM3 in a
    16-vCPU Firecracker VM, one NUMA node): the saved tree reads back as nvidia-smi and lscpu
    described that machine, and the default plan gives the one rank every CPU."""
    with tarfile.open(Path(__file__).parents[1] / "data" / "h100-vm-sysfs.tar.gz") as tar:
        extract(tar, tmp_path)
    topo = read(tmp_path)
    assert topo.online_cpus == tuple(range(16))
    assert len(topo.cores) == 16 and len(topo.packages) == 1
    assert [n.id for n in topo.nodes] == [0] and node(topo, 0).cpus == tuple(range(16))
    assert node(topo, 0).memory_bytes == 5860848 * 1024
    assert [(g.pci_address, g.vendor, g.numa_node) for g in topo.gpus] == [
        ("0000:00:06.0", "nvidia", 0)
    ]
    assert [(n.pci_address, n.names, n.kind) for n in topo.nics] == [
        ("0000:00:03.0", ("eth0",), "ethernet")
    ]
    plan = make_plan(topo, 1, "exclusive")
    assert [(r.gpu, r.cpus, r.mems) for r in plan.ranks] == [(0, tuple(range(16)), (0,))]

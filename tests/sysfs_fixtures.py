"""Fake sysfs trees for machines we do not have.

A :class:`FakeMachine` describes a machine; :func:`write_sysfs` writes the files the Linux kernel
would expose for it under ``root/sys`` (same paths, same formats), so that
``read_topology(write_sysfs(dgx_h100(), tmp_path))`` reads it like the real thing.

Named shapes (``SHAPES``) are functions returning a machine; each docstring spells out the CPU
numbering so that expected CPU sets can be checked by hand.

Conventions of the fake kernel, chosen to match what real kernels do:

* offline CPUs have ``cpuN/online`` = ``0`` and no ``topology``/``cache`` directories; they are
  absent from ``cpu/online``, node ``cpulist`` and every sibling / shared-cache list;
* ``cpu0`` has no ``online`` file (it cannot be hot-unplugged);
* a node listed in ``memory_nodes`` (or having CPUs) is online and has a ``nodeN`` directory; a
  node only in ``possible_nodes`` is possible but offline and has no directory (GH200's empty
  nodes 2-8);
* the ``distance`` file of a node lists distances to every online node, ascending;
* caches per CPU: ``index0`` L1 Data 48K, ``index1`` L1 Instruction 32K, ``index2`` L2 Unified
  2048K (per core), ``index3`` L3 Unified (per L3 group, 2048K per physical core in it);
* ``sys/bus/pci/devices/<addr>`` are symlinks to ``sys/devices/pci<dom>:<bus>/<addr>``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from numarun.machine.cpulist import format_cpulist

NVIDIA = 0x10DE
AMD = 0x1002
INTEL = 0x8086
MELLANOX = 0x15B3
ASPEED = 0x1A03
BROADCOM = 0x1000

CLASS_3D = 0x030200
CLASS_VGA = 0x030000
CLASS_ACCEL = 0x120000
CLASS_NVSWITCH = 0x068000
CLASS_BRIDGE = 0x060400
CLASS_AUDIO = 0x040300
CLASS_ETHERNET = 0x020000
CLASS_INFINIBAND = 0x020700

GIB = 1 << 30
TIB = 1 << 40


@dataclass(frozen=True)
class FakeGpu:
    """A GPU PCI function. ``local_cpus`` None: its node's CPU list, or every CPU for node -1."""

    pci_address: str
    numa_node: int
    vendor: int = NVIDIA
    pci_class: int = CLASS_3D
    device: int = 0x2330
    local_cpus: str | None = None


@dataclass(frozen=True)
class FakePci:
    """Any other PCI function; ``net`` / ``infiniband`` name its interface / HCA directories."""

    pci_address: str
    pci_class: int
    vendor: int
    numa_node: int = -1
    net: tuple[str, ...] = ()
    infiniband: tuple[str, ...] = ()
    device: int = 0x0001


@dataclass(frozen=True)
class FakeMachine:
    """A machine to lay out as sysfs.

    ``nodes``: node id -> its physical cores, each a tuple of logical CPU ids (SMT siblings).
    ``packages``: package id -> node ids with CPUs on it.
    ``l3_cores``: physical cores per L3 group, grouped in each node's core order; None means one
    L3 per package. ``memory_nodes``: node id -> MemTotal bytes (a multiple of 1024; CPU nodes
    included; memory-only nodes appear only here). ``possible_nodes``: default every node
    mentioned. ``distances``: node id -> row over online nodes ascending; default 10 local, 20
    same package, 32 other package, 80 to or from a node without CPUs.
    """

    nodes: dict[int, list[tuple[int, ...]]]
    packages: dict[int, list[int]]
    l3_cores: int | None
    memory_nodes: dict[int, int]
    possible_nodes: tuple[int, ...] | None = None
    offline_cpus: tuple[int, ...] = ()
    gpus: tuple[FakeGpu, ...] = ()
    other_pci: tuple[FakePci, ...] = ()
    distances: dict[int, tuple[int, ...]] | None = field(default=None)

    @property
    def all_cpus(self) -> tuple[int, ...]:
        return tuple(sorted(c for cores in self.nodes.values() for core in cores for c in core))

    @property
    def online_cpus(self) -> tuple[int, ...]:
        offline = set(self.offline_cpus)
        return tuple(c for c in self.all_cpus if c not in offline)

    @property
    def online_nodes(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.nodes) | set(self.memory_nodes)))

    def node_cpus(self, node: int) -> tuple[int, ...]:
        """Online CPUs of ``node`` (empty for memory-only or unknown nodes)."""
        offline = set(self.offline_cpus)
        return tuple(
            sorted(c for core in self.nodes.get(node, []) for c in core if c not in offline)
        )


def write_sysfs(machine: FakeMachine, root: Path) -> Path:
    """Write ``machine`` as ``root/sys/...`` and return ``root``."""
    root = Path(root)
    _write_cpus(machine, root / "sys/devices/system/cpu")
    _write_nodes(machine, root / "sys/devices/system/node")
    _write_pci(machine, root)
    return root


def _put(path: Path, text: str) -> None:
    os.makedirs(path.parent, exist_ok=True)
    with open(path, "w") as f:
        f.write(text + "\n")


def _package_of_node(machine: FakeMachine) -> dict[int, int]:
    return {node: pkg for pkg, nodes in machine.packages.items() for node in nodes}


def _l3_groups(machine: FakeMachine) -> list[list[tuple[int, ...]]]:
    """Physical cores grouped by shared L3."""
    node_pkg = _package_of_node(machine)
    if machine.l3_cores is None:
        by_pkg: dict[int, list[tuple[int, ...]]] = {}
        for node, cores in sorted(machine.nodes.items()):
            by_pkg.setdefault(node_pkg[node], []).extend(cores)
        return list(by_pkg.values())
    groups = []
    for _node, cores in sorted(machine.nodes.items()):
        for i in range(0, len(cores), machine.l3_cores):
            groups.append(cores[i : i + machine.l3_cores])
    return groups


def _write_cpus(machine: FakeMachine, cpu_dir: Path) -> None:
    offline = set(machine.offline_cpus)
    online = machine.online_cpus
    _put(cpu_dir / "online", format_cpulist(online))
    _put(cpu_dir / "possible", format_cpulist(machine.all_cpus))
    _put(cpu_dir / "present", format_cpulist(machine.all_cpus))

    node_pkg = _package_of_node(machine)
    pkg_cpus: dict[int, list[int]] = {}
    for node, cores in machine.nodes.items():
        pkg_cpus.setdefault(node_pkg[node], []).extend(c for core in cores for c in core)

    def on(cpus: tuple[int, ...] | list[int]) -> str:
        return format_cpulist(c for c in cpus if c not in offline)

    l3_of: dict[int, tuple[int, ...]] = {}
    for group in _l3_groups(machine):
        members = tuple(c for core in group for c in core)
        for c in members:
            l3_of[c] = members
            if c not in offline:
                _put(cpu_dir / f"cpu{c}/cache/index3/size", f"{2048 * len(group)}K")

    for node, cores in machine.nodes.items():
        pkg = node_pkg[node]
        pkg_core_ids = [core for n in machine.packages[pkg] for core in machine.nodes[n]]
        for core in cores:
            for cpu in core:
                d = cpu_dir / f"cpu{cpu}"
                if cpu != 0:
                    _put(d / "online", "0" if cpu in offline else "1")
                if cpu in offline:
                    continue
                topo = d / "topology"
                _put(topo / "physical_package_id", str(pkg))
                _put(topo / "core_id", str(pkg_core_ids.index(core)))
                _put(topo / "die_id", "0")
                _put(topo / "thread_siblings_list", on(core))
                _put(topo / "core_cpus_list", on(core))
                _put(topo / "cluster_cpus_list", on(core))
                _put(topo / "core_siblings_list", on(pkg_cpus[pkg]))
                _put(topo / "package_cpus_list", on(pkg_cpus[pkg]))
                _put(topo / "die_cpus_list", on(pkg_cpus[pkg]))
                caches = (
                    (1, "Data", "48K", on(core)),
                    (1, "Instruction", "32K", on(core)),
                    (2, "Unified", "2048K", on(core)),
                    (3, "Unified", None, on(l3_of[cpu])),
                )
                for index, (level, kind, size, shared) in enumerate(caches):
                    idx = d / f"cache/index{index}"
                    _put(idx / "level", str(level))
                    _put(idx / "type", kind)
                    _put(idx / "shared_cpu_list", shared)
                    if size is not None:
                        _put(idx / "size", size)


def _default_distance(machine: FakeMachine, a: int, b: int) -> int:
    if a == b:
        return 10
    if a not in machine.nodes or b not in machine.nodes:
        return 80
    node_pkg = _package_of_node(machine)
    return 20 if node_pkg[a] == node_pkg[b] else 32


def _write_nodes(machine: FakeMachine, node_dir: Path) -> None:
    online_nodes = machine.online_nodes
    possible = machine.possible_nodes
    if possible is None:
        possible = online_nodes
    _put(node_dir / "possible", format_cpulist(possible))
    _put(node_dir / "online", format_cpulist(online_nodes))
    _put(node_dir / "has_cpu", format_cpulist(n for n in online_nodes if machine.node_cpus(n)))
    with_memory = [n for n in online_nodes if machine.memory_nodes.get(n, 0) > 0]
    _put(node_dir / "has_memory", format_cpulist(with_memory))
    _put(node_dir / "has_normal_memory", format_cpulist(with_memory))
    for node in online_nodes:
        d = node_dir / f"node{node}"
        _put(d / "cpulist", format_cpulist(machine.node_cpus(node)))
        total_kb = machine.memory_nodes.get(node, 0) // 1024
        free_kb = total_kb // 2
        _put(
            d / "meminfo",
            f"Node {node} MemTotal:       {total_kb:8d} kB\n"
            f"Node {node} MemFree:        {free_kb:8d} kB\n"
            f"Node {node} MemUsed:        {total_kb - free_kb:8d} kB",
        )
        if machine.distances is not None:
            row = machine.distances[node]
        else:
            row = tuple(_default_distance(machine, node, other) for other in online_nodes)
        _put(d / "distance", " ".join(str(x) for x in row))


def _write_pci_function(
    machine: FakeMachine,
    root: Path,
    address: str,
    pci_class: int,
    vendor: int,
    device: int,
    numa_node: int,
    local_cpus: str,
) -> Path:
    domain, bus = address.split(":")[:2]
    real = root / f"sys/devices/pci{domain}:{bus}" / address
    real.mkdir(parents=True, exist_ok=True)
    _put(real / "class", f"0x{pci_class:06x}")
    _put(real / "vendor", f"0x{vendor:04x}")
    _put(real / "device", f"0x{device:04x}")
    _put(real / "numa_node", str(numa_node))
    _put(real / "local_cpulist", local_cpus)
    link_dir = root / "sys/bus/pci/devices"
    link_dir.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(real, link_dir), link_dir / address)
    return real


def _write_pci(machine: FakeMachine, root: Path) -> None:
    (root / "sys/bus/pci/devices").mkdir(parents=True, exist_ok=True)
    everything = format_cpulist(machine.online_cpus)

    def local_of(node: int) -> str:
        return format_cpulist(machine.node_cpus(node)) if node >= 0 else everything

    for gpu in machine.gpus:
        local = gpu.local_cpus if gpu.local_cpus is not None else local_of(gpu.numa_node)
        _write_pci_function(
            machine,
            root,
            gpu.pci_address,
            gpu.pci_class,
            gpu.vendor,
            gpu.device,
            gpu.numa_node,
            local,
        )
    for dev in machine.other_pci:
        real = _write_pci_function(
            machine,
            root,
            dev.pci_address,
            dev.pci_class,
            dev.vendor,
            dev.device,
            dev.numa_node,
            local_of(dev.numa_node),
        )
        for name in dev.net:
            (real / "net" / name).mkdir(parents=True)
            _put(real / "net" / name / "ifindex", "2")
        for name in dev.infiniband:
            (real / "infiniband" / name).mkdir(parents=True)
            _put(real / "infiniband" / name / "node_type", "1: CA")


# ---------------------------------------------------------------------------------------------
# Named shapes.


def _smt2(first: int, count: int, sibling_offset: int) -> list[tuple[int, ...]]:
    return [(c, c + sibling_offset) for c in range(first, first + count)]


def _single(first: int, count: int) -> list[tuple[int, ...]]:
    return [(c,) for c in range(first, first + count)]


def dgx_h100() -> FakeMachine:
    """DGX H100: 2 packages x 56 cores, SMT2, one node and one L3 per package.

    node 0 = package 0 = CPUs 0-55 (cores) + 112-167 (siblings: core c is (c, c+112));
    node 1 = package 1 = CPUs 56-111 + 168-223. About 1 TiB per node.
    GPUs (PCI order = index): 0000:18:00.0, 0000:2a:00.0, 0000:3a:00.0, 0000:5d:00.0 on node 0;
    0000:9a:00.0, 0000:ab:00.0, 0000:ba:00.0, 0000:db:00.0 on node 1.
    Not GPUs: 4 NVSwitches 0000:05-08:00.0, a PCIe switch bridge 0000:17:00.0, ASPEED BMC VGA
    0000:03:00.0. NICs: ConnectX-7 IB 0000:19:00.0 (mlx5_0, ib0) and 0000:3b:00.0 (mlx5_1, ib1)
    on node 0, 0000:9b:00.0 (mlx5_2, ib2) and 0000:bb:00.0 (mlx5_3, ib3) on node 1; Ethernet
    0000:a9:00.0 (eno1) on node 1.
    """
    gpus = tuple(
        FakeGpu(addr, node, device=0x2330)
        for addr, node in (
            ("0000:18:00.0", 0),
            ("0000:2a:00.0", 0),
            ("0000:3a:00.0", 0),
            ("0000:5d:00.0", 0),
            ("0000:9a:00.0", 1),
            ("0000:ab:00.0", 1),
            ("0000:ba:00.0", 1),
            ("0000:db:00.0", 1),
        )
    )
    other = (
        *(
            FakePci(f"0000:0{i}:00.0", CLASS_NVSWITCH, NVIDIA, 0, device=0x22A3)
            for i in (5, 6, 7, 8)
        ),
        FakePci("0000:17:00.0", CLASS_BRIDGE, BROADCOM, 0, device=0xC030),
        FakePci("0000:03:00.0", CLASS_VGA, ASPEED, 0, device=0x2000),
        FakePci("0000:19:00.0", CLASS_INFINIBAND, MELLANOX, 0, ("ib0",), ("mlx5_0",), 0x1021),
        FakePci("0000:3b:00.0", CLASS_INFINIBAND, MELLANOX, 0, ("ib1",), ("mlx5_1",), 0x1021),
        FakePci("0000:9b:00.0", CLASS_INFINIBAND, MELLANOX, 1, ("ib2",), ("mlx5_2",), 0x1021),
        FakePci("0000:bb:00.0", CLASS_INFINIBAND, MELLANOX, 1, ("ib3",), ("mlx5_3",), 0x1021),
        FakePci("0000:a9:00.0", CLASS_ETHERNET, INTEL, 1, ("eno1",), (), 0x1592),
    )
    return FakeMachine(
        nodes={0: _smt2(0, 56, 112), 1: _smt2(56, 56, 112)},
        packages={0: [0], 1: [1]},
        l3_cores=None,
        memory_nodes={0: 1056677668 * 1024, 1: 1056945120 * 1024},
        gpus=gpus,
        other_pci=other,
    )


def dgx_a100() -> FakeMachine:
    """DGX A100: 2 x EPYC 7742 (64 cores, SMT2), NPS4 = 8 nodes, L3 groups of 4 cores.

    node n (0-7) has cores 16n..16n+15, core c is (c, c+128); nodes 0-3 on package 0, 4-7 on
    package 1. L3 groups: cores 4k..4k+3, e.g. CPUs 0-3,128-131 | 4-7,132-135 | ... (32 groups).
    Distances: 10 local, 12 same package, 32 other package. 128 GiB per node.
    GPUs (PCI order): 0000:07:00.0 n3, 0000:0f:00.0 n3, 0000:47:00.0 n1, 0000:4e:00.0 n1,
    0000:87:00.0 n7, 0000:90:00.0 n7, 0000:b7:00.0 n5, 0000:bd:00.0 n5.
    6 NVSwitches at 0000:c1-c6:00.0 (node 4); IB mlx5_0 at 0000:0c:00.0 (node 3), mlx5_6 at
    0000:8c:00.0 (node 7).
    """
    gpu_nodes = (
        ("0000:07:00.0", 3),
        ("0000:0f:00.0", 3),
        ("0000:47:00.0", 1),
        ("0000:4e:00.0", 1),
        ("0000:87:00.0", 7),
        ("0000:90:00.0", 7),
        ("0000:b7:00.0", 5),
        ("0000:bd:00.0", 5),
    )
    gpus = tuple(FakeGpu(addr, node, device=0x20B0) for addr, node in gpu_nodes)
    other = (
        *(
            FakePci(f"0000:c{i}:00.0", CLASS_NVSWITCH, NVIDIA, 4, device=0x1AF1)
            for i in range(1, 7)
        ),
        FakePci("0000:0c:00.0", CLASS_INFINIBAND, MELLANOX, 3, ("ib0",), ("mlx5_0",), 0x101B),
        FakePci("0000:8c:00.0", CLASS_INFINIBAND, MELLANOX, 7, ("ib6",), ("mlx5_6",), 0x101B),
    )
    distances = {
        a: tuple(10 if a == b else 12 if a // 4 == b // 4 else 32 for b in range(8))
        for a in range(8)
    }
    return FakeMachine(
        nodes={n: _smt2(16 * n, 16, 128) for n in range(8)},
        packages={0: [0, 1, 2, 3], 1: [4, 5, 6, 7]},
        l3_cores=4,
        memory_nodes={n: 128 * GIB for n in range(8)},
        gpus=gpus,
        other_pci=other,
        distances=distances,
    )


def grace_hopper() -> FakeMachine:
    """GH200: 1 package, 72 Neoverse cores, no SMT, one L3.

    node 0 = CPUs 0-71 with 480 GiB; node 1 = GPU HBM, memory only (96 GiB, no CPUs);
    nodes 2-8 possible but offline and empty (no directory). Distance 0<->1 is 80.
    One GPU 0009:01:00.0 (device 0x2342) on node 0.
    """
    return FakeMachine(
        nodes={0: _single(0, 72)},
        packages={0: [0]},
        l3_cores=None,
        memory_nodes={0: 480 * GIB, 1: 96 * GIB},
        possible_nodes=tuple(range(9)),
        gpus=(FakeGpu("0009:01:00.0", 0, device=0x2342),),
    )


def grace_hopper_x2() -> FakeMachine:
    """Two GH200 superchips: node 0 = CPUs 0-71 (package 0), node 1 = CPUs 72-143 (package 1).

    Each CPU node has 480 GiB. GPU HBM nodes: node 2 (superchip 0) and node 10 (superchip 1),
    96 GiB each, no CPUs. Possible nodes 0-17; 3-9 and 11-17 are offline and empty.
    GPUs: 0009:01:00.0 on node 0 and 0019:01:00.0 on node 1.
    """
    return FakeMachine(
        nodes={0: _single(0, 72), 1: _single(72, 72)},
        packages={0: [0], 1: [1]},
        l3_cores=None,
        memory_nodes={0: 480 * GIB, 1: 480 * GIB, 2: 96 * GIB, 10: 96 * GIB},
        possible_nodes=tuple(range(18)),
        gpus=(
            FakeGpu("0009:01:00.0", 0, device=0x2342),
            FakeGpu("0019:01:00.0", 1, device=0x2342),
        ),
    )


def cloud_vm_unknown_numa() -> FakeMachine:
    """Cloud VM: 2 nodes x 8 cores SMT2, one package per node, GPUs report numa_node -1.

    node 0 = CPUs 0-7,16-23 (core c is (c, c+16)); node 1 = CPUs 8-15,24-31.
    GPUs (PCI order): 0000:00:04.0 local_cpulist 0-7,16-23 (resolves to node 0);
    0000:00:05.0 local_cpulist 8-15,24-31 (node 1); 0000:00:06.0 and 0000:00:07.0 with
    local_cpulist 0-31 (ambiguous: node unknown, warning). 64 GiB per node.
    """
    return FakeMachine(
        nodes={0: _smt2(0, 8, 16), 1: _smt2(8, 8, 16)},
        packages={0: [0], 1: [1]},
        l3_cores=None,
        memory_nodes={0: 64 * GIB, 1: 64 * GIB},
        gpus=(
            FakeGpu("0000:00:04.0", -1, local_cpus="0-7,16-23"),
            FakeGpu("0000:00:05.0", -1, local_cpus="8-15,24-31"),
            FakeGpu("0000:00:06.0", -1, local_cpus="0-31"),
            FakeGpu("0000:00:07.0", -1, local_cpus="0-31"),
        ),
        other_pci=(FakePci("0000:00:03.0", CLASS_ETHERNET, 0x1AF4, -1, ("ens3",), (), 0x1000),),
    )


def _smt_off_gpus() -> tuple[FakeGpu, ...]:
    return (
        FakeGpu("0000:1b:00.0", 0, device=0x2204),
        FakeGpu("0000:3d:00.0", 0, device=0x2204),
        FakeGpu("0000:89:00.0", 1, device=0x2204),
        FakeGpu("0000:b1:00.0", 1, device=0x2204),
    )


def smt_off() -> FakeMachine:
    """2 nodes x 16 cores, SMT off: node 0 = package 0 = CPUs 0-15, node 1 = 16-31.

    GPUs (workstation cards with HDMI audio functions at .1, which are not GPUs):
    0000:1b:00.0 and 0000:3d:00.0 on node 0, 0000:89:00.0 and 0000:b1:00.0 on node 1.
    64 GiB per node.
    """
    audio = tuple(
        FakePci(g.pci_address[:-1] + "1", CLASS_AUDIO, NVIDIA, g.numa_node, device=0x1AEF)
        for g in _smt_off_gpus()
    )
    return FakeMachine(
        nodes={0: _single(0, 16), 1: _single(16, 16)},
        packages={0: [0], 1: [1]},
        l3_cores=None,
        memory_nodes={0: 64 * GIB, 1: 64 * GIB},
        gpus=_smt_off_gpus(),
        other_pci=audio,
    )


def interleaved() -> FakeMachine:
    """2 nodes x 16 cores SMT2 with interleaved numbering (like many Intel BIOSes).

    node 0 = package 0 = even CPUs 0,2,...,62: core c (0-15) is (2c, 2c+32);
    node 1 = package 1 = odd CPUs 1,3,...,63: core c (0-15) is (2c+1, 2c+33).
    GPUs: 0000:1a:00.0 and 0000:3d:00.0 on node 0, 0000:88:00.0 and 0000:b2:00.0 on node 1.
    64 GiB per node.
    """
    return FakeMachine(
        nodes={
            0: [(2 * c, 2 * c + 32) for c in range(16)],
            1: [(2 * c + 1, 2 * c + 33) for c in range(16)],
        },
        packages={0: [0], 1: [1]},
        l3_cores=None,
        memory_nodes={0: 64 * GIB, 1: 64 * GIB},
        gpus=(
            FakeGpu("0000:1a:00.0", 0),
            FakeGpu("0000:3d:00.0", 0),
            FakeGpu("0000:88:00.0", 1),
            FakeGpu("0000:b2:00.0", 1),
        ),
    )


def offline_cpus() -> FakeMachine:
    """Like :func:`smt_off` (node 0 = CPUs 0-15, node 1 = 16-31, same 4 GPUs, no audio) but
    CPUs 3 and 20 are offline: online is 0-2,4-19,21-31; node 0 cpulist 0-2,4-15, node 1
    16-19,21-31."""
    return FakeMachine(
        nodes={0: _single(0, 16), 1: _single(16, 16)},
        packages={0: [0], 1: [1]},
        l3_cores=None,
        memory_nodes={0: 64 * GIB, 1: 64 * GIB},
        offline_cpus=(3, 20),
        gpus=_smt_off_gpus(),
    )


def uneven_cores() -> FakeMachine:
    """2 nodes x 10 cores SMT2: node 0 = CPUs 0-9,20-29 (core c is (c, c+20)), node 1 =
    10-19,30-39. GPUs 0000:1b:00.0, 0000:3d:00.0, 0000:5e:00.0 on node 0 and 0000:89:00.0 on
    node 1 (exclusive splits node 0's 10 cores 4/3/3). 64 GiB per node."""
    return FakeMachine(
        nodes={0: _smt2(0, 10, 20), 1: _smt2(10, 10, 20)},
        packages={0: [0], 1: [1]},
        l3_cores=None,
        memory_nodes={0: 64 * GIB, 1: 64 * GIB},
        gpus=(
            FakeGpu("0000:1b:00.0", 0),
            FakeGpu("0000:3d:00.0", 0),
            FakeGpu("0000:5e:00.0", 0),
            FakeGpu("0000:89:00.0", 1),
        ),
    )


def crowded_node() -> FakeMachine:
    """No SMT. node 0 = package 0 = CPUs 0-1 (2 cores) with 4 GPUs 0000:1b:00.0,
    0000:3d:00.0, 0000:5e:00.0, 0000:60:00.0; node 1 = package 1 = CPUs 2-9 (8 cores), no GPU.
    Exclusive binding (4 GPUs sharing 2 cores) must refuse.
    32 GiB per node."""
    return FakeMachine(
        nodes={0: _single(0, 2), 1: _single(2, 8)},
        packages={0: [0], 1: [1]},
        l3_cores=None,
        memory_nodes={0: 32 * GIB, 1: 32 * GIB},
        gpus=(
            FakeGpu("0000:1b:00.0", 0),
            FakeGpu("0000:3d:00.0", 0),
            FakeGpu("0000:5e:00.0", 0),
            FakeGpu("0000:60:00.0", 0),
        ),
    )


def no_gpus() -> FakeMachine:
    """2 nodes x 8 cores SMT2, no GPUs: node 0 = CPUs 0-7,16-23 (core c is (c, c+16)),
    node 1 = 8-15,24-31. An Ethernet NIC 0000:01:00.0 (eth0) on node 0. 64 GiB per node."""
    return FakeMachine(
        nodes={0: _smt2(0, 8, 16), 1: _smt2(8, 8, 16)},
        packages={0: [0], 1: [1]},
        l3_cores=None,
        memory_nodes={0: 64 * GIB, 1: 64 * GIB},
        other_pci=(FakePci("0000:01:00.0", CLASS_ETHERNET, INTEL, 0, ("eth0",), (), 0x1563),),
    )


def one_node_small() -> FakeMachine:
    """1 node, 1 package, 2 cores, no SMT (CPUs 0 and 1, like the CI box), 8 GiB.
    One GPU 0000:01:00.0 with numa_node -1 (resolves to node 0: the one-node rule)."""
    return FakeMachine(
        nodes={0: _single(0, 2)},
        packages={0: [0]},
        l3_cores=None,
        memory_nodes={0: 8 * GIB},
        gpus=(FakeGpu("0000:01:00.0", -1),),
    )


def amd_instinct() -> FakeMachine:
    """Not in SHAPES (an extra for vendor tests): 2 nodes x 8 cores SMT2 like :func:`no_gpus`
    (node 0 = 0-7,16-23; node 1 = 8-15,24-31), 4 AMD MI300X (class 0x120000 processing
    accelerator, vendor 0x1002): 0000:05:00.0 and 0000:26:00.0 on node 0, 0000:85:00.0 and
    0000:a6:00.0 on node 1; plus an ASPEED BMC VGA 0000:02:00.0 (not a GPU)."""
    return FakeMachine(
        nodes={0: _smt2(0, 8, 16), 1: _smt2(8, 8, 16)},
        packages={0: [0], 1: [1]},
        l3_cores=4,
        memory_nodes={0: 64 * GIB, 1: 64 * GIB},
        gpus=(
            FakeGpu("0000:05:00.0", 0, AMD, CLASS_ACCEL, 0x74A1),
            FakeGpu("0000:26:00.0", 0, AMD, CLASS_ACCEL, 0x74A1),
            FakeGpu("0000:85:00.0", 1, AMD, CLASS_ACCEL, 0x74A1),
            FakeGpu("0000:a6:00.0", 1, AMD, CLASS_ACCEL, 0x74A1),
        ),
        other_pci=(FakePci("0000:02:00.0", CLASS_VGA, ASPEED, 0, device=0x2000),),
    )


SHAPES: dict[str, Callable[[], FakeMachine]] = {
    "dgx_h100": dgx_h100,
    "dgx_a100": dgx_a100,
    "grace_hopper": grace_hopper,
    "grace_hopper_x2": grace_hopper_x2,
    "cloud_vm_unknown_numa": cloud_vm_unknown_numa,
    "smt_off": smt_off,
    "interleaved": interleaved,
    "offline_cpus": offline_cpus,
    "uneven_cores": uneven_cores,
    "crowded_node": crowded_node,
    "no_gpus": no_gpus,
    "one_node_small": one_node_small,
}


def scratch_dir() -> str:
    """A fresh temporary directory, on tmpfs (/dev/shm) when there is one: a DGX tree is ~7000
    files, and writing them to a busy disk takes seconds. The caller removes it."""
    shm = "/dev/shm"
    where = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None
    return tempfile.mkdtemp(prefix="numarun-sysfs-", dir=where)


@pytest.fixture
def sysfs_root(tmp_path: Path) -> Callable[[FakeMachine], Path]:
    """Factory fixture: ``sysfs_root(dgx_h100())`` writes the tree under a fresh temp dir."""
    counter = iter(range(1_000_000))

    def make(machine: FakeMachine) -> Path:
        return write_sysfs(machine, tmp_path / f"machine{next(counter)}")

    return make


@pytest.fixture(scope="session")
def shape_root() -> Iterator[Callable[[str], Path]]:
    """Session fixture: ``shape_root("dgx_h100")`` is the root of that SHAPES tree, written once
    per test session (on tmpfs when available) and shared: do not modify it."""
    base = Path(scratch_dir())
    roots: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in roots:
            roots[name] = write_sysfs(SHAPES[name](), base / name)
        return roots[name]

    yield get
    shutil.rmtree(base, ignore_errors=True)

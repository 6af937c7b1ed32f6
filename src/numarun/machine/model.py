"""The machine as frozen values, in hwloc's vocabulary.

A machine has packages (sockets); a package has NUMA nodes; a node has core complexes (CPUs
sharing the largest data/unified cache, usually an L3); a complex has physical cores; a core
has logical CPUs (SMT siblings, hwloc's PUs). NUMA nodes may have memory and no CPUs (HBM, CXL,
Grace-Hopper GPU memory), or neither (possible but empty). :func:`numarun.machine.topology.
read_topology` builds them; everything else only reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Cpu:
    """One logical CPU (hwloc PU)."""

    id: int
    core: int  # id of its physical core: the lowest CPU id among its SMT siblings
    package: int  # physical_package_id
    node: int | None  # NUMA node, None when the kernel reports none
    cache: int  # id of its largest-cache group: the lowest CPU id sharing that cache


@dataclass(frozen=True)
class Core:
    """A physical core and its online SMT siblings."""

    id: int  # lowest CPU id among its siblings
    cpus: tuple[int, ...]
    package: int
    node: int | None
    cache: int


@dataclass(frozen=True)
class CacheGroup:
    """CPUs sharing the largest data/unified cache (an L3 complex, or CCX on AMD)."""

    id: int  # lowest CPU id in the group
    level: int
    size_bytes: int | None
    cpus: tuple[int, ...]  # online CPUs sharing it


@dataclass(frozen=True)
class Package:
    """A socket."""

    id: int
    cpus: tuple[int, ...]
    nodes: tuple[int, ...]  # NUMA nodes with CPUs on this package


@dataclass(frozen=True)
class NumaNode:
    """A NUMA node. ``cpus`` is empty for memory-only nodes and for possible-but-empty ones."""

    id: int
    cpus: tuple[int, ...]  # online CPUs of the node
    memory_bytes: int  # MemTotal; 0 for nodes without memory
    # SLIT row, one entry per node of ``Topology.nodes`` in that order; 0 where the kernel gives
    # none (offline nodes, and every entry of an offline node's own row)
    distances: tuple[int, ...]
    package: int | None  # package of its CPUs; None for memory-only nodes
    online: bool = True  # False for possible-but-offline nodes

    @property
    def has_cpus(self) -> bool:
        return bool(self.cpus)


@dataclass(frozen=True)
class Gpu:
    """A GPU as a PCI function, in visible order (``index``) and PCI order (``pci_index``)."""

    index: int  # position among visible GPUs: what local rank ``index`` uses
    pci_index: int  # position among all GPUs in PCI address order (NVML / PCI_BUS_ID index)
    pci_address: str  # "0000:18:00.0", lower case
    vendor: str  # "nvidia", "amd" or "intel"
    numa_node: int | None  # resolved node; None means unknown: local to every allowed CPU
    local_cpus: tuple[int, ...]  # the device's local_cpulist (online CPUs)
    name: str | None = None  # from NVML when available
    uuid: str | None = None  # from NVML when available


@dataclass(frozen=True)
class Nic:
    """A network PCI function (InfiniBand or Ethernet), for display."""

    pci_address: str
    names: tuple[str, ...]  # interface / HCA names (e.g. "mlx5_0", "ib0", "eth0")
    kind: str  # "infiniband" or "ethernet"
    numa_node: int | None


@dataclass(frozen=True)
class Topology:
    """What numarun knows about the machine. Built by :func:`read_topology`."""

    root: str
    online_cpus: tuple[int, ...]
    allowed_cpus: tuple[int, ...]  # online CPUs this process may use (or --cpus-allowed)
    cpus: tuple[Cpu, ...]  # online CPUs, by id
    cores: tuple[Core, ...]  # ordered by id
    caches: tuple[CacheGroup, ...]  # ordered by id
    packages: tuple[Package, ...]  # ordered by id
    nodes: tuple[NumaNode, ...]  # every possible node, ordered by id
    gpus: tuple[Gpu, ...]  # visible GPUs, in visible order
    all_gpus: tuple[Gpu, ...]  # every GPU, in PCI address order
    nics: tuple[Nic, ...]
    gpu_env: tuple[tuple[str, str], ...] = ()  # env the workers need so GPU i is rank i's
    warnings: tuple[str, ...] = field(default=())

"""The machine as frozen values, in hwloc's vocabulary, and :class:`Value`, the immutable record
every numarun value type is built on.

A machine has packages (sockets); a package has NUMA nodes; a node has core complexes (CPUs
sharing the largest data/unified cache, usually an L3); a complex has physical cores; a core
has logical CPUs (SMT siblings, hwloc's PUs). NUMA nodes may have memory and no CPUs (HBM, CXL,
Grace-Hopper GPU memory), or neither (possible but empty). :func:`numarun.machine.topology.
read_topology` builds them; everything else only reads them.
"""

from __future__ import annotations

# `TYPE_CHECKING = False`, not `from typing import TYPE_CHECKING`: the constant type checkers look
# for, without importing typing at run time, which every command's start-up would pay for and
# which the failure path must not import (DESIGN.md, "Start-up and failure-path imports"). Every
# numarun module that guards imports for type checkers uses this idiom, bare.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import TypeVar

    _V = TypeVar("_V", bound="Value")

_set = object.__setattr__  # how a Value's own __init__ fills its slots


class Value:
    """An immutable record: what ``@dataclass(frozen=True)`` gives, without its cost at import
    (the dataclass machinery compiles five methods per class, about a millisecond each class
    on every command's start-up path).

    A subclass names its fields in order in ``_fields``, has them (and any slot computed from
    them, as ``Group.ranks``) as ``__slots__``, and fills them in its own ``__init__`` with
    ``object.__setattr__``. Semantics, as a frozen dataclass's: equal when of the same
    class with equal fields, hashed by its fields, ``repr`` ``Name(field=value, ...)``, any
    assignment or deletion after ``__init__`` raises :class:`AttributeError`; plus
    :meth:`replace` (``dataclasses.replace``) and :meth:`as_dict` (one level of
    ``dataclasses.asdict``), and pickling and copying by fields.
    """

    __slots__ = ()
    _fields: tuple[str, ...] = ()

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable: cannot assign {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable: cannot delete {name!r}")

    def _values(self) -> tuple:
        return tuple([getattr(self, name) for name in self._fields])

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return self._values() == other._values()  # type: ignore[attr-defined]
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__qualname__}({fields})"

    def __reduce__(self) -> tuple:
        return (type(self), self._values())

    def replace(self: _V, **changes: object) -> _V:
        """A copy with ``changes`` (field name -> new value); TypeError for a name that is not
        a field."""
        unknown = sorted(changes.keys() - set(self._fields))
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field {unknown[0]!r}")
        values = {name: getattr(self, name) for name in self._fields}
        values.update(changes)
        return type(self)(**values)

    def as_dict(self) -> dict[str, object]:
        """The fields as a dict (values as they are: nested values stay values)."""
        return {name: getattr(self, name) for name in self._fields}


def fill_fields(record: Value, values: dict[str, object]) -> None:
    """Set every field of ``record`` from ``values``, a mapping with (at least) one entry per
    field: for a record of many fields, whose ``__init__`` takes them as named parameters and
    passes its ``locals()`` here instead of one ``object.__setattr__`` line per field."""
    for name in record._fields:
        _set(record, name, values[name])


class Cpu(Value):
    """One logical CPU (hwloc PU)."""

    _fields = ("id", "core", "package", "node", "cache")
    __slots__ = _fields
    id: int
    core: int  # id of its physical core: the lowest CPU id among its SMT siblings
    package: int  # physical_package_id
    node: int | None  # NUMA node, None when the kernel reports none
    cache: int  # id of its largest-cache group: the lowest CPU id sharing that cache

    def __init__(self, id: int, core: int, package: int, node: int | None, cache: int) -> None:
        _set(self, "id", id)
        _set(self, "core", core)
        _set(self, "package", package)
        _set(self, "node", node)
        _set(self, "cache", cache)


class Core(Value):
    """A physical core and its online SMT siblings."""

    _fields = ("id", "cpus", "package", "node", "cache")
    __slots__ = _fields
    id: int  # lowest CPU id among its siblings
    cpus: tuple[int, ...]
    package: int
    node: int | None
    cache: int

    def __init__(
        self, id: int, cpus: tuple[int, ...], package: int, node: int | None, cache: int
    ) -> None:
        _set(self, "id", id)
        _set(self, "cpus", cpus)
        _set(self, "package", package)
        _set(self, "node", node)
        _set(self, "cache", cache)


class CacheGroup(Value):
    """CPUs sharing the largest data/unified cache (an L3 complex, or CCX on AMD)."""

    _fields = ("id", "level", "size_bytes", "cpus")
    __slots__ = _fields
    id: int  # lowest CPU id in the group
    level: int
    size_bytes: int | None
    cpus: tuple[int, ...]  # online CPUs sharing it

    def __init__(self, id: int, level: int, size_bytes: int | None, cpus: tuple[int, ...]) -> None:
        _set(self, "id", id)
        _set(self, "level", level)
        _set(self, "size_bytes", size_bytes)
        _set(self, "cpus", cpus)


class Package(Value):
    """A socket."""

    _fields = ("id", "cpus", "nodes")
    __slots__ = _fields
    id: int
    cpus: tuple[int, ...]
    nodes: tuple[int, ...]  # NUMA nodes with CPUs on this package

    def __init__(self, id: int, cpus: tuple[int, ...], nodes: tuple[int, ...]) -> None:
        _set(self, "id", id)
        _set(self, "cpus", cpus)
        _set(self, "nodes", nodes)


class NumaNode(Value):
    """A NUMA node. ``cpus`` is empty for memory-only nodes and for possible-but-empty ones."""

    _fields = ("id", "cpus", "memory_bytes", "distances", "package", "online")
    __slots__ = _fields
    id: int
    cpus: tuple[int, ...]  # online CPUs of the node
    memory_bytes: int  # MemTotal; 0 for nodes without memory
    # SLIT row, one entry per node of ``Topology.nodes`` in that order; 0 where the kernel gives
    # none (offline nodes, and every entry of an offline node's own row)
    distances: tuple[int, ...]
    package: int | None  # package of its CPUs; None for memory-only nodes
    online: bool  # False for possible-but-offline nodes

    def __init__(
        self,
        id: int,
        cpus: tuple[int, ...],
        memory_bytes: int,
        distances: tuple[int, ...],
        package: int | None,
        online: bool = True,
    ) -> None:
        _set(self, "id", id)
        _set(self, "cpus", cpus)
        _set(self, "memory_bytes", memory_bytes)
        _set(self, "distances", distances)
        _set(self, "package", package)
        _set(self, "online", online)

    @property
    def has_cpus(self) -> bool:
        return bool(self.cpus)


class Gpu(Value):
    """A GPU as a PCI function, in visible order (``index``) and PCI order (``pci_index``)."""

    _fields = (
        "index", "pci_index", "pci_address", "vendor", "numa_node", "local_cpus", "name", "uuid"
    )  # fmt: skip
    __slots__ = _fields
    index: int  # position among visible GPUs: what local rank ``index`` uses
    pci_index: int  # position among all GPUs in PCI address order (NVML / PCI_BUS_ID index)
    pci_address: str  # "0000:18:00.0", lower case
    vendor: str  # "nvidia", "amd" or "intel"
    numa_node: int | None  # resolved node; None means unknown: local to every allowed CPU
    local_cpus: tuple[int, ...]  # the device's local_cpulist (online CPUs)
    name: str | None  # from NVML when available
    uuid: str | None  # from NVML when available

    def __init__(
        self,
        index: int,
        pci_index: int,
        pci_address: str,
        vendor: str,
        numa_node: int | None,
        local_cpus: tuple[int, ...],
        name: str | None = None,
        uuid: str | None = None,
    ) -> None:
        _set(self, "index", index)
        _set(self, "pci_index", pci_index)
        _set(self, "pci_address", pci_address)
        _set(self, "vendor", vendor)
        _set(self, "numa_node", numa_node)
        _set(self, "local_cpus", local_cpus)
        _set(self, "name", name)
        _set(self, "uuid", uuid)


class Nic(Value):
    """A network PCI function (InfiniBand or Ethernet), for display."""

    _fields = ("pci_address", "names", "kind", "numa_node")
    __slots__ = _fields
    pci_address: str
    names: tuple[str, ...]  # interface / HCA names (e.g. "mlx5_0", "ib0", "eth0")
    kind: str  # "infiniband" or "ethernet"
    numa_node: int | None

    def __init__(
        self, pci_address: str, names: tuple[str, ...], kind: str, numa_node: int | None
    ) -> None:
        _set(self, "pci_address", pci_address)
        _set(self, "names", names)
        _set(self, "kind", kind)
        _set(self, "numa_node", numa_node)


class Topology(Value):
    """What numarun knows about the machine. Built by :func:`read_topology`."""

    _fields = (
        "root", "online_cpus", "allowed_cpus", "cpus", "cores", "caches", "packages", "nodes",
        "gpus", "all_gpus", "nics", "gpu_env", "warnings",
    )  # fmt: skip
    __slots__ = _fields
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
    gpu_env: tuple[tuple[str, str], ...]  # env the workers need so GPU i is rank i's
    warnings: tuple[str, ...]

    def __init__(
        self,
        root: str,
        online_cpus: tuple[int, ...],
        allowed_cpus: tuple[int, ...],
        cpus: tuple[Cpu, ...],
        cores: tuple[Core, ...],
        caches: tuple[CacheGroup, ...],
        packages: tuple[Package, ...],
        nodes: tuple[NumaNode, ...],
        gpus: tuple[Gpu, ...],
        all_gpus: tuple[Gpu, ...],
        nics: tuple[Nic, ...],
        gpu_env: tuple[tuple[str, str], ...] = (),
        warnings: tuple[str, ...] = (),
    ) -> None:
        _set(self, "root", root)
        _set(self, "online_cpus", online_cpus)
        _set(self, "allowed_cpus", allowed_cpus)
        _set(self, "cpus", cpus)
        _set(self, "cores", cores)
        _set(self, "caches", caches)
        _set(self, "packages", packages)
        _set(self, "nodes", nodes)
        _set(self, "gpus", gpus)
        _set(self, "all_gpus", all_gpus)
        _set(self, "nics", nics)
        _set(self, "gpu_env", gpu_env)
        _set(self, "warnings", warnings)

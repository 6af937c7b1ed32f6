"""Pure planning: (Topology, nprocs, mode, options) -> Plan.

No effects: nothing here reads files or changes the process. Most tests live here.

The GPU modes keep the semantics of PyTorch's ``torch.numa.binding.AffinityMode`` so a job
moved from ``torchrun --numa-binding MODE`` gets the same CPUs, with three deliberate
differences: a node without allowed CPUs never crashes ``socket`` (it adds nothing), a GPU
whose NUMA node is unknown is local to every allowed CPU (with a warning) instead of silently
counting as node 0, and every refusal is one line raised before anything starts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from numarun.errors import PlanError, UsageError
from numarun.machine.cpulist import format_cpulist
from numarun.machine.model import Cpu, Gpu, Topology, Value

GPU_MODES = ("node", "socket", "exclusive", "core-complex")
MODES = (*GPU_MODES, "cpu", "explicit")
UNBOUND_MODE = "none"  # Plan.mode when no binding was asked for (mode None)
JSON_VERSION = 1  # plan_to_json's shape; raised when a key changes meaning or goes away
_set = object.__setattr__  # how a Value's __init__ fills its slots


class RankBinding(Value):
    """Where one local rank runs."""

    _fields = ("local_rank", "gpu", "numa_node", "cpus", "mems", "threads", "pci_address")
    __slots__ = _fields
    local_rank: int
    gpu: int | None  # visible GPU index, None in CPU-only modes
    numa_node: int | None  # the node the binding is centred on, None when unknown
    cpus: tuple[int, ...]  # sorted logical CPUs
    mems: tuple[int, ...]  # sorted memory nodes for the memory policy
    threads: int  # suggested thread count: physical cores bound
    pci_address: str | None  # the GPU's PCI address, None without a GPU

    def __init__(
        self,
        local_rank: int,
        gpu: int | None,
        numa_node: int | None,
        cpus: tuple[int, ...],
        mems: tuple[int, ...],
        threads: int,
        pci_address: str | None = None,
    ) -> None:
        _set(self, "local_rank", local_rank)
        _set(self, "gpu", gpu)
        _set(self, "numa_node", numa_node)
        _set(self, "cpus", cpus)
        _set(self, "mems", mems)
        _set(self, "threads", threads)
        _set(self, "pci_address", pci_address)


class Plan(Value):
    """Per-rank bindings plus what every worker's environment needs."""

    _fields = ("mode", "ranks", "bound", "env", "warnings")
    __slots__ = _fields
    mode: str
    ranks: tuple[RankBinding, ...]
    bound: bool  # False when the user allowed fallback and binding was impossible
    env: tuple[tuple[str, str], ...]
    warnings: tuple[str, ...]

    def __init__(
        self,
        mode: str,
        ranks: tuple[RankBinding, ...],
        bound: bool = True,
        env: tuple[tuple[str, str], ...] = (),
        warnings: tuple[str, ...] = (),
    ) -> None:
        _set(self, "mode", mode)
        _set(self, "ranks", ranks)
        _set(self, "bound", bound)
        _set(self, "env", env)
        _set(self, "warnings", warnings)


class _Machine:
    """Lookups built once per plan from a Topology, all restricted to allowed CPUs."""

    __slots__ = ("allowed", "cpu_by_id", "node_cpus", "topology")

    def __init__(
        self,
        topology: Topology,
        allowed: frozenset[int],
        cpu_by_id: dict[int, Cpu],
        node_cpus: dict[int, tuple[int, ...]],  # node id -> its allowed CPUs (every known node)
    ) -> None:
        self.topology = topology
        self.allowed = allowed
        self.cpu_by_id = cpu_by_id
        self.node_cpus = node_cpus


def make_plan(
    topology: Topology,
    nprocs: int,
    mode: str | None,
    *,
    rank_cpus: Sequence[Sequence[int]] | None = None,
    allow_unbound: bool = False,
) -> Plan:
    """Decide each local rank's GPU, CPUs and memory nodes. Pure: reads and changes nothing.

    ``mode`` is one of :data:`MODES`, or None for no binding. Local rank ``i`` uses visible GPU
    ``i`` (``topology.gpus[i]``) in every mode when that GPU exists, else no GPU.

    * ``None``: an unbound plan (``bound=False``, ``mode="none"``): every rank gets all
      allowed CPUs, no memory nodes, no warning of its own. Never raises :class:`PlanError`.
    * ``node``: the allowed CPUs of the GPU's NUMA node; ``mems`` is that node.
    * ``socket``: the allowed CPUs of every NUMA node on the GPU's package (a node's package is
      that of its lowest allowed CPU, as in PyTorch); nodes with no allowed CPUs add nothing.
      ``mems`` is the package's nodes that have allowed CPUs.
    * ``exclusive``: the allowed physical cores of the GPU's node, ordered by their lowest
      allowed CPU, split evenly and contiguously among all visible GPUs of that node in GPU
      order (the lowest GPUs take one extra core when it does not divide); each core brings
      every allowed SMT sibling.
    * ``core-complex``: the node's largest-cache groups restricted to allowed CPUs, ordered by
      most allowed CPUs first, then by cache id (the group's lowest online CPU); the node's
      ``k``-th visible GPU takes group ``k % groups``.
    * A GPU whose node is unknown (``Gpu.numa_node is None``) counts as local to every allowed
      CPU: ``node``/``socket`` give all allowed CPUs, ``exclusive``/``core-complex`` divide all
      allowed CPUs among the unknown-node GPUs; ``numa_node`` is None, ``mems`` empty, and the
      plan carries a warning.
    * ``cpu``: the allowed physical cores, ordered node by node then by lowest CPU, split
      contiguously into ``nprocs`` slices of floor or ceil of cores/nprocs, choosing among those
      splits the one with the fewest ranks straddling two nodes (ties: the lowest ranks get the
      extra core). ``numa_node`` is the rank's node when it has one, ``mems`` its CPUs' nodes.
      GPU locality plays no part: rank ``i`` still gets GPU ``i`` when there is one, and a
      warning names the ranks whose CPUs lie on another node than their GPU.
    * ``explicit``: ``rank_cpus[i]`` is rank ``i``'s CPUs; ``numa_node``/``mems`` follow from
      their nodes. Ranks sharing CPUs get a warning, not an error.

    ``threads`` is the number of distinct physical cores in ``cpus``. ``Plan.env`` is
    ``topology.gpu_env``; ``Plan.warnings`` is ``topology.warnings`` then the planner's own.

    Raises :class:`UsageError` (never swallowed) for: an unknown mode, ``nprocs < 1``,
    ``rank_cpus`` with a mode other than ``explicit`` or ``explicit`` without it, a
    ``rank_cpus`` whose length is not ``nprocs``, an empty or negative CPU entry.
    Raises :class:`PlanError` for: more ranks than visible GPUs in a GPU mode, a GPU node with
    no allowed CPUs in ``node``/``exclusive``/``core-complex`` (or a package with none in
    ``socket``), a node with more GPUs than allowed physical cores in ``exclusive``, more
    ranks than allowed physical cores in ``cpu``, an explicit CPU that is offline or not
    allowed, an empty allowed set. With ``allow_unbound=True`` a :class:`PlanError` instead
    gives an unbound plan (``bound=False``, the requested mode, all allowed CPUs, no memory
    nodes) whose last warning says why binding was dropped.
    """
    if mode is not None and mode not in MODES:
        raise UsageError(f"unknown --numa-binding mode {mode!r}: use one of {', '.join(MODES)}")
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise UsageError(f"the number of ranks must be a positive integer, not {nprocs!r}")
    if rank_cpus is not None and mode != "explicit":
        combined = "no binding mode" if mode is None else f"--numa-binding {mode}"
        raise UsageError(
            f"--rank-cpus gives explicit CPUs; it cannot be combined with {combined} "
            "(use --numa-binding explicit)"
        )
    if mode == "explicit":
        _check_rank_cpus_shape(rank_cpus, nprocs)
    machine = _machine(topology)
    if mode is None:
        return _unbound_plan(machine, nprocs, UNBOUND_MODE, ())
    try:
        ranks, warnings = _bound_ranks(machine, nprocs, mode, rank_cpus)
    except PlanError as error:
        if not allow_unbound:
            raise
        reason = f"NUMA binding ({mode}) disabled, workers inherit the launcher's CPUs: {error}"
        return _unbound_plan(machine, nprocs, mode, (reason,))
    return Plan(
        mode=mode,
        ranks=ranks,
        bound=True,
        env=topology.gpu_env,
        warnings=(*topology.warnings, *warnings),
    )


def plan_to_json(plan: Plan, topology: Topology | None = None) -> dict:
    """The plan as JSON-ready data: a contract other tools read.

    Exactly ``{"version", "mode", "bound", "ranks", "env", "warnings"}`` (``version``: the
    shape's version, :data:`JSON_VERSION`, as the topology's JSON has one); each rank is
    ``{"local_rank", "gpu", "numa_node", "cpus", "mems", "threads", "pci_address"}`` with
    ``cpus``/``mems`` as sorted integer lists, ranks ordered by ``local_rank``. ``gpu``,
    ``numa_node`` and ``pci_address`` are null when absent. ``topology`` (optional) fills
    ``pci_address`` for ranks built without one.
    """
    return {
        "version": JSON_VERSION,
        "mode": plan.mode,
        "bound": plan.bound,
        "ranks": [
            {
                "local_rank": rank.local_rank,
                "gpu": rank.gpu,
                "numa_node": rank.numa_node,
                "cpus": sorted(rank.cpus),
                "mems": sorted(rank.mems),
                "threads": rank.threads,
                "pci_address": _pci_address(rank, topology),
            }
            for rank in sorted(plan.ranks, key=lambda rank: rank.local_rank)
        ],
        "env": dict(plan.env),
        "warnings": list(plan.warnings),
    }


def format_plan_table(plan: Plan, topology: Topology | None = None) -> str:
    """The plan as aligned text for a person: a header line, one row per rank, then warnings.

    Columns: rank, gpu (index and PCI address), node, cpus (kernel ranges like
    ``0-27,112-139``), mems, threads; ``-`` marks an absent value. No trailing newline.
    """
    state = "bound" if plan.bound else "NOT bound"
    lines = [f"numa-binding: {plan.mode} ({state})"]
    header = ("rank", "gpu", "node", "cpus", "mems", "threads")
    rows = [header]
    for rank in sorted(plan.ranks, key=lambda rank: rank.local_rank):
        pci = _pci_address(rank, topology)
        gpu = "-" if rank.gpu is None else str(rank.gpu) + (f" ({pci})" if pci else "")
        rows.append(
            (
                str(rank.local_rank),
                gpu,
                "-" if rank.numa_node is None else str(rank.numa_node),
                format_cpulist(rank.cpus) or "-",
                format_cpulist(rank.mems) or "-",
                str(rank.threads),
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    for row in rows:
        lines.append(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
    lines.extend(f"warning: {warning}" for warning in plan.warnings)
    for key, value in plan.env:
        lines.append(f"env: {key}={value}")
    return "\n".join(lines)


# --- building blocks -------------------------------------------------------------------------


def _machine(topology: Topology) -> _Machine:
    allowed = frozenset(topology.allowed_cpus)
    node_cpus = {
        node.id: tuple(cpu for cpu in node.cpus if cpu in allowed) for node in topology.nodes
    }
    return _Machine(
        topology=topology,
        allowed=allowed,
        cpu_by_id={cpu.id: cpu for cpu in topology.cpus},
        node_cpus=node_cpus,
    )


def _bound_ranks(
    machine: _Machine, nprocs: int, mode: str, rank_cpus: Sequence[Sequence[int]] | None
) -> tuple[tuple[RankBinding, ...], list[str]]:
    if not machine.allowed:
        raise PlanError(
            "no allowed CPUs to bind to (the allowed set is empty): check --cpus-allowed "
            "and this process's CPU affinity"
        )
    if mode == "explicit":
        assert rank_cpus is not None  # checked by _check_rank_cpus_shape
        return _explicit_ranks(machine, rank_cpus)
    if mode == "cpu":
        ranks = _cpu_ranks(machine, nprocs)
        return ranks, _far_from_gpu_warnings(machine, ranks)
    return _gpu_ranks(machine, nprocs, mode)


def _unbound_plan(machine: _Machine, nprocs: int, mode: str, reasons: tuple[str, ...]) -> Plan:
    topology = machine.topology
    cpus = tuple(sorted(machine.allowed))
    threads = _count_cores(machine, cpus)
    ranks = tuple(
        RankBinding(
            local_rank=i,
            gpu=_gpu_index(topology, i),
            numa_node=None,
            cpus=cpus,
            mems=(),
            threads=threads,
            pci_address=topology.gpus[i].pci_address if i < len(topology.gpus) else None,
        )
        for i in range(nprocs)
    )
    return Plan(
        mode=mode,
        ranks=ranks,
        bound=False,
        env=topology.gpu_env,
        warnings=(*topology.warnings, *reasons),
    )


def _binding(
    machine: _Machine,
    local_rank: int,
    cpus: Iterable[int],
    *,
    numa_node: int | None,
    mems: Iterable[int],
) -> RankBinding:
    ordered = tuple(sorted(set(cpus)))
    gpus = machine.topology.gpus
    return RankBinding(
        local_rank=local_rank,
        gpu=_gpu_index(machine.topology, local_rank),
        numa_node=numa_node,
        cpus=ordered,
        mems=tuple(sorted(set(mems))),
        threads=_count_cores(machine, ordered),
        pci_address=gpus[local_rank].pci_address if local_rank < len(gpus) else None,
    )


def _gpu_index(topology: Topology, local_rank: int) -> int | None:
    return local_rank if local_rank < len(topology.gpus) else None


def _count_cores(machine: _Machine, cpus: Iterable[int]) -> int:
    return len({_core_of(machine, cpu) for cpu in cpus})


def _core_of(machine: _Machine, cpu: int) -> int:
    # A CPU the topology does not describe (explicit lists are checked first) is its own core.
    info = machine.cpu_by_id.get(cpu)
    return cpu if info is None else info.core


def _node_of(machine: _Machine, cpu: int) -> int | None:
    info = machine.cpu_by_id.get(cpu)
    return None if info is None else info.node


def _group_by(cpus: Iterable[int], key: Callable[[int], int]) -> list[tuple[int, ...]]:
    """Group CPUs by key; groups come out as sorted tuples in no particular order."""
    groups: dict[int, list[int]] = {}
    for cpu in cpus:
        groups.setdefault(key(cpu), []).append(cpu)
    return [tuple(sorted(group)) for group in groups.values()]


def _physical_cores(machine: _Machine, cpus: Iterable[int]) -> list[tuple[int, ...]]:
    """The allowed CPUs of each physical core touched by ``cpus``, node by node, then by the
    core's lowest allowed CPU (not by core id: numbering need not be linear)."""
    cores = _group_by(cpus, lambda cpu: _core_of(machine, cpu))

    def order(core: tuple[int, ...]) -> tuple[int, int]:
        node = _node_of(machine, core[0])
        return (-1 if node is None else node, core[0])

    return sorted(cores, key=order)


def _describe_gpu(gpu: Gpu) -> str:
    return f"GPU {gpu.index} ({gpu.pci_address})"


# --- GPU modes -------------------------------------------------------------------------------


def _gpu_ranks(
    machine: _Machine, nprocs: int, mode: str
) -> tuple[tuple[RankBinding, ...], list[str]]:
    gpus = machine.topology.gpus
    if not gpus:
        raise PlanError(
            f"--numa-binding {mode} binds ranks to GPUs but there are no visible GPUs: "
            "use --numa-binding cpu, or check CUDA_VISIBLE_DEVICES"
        )
    if nprocs > len(gpus):
        raise PlanError(
            f"{nprocs} ranks but {len(gpus)} visible GPUs: use --nproc-per-node <= {len(gpus)}, "
            "--numa-binding cpu, or check CUDA_VISIBLE_DEVICES"
        )
    choose = {
        "node": _node_mode,
        "socket": _socket_mode,
        "exclusive": _exclusive_mode,
        "core-complex": _core_complex_mode,
    }[mode]
    ranks = tuple(choose(machine, gpus[i]) for i in range(nprocs))
    unknown = [gpu for gpu in gpus[:nprocs] if gpu.numa_node is None]
    warnings = []
    if unknown:
        names = ", ".join(_describe_gpu(gpu) for gpu in unknown)
        warnings.append(
            f"NUMA node unknown for {names}: treated as local to every allowed CPU "
            f"({format_cpulist(machine.allowed)}); check the BIOS/VM's NUMA reporting"
        )
    return ranks, warnings


def _node_cpus_or_refuse(machine: _Machine, gpu: Gpu, mode: str) -> tuple[int, ...]:
    """The allowed CPUs of a GPU's known node; PlanError when there are none."""
    node = gpu.numa_node
    assert node is not None
    cpus = machine.node_cpus.get(node, ())
    if cpus:
        return cpus
    has_any = any(n.id == node and n.cpus for n in machine.topology.nodes)
    why = "none of its CPUs is allowed" if has_any else "it has no CPUs"
    raise PlanError(
        f"{_describe_gpu(gpu)} is on NUMA node {node} but {why} "
        f"(allowed: {format_cpulist(machine.allowed)}): allow that node's CPUs, use "
        f"--numa-binding {'socket' if mode != 'socket' else 'cpu'}, or --binding-fallback"
    )


def _node_mode(machine: _Machine, gpu: Gpu) -> RankBinding:
    if gpu.numa_node is None:
        return _binding(machine, gpu.index, machine.allowed, numa_node=None, mems=())
    cpus = _node_cpus_or_refuse(machine, gpu, "node")
    return _binding(machine, gpu.index, cpus, numa_node=gpu.numa_node, mems=(gpu.numa_node,))


def _socket_of_node(machine: _Machine, node: int) -> int | None:
    # PyTorch takes a node's socket from its lowest allowed CPU; a node with no allowed CPU
    # falls back to the package the topology records (None for memory-only nodes).
    cpus = machine.node_cpus.get(node, ())
    if cpus:
        return machine.cpu_by_id[cpus[0]].package
    for info in machine.topology.nodes:
        if info.id == node:
            return info.package
    return None


def _socket_mode(machine: _Machine, gpu: Gpu) -> RankBinding:
    if gpu.numa_node is None:
        return _binding(machine, gpu.index, machine.allowed, numa_node=None, mems=())
    package = _socket_of_node(machine, gpu.numa_node)
    if package is None:
        _node_cpus_or_refuse(machine, gpu, "socket")  # raises: the node has no CPUs
    nodes = [
        node
        for node, cpus in machine.node_cpus.items()
        if cpus and machine.cpu_by_id[cpus[0]].package == package
    ]
    cpus = [cpu for node in nodes for cpu in machine.node_cpus[node]]
    if not cpus:
        raise PlanError(
            f"{_describe_gpu(gpu)} is on package {package}, which has no allowed CPUs "
            f"(allowed: {format_cpulist(machine.allowed)}): allow that package's CPUs, use "
            "--numa-binding cpu, or --binding-fallback"
        )
    return _binding(machine, gpu.index, cpus, numa_node=gpu.numa_node, mems=nodes)


def _peer_gpus(machine: _Machine, gpu: Gpu) -> list[Gpu]:
    """Visible GPUs sharing ``gpu``'s node (unknown counts as one shared node), in GPU order."""
    return [other for other in machine.topology.gpus if other.numa_node == gpu.numa_node]


def _local_cpus(machine: _Machine, gpu: Gpu, mode: str) -> tuple[int, ...]:
    if gpu.numa_node is None:
        return tuple(sorted(machine.allowed))
    return _node_cpus_or_refuse(machine, gpu, mode)


def _exclusive_mode(machine: _Machine, gpu: Gpu) -> RankBinding:
    cpus = _local_cpus(machine, gpu, "exclusive")
    cores = _physical_cores(machine, cpus)
    peers = _peer_gpus(machine, gpu)
    where = "all allowed CPUs" if gpu.numa_node is None else f"NUMA node {gpu.numa_node}"
    if len(cores) < len(peers):
        raise PlanError(
            f"--numa-binding exclusive: {where} has {len(cores)} allowed physical cores for "
            f"{len(peers)} GPUs ({', '.join(str(peer.index) for peer in peers)}): use "
            "--numa-binding node or core-complex, or allow more CPUs"
        )
    start, end = _even_slice(len(cores), len(peers), peers.index(gpu))
    chosen = [cpu for core in cores[start:end] for cpu in core]
    node = gpu.numa_node
    return _binding(machine, gpu.index, chosen, numa_node=node, mems=_own_node(node))


def _own_node(node: int | None) -> tuple[int, ...]:
    return () if node is None else (node,)


def _even_slice(items: int, parts: int, part: int) -> tuple[int, int]:
    """[start, end) of ``part`` when ``items`` split contiguously, lowest parts larger."""
    size, extra = divmod(items, parts)
    start = part * size + min(part, extra)
    return start, start + size + (1 if part < extra else 0)


def _core_complex_mode(machine: _Machine, gpu: Gpu) -> RankBinding:
    cpus = _local_cpus(machine, gpu, "core-complex")
    groups = _group_by(cpus, lambda cpu: machine.cpu_by_id[cpu].cache)
    # Ties go to the lower cache id (its lowest online CPU), as in PyTorch.
    groups.sort(key=lambda group: (-len(group), machine.cpu_by_id[group[0]].cache))
    peers = _peer_gpus(machine, gpu)
    chosen = groups[peers.index(gpu) % len(groups)]
    node = gpu.numa_node
    return _binding(machine, gpu.index, chosen, numa_node=node, mems=_own_node(node))


# --- cpu mode --------------------------------------------------------------------------------


def _cpu_ranks(machine: _Machine, nprocs: int) -> tuple[RankBinding, ...]:
    cores = _physical_cores(machine, machine.allowed)
    if nprocs > len(cores):
        raise PlanError(
            f"--numa-binding cpu: {nprocs} ranks but only {len(cores)} allowed physical cores: "
            f"use --nproc-per-node <= {len(cores)} or allow more CPUs"
        )
    core_nodes = [_node_of(machine, core[0]) for core in cores]
    sizes = _aligned_sizes(core_nodes, nprocs)
    ranks = []
    start = 0
    for local_rank, size in enumerate(sizes):
        chosen = cores[start : start + size]
        nodes = {core_nodes[start + k] for k in range(size)}
        start += size
        known = sorted(node for node in nodes if node is not None)
        ranks.append(
            _binding(
                machine,
                local_rank,
                (cpu for core in chosen for cpu in core),
                numa_node=known[0] if len(nodes) == 1 and known else None,
                mems=known,
            )
        )
    return tuple(ranks)


def _far_from_gpu_warnings(machine: _Machine, ranks: Sequence[RankBinding]) -> list[str]:
    """``cpu`` mode splits the cores without regard to GPUs, yet local rank ``i`` still gets
    GPU ``i`` (``LOCAL_RANK`` names it): one warning naming the ranks whose CPUs lie on
    another NUMA node than that GPU, if any."""
    gpus = machine.topology.gpus
    far = []
    for rank in ranks:
        if rank.gpu is None or gpus[rank.gpu].numa_node is None:
            continue
        nodes = {_node_of(machine, cpu) for cpu in rank.cpus}
        if gpus[rank.gpu].numa_node not in nodes:
            far.append(rank)
    if not far:
        return []
    first = far[0]
    where = format_cpulist({_node_of(machine, cpu) for cpu in first.cpus} - {None})
    return [
        f"--numa-binding cpu splits the cores without regard to GPUs: rank"
        f"{'s' if len(far) > 1 else ''} {format_cpulist(r.local_rank for r in far)} run on "
        f"another NUMA node than the GPU of the same index (rank {first.local_rank}: GPU "
        f"{first.gpu} on node {gpus[first.gpu].numa_node}, CPUs on node {where}); for GPU "
        "jobs use --numa-binding node, socket, exclusive or core-complex"
    ]


def _aligned_sizes(core_nodes: Sequence[int | None], nprocs: int) -> list[int]:
    """Slice sizes (floor or ceil of cores/nprocs, in rank order) that minimise the number of
    slices spanning two nodes; among equals, the lowest ranks take the extra cores.

    Nodes form contiguous runs in ``core_nodes``, so a slice straddles exactly when its first
    and last core differ in node. best[i][e]: fewest straddles for ranks i.. given that the
    earlier ranks used e extra cores (rank i starts at core i*size + e).
    """
    size, extra = divmod(len(core_nodes), nprocs)

    def straddles(start: int, length: int) -> int:
        return int(core_nodes[start] != core_nodes[start + length - 1])

    impossible = nprocs + 1
    best = [[impossible] * (extra + 1) for _ in range(nprocs + 1)]
    best[nprocs][extra] = 0
    for i in range(nprocs - 1, -1, -1):
        for used in range(extra + 1):
            start = i * size + used
            plain = best[i + 1][used] + straddles(start, size)
            bigger = (
                best[i + 1][used + 1] + straddles(start, size + 1) if used < extra else impossible
            )
            best[i][used] = min(plain, bigger)
    sizes = []
    used = 0
    for i in range(nprocs):
        start = i * size + used
        if used < extra and best[i][used] == best[i + 1][used + 1] + straddles(start, size + 1):
            sizes.append(size + 1)
            used += 1
        else:
            sizes.append(size)
    return sizes


# --- explicit mode ---------------------------------------------------------------------------


def _check_rank_cpus_shape(rank_cpus: Sequence[Sequence[int]] | None, nprocs: int) -> None:
    if rank_cpus is None:
        raise UsageError("--numa-binding explicit needs one --rank-cpus LIST per rank")
    if len(rank_cpus) != nprocs:
        raise UsageError(
            f"--rank-cpus given {len(rank_cpus)} times for {nprocs} ranks: give exactly one "
            "CPU list per rank"
        )
    for local_rank, cpus in enumerate(rank_cpus):
        if len(cpus) == 0:
            raise UsageError(f"--rank-cpus for rank {local_rank} is empty: give at least one CPU")
        bad = [cpu for cpu in cpus if isinstance(cpu, bool) or not isinstance(cpu, int) or cpu < 0]
        if bad:
            raise UsageError(
                f"--rank-cpus for rank {local_rank} has invalid CPU numbers {bad}: "
                "use non-negative integers"
            )


def _explicit_ranks(
    machine: _Machine, rank_cpus: Sequence[Sequence[int]]
) -> tuple[tuple[RankBinding, ...], list[str]]:
    ranks = []
    for local_rank, cpus in enumerate(rank_cpus):
        outside = sorted(set(cpus) - machine.allowed)
        if outside:
            which = "CPUs" if len(outside) > 1 else "CPU"
            verb = "are" if len(outside) > 1 else "is"
            raise PlanError(
                f"--rank-cpus for rank {local_rank}: {which} {format_cpulist(outside)} {verb} "
                f"offline or not allowed (allowed: {format_cpulist(machine.allowed)})"
            )
        nodes = {_node_of(machine, cpu) for cpu in cpus}
        known = sorted(node for node in nodes if node is not None)
        ranks.append(
            _binding(
                machine,
                local_rank,
                cpus,
                numa_node=known[0] if len(nodes) == 1 and known else None,
                mems=known,
            )
        )
    return tuple(ranks), _overlap_warnings(ranks)


def _overlap_warnings(ranks: Sequence[RankBinding]) -> list[str]:
    warnings = []
    for i, first in enumerate(ranks):
        for second in ranks[i + 1 :]:
            shared = set(first.cpus) & set(second.cpus)
            if shared:
                warnings.append(
                    f"ranks {first.local_rank} and {second.local_rank} share CPUs "
                    f"{format_cpulist(shared)}"
                )
    return warnings


def _pci_address(rank: RankBinding, topology: Topology | None) -> str | None:
    if rank.pci_address is not None or rank.gpu is None or topology is None:
        return rank.pci_address
    return topology.gpus[rank.gpu].pci_address if rank.gpu < len(topology.gpus) else None

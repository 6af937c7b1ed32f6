"""What ``numarun plan`` and ``numarun check`` choose for this machine when not told.

:func:`plan_defaults`: without ``--numa-binding`` or ``--nproc-per-node``, with visible GPUs one
rank per GPU in ``exclusive`` mode (``node`` when a node has more GPUs than allowed cores);
without, ``cpu`` mode with one rank per NUMA node that has allowed CPUs; and the note that says
so. :func:`requested_mode`: ``--numa-binding`` and ``--rank-cpus`` checked together, before the
machine is read. Pure: a function of the :class:`~numarun.machine.model.Topology` and the flags
given.
"""

from __future__ import annotations

from numarun.errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from numarun.machine.model import Topology


def requested_mode(
    mode: str | None, rank_cpus: Sequence[str] | None
) -> tuple[str | None, list[tuple[int, ...]] | None]:
    """(mode, each rank's CPUs) from ``--numa-binding`` and the ``--rank-cpus`` lists given:
    ``--rank-cpus`` implies ``explicit`` (any other mode with it: :class:`UsageError`), and
    ``explicit`` needs them; an unknown mode is a :class:`UsageError` naming the closest. The
    mode is None when not given (:func:`plan_defaults` chooses it)."""
    from numarun.machine.cpulist import parse_cpulist
    from numarun.placement.plan import MODES

    cpus = None
    if rank_cpus is not None:
        if mode not in (None, "explicit"):
            raise UsageError(
                f"--rank-cpus gives explicit CPUs; it cannot be combined with --numa-binding {mode}"
            )
        mode = "explicit"
        cpus = [parse_cpulist(text) for text in rank_cpus]
    if mode is not None and mode not in MODES:
        from numarun.errors import unknown_choice

        raise UsageError(unknown_choice("--numa-binding", mode, MODES))
    if mode == "explicit" and cpus is None:
        raise UsageError("--numa-binding explicit needs one --rank-cpus LIST per rank")
    return mode, cpus


def _nprocs(text: str, topo: Topology) -> int:
    if text == "gpu":
        if not topo.gpus:
            raise UsageError("--nproc-per-node gpu: no visible GPUs on this machine")
        return len(topo.gpus)
    try:
        value = int(text)
    except ValueError:
        raise UsageError(
            f"--nproc-per-node must be a positive integer or 'gpu', not {text!r}"
        ) from None
    if value < 1:
        raise UsageError(f"--nproc-per-node must be at least 1, not {value}")
    return value


def plan_defaults(
    topo: Topology, mode: str | None, nproc_text: str | None, rank_cpus: list | None
) -> tuple[int, str, str | None]:
    """(ranks, mode, a note saying what was chosen and why, or None) for ``numarun plan`` and
    ``numarun check``.

    Whatever is not given is chosen for this machine: with visible GPUs one rank per GPU in
    ``exclusive`` mode (``node`` when a node has more GPUs than allowed cores); without, in
    ``cpu`` mode, one rank per NUMA node with allowed CPUs. A GPU mode without
    ``--nproc-per-node`` has one rank per visible GPU, ``cpu`` one per such node."""
    from numarun.placement.plan import GPU_MODES

    chosen = []
    why = []
    if rank_cpus is not None:
        nprocs = len(rank_cpus) if nproc_text is None else _nprocs(nproc_text, topo)
        return nprocs, "explicit", None
    if nproc_text is not None:
        nprocs = _nprocs(nproc_text, topo)
    if mode is None:
        if topo.gpus and (nproc_text is None or nprocs <= len(topo.gpus)):
            mode = "exclusive" if _exclusive_fits(topo) else "node"
            why.append(
                f"{len(topo.gpus)} visible GPU{'s' if len(topo.gpus) != 1 else ''}"
                + ("" if mode == "exclusive" else ", a node with more GPUs than cores")
            )
        else:
            mode = "cpu"
            why.append("no visible GPUs" if not topo.gpus else "more ranks than GPUs")
        chosen.append(f"--numa-binding {mode}")
    if nproc_text is None:
        if mode in GPU_MODES:
            nprocs = _nprocs("gpu", topo)  # as before --numa-binding had a default: no note
            if chosen:
                why.append("one rank per GPU")
                chosen.insert(0, f"--nproc-per-node {nprocs}")
        else:
            nodes = [node for node in topo.nodes if set(node.cpus) & set(topo.allowed_cpus)]
            nprocs = max(1, len(nodes))
            why.append("one rank per NUMA node with allowed CPUs")
            chosen.insert(0, f"--nproc-per-node {nprocs}")
    note = None
    if chosen:
        note = f"planned with {' '.join(chosen)} for this machine ({', '.join(why)})"
    return nprocs, mode, note


def _exclusive_fits(topo: Topology) -> bool:
    """Whether ``exclusive`` can give each visible GPU at least one core of its node."""
    allowed = set(topo.allowed_cpus)
    for node in {gpu.numa_node for gpu in topo.gpus}:
        gpus = sum(1 for gpu in topo.gpus if gpu.numa_node == node)
        cores = {
            cpu.core
            for cpu in topo.cpus
            if cpu.id in allowed and (node is None or cpu.node == node)
        }
        if len(cores) < gpus:
            return False
    return True

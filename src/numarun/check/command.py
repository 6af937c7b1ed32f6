"""``numarun check``, the launcher's side: a real launch of the probe, and its results collected.

:func:`run_check` turns the binding flags into the argv of a job whose entry point is
``-m numarun.check.probe`` and parses it with the launcher's own
:func:`numarun.cmdline.config.parse_args` (same checks, same ``PET_*`` defaults for the binding
flags, same one-line errors), plans with :func:`numarun.launch.launcher.make_plan`, writes the
probe's instructions (:func:`instructions`) into a private temporary directory, and runs the job
with :func:`numarun.launch.launcher.run`: the supervisor starts every rank bound at birth,
exactly as it starts a training script. Each rank leaves ``rank<N>.json`` there;
:mod:`numarun.check.verdict` judges them. The directory is removed at the end.

The farthest node (:func:`far_nodes`) is chosen among the NUMA nodes that have both CPUs and
memory (ordinary DRAM nodes; memory-only nodes such as HBM, CXL or a Grace Hopper GPU's memory
are left out), by the kernel's distance table, lowest id on a tie, within the launcher's
``Mems_allowed``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from numarun.errors import NumarunError, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from numarun.cmdline.config import LaunchConfig
    from numarun.machine.model import Topology
    from numarun.placement.plan import Plan

PROBE_MODULE = "numarun.check.probe"
DEFAULT_SECONDS = 60.0
DEFAULT_BUFFER_MIB = 256
# The longest a rank waits for the others at the start of a phase (setting up a phase can take
# seconds on a loaded machine: touching buffers, a CUDA context).
BARRIER_TIMEOUT = 120.0
# PET_* variables the check honours, as a job would: the binding flags' only.
_BINDING_PET = (
    "PET_NPROC_PER_NODE",
    "PET_NUMA_BINDING",
    "PET_MEM_BINDING",
    "PET_BINDING_FALLBACK",
    "PET_CPUS_ALLOWED",
)


def launch_argv(
    *,
    nproc_per_node: str | None = None,
    numa_binding: str | None = None,
    rank_cpus: Sequence[str] | None = None,
    mem_binding: str | None = None,
    binding_fallback: bool = False,
    cpus_allowed: str | None = None,
    sysfs_root: str | None = None,
    dry_run: bool = False,
) -> list[str]:
    """The argv of the job ``numarun check`` runs: these binding flags, then the probe."""
    argv: list[str] = []
    for flag, value in (
        ("--nproc-per-node", nproc_per_node),
        ("--numa-binding", numa_binding),
        ("--mem-binding", mem_binding),
        ("--cpus-allowed", cpus_allowed),
        ("--sysfs-root", sysfs_root),
    ):
        if value is not None:
            argv += [flag, value]
    for cpus in rank_cpus or ():
        argv += ["--rank-cpus", cpus]
    if binding_fallback:
        argv.append("--binding-fallback")
    if dry_run:
        argv.append("--dry-run")
    return [*argv, "-m", PROBE_MODULE]


class CheckStopped(NumarunError):
    """A teardown signal (Ctrl-C, SIGTERM, SIGHUP) ended the probes' job: no report;
    :attr:`exit_code` is the launcher's, 128+N."""


def machine_defaults(
    *, sysfs_root: str | None, cpus_allowed: str | None, environ: Mapping[str, str] | None = None
) -> tuple[str, str, str] | None:
    """(``--nproc-per-node``, ``--numa-binding``, the note saying why) that ``numarun plan``
    would choose for this machine (:func:`numarun.placement.defaults.plan_defaults`), for a
    check given neither (nor their ``PET_*`` variables); None when one of them is given."""
    env = os.environ if environ is None else environ
    if env.get("PET_NPROC_PER_NODE") or env.get("PET_NUMA_BINDING"):
        return None
    from numarun.machine.topology import read_topology
    from numarun.placement.defaults import plan_defaults

    topology = read_topology(sysfs_root or "/", cpus_allowed=cpus_allowed)
    nprocs, mode, note = plan_defaults(topology, None, None, None)
    return str(nprocs), mode, note or ""


def chosen_binding(
    nproc_per_node: str | None,
    numa_binding: str | None,
    rank_cpus: Sequence[str] | None,
    *,
    sysfs_root: str | None,
    cpus_allowed: str | None,
) -> tuple[str | None, str | None, str | None]:
    """(``--nproc-per-node``, ``--numa-binding``, a note or None) for the check: as given, or,
    given none of them nor ``--rank-cpus``, what ``numarun plan`` chooses for this machine
    (:func:`machine_defaults`) and the note saying so."""
    if nproc_per_node is None and numa_binding is None and rank_cpus is None:
        chosen = machine_defaults(sysfs_root=sysfs_root, cpus_allowed=cpus_allowed)
        if chosen is not None:
            return chosen
    return nproc_per_node, numa_binding, None


def run_check(
    argv: Sequence[str],
    *,
    seconds: float = DEFAULT_SECONDS,
    buffer_mib: int = DEFAULT_BUFFER_MIB,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Run ``numarun check`` for the job ``argv`` (see :func:`launch_argv`); return the report
    document (:func:`numarun.check.verdict.build_document`), whose ``exit_code`` is 0 when
    every rank was bound as planned and 1 when not (a rank without a result counts as not), or
    when the probes' job failed (its summary is on stderr, as for any job).

    ``argv`` with ``--dry-run`` starts nothing: the document holds the plan, each rank's home
    and farthest nodes and the phases that would run (``--sysfs-root`` needs it, as for a job).
    ``seconds`` is the measuring time, shared by the phases; ``buffer_mib`` each copy buffer's
    size, lowered so that every rank's buffers fit in half of ``MemAvailable``.

    Raises :class:`numarun.errors.NumarunError` (one line, nothing started) for bad input, an
    impossible plan or memory policy, as the launcher does; :class:`CheckStopped` when a
    teardown signal ended the probes' job (its exit status 128+N, no document).
    """
    from numarun.check import verdict
    from numarun.cmdline.config import parse_args
    from numarun.launch import launcher
    from numarun.machine.topology import read_topology

    if not 0 < seconds < 86400:
        raise UsageError(f"--seconds must be a number of seconds > 0 (under a day), not {seconds}")
    env = dict(os.environ if environ is None else environ)
    launch_env = {k: v for k, v in env.items() if not k.startswith("PET_") or k in _BINDING_PET}
    config = parse_args(argv, launch_env)
    topology = read_topology(config.sysfs_root, cpus_allowed=config.cpus_allowed)
    plan = launcher.make_plan(config, topology)
    real = not config.dry_run
    check_buffer_mib(buffer_mib, topology, real=real)
    planned = planned_ranks(config, topology, plan, real=real)
    allowed = _mems_allowed() if real else None
    far_of = far_nodes(topology, allowed)
    buffer_bytes, lowered = _buffer_bytes(buffer_mib, config.nproc_per_node, real=real)
    phases = _phases(planned, far_of)
    settings = {
        "nproc_per_node": config.nproc_per_node,
        "numa_binding": config.numa_binding,
        "mem_binding": config.mem_binding,
        "plan_bound": plan is not None and plan.bound,
        "seconds": seconds,
        "buffer_mib": buffer_bytes >> 20,
        "buffer_lowered": lowered,
        "dry_run": config.dry_run,
    }
    machine = _machine_facts(topology, far_of)
    if config.dry_run:
        return verdict.build_document(settings, machine, planned, None, phases, far_of)
    document = instructions(planned, far_of, phases, seconds, buffer_bytes)
    directory = tempfile.mkdtemp(prefix="numarun-check-")
    try:
        import json

        with open(os.path.join(directory, "check.json"), "w", encoding="utf-8") as out:
            json.dump(document, out)
        code = launcher.run(config, {**env, "NUMARUN_CHECK_DIR": directory})
        stopped = {128 + int(signum): signum for signum in config.teardown_signals}
        if code in stopped:
            import signal

            stopping = CheckStopped(
                f"the check was stopped by {signal.Signals(stopped[code]).name}; no report"
            )
            stopping.exit_code = code
            raise stopping
        results = [_read_result(directory, rank) for rank in range(config.nproc_per_node)]
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return verdict.build_document(
        settings, machine, planned, results, phases, far_of, launch_code=code
    )


def planned_ranks(
    config: LaunchConfig, topology: Topology, plan: Plan | None, *, real: bool
) -> list[dict[str, Any]]:
    """What each local rank should get: ``cpus``, ``mems``, the memory policy it should find
    in force (``policy``: get_mempolicy's mode name and nodes), ``home`` (the node its memory
    should be on; None when the plan does not say), ``local_nodes`` (where its pages count as
    local: its memory nodes, else its CPUs' nodes), ``gpu`` and ``pci_address``.

    Without a bound plan a rank inherits the launcher's CPUs (``real``: this process's affinity;
    else the topology's allowed CPUs) and memory policy.
    """
    from numarun.placement import binding
    from numarun.placement.plan import make_plan

    unbound = plan is None or not plan.bound
    if plan is None:
        # The launcher binds nothing; the planner still says which GPU rank i uses.
        plan = make_plan(topology, config.nproc_per_node, None)
    inherited_cpus = sorted(os.sched_getaffinity(0)) if real else list(topology.allowed_cpus)
    inherited_policy = _own_policy() if real else {"mode": "default", "nodes": []}
    node_of = {cpu.id: cpu.node for cpu in topology.cpus}
    ranks = []
    for rank in plan.ranks:
        cpus = inherited_cpus if unbound else list(rank.cpus)
        mems = [] if unbound else list(rank.mems)
        policy = None if unbound else binding.mem_policy_for(config.mem_binding, rank.mems)
        home = None
        if not unbound:
            home = rank.numa_node if rank.numa_node is not None else _only(mems)
        cpu_nodes = sorted({node_of[c] for c in cpus if node_of.get(c) is not None})
        ranks.append(
            {
                "local_rank": rank.local_rank,
                "rank": config.global_rank(rank.local_rank),
                "cpus": cpus,
                "mems": mems,
                "policy": inherited_policy if policy is None else kernel_policy(policy),
                "home": home,
                "local_nodes": mems or cpu_nodes,
                "gpu": rank.gpu,
                "pci_address": rank.pci_address,
            }
        )
    return ranks


def kernel_policy(policy: Any) -> dict[str, Any]:
    """A :class:`numarun.placement.binding.MemPolicy` as ``get_mempolicy(2)`` reports it once
    applied: ``preferred`` over several nodes is the kernel's ``preferred_many``."""
    mode = policy.mode
    if mode == "preferred" and len(policy.nodes) > 1:
        mode = "preferred_many"
    return {"mode": mode, "nodes": sorted(policy.nodes)}


def far_nodes(topology: Topology, allowed: Sequence[int] | None = None) -> dict[int, int | None]:
    """For each NUMA node with CPUs and memory (and in ``allowed``, when given): the farthest
    other such node by the kernel's distances (lowest id among the farthest), or None when it
    is the only one."""
    candidates = [
        node.id
        for node in topology.nodes
        if node.online
        and node.cpus
        and node.memory_bytes > 0
        and (allowed is None or node.id in allowed)
    ]
    position = {node.id: i for i, node in enumerate(topology.nodes)}
    far: dict[int, int | None] = {}
    for node in candidates:
        row = topology.nodes[position[node]].distances
        others = [other for other in candidates if other != node]
        far[node] = max(others, key=lambda other: (row[position[other]], -other), default=None)
    return far


def instructions(
    planned: Sequence[Mapping[str, Any]],
    far_of: Mapping[int, int | None],
    phases: Sequence[str],
    seconds: float,
    buffer_bytes: int,
) -> dict[str, Any]:
    """The probe's ``check.json``: what every rank measures and for how long."""
    return {
        "nprocs": len(planned),
        "phases": list(phases),
        "phase_seconds": seconds / max(1, len(phases)),
        "buffer_bytes": buffer_bytes,
        "barrier_timeout": BARRIER_TIMEOUT,
        "far_of": {str(node): far for node, far in far_of.items()},
        "ranks": [{"home": rank["home"], "gpu": rank["gpu"]} for rank in planned],
    }


def _phases(planned: Sequence[Mapping[str, Any]], far_of: Mapping[int, int | None]) -> list[str]:
    """The phases every rank goes through, in order; the far ones only where a far node exists,
    the copy ones only where a rank has a GPU and torch is installed."""
    import importlib.util

    far = any(node is not None for node in far_of.values())
    phases = ["memory-local", *(["memory-far"] if far else [])]
    if any(rank["gpu"] is not None for rank in planned) and importlib.util.find_spec("torch"):
        for kind in ("h2d", "d2h"):
            phases += [f"{kind}-planned", *([f"{kind}-far"] if far else [])]
    return phases


def _machine_facts(topology: Topology, far_of: Mapping[int, int | None]) -> dict[str, Any]:
    import importlib.util

    return {
        "numa_nodes": [node.id for node in topology.nodes if node.online],
        "cpu_memory_nodes": sorted(far_of),
        "gpus": len(topology.gpus),
        "torch": importlib.util.find_spec("torch") is not None,
    }


def check_buffer_mib(buffer_mib: int, topology: Topology, *, real: bool) -> None:
    """Raise :class:`UsageError` (one line) for a copy buffer under 1 MiB or larger than the
    machine's memory (``topology``'s NUMA nodes' ``MemTotal``, else ``/proc/meminfo``'s when
    ``real``, this machine): a unit slip (bytes for MiB) that no lowering makes sense of. One
    that fits the machine but not the memory available now is lowered (:func:`_buffer_bytes`)."""
    if buffer_mib < 1:
        raise UsageError(f"--buffer-mib must be at least 1, not {buffer_mib}")
    total = sum(node.memory_bytes for node in topology.nodes)
    if not total and real:
        total = _meminfo("MemTotal:") or 0
    if total and buffer_mib << 20 > total:
        raise UsageError(
            f"--buffer-mib {buffer_mib} is more than this machine's memory ({total >> 20} MiB "
            f"in all): give at most {total >> 20}; a size that does not fit in the memory "
            "available now is lowered to fit"
        )


def _buffer_bytes(buffer_mib: int, nprocs: int, *, real: bool) -> tuple[int, bool]:
    """Each copy buffer's size: ``buffer_mib``, lowered (to a whole MiB, at least 1) so that
    every rank's buffers (two at a time, plus the placed one) fit in half of MemAvailable."""
    wanted = buffer_mib << 20
    available = _mem_available() if real else None
    if available is None:
        return wanted, False
    fitting = (available // 2 // max(1, nprocs) - (64 << 20)) // 2 >> 20 << 20
    if wanted <= fitting:
        return wanted, False
    return max(1 << 20, fitting), True


def _mem_available() -> int | None:
    return _meminfo("MemAvailable:")


def _meminfo(field: str) -> int | None:
    """``/proc/meminfo``'s ``field`` (``"MemAvailable:"``) in bytes; None where unreadable."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _mems_allowed() -> tuple[int, ...] | None:
    from numarun.check.memory import mems_allowed

    return mems_allowed()


def _own_policy() -> dict[str, Any]:
    """This process's memory policy, which a worker without one of its own inherits."""
    from numarun.errors import BindingError
    from numarun.placement.binding import get_mem_policy

    try:
        mode, nodes = get_mem_policy()
    except (OSError, BindingError) as error:
        return {"error": str(error)}
    return {"mode": mode, "nodes": list(nodes)}


def _only(values: Sequence[int]) -> int | None:
    return values[0] if len(values) == 1 else None


def _read_result(directory: str, local_rank: int) -> dict[str, Any] | None:
    import json

    path = os.path.join(directory, f"rank{local_rank}.json")
    try:
        with open(path, encoding="utf-8") as source:
            return json.load(source)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        print(f"numarun: warning: rank {local_rank}'s result is unreadable: {error}",
              file=sys.stderr)  # fmt: skip
        return None

"""Where each spawned rank goes and what environment it gets: ``binding=`` / ``mem_binding=``
turned into checked per-rank CPUs and memory policies (through the planner), and each rank's
environment: the caller's, as under ``torch.multiprocessing.spawn``, plus only what the caller
asked for (``OMP_NUM_THREADS`` and the plan's variables with a binding; ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ... with ``dist_env=True``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from numarun.errors import InvalidArgument, NumarunError, unknown_choice
from numarun.machine.model import Value
from numarun.placement import workerenv
from numarun.spawning.exceptions import warn

TYPE_CHECKING = False
if TYPE_CHECKING:
    from numarun.machine.model import Topology
    from numarun.placement.binding import MemPolicy
    from numarun.placement.plan import Plan


class Placement(Value):
    """Per-rank CPUs (None: inherit), memory policies, the bound physical cores per rank
    (None: unbound, so no ``OMP_NUM_THREADS`` is set), and the plan's environment variables."""

    _fields = ("cpus", "mems", "threads", "env")
    __slots__ = _fields
    cpus: list[tuple[int, ...] | None]
    mems: list[MemPolicy | None]
    threads: list[int] | None
    env: tuple[tuple[str, str], ...]

    def __init__(
        self,
        cpus: list[tuple[int, ...] | None],
        mems: list[MemPolicy | None],
        threads: list[int] | None,
        env: tuple[tuple[str, str], ...],
    ) -> None:
        object.__setattr__(self, "cpus", cpus)
        object.__setattr__(self, "mems", mems)
        object.__setattr__(self, "threads", threads)
        object.__setattr__(self, "env", env)


UNBOUND = "none"  # binding="none": as None (mem_binding's word, and an unbound plan's mode)


def resolve_binding(
    binding: object,
    mem_binding: str | None,
    nprocs: int,
    allow_fallback: bool,
    environ: Mapping[str, str],
) -> Placement:
    """Turn ``binding`` / ``mem_binding`` into checked per-rank CPUs and memory policies.

    The planner and the binding checks speak the command line's words (``--numa-binding
    cpu``); their errors and warnings reach the caller in this API's (``binding='cpu'``):
    :func:`in_python_terms`. Raises what they raise, of the same class."""
    try:
        return _resolve_binding(binding, mem_binding, nprocs, allow_fallback, environ)
    except NumarunError as error:
        raise type(error)(in_python_terms(str(error))) from None


# The command line's words in the planner's and binding checks' messages -> this API's, in
# order (a flag with its value before the bare flag). tests/spawning/test_api.py checks that every
# flag those modules name is here.
_PYTHON_TERMS = (
    (r"--numa-binding (node|socket|exclusive|core-complex|cpu|explicit)\b", r"binding='\1'"),
    (r"--numa-binding", "binding"),
    (r"--mem-binding (none|local|preferred|bind|interleave)\b", r"mem_binding='\1'"),
    (r"--mem-binding", "mem_binding"),
    (r"--binding-fallback", "binding_fallback=True"),
    (r"--nproc-per-node", "nprocs"),
    (r"one --rank-cpus LIST per rank", "one CPU list per rank as binding (binding=[[0], [1]])"),
    (r"--rank-cpus for rank", "the CPU list in binding for rank"),
    (r"--rank-cpus", "binding's CPU lists"),
    (r"check --cpus-allowed and this", "check this"),
    (r"--cpus-allowed", "the allowed CPUs"),
    (r"--sysfs-root", "the sysfs root"),
)


def in_python_terms(message: str) -> str:
    """``message`` with each command-line flag of :data:`_PYTHON_TERMS` replaced by the
    keyword argument of :func:`numarun.spawn` that means the same."""
    import re

    for pattern, replacement in _PYTHON_TERMS:
        message = re.sub(pattern, replacement, message)
    return message


def _resolve_binding(
    binding: object,
    mem_binding: str | None,
    nprocs: int,
    allow_fallback: bool,
    environ: Mapping[str, str],
) -> Placement:
    if binding is None or (isinstance(binding, str) and binding == UNBOUND):
        return _unbound_placement(mem_binding, nprocs)
    from numarun.placement import binding as binding_module

    plan = _make_plan(binding, nprocs, allow_fallback, environ)
    for message in plan.warnings:
        warn(in_python_terms(message))
    if not plan.bound:
        if mem_binding not in (None, "none", "local"):
            warn(
                f"mem_binding={mem_binding!r} dropped: the CPU binding fell back to none, so "
                "there are no memory nodes to bind to"
            )
            mem_binding = None
        return _unbound_placement(mem_binding, nprocs, env=plan.env)
    for rank in plan.ranks:
        binding_module.check_cpus(rank.cpus, rank=rank.local_rank)
    policies = [binding_module.mem_policy_for(mem_binding, rank.mems) for rank in plan.ranks]
    policies, messages = binding_module.check_mem_policy(policies, allow_fallback=allow_fallback)
    for message in messages:
        warn(in_python_terms(message))
    return Placement(
        cpus=[tuple(rank.cpus) for rank in plan.ranks],
        mems=policies,
        threads=[max(1, rank.threads) for rank in plan.ranks],
        env=plan.env,
    )


def _unbound_placement(
    mem_binding: str | None, nprocs: int, env: tuple[tuple[str, str], ...] = ()
) -> Placement:
    if mem_binding in (None, "none"):
        return Placement([None] * nprocs, [None] * nprocs, None, env)
    if mem_binding != "local":
        raise InvalidArgument(
            f"mem_binding={mem_binding!r} needs memory nodes from a CPU binding; "
            "pass binding='node' (or another mode), or use mem_binding='local'"
        )
    from numarun.placement import binding as binding_module

    policy = binding_module.mem_policy_for("local", ())
    policies, _ = binding_module.check_mem_policy([policy] * nprocs, allow_fallback=False)
    return Placement([None] * nprocs, policies, None, env)


def _make_plan(
    binding: object, nprocs: int, allow_fallback: bool, environ: Mapping[str, str]
) -> Plan:
    from numarun.placement.plan import Plan, make_plan

    if isinstance(binding, Plan):
        if len(binding.ranks) != nprocs:
            raise InvalidArgument(
                f"the plan has {len(binding.ranks)} ranks but nprocs is {nprocs}; "
                "make the plan for the same number of workers"
            )
        return binding
    if isinstance(binding, str):
        from numarun.placement.plan import MODES

        if binding == "explicit":
            raise InvalidArgument(
                "binding='explicit' names no CPUs: pass the CPUs themselves, one list per "
                "rank, as binding (binding=[[0, 1], [2, 3]] or ['0-1', '2-3'])"
            )
        if binding not in MODES:
            named = [*(mode for mode in MODES if mode != "explicit"), UNBOUND]
            raise InvalidArgument(unknown_choice("binding", binding, named))
        return make_plan(_read_topology(environ), nprocs, binding, allow_unbound=allow_fallback)
    topology = _read_topology(environ)
    rank_cpus = _explicit_cpus(binding, nprocs)
    return make_plan(
        topology, nprocs, "explicit", rank_cpus=rank_cpus, allow_unbound=allow_fallback
    )


def _explicit_cpus(binding: object, nprocs: int) -> list[tuple[int, ...]]:
    from numarun.machine.cpulist import parse_cpulist

    if not isinstance(binding, Sequence) or isinstance(binding, (bytes, bytearray)):
        raise InvalidArgument(
            "binding must be a mode name, a Plan or one CPU list per rank "
            f"(e.g. [[0], [1]]), got {type(binding).__name__}"
        )
    if len(binding) != nprocs:
        raise InvalidArgument(
            f"binding lists CPUs for {len(binding)} rank{'s' if len(binding) != 1 else ''} "
            f"but nprocs is {nprocs}; "
            "give one CPU list per rank"
        )
    rank_cpus = []
    for item in binding:
        if isinstance(item, str):
            rank_cpus.append(parse_cpulist(item))
        elif isinstance(item, Sequence) and all(
            isinstance(cpu, int) and not isinstance(cpu, bool) for cpu in item
        ):
            rank_cpus.append(tuple(sorted(set(item))))
        else:
            raise InvalidArgument(
                f"invalid CPU list {item!r} in binding; use a list of CPU numbers or a "
                "string like '0-3,8'"
            )
    return rank_cpus


def _read_topology(environ: Mapping[str, str]) -> Topology:
    from numarun.machine.topology import read_topology

    return read_topology("/", environ=environ)


DIST_ENV_NAMES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def check_dist_env(dist_env: object, master_addr: object, master_port: object) -> None:
    """Raise InvalidArgument (one line, naming the keyword) for a bad ``dist_env``,
    ``master_addr`` or ``master_port``, or for an address or port given without
    ``dist_env=True`` (it would otherwise be dropped without a word)."""
    if not isinstance(dist_env, bool):
        raise InvalidArgument(f"dist_env must be True or False, got {dist_env!r}")
    if master_addr is not None and (not isinstance(master_addr, str) or not master_addr):
        raise InvalidArgument(f"master_addr must be a non-empty host name, got {master_addr!r}")
    if master_port is not None and (
        isinstance(master_port, bool)
        or not isinstance(master_port, int)
        or not 0 < master_port < 65536
    ):
        raise InvalidArgument(f"master_port must be a port number 1-65535, got {master_port!r}")
    if not dist_env:
        for name, value in (("master_addr", master_addr), ("master_port", master_port)):
            if value is not None:
                raise InvalidArgument(
                    f"{name}={value!r} needs dist_env=True: numarun.spawn sets MASTER_ADDR, "
                    "MASTER_PORT, RANK and the other init_process_group variables only when "
                    "asked (torch.multiprocessing.spawn sets none)"
                )


def worker_envs(
    base: dict[str, str],
    nprocs: int,
    placement: Placement,
    *,
    dist_env: bool = False,
    master_addr: str | None = None,
    master_port: int | None = None,
) -> list[dict[str, str]]:
    """Each rank's environment, by local rank: ``base`` (the caller's ``os.environ`` plus
    ``env=``) unchanged, as ``torch.multiprocessing.spawn`` passes it, plus:

    * with a binding in force (``placement.threads``): the plan's variables
      (``CUDA_DEVICE_ORDER``, ...) and, unless ``base`` sets it, ``OMP_NUM_THREADS`` = the
      rank's bound physical cores; without one, neither (OpenMP's own default applies, as
      under torch: forcing a count would starve Hogwild-style workers or oversubscribe);
    * with ``dist_env``: ``RANK`` = ``LOCAL_RANK`` = the local rank, ``WORLD_SIZE`` =
      ``LOCAL_WORLD_SIZE`` = ``nprocs``, ``MASTER_ADDR`` (``master_addr``, else ``base``'s,
      else ``127.0.0.1``) and ``MASTER_PORT`` (``master_port``, else ``base``'s, else a port
      free when checked: bound to port 0 and released, so another process may take it
      meanwhile), what ``init_process_group("env://")`` reads.
    """
    common = dict(base)
    common.update(placement.env)
    if dist_env:
        common["WORLD_SIZE"] = str(nprocs)
        common["LOCAL_WORLD_SIZE"] = str(nprocs)
        common["MASTER_ADDR"] = master_addr or base.get("MASTER_ADDR") or "127.0.0.1"
        if master_port is not None:
            common["MASTER_PORT"] = str(master_port)
        elif not base.get("MASTER_PORT"):
            common["MASTER_PORT"] = str(workerenv.free_port())
    threads = placement.threads if "OMP_NUM_THREADS" not in base else None
    envs = []
    for rank in range(nprocs):
        worker_env = dict(common)
        if dist_env:
            worker_env["RANK"] = str(rank)
            worker_env["LOCAL_RANK"] = str(rank)
        if threads is not None:
            worker_env["OMP_NUM_THREADS"] = str(threads[rank])
        envs.append(worker_env)
    return envs

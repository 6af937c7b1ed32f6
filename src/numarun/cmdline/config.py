"""argv -> :class:`LaunchConfig`: torchrun's command line, checked, with nothing started.

:func:`parse_args` reads ``numarun``'s own options (torchrun's flags in both spellings, with
torchrun's ``PET_<OPTION>`` environment defaults: :mod:`numarun.cmdline.options`), splits off the
entry point and its arguments untouched, and decides everything a launch needs: the number of
workers per node, the node facts (flags, or Slurm / Open MPI) and the rendezvous, numarun's static
one or a PyTorch backend (:mod:`numarun.cmdline.nodes`), binding mode and explicit rank CPUs, output
specs, teardown and forwarded signals, the grace period, ``--max-restarts``. Any malformed or
conflicting argument is one :class:`UsageError` line. Reads no files, except the topology for
``--nproc-per-node gpu|auto`` (or ``cpu`` with ``--sysfs-root`` or ``--cpus-allowed``); the
modules for that, and for CPU lists, binding modes, scheduler node facts and output specs, are
imported only on the path that needs them. Before the entry point, an unambiguous prefix of a
flag stands for it. Running a config is :mod:`numarun.launch.launcher`'s job.
"""

from __future__ import annotations

import _signal as signal  # not signal.py, whose enums cost a launch ~2 ms (DESIGN.md)
import os
import sys

from numarun.cmdline.nodes import parse_nodes
from numarun.cmdline.options import parse_int, parse_seconds, read_options, split_argv
from numarun.errors import UsageError, unknown_choice
from numarun.machine.model import Value, fill_fields
from numarun.process import capacity

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping, Sequence

DEFAULT_GRACE_PERIOD = 30.0  # torchrun's SIGTERM -> SIGKILL default
# torchrun's --signals-to-handle default: each stops the job, reaching the workers first.
DEFAULT_SIGNALS_TO_HANDLE = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
TEARDOWN_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
# Stop the job even when left out of --signals-to-handle: a launcher that ignores Ctrl-C or
# dies of SIGHUP leaves its workers running.
ALWAYS_TEARDOWN = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Slurm sends these ahead of preemption (``--signal``); the job must keep running to checkpoint.
FORWARD_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
# torch.distributed.elastic.events' handler names (``--event-log-handler``).
EVENT_LOG_HANDLERS = ("null", "console", "dynamic_rendezvous")


class LaunchConfig(Value):
    """Everything a launch needs, decided from argv and the environment; nothing started yet.

    ``entrypoint_kind`` is ``"script"``, ``"module"`` or ``"binary"``. ``master_port`` is
    ``None`` when a free port is to be picked at start (single node, none given).
    ``numa_binding`` is a :data:`numarun.placement.plan.MODES` value or ``None`` (no binding);
    ``rank_cpus`` is set exactly when it is ``"explicit"``. ``node_source`` says where the node
    facts came from: ``"flags"``, ``"slurm"`` or ``"mpi"``. ``master_addr`` is a host name or an
    address without brackets (``::1`` for ``[::1]``), as torch's ``env://`` wants it.
    ``duplicate_*_filters``: tee'd lines containing any of these go to
    ``attempt_<k>/filtered_std{out,err}.log`` as well (torchrun's meaning; empty: off).

    Rendezvous: ``rdzv_backend`` is ``"static"`` (numarun's own, torch-free path: ``nnodes``,
    ``node_rank``, ``master_addr`` and ``master_port`` say everything) or the name of a torch
    rendezvous backend (``"c10d"``, ``"etcd"``, ``"etcd-v2"`` or a ``torchrun.handlers``
    plugin: :attr:`elastic`), whose rounds decide the ranks, the node count between
    ``min_nodes`` and ``max_nodes`` and the master address (``node_rank``, ``master_addr``
    and ``master_port`` are then unused, as in torchrun). ``rdzv_endpoint`` is the endpoint as
    given (``""``: the backend's default), ``rdzv_conf`` the ``--rdzv-conf`` pairs in order,
    checked. ``max_restarts``: how many times a failed local worker group is restarted.
    ``monitor_interval``: seconds between looks at the rendezvous while workers run (None:
    numarun's default). ``local_addr``: this node's address in the rendezvous. ``warnings``:
    lines to print before starting (flags that torchrun also ignores). ``quiet`` (``-q``):
    numarun prints only errors and the failure summary.
    """

    _fields = (
        "entrypoint", "entrypoint_kind", "args", "nproc_per_node", "nnodes", "node_rank",
        "node_source", "master_addr", "master_port", "run_id", "role", "redirects", "tee",
        "log_dir", "local_ranks_filter", "numa_binding", "rank_cpus", "mem_binding",
        "binding_fallback", "grace_period", "dry_run", "sysfs_root", "cpus_allowed",
        "start_method", "teardown_signals", "forward_signals", "signals_to_handle", "python_exec",
        "duplicate_stdout_filters", "duplicate_stderr_filters", "virtual_local_rank",
        "event_log_handler", "hang_timeout", "rdzv_backend", "rdzv_endpoint", "rdzv_conf",
        "min_nodes", "max_nodes", "max_restarts", "monitor_interval", "local_addr", "warnings",
        "diagnostics_store",
        "quiet", "preload", "preload_required", "preload_late", "log_line_prefix_template",
    )  # fmt: skip
    __slots__ = _fields
    entrypoint: str
    entrypoint_kind: str
    args: tuple[str, ...]
    nproc_per_node: int
    nnodes: int
    node_rank: int
    node_source: str
    master_addr: str
    master_port: int | None
    run_id: str
    role: str
    redirects: str
    tee: str
    log_dir: str | None
    local_ranks_filter: str
    numa_binding: str | None
    rank_cpus: tuple[tuple[int, ...], ...] | None
    mem_binding: str
    binding_fallback: bool
    grace_period: float
    dry_run: bool
    sysfs_root: str
    cpus_allowed: str | None
    start_method: str
    teardown_signals: tuple[int, ...]
    forward_signals: tuple[int, ...]
    signals_to_handle: str  # as given: workers' env, like torchrun
    python_exec: str
    duplicate_stdout_filters: tuple[str, ...]
    duplicate_stderr_filters: tuple[str, ...]
    virtual_local_rank: bool
    event_log_handler: str
    hang_timeout: float | None  # seconds without progress before a hang (None: off)
    rdzv_backend: str
    rdzv_endpoint: str
    rdzv_conf: tuple[tuple[str, str], ...]
    min_nodes: int
    max_nodes: int
    max_restarts: int
    monitor_interval: float | None
    local_addr: str | None
    warnings: tuple[str, ...]
    quiet: bool  # -q: numarun prints errors and the failure summary only
    preload: tuple[str, ...]  # --preload: the modules each local rank's standby imports
    preload_required: bool  # --preload-required: a failed preload ends the job
    preload_late: bool  # --preload-late: the next standbys start with the workers
    log_line_prefix_template: str | None  # --log-line-prefix-template (None: the environment's)
    diagnostics_store: str  # --diagnostics-store: "own" or "rendezvous" (the whole-job view's keys)

    def __init__(
        self,
        entrypoint: str,
        entrypoint_kind: str,
        args: tuple[str, ...],
        nproc_per_node: int,
        nnodes: int = 1,
        node_rank: int = 0,
        node_source: str = "flags",
        master_addr: str = "127.0.0.1",
        master_port: int | None = None,
        run_id: str = "none",
        role: str = "default",
        redirects: str = "0",
        tee: str = "0",
        log_dir: str | None = None,
        local_ranks_filter: str = "",
        numa_binding: str | None = None,
        rank_cpus: tuple[tuple[int, ...], ...] | None = None,
        mem_binding: str = "none",
        binding_fallback: bool = False,
        grace_period: float = DEFAULT_GRACE_PERIOD,
        dry_run: bool = False,
        sysfs_root: str = "/",
        cpus_allowed: str | None = None,
        start_method: str = "spawn",
        teardown_signals: tuple[int, ...] = tuple(TEARDOWN_SIGNALS),
        forward_signals: tuple[int, ...] = tuple(FORWARD_SIGNALS),
        signals_to_handle: str = DEFAULT_SIGNALS_TO_HANDLE,
        python_exec: str = sys.executable,
        duplicate_stdout_filters: tuple[str, ...] = (),
        duplicate_stderr_filters: tuple[str, ...] = (),
        virtual_local_rank: bool = False,
        event_log_handler: str = "null",
        hang_timeout: float | None = None,
        rdzv_backend: str = "static",
        rdzv_endpoint: str = "",
        rdzv_conf: tuple[tuple[str, str], ...] = (),
        min_nodes: int = 1,
        max_nodes: int = 1,
        max_restarts: int = 0,
        monitor_interval: float | None = None,
        local_addr: str | None = None,
        warnings: tuple[str, ...] = (),
        quiet: bool = False,
        preload: tuple[str, ...] = (),
        preload_required: bool = False,
        preload_late: bool = False,
        log_line_prefix_template: str | None = None,
        diagnostics_store: str = "rendezvous",
    ) -> None:
        fill_fields(self, locals())

    @property
    def elastic(self) -> bool:
        """True when a torch rendezvous backend (not numarun's static one) forms the job."""
        return self.rdzv_backend != "static"

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    def global_rank(self, local_rank: int) -> int:
        return self.node_rank * self.nproc_per_node + local_rank


def parse_args(
    argv: Sequence[str], environ: Mapping[str, str] | None = None, *, epilog: str | None = None
) -> LaunchConfig:
    """Turn ``numarun``'s argv (without the program name) into a :class:`LaunchConfig`.

    ``environ`` (default ``os.environ``) supplies ``PET_*`` defaults, ``PYTHON_EXEC``,
    ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, ``TORCHELASTIC_SIGNALS_TO_HANDLE``,
    ``MASTER_ADDR``/``MASTER_PORT`` (under a scheduler only) and the Slurm / Open MPI node
    facts, which apply when neither ``--nnodes`` nor ``--node-rank`` was given. Reads no
    files, except the topology for ``--nproc-per-node gpu|auto``. Starts nothing.

    Raises :class:`UsageError` with one line for any malformed or conflicting argument; the
    entry point's existence is checked later, by :func:`run`. ``--help`` raises
    ``SystemExit(0)`` after printing the help (with ``epilog`` at its end), ``--version``
    after printing the version.
    """
    env = os.environ if environ is None else environ
    own, rest = split_argv(argv)
    ns = read_options(own, env, epilog)
    kind, entrypoint, args = _entrypoint(ns, rest)

    rank_cpus, numa_binding, sysfs_root = _binding(ns)
    nproc = _nproc(ns.nproc_per_node, rank_cpus, sysfs_root, ns.cpus_allowed)
    nodes = parse_nodes(ns, env)
    max_restarts, monitor_interval = _restarts(ns)
    start_method = ns.start_method or "spawn"
    if start_method not in ("spawn", "fork", "forkserver"):
        raise UsageError(
            unknown_choice("--start-method", start_method, ("spawn", "fork", "forkserver"))
        )
    redirects, tee, ranks_filter, output_warnings = _output_specs(ns, nproc)
    mem_binding = (ns.mem_binding or "none").strip()
    _check_mem_binding(mem_binding, numa_binding)
    signals_text = (
        ns.signals_to_handle
        if ns.signals_to_handle is not None
        else env.get("TORCHELASTIC_SIGNALS_TO_HANDLE")
    )
    teardown, forward = _signals(signals_text)
    event_log_handler = _event_log_handler(ns)
    hang_timeout = _hang_timeout(ns.hang_timeout, kind, redirects, tee, nproc)
    preload = _preload(ns.preload, kind)
    if (ns.preload_required or ns.preload_late) and not preload:
        flag = "--preload-required" if ns.preload_required else "--preload-late"
        raise UsageError(f"{flag} goes with --preload MODULES (which modules to preload?)")
    run_id = _run_id(ns.rdzv_id, nodes.backend)
    return LaunchConfig(
        entrypoint=entrypoint,
        entrypoint_kind=kind,
        args=tuple(args),
        nproc_per_node=nproc,
        nnodes=nodes.nnodes,
        node_rank=nodes.node_rank,
        node_source=nodes.source,
        master_addr=nodes.master_addr,
        master_port=nodes.master_port,
        run_id=run_id,
        role=ns.role or "default",
        redirects=redirects,
        tee=tee,
        log_dir=ns.log_dir or None,
        local_ranks_filter=ranks_filter,
        numa_binding=numa_binding,
        rank_cpus=rank_cpus,
        mem_binding=mem_binding,
        binding_fallback=ns.binding_fallback,
        grace_period=_grace_period(ns.grace_period, env),
        dry_run=ns.dry_run,
        sysfs_root=sysfs_root,
        cpus_allowed=ns.cpus_allowed,
        start_method=start_method,
        teardown_signals=teardown,
        forward_signals=forward,
        signals_to_handle=signals_text or DEFAULT_SIGNALS_TO_HANDLE,
        python_exec=env.get("PYTHON_EXEC") or sys.executable,
        duplicate_stdout_filters=_filters(ns.duplicate_stdout_filters),
        duplicate_stderr_filters=_filters(ns.duplicate_stderr_filters),
        virtual_local_rank=ns.virtual_local_rank,
        event_log_handler=event_log_handler,
        hang_timeout=hang_timeout,
        rdzv_backend=nodes.backend,
        rdzv_endpoint=nodes.endpoint,
        rdzv_conf=nodes.conf,
        min_nodes=nodes.min_nodes,
        max_nodes=nodes.max_nodes,
        max_restarts=max_restarts,
        monitor_interval=monitor_interval,
        local_addr=(ns.local_addr or "").strip() or None,
        warnings=(*nodes.warnings, *output_warnings, *_after_entrypoint(entrypoint, args)),
        quiet=ns.quiet,
        preload=preload,
        preload_required=ns.preload_required,
        preload_late=ns.preload_late,
        log_line_prefix_template=ns.log_line_prefix_template or None,
        diagnostics_store=_diagnostics_store(ns.diagnostics_store, nodes.backend),
    )


def _binding(ns: argparse.Namespace) -> tuple[tuple[tuple[int, ...], ...] | None, str | None, str]:
    """(``--rank-cpus``, ``--numa-binding``, ``--sysfs-root``), checked together."""
    rank_cpus = _rank_cpus(ns.rank_cpus)
    numa_binding = _numa_binding(ns.numa_binding, rank_cpus)
    sysfs_root = ns.sysfs_root or "/"
    if sysfs_root != "/" and not ns.dry_run:
        raise UsageError(
            "--sysfs-root plans for another machine; use it with --dry-run "
            "(workers can only be bound on this machine)"
        )
    if ns.cpus_allowed is not None and numa_binding is None:
        raise UsageError(
            "--cpus-allowed only restricts a binding plan: add --numa-binding MODE "
            "(or bind the launcher itself with taskset)"
        )
    return rank_cpus, numa_binding, sysfs_root


def _restarts(ns: argparse.Namespace) -> tuple[int, float | None]:
    """(``--max-restarts``, ``--monitor-interval``): 0 and None when not given."""
    max_restarts = (
        parse_int(ns.max_restarts, "--max-restarts", low=0) if ns.max_restarts is not None else 0
    )
    monitor_interval = None
    if ns.monitor_interval is not None:
        monitor_interval = parse_seconds(ns.monitor_interval, "--monitor-interval")
        if monitor_interval <= 0:
            raise UsageError(f"--monitor-interval must be > 0 seconds, not {ns.monitor_interval}")
    return max_restarts, monitor_interval


def _event_log_handler(ns: argparse.Namespace) -> str:
    """``--event-log-handler`` (one of torchrun's), with ``--logs-specs`` refused unless
    torchrun's default: numarun loads no plugin."""
    event_log_handler = (ns.event_log_handler or "null").strip()
    if event_log_handler not in EVENT_LOG_HANDLERS:
        raise UsageError(
            f"--event-log-handler {event_log_handler!r} is not one of torchrun's handlers "
            f"({', '.join(EVENT_LOG_HANDLERS)})"
        )
    if ns.logs_specs is not None and ns.logs_specs.strip() != "default":
        raise UsageError(
            f"--logs-specs {ns.logs_specs!r}: numarun writes torchrun's default log layout only "
            "(--logs-specs default); log plugins are not loaded"
        )
    return event_log_handler


DIAGNOSTICS_STORES = ("own", "rendezvous")
_NO_TCPSTORE = ("etcd", "etcd-v2")  # rendezvous backends without a TCPStore to host one beside


def _diagnostics_store(text: str | None, backend: str) -> str:
    """``--diagnostics-store``: ``own`` (a TCPStore of the whole-job view's own, hosted by each
    round's node 0: :mod:`numarun.rendezvous.diagstore`) or ``rendezvous`` (the rendezvous's
    store, as before). Default: ``own`` under a torch backend with a TCPStore, ``rendezvous``
    with etcd (and on the static path, which has no whole-job view)."""
    default = "rendezvous" if backend in (*_NO_TCPSTORE, "static") else "own"
    if text is None:
        return default
    value = text.strip()
    if value not in DIAGNOSTICS_STORES:
        raise UsageError(unknown_choice("--diagnostics-store", value, DIAGNOSTICS_STORES))
    if value == "own" and backend in _NO_TCPSTORE:
        raise UsageError(f"--diagnostics-store own needs a TCPStore, which --rdzv-backend "
                         f"{backend} has not; use --diagnostics-store rendezvous")  # fmt: skip
    return value


def _run_id(text: str | None, backend: str) -> str:
    """The run id from ``--rdzv-id`` (it names a log directory): random under the static
    rendezvous for torchrun's default ``none``; kept under a torch backend, where the nodes
    of one job meet under it."""
    rdzv_id = (text if text is not None else "none").strip()
    if rdzv_id in (".", "..") or "/" in rdzv_id or "\0" in rdzv_id:
        raise UsageError(
            f"--rdzv-id {rdzv_id!r} cannot name a log directory: use letters, digits, '-' or '_'"
        )
    if backend != "static":
        return rdzv_id or os.urandom(6).hex()
    return rdzv_id if rdzv_id and rdzv_id != "none" else os.urandom(6).hex()


def _hang_timeout(
    text: str | None, kind: str, redirects: str, tee: str, nproc: int
) -> float | None:
    """``--hang-timeout``: seconds, at least what the stack sampling of ``nproc`` ranks can
    judge (:func:`numarun.stacks.hang.timeout_floor`), or None for 0 / not given.
    ``--no-python`` workers have no stacks: only their output tells progress, so it must reach
    numarun."""
    if text is None:
        return None
    value = parse_seconds(text, "--hang-timeout")
    if value == 0:
        return None
    from numarun.stacks.hang import timeout_floor

    floor = timeout_floor(nproc)
    if value < floor:
        raise UsageError(
            f"--hang-timeout {text.strip()} is shorter than the stack sampling can judge: "
            f"each of the {nproc} rank(s) here is sampled every {floor:g} s (1 s per 8 ranks "
            f"with more) and counts as still once two samples agree; give at least {floor:g} s, "
            "or 0 to turn it off"
        )
    if kind == "binary" and redirects == "0" and tee == "0":
        raise UsageError(
            "--hang-timeout with --no-python sees progress only in the workers' output: "
            "add --redirects 3 or --tee 3 (a binary has no Python stacks)"
        )
    return value


def _preload(text: str | None, kind: str) -> tuple[str, ...]:
    """``--preload``: comma-separated module names (dotted identifiers), each once, in order;
    none for no value. A binary has nothing to preload."""
    if text is None:
        return ()
    if kind == "binary":
        raise UsageError(
            "--preload imports Python modules ahead of Python workers; a --no-python binary "
            "has nothing to preload"
        )
    names: list[str] = []
    for item in text.split(","):
        name = item.strip()
        if not name or not all(part.isidentifier() for part in name.split(".")):
            raise UsageError(
                f"--preload takes comma-separated module names (torch,transformers), not {text!r}"
            )
        if name not in names:
            names.append(name)
    return tuple(names)


def _filters(text: str | None) -> tuple[str, ...]:
    """torchrun's comma-separated filter list: ``',,'`` stands for a comma; an empty value is
    one empty filter (every line matches), as in torchrun; no value: no filters."""
    if text is None:
        return ()
    return tuple(item.replace("\0", ",") for item in text.replace(",,", "\0").split(","))


def _entrypoint(ns: argparse.Namespace, rest: list[str]) -> tuple[str, str, list[str]]:
    # As torchrun's config_from_args: --run-path runs the script file whatever -m or
    # --no-python say; only without it are -m and --no-python refused together.
    if ns.run_path:
        what = "script"
    elif ns.module and ns.no_python:
        raise UsageError("-m/--module and --no-python cannot be combined")
    else:
        what = "module" if ns.module else "binary" if ns.no_python else "script"
    if not rest or not rest[0]:
        raise UsageError(
            "missing the training script (numarun [options] train.py [args...], "
            "-m MODULE or --no-python BINARY)"
        )
    return what, rest[0], rest[1:]


def _rank_cpus(texts: list[str] | None) -> tuple[tuple[int, ...], ...] | None:
    if texts is None:
        return None
    from numarun.machine.cpulist import parse_cpulist

    lists = tuple(parse_cpulist(text) for text in texts)
    for local_rank, cpus in enumerate(lists):
        if not cpus:
            raise UsageError(f"--rank-cpus for local rank {local_rank} is empty")
    return lists


def _after_entrypoint(entrypoint: str, args: Sequence[str]) -> tuple[str, ...]:
    from numarun.cmdline.options import options_after_entrypoint

    warning = options_after_entrypoint(entrypoint, args)
    return (warning,) if warning else ()


def _numa_binding(mode: str | None, rank_cpus: tuple[tuple[int, ...], ...] | None) -> str | None:
    if mode is not None:
        from numarun.placement.plan import MODES

        if mode not in MODES:
            raise UsageError(unknown_choice("--numa-binding", mode, MODES))
    if rank_cpus is None:
        if mode == "explicit":
            raise UsageError("--numa-binding explicit needs one --rank-cpus LIST per local rank")
        return mode
    if mode not in (None, "explicit"):
        raise UsageError(
            f"--rank-cpus gives explicit CPUs; it cannot be combined with --numa-binding {mode}"
        )
    return "explicit"


def _nproc(
    text: str | None,
    rank_cpus: tuple[tuple[int, ...], ...] | None,
    sysfs_root: str,
    cpus_allowed: str | None,
) -> int:
    """``--nproc-per-node``; without it, one rank per ``--rank-cpus`` or 1."""
    if text is None:
        return len(rank_cpus) if rank_cpus is not None else 1
    text = text.strip()
    if text in ("gpu", "auto", "cpu"):
        if text == "cpu" and sysfs_root == "/" and cpus_allowed is None:
            # The CPUs this process may use (taskset, cpuset), as torchrun counts them.
            nproc = len(os.sched_getaffinity(0)) or 1
        else:
            from numarun.machine.topology import read_topology

            topology = read_topology(sysfs_root, cpus_allowed=cpus_allowed)
            if text == "gpu" and not topology.gpus:
                raise UsageError("--nproc-per-node gpu: no visible GPUs on this machine")
            nproc = (
                len(topology.gpus)
                if text != "cpu" and topology.gpus
                else len(topology.allowed_cpus)
            )
    elif text.lstrip("-").isdigit():
        nproc = parse_int(text, "--nproc-per-node", low=1)
    else:
        raise UsageError(
            f"--nproc-per-node must be a positive integer, 'gpu', 'cpu' or 'auto', not {text!r}"
        )
    if rank_cpus is not None and len(rank_cpus) != nproc:
        raise UsageError(
            f"{len(rank_cpus)} --rank-cpus given for --nproc-per-node {nproc}: "
            "give exactly one per local rank"
        )
    if nproc > capacity.ALWAYS_FINE:
        problem = capacity.worker_count_problem(nproc)
        if problem is not None:
            raise UsageError(f"--nproc-per-node {nproc}: {problem}")
    return nproc


def _output_specs(ns: argparse.Namespace, nproc: int) -> tuple[str, str, str, tuple[str, ...]]:
    """Validate --redirects, --tee and --local-ranks-filter now, so nothing starts on a typo;
    the warning for a filter naming local ranks that do not exist (accepted, as torchrun)."""
    redirects = (ns.redirects or "0").strip()
    tee = (ns.tee or "0").strip()
    ranks_filter = (ns.local_ranks_filter or "").strip()
    warnings: tuple[str, ...] = ()
    if redirects != "0" or tee != "0" or ranks_filter:
        from numarun.cmdline import stdspec

        stdspec.parse_std_spec(redirects, nproc, flag="--redirects")
        stdspec.parse_std_spec(tee, nproc, flag="--tee")
        warning = stdspec.ranks_filter_warning(ranks_filter, nproc)
        warnings = (warning,) if warning else ()
    return redirects, tee, ranks_filter, warnings


def _check_mem_binding(mem_binding: str, numa_binding: str | None) -> None:
    choices = ("none", "local", "preferred", "bind", "interleave")
    if mem_binding not in choices:
        raise UsageError(unknown_choice("--mem-binding", mem_binding, choices))
    if mem_binding != "none" and numa_binding is None:
        raise UsageError(
            f"--mem-binding {mem_binding} needs a CPU binding to know each rank's memory nodes: "
            "add --numa-binding MODE or --rank-cpus LIST"
        )


def _signals(text: str | None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(teardown signals, forwarded signals) from ``--signals-to-handle``.

    torchrun's meaning: each listed signal stops the job and is what the workers receive first
    (SIGKILL follows after the grace period); the default list is
    ``SIGTERM,SIGINT,SIGHUP,SIGQUIT``. numarun's additions: SIGINT, SIGTERM and SIGHUP stop
    the job even when left out, and SIGUSR1/SIGUSR2, unless listed, are forwarded to the
    workers and the job goes on (Slurm's preemption notice).
    """
    from numarun.process.spec import signal_numbers

    numbers = signal_numbers()
    teardown = list(ALWAYS_TEARDOWN)
    for item in (DEFAULT_SIGNALS_TO_HANDLE if text is None else text).split(","):
        name = item.strip().upper()
        if not name:
            continue
        signum = _signal_number(name, numbers)
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            raise UsageError(f"--signals-to-handle: {name} cannot be caught")
        if signum == signal.SIGCHLD:
            raise UsageError("--signals-to-handle: SIGCHLD cannot stop the job")
        if signum not in teardown:
            teardown.append(signum)
    forward = [signum for signum in FORWARD_SIGNALS if signum not in teardown]
    return tuple(int(s) for s in teardown), tuple(int(s) for s in forward)


def _signal_number(name: str, numbers: Mapping[str, int]) -> int:
    if name.isdigit():
        if int(name) in numbers.values():
            return int(name)
    else:
        full = name if name.startswith("SIG") else f"SIG{name}"
        if full in numbers:
            return numbers[full]
    raise UsageError(f"--signals-to-handle: unknown signal {name!r} (use names like SIGUSR1)")


def _grace_period(text: str | None, env: Mapping[str, str]) -> float:
    if text is not None:
        return parse_seconds(text, "--grace-period")
    if env.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT"):
        timeout = env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]
        return parse_seconds(timeout, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT")
    return DEFAULT_GRACE_PERIOD

"""argv -> :class:`LaunchConfig`: torchrun's command line, checked, with nothing started.

:func:`parse_args` reads ``numarun``'s own options (torchrun's flags in both spellings, with
torchrun's ``PET_<OPTION>`` environment defaults), splits off the entry point and its arguments
untouched, and decides everything a launch needs: the number of workers per node, the node facts
(flags, or Slurm / Open MPI), the store's endpoint, binding mode and explicit rank CPUs, output
specs, teardown and forwarded signals, the grace period, and the rendezvous: numarun's static one
or a PyTorch backend (checked without importing torch), ``--rdzv-conf`` read as torch reads it,
``--nnodes MIN:MAX``, ``--max-restarts``. Any malformed or conflicting argument is one
:class:`UsageError` line. Reads no files, except the topology for ``--nproc-per-node
gpu|auto`` (or ``cpu`` with ``--sysfs-root`` or ``--cpus-allowed``); the modules for that, and
for CPU lists, binding modes, scheduler node facts and output specs, are imported only on the
path that needs them. Before the entry point, an unambiguous prefix of a flag stands for it.
Running a config is :mod:`numarun.launch.launcher`'s job.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from numarun.errors import UsageError

DEFAULT_MULTI_NODE_PORT = 29500  # torchrun's --master-port default
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


@dataclass(frozen=True)
class LaunchConfig:
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
    lines to print before starting (flags that torchrun also ignores).
    """

    entrypoint: str
    entrypoint_kind: str
    args: tuple[str, ...]
    nproc_per_node: int
    nnodes: int = 1
    node_rank: int = 0
    node_source: str = "flags"
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    run_id: str = "none"
    role: str = "default"
    redirects: str = "0"
    tee: str = "0"
    log_dir: str | None = None
    local_ranks_filter: str = ""
    numa_binding: str | None = None
    rank_cpus: tuple[tuple[int, ...], ...] | None = None
    mem_binding: str = "none"
    binding_fallback: bool = False
    grace_period: float = DEFAULT_GRACE_PERIOD
    dry_run: bool = False
    sysfs_root: str = "/"
    cpus_allowed: str | None = None
    start_method: str = "spawn"
    teardown_signals: tuple[int, ...] = tuple(TEARDOWN_SIGNALS)
    forward_signals: tuple[int, ...] = tuple(FORWARD_SIGNALS)
    signals_to_handle: str = DEFAULT_SIGNALS_TO_HANDLE  # as given: workers' env, like torchrun
    python_exec: str = sys.executable
    duplicate_stdout_filters: tuple[str, ...] = ()
    duplicate_stderr_filters: tuple[str, ...] = ()
    virtual_local_rank: bool = False
    event_log_handler: str = "null"
    hang_timeout: float | None = None  # seconds without progress before a hang (None: off)
    rdzv_backend: str = "static"
    rdzv_endpoint: str = ""
    rdzv_conf: tuple[tuple[str, str], ...] = ()
    min_nodes: int = 1
    max_nodes: int = 1
    max_restarts: int = 0
    monitor_interval: float | None = None
    local_addr: str | None = None
    warnings: tuple[str, ...] = ()

    @property
    def elastic(self) -> bool:
        """True when a torch rendezvous backend (not numarun's static one) forms the job."""
        return self.rdzv_backend != "static"

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    def global_rank(self, local_rank: int) -> int:
        return self.node_rank * self.nproc_per_node + local_rank


# --- command line --------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad usage as one line (exit 2) instead of usage + error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see 'numarun --help')")


@dataclass(frozen=True)
class _Option:
    names: tuple[str, ...]
    help: str
    flag: bool = False  # store_true; PET_* value is "0"/"1" like torchrun's check_env
    repeat: bool = False  # action="append"; no PET_* fallback
    metavar: str | None = None

    @property
    def dest(self) -> str:
        first_long = next(name for name in self.names if name.startswith("--"))
        return first_long[2:].replace("-", "_")


def _dual(name: str) -> tuple[str, ...]:
    """``--nproc-per-node`` and ``--nproc_per_node``: torchrun accepts both spellings."""
    underscored = name.replace("-", "_").replace("__", "--", 1)
    return (name,) if underscored == name else (name, underscored)


_OPTIONS: tuple[_Option, ...] = (
    _Option(
        _dual("--nproc-per-node"),
        "workers on this node: an integer, 'gpu' (one per "
        "visible GPU), 'cpu' (one per CPU this process may use: its affinity) or 'auto' (GPUs if "
        "any, else CPUs); default 1",
        metavar="N",
    ),
    _Option(
        ("--nnodes",),
        "number of nodes: N, or MIN:MAX (a torch rendezvous admits MIN to MAX nodes; "
        "the static one takes MAX, as torchrun does); default 1, or from Slurm / Open MPI",
        metavar="N",
    ),
    _Option(
        _dual("--node-rank"),
        "rank of this node, 0..nnodes-1; default 0, or from Slurm / Open MPI",
        metavar="K",
    ),
    _Option(
        _dual("--master-addr"),
        "host of global rank 0 (the TCPStore); IPv6 as [::1]; default 127.0.0.1, or the first "
        "Slurm node",
        metavar="HOST",
    ),
    _Option(
        _dual("--master-port"),
        "port of the TCPStore; default: a free port on one node, 29500 on several",
        metavar="PORT",
    ),
    _Option(
        ("--standalone",),
        "single node on 127.0.0.1 with a free port (numarun's static rendezvous, no torch in "
        "the launcher; torchrun uses c10d on localhost:0)",
        flag=True,
    ),
    _Option(
        _dual("--rdzv-backend"),
        "static (default: numarun's own, torch-free) or a torch rendezvous backend: c10d, "
        "etcd, etcd-v2, or one registered under torchrun.handlers",
        metavar="NAME",
    ),
    _Option(
        _dual("--rdzv-endpoint"),
        "HOST[:PORT] of the rendezvous (c10d: the TCPStore, default localhost:29400); with "
        "static the same as --master-addr/--master-port",
        metavar="HOST:PORT",
    ),
    _Option(
        _dual("--rdzv-id"),
        "job id, exported as TORCHELASTIC_RUN_ID and used in log paths; the nodes of one job "
        "share it (torch backends; default 'none', as in torchrun)",
        metavar="ID",
    ),
    _Option(
        _dual("--rdzv-conf"),
        "rendezvous options KEY=VALUE,... as torch reads them (c10d: join_timeout, "
        "last_call_timeout, close_timeout, heartbeat_timeout, keep_alive_interval, "
        "keep_alive_max_attempt, read_timeout, is_host, store_type; static: timeout)",
        metavar="CONF",
    ),
    _Option(
        _dual("--max-restarts"),
        "restart the local worker group up to N times after a worker fails (default 0); each "
        "attempt logs under attempt_<k>/",
        metavar="N",
    ),
    _Option(
        _dual("--monitor-interval"),
        "seconds between looks at a torch rendezvous while workers run (default 2; workers "
        "themselves are watched event-driven)",
        metavar="SECONDS",
    ),
    _Option(
        _dual("--local-addr"),
        "this node's address in a torch rendezvous (and MASTER_ADDR when it gets group rank "
        "0); default: its fully qualified host name, as torchrun",
        metavar="HOST",
    ),
    _Option(
        _dual("--start-method"),
        "accepted for compatibility (spawn, fork, forkserver); workers are always exec'd",
        metavar="METHOD",
    ),
    _Option(
        _dual("--event-log-handler"),
        "torchrun's event log destination: null (default), console or dynamic_rendezvous; "
        "accepted, numarun records no events",
        metavar="NAME",
    ),
    _Option(
        ("--role",),
        "role name: ROLE_NAME and the --tee prefix '[<role><local rank>]:'; default 'default'",
        metavar="NAME",
    ),
    _Option(("-m", "--module"), "run the entry point as a module, like 'python -m'", flag=True),
    _Option(
        _dual("--no-python"),
        "execute the entry point directly (a binary or script with a #! line), not through python",
        flag=True,
    ),
    _Option(
        _dual("--run-path"),
        "accepted: Python scripts already run through a bootstrap that records errors",
        flag=True,
    ),
    _Option(
        _dual("--log-dir"),
        "base directory for per-rank logs and error files: "
        "LOG_DIR/RUN_ID/attempt_<k>/LOCAL_RANK/",
        metavar="DIR",
    ),
    _Option(
        ("-r", "--redirects"),
        "send worker output to files: 0 none, 1 stdout, 2 stderr, "
        "3 both, or per local rank '0:3,1:0'",
        metavar="SPEC",
    ),
    _Option(
        ("-t", "--tee"),
        "like --redirects, but also show the output on the console, each line prefixed "
        "'[<role><local rank>]:' ($TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE overrides it)",
        metavar="SPEC",
    ),
    _Option(
        _dual("--local-ranks-filter"),
        "show only these local ranks' output on the console, e.g. '0' or '0,2'",
        metavar="RANKS",
    ),
    _Option(
        _dual("--duplicate-stdout-filters"),
        "also write tee'd stdout lines containing any of these comma-separated strings (',,' "
        "for a comma) from every rank to <log dir>/<run id>/attempt_<k>/filtered_stdout.log",
        metavar="FILTERS",
    ),
    _Option(
        _dual("--duplicate-stderr-filters"),
        "the same for stderr: filtered_stderr.log",
        metavar="FILTERS",
    ),
    _Option(
        _dual("--logs-specs"),
        "torchrun's log layout plugin: only 'default' (the layout numarun writes)",
        metavar="NAME",
    ),
    _Option(
        _dual("--virtual-local-rank"),
        "each worker gets LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES naming only its own GPU (the "
        "parent's entry for its local rank); binding still follows the real local rank",
        flag=True,
    ),
    _Option(
        _dual("--numa-binding"),
        "bind each worker at birth: node, socket, exclusive, "
        "core-complex (GPU modes), cpu (split the cores), explicit (with --rank-cpus)",
        metavar="MODE",
    ),
    _Option(
        _dual("--rank-cpus"),
        "CPUs of the next local rank (repeat once per rank, in order): explicit binding",
        repeat=True,
        metavar="LIST",
    ),
    _Option(
        _dual("--mem-binding"),
        "memory policy of each bound worker: none (default), local, preferred, bind, interleave",
        metavar="POLICY",
    ),
    _Option(
        _dual("--binding-fallback"),
        "when binding or the memory policy is impossible, "
        "warn and run with less instead of failing",
        flag=True,
    ),
    _Option(
        _dual("--signals-to-handle"),
        "signals that stop the job, each sent to the workers first, SIGKILL after the "
        "grace period (default SIGTERM,SIGINT,SIGHUP,SIGQUIT; SIGINT, SIGTERM, SIGHUP always "
        "stop it); SIGUSR1/SIGUSR2 not listed are forwarded and the job goes on",
        metavar="SIGNALS",
    ),
    _Option(
        (*_dual("--grace-period"), *_dual("--shutdown-timeout")),
        "seconds between "
        "SIGTERM and SIGKILL at teardown; default $TORCH_ELASTIC_SHUTDOWN_TIMEOUT or 30",
        metavar="SECONDS",
    ),
    _Option(
        _dual("--hang-timeout"),
        "when no rank made progress for this long (stacks unchanged, no output), print "
        "every rank's stacks, naming the ranks stuck elsewhere, stop the job and exit 124; "
        "default off (0)",
        metavar="SECONDS",
    ),
    _Option(
        _dual("--dry-run"),
        "print the plan and each rank's environment and argv; start nothing",
        flag=True,
    ),
    _Option(
        _dual("--sysfs-root"),
        "with --dry-run: plan for the machine under DIR (a snapshot or fake sysfs tree)",
        metavar="DIR",
    ),
    _Option(
        _dual("--cpus-allowed"),
        "plan within these CPUs instead of this process's affinity",
        metavar="LIST",
    ),
)


def _build_parser(environ: Mapping[str, str], epilog: str | None = None) -> _Parser:
    from numarun._version import __version__

    parser = _Parser(
        prog="numarun",
        usage="numarun [options] (SCRIPT | -m MODULE | --no-python BINARY) [args...]\n"
        "       numarun COMMAND [args...]    (commands: see the end)",
        description="Start one worker per GPU or CPU slice, bound near its device, with\n"
        "torchrun's flags and environment. Everything after the script, module or binary is\n"
        "passed to the workers untouched. Options may also come from PET_<OPTION> variables\n"
        "and, before the script, be shortened to any unambiguous prefix (--nnode 1).",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # prefixes are spelled out by _split_argv, before the script only
    )
    parser.add_argument("--version", action="version", version=f"numarun {__version__}")
    for option in _OPTIONS:
        default = _pet_default(option, environ)
        if option.flag:
            parser.add_argument(
                *option.names,
                dest=option.dest,
                action="store_true",
                default=default,
                help=option.help,
            )
        elif option.repeat:
            parser.add_argument(
                *option.names,
                dest=option.dest,
                action="append",
                default=None,
                metavar=option.metavar,
                help=option.help,
            )
        else:
            parser.add_argument(
                *option.names,
                dest=option.dest,
                default=default,
                metavar=option.metavar,
                help=option.help,
            )
    return parser


def _pet_default(option: _Option, environ: Mapping[str, str]) -> object:
    """torchrun's ``PET_<DEST>`` fallback: ``PET_NPROC_PER_NODE=4`` acts as a default."""
    for name in option.names:
        if not name.startswith("--"):
            continue
        key = "PET_" + name[2:].upper().replace("-", "_")
        if key in environ:
            value = environ[key]
            if option.repeat:
                raise UsageError(
                    f"{key} cannot give one value per local rank: pass {name} on the command "
                    "line once per rank"
                )
            if not option.flag:
                return value
            if value.strip() not in ("0", "1"):
                raise UsageError(f"{key}={value!r} must be 0 or 1")
            return value.strip() == "1"
    return False if option.flag else None


def _split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split at the entry point: numarun's options, then the entry point and its arguments.

    Done by hand, not by argparse's REMAINDER, so that nothing after the entry point is ever
    read as numarun's (``--node``, ``--master``, ``--`` reach the worker as written). A ``--``
    before the entry point ends numarun's options. Before it, an unambiguous prefix of a long
    option is spelled out (``--nnode 1`` is ``--nnodes 1``), as torchrun's argparse does.
    """
    by_name = {name: option for option in (*_OPTIONS, *_PARSER_ONLY) for name in option.names}
    own: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return own, list(argv[i + 1 :])
        if not token.startswith("-") or token == "-":
            return own, list(argv[i:])
        token = _spell_out(token, by_name)
        own.append(token)
        option = by_name.get(token)
        if option is not None and not option.flag and i + 1 < len(argv):
            own.append(argv[i + 1])
            i += 1
        i += 1
    return own, []


# argparse's own flags: prefixes of them are spelled out too (``--he`` is ``--help``).
_PARSER_ONLY = (
    _Option(("--help",), "", flag=True),
    _Option(("--version",), "", flag=True),
)


def _spell_out(token: str, by_name: Mapping[str, _Option]) -> str:
    """``--nnode`` -> ``--nnodes``, ``--nnode=2`` -> ``--nnodes=2``: argparse's abbreviation
    rule (allow_abbrev), except that the spellings of one option (``--nproc-per-node``,
    ``--nproc_per_node``) count as one match. Unknown options are left for argparse to refuse."""
    if not token.startswith("--"):
        return token
    name, sep, value = token.partition("=")
    if name in by_name:
        return token
    matches = {
        id(option): (full, option)
        for full, option in by_name.items()
        if full.startswith("--") and full.startswith(name)
    }
    if len(matches) > 1:
        names = sorted(option.names[0] for _full, option in matches.values())
        raise UsageError(f"ambiguous option: {name} could match {', '.join(names)}")
    if not matches:
        return token
    (full, option), = matches.values()
    spelled = next((n for n in option.names if n.startswith(name)), full)
    return spelled + sep + value


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
    own, rest = _split_argv(argv)
    ns = _build_parser(env, epilog).parse_args(own)
    kind, entrypoint, args = _entrypoint(ns, rest)

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
    nproc = _nproc(ns.nproc_per_node, rank_cpus, sysfs_root, ns.cpus_allowed)
    nodes = _nodes(ns, env)
    max_restarts = (
        _int(ns.max_restarts, "--max-restarts", low=0) if ns.max_restarts is not None else 0
    )
    monitor_interval = None
    if ns.monitor_interval is not None:
        monitor_interval = _float(ns.monitor_interval, "--monitor-interval")
        if monitor_interval <= 0:
            raise UsageError(f"--monitor-interval must be > 0 seconds, not {ns.monitor_interval}")
    start_method = ns.start_method or "spawn"
    if start_method not in ("spawn", "fork", "forkserver"):
        raise UsageError(f"--start-method must be spawn, fork or forkserver, not {start_method!r}")
    redirects, tee, ranks_filter = _output_specs(ns, nproc)
    mem_binding = (ns.mem_binding or "none").strip()
    _check_mem_binding(mem_binding, numa_binding)
    signals_text = (
        ns.signals_to_handle
        if ns.signals_to_handle is not None
        else env.get("TORCHELASTIC_SIGNALS_TO_HANDLE")
    )
    teardown, forward = _signals(signals_text)
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
    hang_timeout = _hang_timeout(ns.hang_timeout, kind, redirects, tee)
    rdzv_id = (ns.rdzv_id if ns.rdzv_id is not None else "none").strip()
    if rdzv_id in (".", "..") or "/" in rdzv_id or "\0" in rdzv_id:
        raise UsageError(
            f"--rdzv-id {rdzv_id!r} cannot name a log directory: use letters, digits, '-' or '_'"
        )
    if nodes.backend != "static":
        # The nodes of one job meet under this id: torchrun's default "none" must stay.
        run_id = rdzv_id or os.urandom(6).hex()
    else:
        run_id = rdzv_id if rdzv_id and rdzv_id != "none" else os.urandom(6).hex()
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
        warnings=nodes.warnings,
    )


def _hang_timeout(text: str | None, kind: str, redirects: str, tee: str) -> float | None:
    """``--hang-timeout``: seconds > 0, or None for 0 / not given. ``--no-python`` workers
    have no stacks: only their output tells progress, so it must reach numarun."""
    if text is None:
        return None
    value = _float(text, "--hang-timeout")
    if value == 0:
        return None
    if kind == "binary" and redirects == "0" and tee == "0":
        raise UsageError(
            "--hang-timeout with --no-python sees progress only in the workers' output: "
            "add --redirects 3 or --tee 3 (a binary has no Python stacks)"
        )
    return value


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


def _int(text: object, flag: str, *, low: int | None = None) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise UsageError(f"{flag} must be an integer, not {text!r}") from None
    if low is not None and value < low:
        raise UsageError(f"{flag} must be at least {low}, not {value}")
    return value


def _float(text: object, flag: str) -> float:
    try:
        value = float(str(text).strip())
    except ValueError:
        raise UsageError(f"{flag} must be a number of seconds, not {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise UsageError(f"{flag} must be a finite number of seconds >= 0, not {text!r}")
    return value


def _rank_cpus(texts: list[str] | None) -> tuple[tuple[int, ...], ...] | None:
    if texts is None:
        return None
    from numarun.machine.cpulist import parse_cpulist

    lists = tuple(parse_cpulist(text) for text in texts)
    for local_rank, cpus in enumerate(lists):
        if not cpus:
            raise UsageError(f"--rank-cpus for local rank {local_rank} is empty")
    return lists


def _numa_binding(mode: str | None, rank_cpus: tuple[tuple[int, ...], ...] | None) -> str | None:
    if mode is not None:
        from numarun.placement.plan import MODES

        if mode not in MODES:
            raise UsageError(f"unknown --numa-binding {mode!r}: use one of {', '.join(MODES)}")
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
        nproc = _int(text, "--nproc-per-node", low=1)
    else:
        raise UsageError(
            f"--nproc-per-node must be a positive integer, 'gpu', 'cpu' or 'auto', not {text!r}"
        )
    if rank_cpus is not None and len(rank_cpus) != nproc:
        raise UsageError(
            f"{len(rank_cpus)} --rank-cpus given for --nproc-per-node {nproc}: "
            "give exactly one per local rank"
        )
    return nproc


def _parse_nnodes(text: str) -> tuple[int, int]:
    """``N`` -> (N, N); ``MIN:MAX`` -> (MIN, MAX), torchrun's grammar; one line otherwise."""
    parts = text.strip().split(":")
    if len(parts) == 1:
        count = _int(parts[0], "--nnodes", low=1)
        return count, count
    if len(parts) != 2:
        raise UsageError(f"--nnodes {text!r} must be N or MIN:MAX")
    low = _int(parts[0], "--nnodes MIN", low=1)
    high = _int(parts[1], "--nnodes MAX", low=1)
    if high < low:
        raise UsageError(f"--nnodes {text}: MAX ({high}) must be at least MIN ({low})")
    return low, high



def _split_endpoint(endpoint: str) -> tuple[str | None, int | None]:
    """``host``, ``host:port`` or ``[v6addr]:port``."""
    endpoint = endpoint.strip()
    if not endpoint:
        return None, None
    if endpoint.startswith("["):
        host, _, port = endpoint[1:].partition("]")
        port = port[1:] if port.startswith(":") else port
    elif endpoint.count(":") == 1:
        host, _, port = endpoint.partition(":")
    else:
        host, port = endpoint, ""
    if not host:
        raise UsageError(f"--rdzv-endpoint {endpoint!r} has no host")
    return host, (_port(port, "--rdzv-endpoint port") if port else None)


def _unbracket(host: str | None) -> str | None:
    """``[::1]`` -> ``::1``: torchrun's help asks for brackets around IPv6 addresses, but
    torch's ``env://`` (TCPStore) wants the bare address in MASTER_ADDR, as torchrun gives it."""
    if host is None:
        return None
    host = host.strip()
    if len(host) > 2 and host[0] == "[" and host[-1] == "]":
        return host[1:-1]
    return host


def _port(text: object, flag: str) -> int:
    value = _int(text, flag, low=0)
    if value > 65535:
        raise UsageError(f"{flag} must be a TCP port 0..65535, not {value}")
    return value


class _Nodes(NamedTuple):
    """What the node flags (or the scheduler) decide: see :class:`LaunchConfig`. (A
    NamedTuple: a dataclass costs ten times as much to define on every launch's start-up.)"""

    nnodes: int
    node_rank: int
    source: str
    master_addr: str
    master_port: int | None  # None: a free port at start (static, one node)
    backend: str = "static"
    endpoint: str = ""
    conf: tuple[tuple[str, str], ...] = ()
    min_nodes: int = 1
    max_nodes: int = 1
    warnings: tuple[str, ...] = ()


def _nodes(ns: argparse.Namespace, env: Mapping[str, str]) -> _Nodes:
    """The node facts: the static rendezvous (flags, Slurm, Open MPI) or a torch backend's."""
    backend = (ns.rdzv_backend if ns.rdzv_backend is not None else "static").strip()
    if not backend:
        raise UsageError("--rdzv-backend needs a name: static, c10d, etcd or etcd-v2")
    conf = parse_rdzv_conf(ns.rdzv_conf or "")
    min_nodes, max_nodes = _parse_nnodes(ns.nnodes) if ns.nnodes is not None else (1, 1)
    warnings: list[str] = []
    if ns.standalone:
        if backend != "static" or ns.rdzv_endpoint:
            warnings.append(
                "--standalone runs numarun's static rendezvous on 127.0.0.1; --rdzv-backend "
                "and --rdzv-endpoint are ignored (torchrun ignores them too)"
            )
        backend = "static"
    elif backend != "static":
        return _elastic_nodes(ns, backend, conf, min_nodes, max_nodes)
    warnings.extend(_check_rdzv_conf("static", conf))
    endpoint_host, endpoint_port = _split_endpoint(ns.rdzv_endpoint or "")
    addr = ns.master_addr
    if addr and endpoint_host and _unbracket(addr) != endpoint_host:
        raise UsageError(
            f"--master-addr {addr} and --rdzv-endpoint {ns.rdzv_endpoint} disagree; give one"
        )
    addr = _unbracket(addr) or endpoint_host
    port = _port(ns.master_port, "--master-port") if ns.master_port is not None else None
    if port is not None and endpoint_port is not None and port != endpoint_port:
        raise UsageError(
            f"--master-port {port} and --rdzv-endpoint {ns.rdzv_endpoint} disagree; give one"
        )
    port = port if port is not None else endpoint_port

    if ns.standalone:
        if ns.nnodes is not None and min_nodes != 1:
            raise UsageError("--standalone runs on one node; it cannot be used with --nnodes > 1")
        return _Nodes(1, 0, "flags", "127.0.0.1", None, conf=conf, warnings=tuple(warnings))

    facts = None
    under_scheduler = "SLURM_JOB_ID" in env or "OMPI_COMM_WORLD_RANK" in env
    if ns.nnodes is None and ns.node_rank is None and under_scheduler:
        from numarun.launch.rendezvous import node_facts_from_env

        facts = node_facts_from_env(env)
    if facts is not None:
        nnodes, node_rank, source = facts.nnodes, facts.node_rank, facts.source
        addr = addr or env.get("MASTER_ADDR") or facts.master_addr
        if port is None and env.get("MASTER_PORT"):
            port = _port(env["MASTER_PORT"], "MASTER_PORT")
        if addr is None:
            where = "mpirun" if source == "mpi" else "Slurm without SLURM_JOB_NODELIST"
            raise UsageError(
                f"under {where} numarun needs the host of node rank 0: pass --master-addr HOST "
                "(or set MASTER_ADDR)"
            )
        if nnodes < 1:
            raise UsageError(f"the {source} environment gives {nnodes} nodes")
        min_nodes = max_nodes = nnodes
    else:
        # torch's static rendezvous makes a world of MAX nodes (--nnodes 1:2 is 2 nodes).
        nnodes = max_nodes
        node_rank = _int(ns.node_rank, "--node-rank", low=0) if ns.node_rank is not None else 0
        source = "flags"
    if node_rank >= nnodes:
        raise UsageError(
            f"node rank {node_rank} is out of range for {nnodes} node(s): use 0..{nnodes - 1}"
        )
    if port == 0:
        if nnodes > 1:
            raise UsageError("--master-port 0 cannot be told to the other nodes: give a fixed port")
        port = None  # one node: pick a free port, as torchrun's localhost:0 does
    if port is None and nnodes > 1:
        port = DEFAULT_MULTI_NODE_PORT
    return _Nodes(
        nnodes,
        node_rank,
        source,
        addr or "127.0.0.1",
        port,
        conf=conf,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        warnings=tuple(warnings),
    )


def _elastic_nodes(
    ns: argparse.Namespace,
    backend: str,
    conf: tuple[tuple[str, str], ...],
    min_nodes: int,
    max_nodes: int,
) -> _Nodes:
    """A torch rendezvous forms the job: ranks, node count and master address come from its
    rounds. Checks what can be checked without importing torch: the backend exists (and its
    client package), the endpoint's port, the --rdzv-conf values the backend reads."""
    _check_backend(backend)
    warnings = list(_check_rdzv_conf(backend, conf))
    endpoint = (ns.rdzv_endpoint or "").strip()
    if dict(conf).get("store_type", "tcp").strip().lower() != "file":
        _split_endpoint(endpoint)  # a bad port is one line now, not torch's ValueError later
    ignored = [
        flag
        for flag, value in (
            ("--master-addr", ns.master_addr),
            ("--master-port", ns.master_port),
            ("--node-rank", ns.node_rank),
        )
        if value is not None
    ]
    if ignored:
        warnings.append(
            f"{' and '.join(ignored)} {'is' if len(ignored) == 1 else 'are'} not used with "
            f"--rdzv-backend {backend} (torchrun ignores {'it' if len(ignored) == 1 else 'them'} "
            "too): the rendezvous decides ranks and the master address"
        )
    return _Nodes(
        nnodes=max_nodes,
        node_rank=0,
        source="rendezvous",
        master_addr="",
        master_port=None,
        backend=backend,
        endpoint=endpoint,
        conf=conf,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        warnings=tuple(warnings),
    )


# torch's own rendezvous backends; others come from the torchrun.handlers entry point group.
TORCH_BACKENDS = ("c10d", "etcd", "etcd-v2")


def _check_backend(backend: str) -> None:
    """One line, before anything starts, when the backend cannot be loaded here."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise UsageError(
            f"--rdzv-backend {backend} is PyTorch's rendezvous and needs torch installed "
            "(numarun's static rendezvous needs none)"
        )
    if backend in ("etcd", "etcd-v2"):
        if importlib.util.find_spec("etcd") is None:
            raise UsageError(
                f"--rdzv-backend {backend} needs the etcd client package python-etcd "
                "(pip install python-etcd)"
            )
        return
    if backend in TORCH_BACKENDS:
        return
    from importlib.metadata import entry_points

    if backend not in {point.name for point in entry_points(group="torchrun.handlers")}:
        raise UsageError(
            f"unknown --rdzv-backend {backend!r}: use static, c10d, etcd or etcd-v2 (or install "
            "a package registering it under torchrun.handlers)"
        )


def parse_rdzv_conf(text: str) -> tuple[tuple[str, str], ...]:
    """``--rdzv-conf`` in torchrun's grammar: ``KEY=VALUE,KEY=VALUE,...``, keys and values
    stripped, a later key replacing an earlier one; empty text is no options. An item without
    a key or without a value is one :class:`UsageError` line (torchrun: a ValueError
    traceback). Values stay strings, as torch's backends receive them."""
    text = text.strip()
    if not text:
        return ()
    conf: dict[str, str] = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not key:
            raise UsageError(f"--rdzv-conf {text!r}: every item must be KEY=VALUE")
        if not value:
            raise UsageError(f"--rdzv-conf option {key!r} has no value: write {key}=VALUE")
        conf[key] = value
    return tuple(conf.items())


# The --rdzv-conf keys each torch 2.13 backend reads (unknown keys are ignored by torch).
_DYNAMIC_KEYS = (
    "join_timeout",
    "last_call_timeout",
    "close_timeout",
    "heartbeat_timeout",
    "keep_alive_interval",
    "keep_alive_max_attempt",
)
RDZV_CONF_KEYS: dict[str, tuple[str, ...]] = {
    "static": ("timeout",),
    "c10d": (*_DYNAMIC_KEYS, "read_timeout", "is_host", "store_type"),
    "etcd-v2": (*_DYNAMIC_KEYS, "read_timeout", "protocol", "ssl_cert", "ssl_cert_key", "ca_cert"),
    "etcd": ("timeout", "last_call_timeout", "etcd_prefix", "protocol", "cacert", "cert", "key"),
}
_SECONDS_KEYS = (*_DYNAMIC_KEYS, "read_timeout", "timeout")
_BOOLEANS = {"1": True, "true": True, "t": True, "yes": True, "y": True}
_BOOLEANS.update({"0": False, "false": False, "f": False, "no": False, "n": False})


def _check_rdzv_conf(backend: str, conf: tuple[tuple[str, str], ...]) -> list[str]:
    """Check the values ``backend`` reads as torch reads them (integers as ``int()``,
    booleans as ``RendezvousParameters.get_as_bool``), refusing in one line what torch would
    refuse with a traceback (or, for a zero interval, spin on); return warnings for keys the
    backend does not read (a plugin backend's keys are not known: none)."""
    known = RDZV_CONF_KEYS.get(backend)
    if known is None:
        return []
    warnings = []
    for key, value in conf:
        if key not in known:
            where = f"the {backend} backend (torchrun ignores it too)"
            if backend == "static":
                where = "numarun's static rendezvous: it has no effect"
            warnings.append(
                f"--rdzv-conf {key}={value} is not read by {where}; options: {', '.join(known)}"
            )
        elif key in _SECONDS_KEYS:
            try:
                number = int(value)
            except ValueError:
                number = 0
            if number <= 0:
                raise UsageError(f"--rdzv-conf {key}={value}: must be a whole number > 0")
        elif key == "is_host" and value.lower() not in _BOOLEANS:
            raise UsageError(f"--rdzv-conf is_host={value}: must be true or false (1/0, yes/no)")
        elif key == "store_type" and value.lower() not in ("tcp", "file"):
            raise UsageError(f"--rdzv-conf store_type={value}: must be tcp or file")
        elif key == "protocol" and value.lower() not in ("http", "https"):
            raise UsageError(f"--rdzv-conf protocol={value}: must be http or https")
    return warnings



def _output_specs(ns: argparse.Namespace, nproc: int) -> tuple[str, str, str]:
    """Validate --redirects, --tee and --local-ranks-filter now, so nothing starts on a typo."""
    redirects = (ns.redirects or "0").strip()
    tee = (ns.tee or "0").strip()
    ranks_filter = (ns.local_ranks_filter or "").strip()
    if redirects != "0" or tee != "0" or ranks_filter:
        from numarun.process import logs

        logs.parse_std_spec(redirects, nproc, flag="--redirects")
        logs.parse_std_spec(tee, nproc, flag="--tee")
        logs.parse_ranks_filter(ranks_filter, nproc)
    return redirects, tee, ranks_filter


def _check_mem_binding(mem_binding: str, numa_binding: str | None) -> None:
    choices = ("none", "local", "preferred", "bind", "interleave")
    if mem_binding not in choices:
        raise UsageError(f"unknown --mem-binding {mem_binding!r}: use one of {', '.join(choices)}")
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
    teardown = list(ALWAYS_TEARDOWN)
    for item in (DEFAULT_SIGNALS_TO_HANDLE if text is None else text).split(","):
        name = item.strip().upper()
        if not name:
            continue
        signum = _signal_number(name)
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            raise UsageError(f"--signals-to-handle: {name} cannot be caught")
        if signum == signal.SIGCHLD:
            raise UsageError("--signals-to-handle: SIGCHLD cannot stop the job")
        if signum not in teardown:
            teardown.append(signum)
    forward = [signum for signum in FORWARD_SIGNALS if signum not in teardown]
    return tuple(int(s) for s in teardown), tuple(int(s) for s in forward)


def _signal_number(name: str) -> int:
    if name.isdigit():
        number = int(name)
        try:
            return int(signal.Signals(number))
        except ValueError:
            pass
    else:
        full = name if name.startswith("SIG") else f"SIG{name}"
        if hasattr(signal.Signals, full):
            return int(signal.Signals[full])
    raise UsageError(f"--signals-to-handle: unknown signal {name!r} (use names like SIGUSR1)")


def _grace_period(text: str | None, env: Mapping[str, str]) -> float:
    if text is not None:
        return _float(text, "--grace-period")
    if env.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT"):
        return _float(env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"], "TORCH_ELASTIC_SHUTDOWN_TIMEOUT")
    return DEFAULT_GRACE_PERIOD

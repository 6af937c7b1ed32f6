"""argv -> :class:`LaunchConfig`: torchrun's command line, checked, with nothing started.

:func:`parse_args` reads ``numarun``'s own options (torchrun's flags in both spellings, with
torchrun's ``PET_<OPTION>`` environment defaults), splits off the entry point and its arguments
untouched, and decides everything a launch needs: the number of workers per node, the node facts
(flags, or Slurm / Open MPI), the store's endpoint, binding mode and explicit rank CPUs, output
specs, teardown and forwarded signals, the grace period. Any malformed or conflicting argument is
one :class:`UsageError` line. Reads no files, except the topology for ``--nproc-per-node
gpu|auto`` (or ``cpu`` with ``--sysfs-root`` or ``--cpus-allowed``); the modules for that, and
for CPU lists, binding modes, scheduler node facts and output specs, are imported only on the
path that needs them. Before the entry point, an unambiguous prefix of a flag stands for it.
Running a config is :mod:`numarun.launcher`'s job.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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
    ``numa_binding`` is a :data:`numarun.plan.MODES` value or ``None`` (no binding);
    ``rank_cpus`` is set exactly when it is ``"explicit"``. ``node_source`` says where the node
    facts came from: ``"flags"``, ``"slurm"`` or ``"mpi"``. ``master_addr`` is a host name or an
    address without brackets (``::1`` for ``[::1]``), as torch's ``env://`` wants it.
    ``duplicate_*_filters``: tee'd lines containing any of these go to
    ``attempt_0/filtered_std{out,err}.log`` as well (torchrun's meaning; empty: off).
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
        "number of nodes: N, or MIN:MAX with MIN == MAX (numarun is not "
        "elastic); default 1, or from Slurm / Open MPI",
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
    _Option(("--standalone",), "single node on 127.0.0.1 with a free port", flag=True),
    _Option(_dual("--rdzv-backend"), "only 'static' (the default) is supported", metavar="NAME"),
    _Option(
        _dual("--rdzv-endpoint"),
        "HOST[:PORT]: the same as --master-addr/--master-port",
        metavar="HOST:PORT",
    ),
    _Option(
        _dual("--rdzv-id"),
        "job id, exported as TORCHELASTIC_RUN_ID and used in log paths",
        metavar="ID",
    ),
    _Option(_dual("--rdzv-conf"), "accepted for compatibility; must be empty", metavar="CONF"),
    _Option(_dual("--max-restarts"), "only 0: a failed worker ends the job", metavar="N"),
    _Option(
        _dual("--monitor-interval"),
        "accepted and ignored: numarun is event-driven",
        metavar="SECONDS",
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
        "base directory for per-rank logs and error files: LOG_DIR/RUN_ID/attempt_0/LOCAL_RANK/",
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
        "for a comma) from every rank to <log dir>/<run id>/attempt_0/filtered_stdout.log",
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
    from numarun import __version__

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
    nnodes, node_rank, source, master_addr, master_port = _nodes(ns, env)
    if ns.max_restarts is not None and _int(ns.max_restarts, "--max-restarts", low=0) > 0:
        raise UsageError(
            f"--max-restarts {ns.max_restarts} is not supported by numarun: a failed worker "
            "ends the job (let the scheduler restart it, resuming from a checkpoint)"
        )
    if ns.monitor_interval is not None:
        _float(ns.monitor_interval, "--monitor-interval")
    if ns.rdzv_conf:
        raise UsageError("--rdzv-conf is not supported by numarun (static rendezvous only)")
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
    rdzv_id = (ns.rdzv_id or "").strip()
    if rdzv_id in (".", "..") or "/" in rdzv_id or "\0" in rdzv_id:
        raise UsageError(
            f"--rdzv-id {rdzv_id!r} cannot name a log directory: use letters, digits, '-' or '_'"
        )
    return LaunchConfig(
        entrypoint=entrypoint,
        entrypoint_kind=kind,
        args=tuple(args),
        nproc_per_node=nproc,
        nnodes=nnodes,
        node_rank=node_rank,
        node_source=source,
        master_addr=master_addr,
        master_port=master_port,
        run_id=rdzv_id if rdzv_id and rdzv_id != "none" else os.urandom(6).hex(),
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
    from numarun.cpulist import parse_cpulist

    lists = tuple(parse_cpulist(text) for text in texts)
    for local_rank, cpus in enumerate(lists):
        if not cpus:
            raise UsageError(f"--rank-cpus for local rank {local_rank} is empty")
    return lists


def _numa_binding(mode: str | None, rank_cpus: tuple[tuple[int, ...], ...] | None) -> str | None:
    if mode is not None:
        from numarun.plan import MODES

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
            from numarun.topology import read_topology

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


def _parse_nnodes(text: str) -> int:
    low, sep, high = text.strip().partition(":")
    if sep and _int(low, "--nnodes MIN", low=1) != _int(high, "--nnodes MAX", low=1):
        raise UsageError(
            f"--nnodes {text}: elastic node ranges are not supported by numarun; "
            "give a fixed count (--nnodes N)"
        )
    return _int(low, "--nnodes", low=1)


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


def _nodes(ns: argparse.Namespace, env: Mapping[str, str]) -> tuple[int, int, str, str, int | None]:
    """(nnodes, node_rank, source, master_addr, master_port or None for a free port)."""
    backend = (ns.rdzv_backend or "static").strip()
    if backend != "static":
        raise UsageError(
            f"--rdzv-backend {backend} is not supported by numarun (static rendezvous only): "
            "give --nnodes N --node-rank K --master-addr HOST --master-port PORT"
        )
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
        if ns.nnodes is not None and _parse_nnodes(ns.nnodes) != 1:
            raise UsageError("--standalone runs on one node; it cannot be used with --nnodes > 1")
        return 1, 0, "flags", "127.0.0.1", None

    facts = None
    under_scheduler = "SLURM_JOB_ID" in env or "OMPI_COMM_WORLD_RANK" in env
    if ns.nnodes is None and ns.node_rank is None and under_scheduler:
        from numarun.rendezvous import node_facts_from_env

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
    else:
        nnodes = _parse_nnodes(ns.nnodes) if ns.nnodes is not None else 1
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
    return nnodes, node_rank, source, addr or "127.0.0.1", port


def _output_specs(ns: argparse.Namespace, nproc: int) -> tuple[str, str, str]:
    """Validate --redirects, --tee and --local-ranks-filter now, so nothing starts on a typo."""
    redirects = (ns.redirects or "0").strip()
    tee = (ns.tee or "0").strip()
    ranks_filter = (ns.local_ranks_filter or "").strip()
    if redirects != "0" or tee != "0" or ranks_filter:
        from numarun import logs

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

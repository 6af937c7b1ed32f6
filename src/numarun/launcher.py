"""``numarun [options] train.py args...``: torchrun's command line, bound workers, clear failures.

Three kinds of entry point, as in torchrun: a Python script (``train.py``), a module
(``-m pkg.module``) and a binary (``--no-python ./binary``). Python workers run
``$PYTHON_EXEC or sys.executable -u -m numarun._script ...`` so that a worker without ``@record``
still leaves an error file with its traceback. Each worker gets torchrun's environment (RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ... TORCHELASTIC_ERROR_FILE) and meets the others through
``env://``: numarun runs no rendezvous service, global rank 0 hosts the ``TCPStore``.

Flow: :func:`parse_args` (argv -> :class:`LaunchConfig`, no effects) -> :func:`run` (entry point
checked, plan made, memory policy proven, workers started by the supervisor, summary printed,
exit code returned). :func:`main` joins the two and turns :class:`NumarunError` into one line on
stderr and exit status 2.

Start-up speed matters (``benchmarks/bench_launch.py`` compares it with bare interpreter
starts), so everything beyond argument parsing and the supervisor is imported only on the path
that needs it: the topology is read only when binding (or ``--nproc-per-node gpu|auto``) asks
for it, the log and failure modules only for redirected output or a failed run.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from numarun import workerenv
from numarun.errors import NumarunError, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from numarun.plan import Plan, RankBinding
    from numarun.supervisor import RunResult

DEFAULT_MULTI_NODE_PORT = 29500  # torchrun's --master-port default
DEFAULT_GRACE_PERIOD = 30.0  # torchrun's SIGTERM -> SIGKILL default
TEARDOWN_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Slurm sends these ahead of preemption (``--signal``); the job must keep running to checkpoint.
FORWARD_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
SCRIPT_BOOTSTRAP = "numarun._script"


@dataclass(frozen=True)
class LaunchConfig:
    """Everything a launch needs, decided from argv and the environment; nothing started yet.

    ``entrypoint_kind`` is ``"script"``, ``"module"`` or ``"binary"``. ``master_port`` is
    ``None`` when a free port is to be picked at start (single node, none given).
    ``numa_binding`` is a :data:`numarun.plan.MODES` value or ``None`` (no binding);
    ``rank_cpus`` is set exactly when it is ``"explicit"``. ``node_source`` says where the node
    facts came from: ``"flags"``, ``"slurm"`` or ``"mpi"``.
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
    python_exec: str = sys.executable

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
        "visible GPU), 'cpu' (os.cpu_count()) or 'auto' (GPUs if any, else CPUs); default 1",
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
        "host of global rank 0 (the TCPStore); default 127.0.0.1, or the first Slurm node",
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
        ("--role",), "role name: ROLE_NAME and the --tee prefix; default 'default'", metavar="NAME"
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
        "like --redirects, but also show the output on the console with '[role<rank>]:' prefixes",
        metavar="SPEC",
    ),
    _Option(
        _dual("--local-ranks-filter"),
        "show only these local ranks' output on the console, e.g. '0' or '0,2'",
        metavar="RANKS",
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
        "extra signals that tear the job down (SIGINT, "
        "SIGTERM, SIGHUP always do; SIGUSR1, SIGUSR2 are always forwarded)",
        metavar="SIGNALS",
    ),
    _Option(
        (*_dual("--grace-period"), *_dual("--shutdown-timeout")),
        "seconds between "
        "SIGTERM and SIGKILL at teardown; default $TORCH_ELASTIC_SHUTDOWN_TIMEOUT or 30",
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


def _build_parser(environ: Mapping[str, str]) -> _Parser:
    parser = _Parser(
        prog="numarun",
        usage="numarun [options] (SCRIPT | -m MODULE | --no-python BINARY) [args...]",
        description="Start one worker per GPU or CPU slice, bound near its device, with "
        "torchrun's flags and environment. Everything after the script, module or binary is "
        "passed to the workers untouched. Options may also come from PET_<OPTION> variables.",
        allow_abbrev=False,
    )
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
    if option.repeat:
        return None
    for name in option.names:
        if not name.startswith("--"):
            continue
        key = "PET_" + name[2:].upper().replace("-", "_")
        if key in environ:
            value = environ[key]
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
    before the entry point ends numarun's options.
    """
    takes_value = {name for option in _OPTIONS if not option.flag for name in option.names}
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return list(argv[:i]), list(argv[i + 1 :])
        if not token.startswith("-") or token == "-":
            return list(argv[:i]), list(argv[i:])
        i += 2 if token in takes_value else 1
    return list(argv), []


def parse_args(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> LaunchConfig:
    """Turn ``numarun``'s argv (without the program name) into a :class:`LaunchConfig`.

    ``environ`` (default ``os.environ``) supplies ``PET_*`` defaults, ``PYTHON_EXEC``,
    ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, ``TORCHELASTIC_SIGNALS_TO_HANDLE``,
    ``MASTER_ADDR``/``MASTER_PORT`` (under a scheduler only) and the Slurm / Open MPI node
    facts, which apply when neither ``--nnodes`` nor ``--node-rank`` was given. Reads no
    files, except the topology for ``--nproc-per-node gpu|auto``. Starts nothing.

    Raises :class:`UsageError` with one line for any malformed or conflicting argument; the
    entry point's existence is checked later, by :func:`run`. ``--help`` raises
    ``SystemExit(0)`` after printing the help.
    """
    env = os.environ if environ is None else environ
    own, rest = _split_argv(argv)
    ns = _build_parser(env).parse_args(own)
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
    teardown, forward = _signals(
        ns.signals_to_handle
        if ns.signals_to_handle is not None
        else env.get("TORCHELASTIC_SIGNALS_TO_HANDLE")
    )
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
        python_exec=env.get("PYTHON_EXEC") or sys.executable,
    )


def _entrypoint(ns: argparse.Namespace, rest: list[str]) -> tuple[str, str, list[str]]:
    if ns.module and ns.no_python:
        raise UsageError("-m/--module and --no-python cannot be combined")
    if ns.run_path and (ns.module or ns.no_python):
        other = "-m/--module" if ns.module else "--no-python"
        raise UsageError(f"--run-path runs a script file; it cannot be combined with {other}")
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
        if text == "cpu" and sysfs_root == "/":
            nproc = os.cpu_count() or 1
        else:
            from numarun.topology import read_topology

            topology = read_topology(sysfs_root, cpus_allowed=cpus_allowed)
            if text == "gpu" and not topology.gpus:
                raise UsageError("--nproc-per-node gpu: no visible GPUs on this machine")
            nproc = (
                len(topology.gpus) if text != "cpu" and topology.gpus else len(topology.online_cpus)
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
    if addr and endpoint_host and addr != endpoint_host:
        raise UsageError(
            f"--master-addr {addr} and --rdzv-endpoint {ns.rdzv_endpoint} disagree; give one"
        )
    addr = addr or endpoint_host
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

    SIGINT, SIGTERM and SIGHUP always tear down and SIGUSR1/SIGUSR2 are always forwarded (the
    job keeps running); listed signals other than those add to the teardown set. torchrun's
    default list (``SIGTERM,SIGINT,SIGHUP,SIGQUIT``) therefore adds SIGQUIT.
    """
    teardown = list(TEARDOWN_SIGNALS)
    forward = list(FORWARD_SIGNALS)
    for item in (text or "").split(","):
        name = item.strip().upper()
        if not name:
            continue
        signum = _signal_number(name)
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            raise UsageError(f"--signals-to-handle: {name} cannot be caught")
        if signum not in teardown and signum not in forward:
            teardown.append(signum)
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


# --- what each worker gets -----------------------------------------------------------------------


def worker_argv(config: LaunchConfig, binary_path: str | None = None) -> list[str]:
    """The argv exec'd for every worker (the same for all ranks; no shell anywhere).

    Scripts: ``PYTHON -u -m numarun._script -- SCRIPT ARGS``; modules: ``PYTHON -u -m
    numarun._script -m MODULE ARGS``; binaries: ``BINARY ARGS`` with ``binary_path`` (the
    resolved path, when given) in place of the name.
    """
    if config.entrypoint_kind == "binary":
        return [binary_path or config.entrypoint, *config.args]
    head = [config.python_exec, "-u", "-m", SCRIPT_BOOTSTRAP]
    if config.entrypoint_kind == "module":
        return [*head, "-m", config.entrypoint, *config.args]
    return [*head, "--", config.entrypoint, *config.args]


def rank_env(
    config: LaunchConfig,
    local_rank: int,
    *,
    base: Mapping[str, str],
    master_port: int,
    error_file: str,
    binding: RankBinding | None = None,
    plan_env: Sequence[tuple[str, str]] = (),
    unbound_threads: int = 1,
) -> dict[str, str]:
    """The variables numarun sets for ``local_rank`` on top of ``base`` (the launcher's env).

    torchrun's set (RANK, LOCAL_RANK, GROUP_RANK, ROLE_RANK, ROLE_NAME, LOCAL_WORLD_SIZE,
    WORLD_SIZE, GROUP_WORLD_SIZE, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_*),
    ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1`` and ``OMP_NUM_THREADS`` only when ``base`` lacks them
    (OMP: the rank's bound physical cores, else ``unbound_threads``), then ``plan_env`` (e.g.
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``), which wins over ``base``.
    """
    rank = config.global_rank(local_rank)
    env = {
        "LOCAL_RANK": str(local_rank),
        "RANK": str(rank),
        "GROUP_RANK": str(config.node_rank),
        "ROLE_RANK": str(rank),
        "ROLE_NAME": config.role,
        "LOCAL_WORLD_SIZE": str(config.nproc_per_node),
        "WORLD_SIZE": str(config.world_size),
        "GROUP_WORLD_SIZE": str(config.nnodes),
        "ROLE_WORLD_SIZE": str(config.world_size),
        "MASTER_ADDR": config.master_addr,
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": config.run_id,
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_ERROR_FILE": error_file,
    }
    if "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in base:
        env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
    if "OMP_NUM_THREADS" not in base:
        threads = binding.threads if binding is not None else unbound_threads
        env["OMP_NUM_THREADS"] = str(max(1, threads))
    env.update(plan_env)
    return env


# --- exit codes ----------------------------------------------------------------------------------


def exit_code_for(result: RunResult) -> int:
    """The launcher's exit status for a finished run.

    128+N when the launcher itself received signal N (130 for Ctrl-C); else 0 when no worker
    failed; else the first failing worker's status: its exit code, 128+N when signal N killed
    it, 1 when it is unaccounted for (unkillable).
    """
    if result.received_signal:
        return 128 + int(result.received_signal)
    failure = result.first_failure
    if failure is None:
        return 0
    if failure.exit_code is None:
        return 1
    if failure.exit_code < 0:
        return 128 - failure.exit_code
    return failure.exit_code or 1


# --- running -------------------------------------------------------------------------------------


def main(argv: Sequence[str]) -> int:
    """Parse ``argv`` (without the program name), launch, and return the exit status.

    Bad input prints ``numarun: error: <one line>`` on stderr and returns 2 with nothing
    started; ``--help`` prints the help and returns 0.
    """
    try:
        config = parse_args(argv)
        return run(config)
    except NumarunError as error:
        print(f"numarun: error: {error}", file=sys.stderr)
        return error.exit_code
    except SystemExit as stop:  # --help
        return stop.code if isinstance(stop.code, int) else 0


def run(config: LaunchConfig, environ: Mapping[str, str] | None = None) -> int:
    """Check the entry point, plan, start every worker, wait, report; return the exit status.

    Before anything starts: the script must be a file, the module findable (without importing
    it), the binary executable; the plan and each memory policy must be applicable (or fall back
    with ``--binding-fallback``). Any of these raises a :class:`NumarunError` subclass. With
    ``--dry-run`` prints the plan, and per rank the argv and the environment added, and
    returns 0. Otherwise returns :func:`exit_code_for` the run (0, the first failing worker's
    status, 128+N for a worker killed by signal N, 128+N when the launcher got teardown signal
    N, also while the workers were still starting); a non-zero run ends with the failure
    summary as the last thing on stderr. ``environ`` (default ``os.environ``) is the base of
    every worker's environment.

    Side effect on the calling process: ``gc.freeze()`` just before the workers start; the
    launcher's start-up objects are never collected afterwards.
    """
    base = dict(os.environ if environ is None else environ)
    binary_path = check_entrypoint(config, base)
    plan = _make_plan(config)
    if plan is not None:
        for warning in plan.warnings:
            print(f"numarun: warning: {warning}", file=sys.stderr)
    port = config.master_port if config.master_port is not None else workerenv.free_port()
    argv = worker_argv(config, binary_path)
    if config.dry_run:
        print(_dry_run_text(config, plan, base, port, argv), end="")
        return 0
    return _launch(config, plan, base, port, argv)


def check_entrypoint(config: LaunchConfig, env: Mapping[str, str]) -> str | None:
    """Raise :class:`UsageError` unless the entry point can start; return a binary's path.

    A script must be an existing file (or a directory with ``__main__.py``). A module must be
    findable from the current directory and ``sys.path`` without importing it (parents are
    located through their ``submodule_search_locations``); a package needs a ``__main__``
    submodule. The module check is skipped when ``PYTHON_EXEC`` names another interpreter (its
    path may differ). A binary is looked up on ``PATH`` when it has no ``/`` and must be an
    executable file.
    """
    if config.entrypoint_kind == "script":
        path = config.entrypoint
        if os.path.isdir(path):
            if not os.path.isfile(os.path.join(path, "__main__.py")):
                raise UsageError(f"training script {path!r} is a directory without __main__.py")
        elif not os.path.isfile(path):
            raise UsageError(f"training script {path!r} not found")
        return None
    if config.entrypoint_kind == "module":
        if config.python_exec == sys.executable:
            _check_module(config.entrypoint)
        return None
    return _resolve_binary(config.entrypoint, env)


def _check_module(name: str) -> None:
    import importlib.machinery
    import importlib.util

    parts = name.split(".")
    if not all(part.isidentifier() for part in parts):
        raise UsageError(f"-m {name!r} is not a valid module name")
    spec = importlib.machinery.PathFinder.find_spec(parts[0], [os.getcwd(), *sys.path])
    if spec is None:
        spec = importlib.util.find_spec(parts[0])  # built-in and frozen modules
    for depth in range(1, len(parts) + 1):
        if spec is None:
            raise UsageError(
                f"module {'.'.join(parts[:depth])!r} not found (from {os.getcwd()} and sys.path)"
            )
        if depth == len(parts):
            break
        locations = spec.submodule_search_locations
        if locations is None:
            raise UsageError(
                f"module {name!r} not found: {'.'.join(parts[:depth])!r} is not a package"
            )
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: depth + 1]), locations)
    if spec is not None and spec.submodule_search_locations is not None:
        main_spec = importlib.machinery.PathFinder.find_spec(
            f"{name}.__main__", spec.submodule_search_locations
        )
        if main_spec is None:
            raise UsageError(
                f"-m {name}: {name!r} is a package without __main__; name a module inside it"
            )


def _resolve_binary(binary: str, env: Mapping[str, str]) -> str:
    import shutil

    if "/" in binary:
        if not os.path.isfile(binary):
            raise UsageError(f"--no-python binary {binary!r} not found")
        if not os.access(binary, os.X_OK):
            raise UsageError(f"--no-python binary {binary!r} is not executable (chmod +x it)")
        return binary
    found = shutil.which(binary, path=env.get("PATH", os.defpath))
    if found is None:
        raise UsageError(f"--no-python binary {binary!r} not found on PATH")
    return found


def _make_plan(config: LaunchConfig) -> Plan | None:
    if config.numa_binding is None:
        return None
    from numarun.plan import make_plan
    from numarun.topology import read_topology

    topology = read_topology(config.sysfs_root, cpus_allowed=config.cpus_allowed)
    return make_plan(
        topology,
        config.nproc_per_node,
        config.numa_binding,
        rank_cpus=config.rank_cpus,
        allow_unbound=config.binding_fallback,
    )


def _bound(plan: Plan | None, local_rank: int) -> RankBinding | None:
    if plan is None or not plan.bound:
        return None
    return plan.ranks[local_rank]


def _unbound_threads(config: LaunchConfig, base: Mapping[str, str]) -> int:
    if "OMP_NUM_THREADS" in base:
        return 1  # not used: the user's value is kept
    return workerenv.unbound_threads(config.nproc_per_node)


def _error_file(attempt_dir: str, local_rank: int) -> str:
    return os.path.join(attempt_dir, str(local_rank), "error.json")


def _dry_run_text(
    config: LaunchConfig, plan: Plan | None, base: Mapping[str, str], port: int, argv: list[str]
) -> str:
    import shlex

    lines: list[str] = []
    if plan is not None:
        from numarun.plan import format_plan_table

        lines.append(format_plan_table(plan))
        lines.append("")
    attempt_dir = os.path.join(config.log_dir or "<temporary dir>", config.run_id, "attempt_0")
    threads = _unbound_threads(config, base)
    for local_rank in range(config.nproc_per_node):
        env = rank_env(
            config,
            local_rank,
            base=base,
            master_port=port,
            error_file=_error_file(attempt_dir, local_rank),
            binding=_bound(plan, local_rank),
            plan_env=plan.env if plan is not None else (),
            unbound_threads=threads,
        )
        binding = _bound(plan, local_rank)
        where = "unbound" if binding is None else f"cpus {_cpus_text(binding.cpus)}"
        lines.append(f"local rank {local_rank} (rank {config.global_rank(local_rank)}, {where}):")
        lines.append(f"  argv: {shlex.join(argv)}")
        for key in sorted(env):
            if base.get(key) != env[key]:
                lines.append(f"  env:  {key}={shlex.quote(env[key])}")
    return "\n".join(lines) + "\n"


def _cpus_text(cpus: Sequence[int]) -> str:
    from numarun.cpulist import format_cpulist

    return format_cpulist(cpus)


def _launch(
    config: LaunchConfig, plan: Plan | None, base: Mapping[str, str], port: int, argv: list[str]
) -> int:
    import gc
    import shutil

    from numarun.supervisor import Supervisor, WorkerSpec

    mem_policies = _mem_policies(config, plan)
    outputs = _output_levels(config)
    # Per-rank files are kept when asked for (--log-dir) or when output went to them; a
    # temporary directory that only held error files is removed at the end.
    to_files = any(outputs[0].values()) or any(outputs[1].values())
    keep = config.log_dir is not None or to_files
    log_base = config.log_dir if config.log_dir is not None else _temp_log_dir(announce=to_files)
    try:
        attempt_dir = _make_attempt_dir(log_base, config, fresh=config.log_dir is None)
        threads = _unbound_threads(config, base)
        specs = []
        for local_rank in range(config.nproc_per_node):
            binding = _bound(plan, local_rank)
            env = {
                **base,
                **rank_env(
                    config,
                    local_rank,
                    base=base,
                    master_port=port,
                    error_file=_error_file(attempt_dir, local_rank),
                    binding=binding,
                    plan_env=plan.env if plan is not None else (),
                    unbound_threads=threads,
                ),
            }
            stdout, stderr = _sinks(config, outputs, local_rank, attempt_dir, base)
            specs.append(
                WorkerSpec(
                    local_rank=local_rank,
                    rank=config.global_rank(local_rank),
                    env=env,
                    argv=argv,
                    cpus=binding.cpus if binding is not None else None,
                    mem=mem_policies[local_rank],
                    stdout=stdout,
                    stderr=stderr,
                )
            )
        supervisor = Supervisor(
            specs,
            grace_period=config.grace_period,
            teardown_signals=config.teardown_signals,
            forward_signals=config.forward_signals,
        )
        # Everything allocated so far lives until exit; freezing it keeps the collector from
        # walking it again, which on a slow machine costs 10+ ms at interpreter exit.
        gc.freeze()
        result = supervisor.run(on_started=_prefetch_failure_report)
        code = exit_code_for(result)
        if code != 0:
            sys.stdout.flush()
            summary = _summary(config, result, attempt_dir, outputs, log_base if keep else None)
            sys.stderr.write(summary + "\n")
            sys.stderr.flush()
        return code
    finally:
        if not keep:
            shutil.rmtree(log_base, ignore_errors=True)


def _prefetch_failure_report(delay: float = 0.25) -> None:
    """Import the failure summary's modules in the background once the workers are under way.

    Importing :mod:`numarun.failures` (json, traceback, ...) costs 10-20 ms, which would
    otherwise sit between a worker's failure and the launcher's exit. The delay keeps the
    import off the CPUs while the workers start; a failure before it just imports in line.
    """
    import threading

    timer = threading.Timer(delay, _import_failures)
    timer.daemon = True
    timer.start()


def _import_failures() -> None:
    import numarun.failures  # noqa: F401


def _temp_log_dir(*, announce: bool) -> str:
    """A fresh private directory ``$TMPDIR/numarun_XXXXXXXXXXXX`` (mode 0700).

    Made by hand rather than with :func:`tempfile.mkdtemp`: :mod:`tempfile` and
    :mod:`numarun.logs` cost a few milliseconds to import on every launch's start-up path.
    """
    base = os.environ.get("TMPDIR") or "/tmp"
    for _ in range(100):
        path = os.path.join(base, f"numarun_{os.urandom(6).hex()}")
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        except OSError as error:
            raise UsageError(
                f"cannot create a temporary log directory in {base}: {error.strerror}; "
                "give --log-dir"
            ) from None
        if announce:
            print(f"numarun: worker logs go to {path}", file=sys.stderr)
        return path
    raise UsageError(f"cannot create a temporary log directory in {base}; give --log-dir")


def _make_attempt_dir(log_base: str, config: LaunchConfig, *, fresh: bool) -> str:
    """``log_base/<run_id>/attempt_0/<local_rank>/`` for every rank; returns the attempt dir.

    A ``fresh`` base (our own new temporary directory) cannot hold stale files, so the
    directories are made directly; otherwise :func:`numarun.logs.make_log_dirs` also removes
    an old ``attempt_0`` of the same run id, whose ``error.json`` would be read as ours.
    """
    if fresh:
        attempt_dir = os.path.join(log_base, config.run_id, "attempt_0")
        for local_rank in range(config.nproc_per_node):
            os.makedirs(os.path.join(attempt_dir, str(local_rank)))
        return attempt_dir
    from numarun.logs import make_log_dirs

    return str(make_log_dirs(log_base, config.run_id, config.nproc_per_node))


def _mem_policies(config: LaunchConfig, plan: Plan | None) -> list:
    """Each rank's memory policy, proven applicable here; CPUs checked against our affinity."""
    if plan is None or not plan.bound:
        return [None] * config.nproc_per_node
    from numarun import binding

    for rank in plan.ranks:
        binding.check_cpus(rank.cpus, rank=rank.local_rank)
    policies = [binding.mem_policy_for(config.mem_binding, rank.mems) for rank in plan.ranks]
    applied, warnings = binding.check_mem_policy(policies, allow_fallback=config.binding_fallback)
    for warning in warnings:
        print(f"numarun: warning: {warning}", file=sys.stderr)
    return applied


def _output_levels(config: LaunchConfig) -> tuple[dict[int, int], dict[int, int], set[int]]:
    """(redirects, tee, shown local ranks); the logs module is imported only when needed."""
    n = config.nproc_per_node
    if config.redirects == "0" and config.tee == "0" and not config.local_ranks_filter:
        return dict.fromkeys(range(n), 0), dict.fromkeys(range(n), 0), set(range(n))
    from numarun import logs

    return (
        logs.parse_std_spec(config.redirects, n, flag="--redirects"),
        logs.parse_std_spec(config.tee, n, flag="--tee"),
        logs.parse_ranks_filter(config.local_ranks_filter, n),
    )


def _sinks(
    config: LaunchConfig,
    outputs: tuple[dict[int, int], dict[int, int], set[int]],
    local_rank: int,
    attempt_dir: str,
    base: Mapping[str, str],
) -> tuple[object, object]:
    redirects, tee, shown = outputs
    if not redirects[local_rank] and not tee[local_rank] and local_rank in shown:
        return None, None  # the worker writes straight to our stdout/stderr
    from pathlib import Path

    from numarun import logs

    rank = config.global_rank(local_rank)
    prefix = logs.make_prefix(rank, local_rank, role_name=config.role, environ=base)
    return logs.sinks_for(
        local_rank,
        rank,
        redirects[local_rank],
        tee[local_rank],
        Path(attempt_dir) / str(local_rank),
        local_rank in shown,
        prefix=prefix,
    )


def _summary(
    config: LaunchConfig,
    result: RunResult,
    attempt_dir: str,
    outputs: tuple[dict[int, int], dict[int, int], set[int]],
    log_dir: str | None,
) -> str:
    from pathlib import Path

    from numarun import failures

    redirects, tee, _ = outputs
    reports = []
    for worker in result.workers:
        to_files = redirects[worker.local_rank] or tee[worker.local_rank]
        reports.append(
            failures.rank_report(
                worker,
                error_file=_error_file(attempt_dir, worker.local_rank),
                log_dir=Path(attempt_dir) / str(worker.local_rank) if to_files else None,
            )
        )
    entrypoint = " ".join([config.entrypoint, *config.args])
    if len(entrypoint) > 200:
        entrypoint = entrypoint[:197] + "..."
    return failures.format_summary(
        reports, entrypoint=entrypoint, host=os.uname().nodename, log_dir=log_dir
    )

"""torchrun's command line as numarun reads it: the option table, the parser, argv's split.

Each option is listed once (:data:`_OPTIONS`) in both of torchrun's spellings
(``--nproc-per-node`` and ``--nproc_per_node``); its default is torchrun's ``PET_<OPTION>``
environment variable when set (a flag's must be ``0`` or ``1``; an option given once per local
rank, ``--rank-cpus``, has none and refuses one). :func:`split_argv` cuts argv at the entry point
by hand, so nothing after it is ever read as numarun's, and before it spells out an unambiguous
prefix of a long option as argparse's ``allow_abbrev`` would. :func:`read_options` reads what
comes before it: by hand when every token is plain, else through :func:`build_parser`'s argparse
parser (help, version, mistakes: one :class:`UsageError` line), which a launch's start-up path
then never imports. :func:`parse_int`,
:func:`parse_seconds` and :func:`parse_port` read one flag's value, or raise one such line naming
the flag. What the values mean is :mod:`numarun.cmdline.config`'s business.
"""

from __future__ import annotations

from numarun.errors import UsageError
from numarun.machine.model import Value, fill_fields

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping, Sequence


class _Option(Value):
    _fields = ("names", "help", "flag", "repeat", "metavar")
    __slots__ = _fields
    names: tuple[str, ...]
    help: str
    flag: bool  # store_true; PET_* value is "0"/"1" like torchrun's check_env
    repeat: bool  # action="append"; no PET_* fallback
    metavar: str | None

    def __init__(
        self,
        names: tuple[str, ...],
        help: str,
        flag: bool = False,
        repeat: bool = False,
        metavar: str | None = None,
    ) -> None:
        fill_fields(self, locals())

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
        ("--preload",),
        "warm workers: one standby per local rank, bound as its worker, imports these "
        "comma-separated modules (e.g. torch) ahead of each attempt, which then starts past "
        "them; imports only, never CUDA (not with --no-python)",
        metavar="MODULES",
    ),
    _Option(
        ("--preload-required",),
        "with --preload: a module that cannot be imported (or initialises CUDA) ends the "
        "job with one line and exit status 1 (2 before anything starts) instead of a "
        "warning and cold starts",
        flag=True,
    ),
    _Option(
        ("--preload-late",),
        "with --preload: start the next attempt's standbys only once an attempt's workers "
        "run, not at launch beside the first attempt's (one set of standbys less while the "
        "node waits in its first rendezvous or as a spare; a failure within one import time "
        "of the start then restarts partly cold)",
        flag=True,
    ),
    _Option(
        _dual("--monitor-interval"),
        "seconds between looks at a torch rendezvous while workers run (default 2; workers "
        "themselves are watched event-driven)",
        metavar="SECONDS",
    ),
    _Option(
        _dual("--diagnostics-store"),
        "where a torch rendezvous's whole-job diagnostics (numarun stacks, hang verdicts, "
        "failure notices) keep their keys: own (default with c10d: a store hosted by the "
        "round's node 0, away from the rendezvous's traffic) or rendezvous (the rendezvous's "
        "store; the default with etcd)",
        metavar="own|rendezvous",
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
        "'[<role><local rank>]:' (--log-line-prefix-template or "
        "$TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE overrides it)",
        metavar="SPEC",
    ),
    _Option(
        _dual("--log-line-prefix-template"),
        "the --tee prefix instead of '[<role><local rank>]:', as torchrun 2.14 reads it: "
        "${role_name}, ${local_rank}, ${rank} and ${hostname} (the short host name) are "
        "substituted, e.g. '${hostname}:${rank}: '; over $TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE",
        metavar="TEMPLATE",
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
        ("-q", "--quiet"),
        "numarun prints only errors and the failure summary: no start line, warnings or "
        "restart notes (the workers' output is untouched)",
        flag=True,
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


class Options:
    """numarun's own options as read: one attribute per option's ``dest`` (``nproc_per_node``,
    ...), the shape of argparse's namespace, which :func:`read_options` gives where it asks
    argparse."""

    def __init__(self, values: Mapping[str, object]) -> None:
        self.__dict__.update(values)


def read_options(
    own: Sequence[str], environ: Mapping[str, str], epilog: str | None = None
) -> Options | argparse.Namespace:
    """The options before the entry point (:func:`split_argv`'s first part, prefixes spelled
    out) with their ``PET_*`` defaults, as :func:`build_parser`'s parser reads them.

    Read by hand when every token is one of :data:`_OPTIONS` by one of its names, a flag with
    no ``=value`` and an option's value non-empty and not starting with ``-`` (where argparse
    could read it as an option): what argparse would make of them, without importing it (a few
    milliseconds of every launch's start-up). Anything else (``--help``, ``--version``, an
    unknown option, a missing or odd value) goes to argparse, which reads it or raises its one
    :class:`UsageError` line (``SystemExit`` after printing the help or the version)."""
    values = _read_plain(own, environ)
    if values is not None:
        return Options(values)
    return build_parser(environ, epilog).parse_args(own)


def _read_plain(own: Sequence[str], environ: Mapping[str, str]) -> dict[str, object] | None:
    """:func:`read_options`'s reading by hand; None where argparse must read ``own``."""
    by_name = {name: option for option in _OPTIONS for name in option.names}
    values: dict[str, object] = {}
    for option in _OPTIONS:  # in build_parser's order, so that a bad PET_* is the same line
        default = _pet_default(option, environ)
        values[option.dest] = None if option.repeat else default
    i = 0
    while i < len(own):
        name, equals, value = own[i].partition("=")
        if not name.startswith("--"):
            name, equals, value = own[i], "", ""  # -q: a short flag takes no "="
        option = by_name.get(name)
        if option is None or (option.flag and equals):
            return None
        if option.flag:
            values[option.dest] = True
            i += 1
            continue
        if not equals:
            i += 1
            if i == len(own):
                return None
            value = own[i]
        if not value or value.startswith("-"):
            return None
        if option.repeat:
            values[option.dest] = [*(values[option.dest] or ()), value]  # type: ignore[misc]
        else:
            values[option.dest] = value
        i += 1
    return values


def build_parser(environ: Mapping[str, str], epilog: str | None = None) -> argparse.ArgumentParser:
    """argparse's parser of numarun's options (``PET_*`` defaults), reporting bad usage as one
    :class:`UsageError` line (exit 2) instead of usage + error, with a "did you mean" for an
    option it does not know (:class:`numarun.cmdline.usage.OneLineParser`)."""
    import argparse

    from numarun._version import __version__
    from numarun.cmdline.usage import OneLineParser

    parser = OneLineParser(
        prog="numarun",
        usage="numarun [options] (SCRIPT | -m MODULE | --no-python BINARY) [args...]\n"
        "       numarun COMMAND [args...]    (commands: see the end)",
        description="Start one worker per GPU or CPU slice, bound near its device, with\n"
        "torchrun's flags and environment. Everything after the script, module or binary is\n"
        "passed to the workers untouched. Options may also come from PET_<OPTION> variables\n"
        "and, before the script, be shortened to any unambiguous prefix (--nnode 1).",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # prefixes are spelled out by split_argv, before the script only
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


def split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
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

# numarun's options that torchrun does not have (dashed spelling). A prefix torchrun reads as
# one of its own options means that option here too, even where one of these also starts with
# it (``--h`` is ``--help``, not ambiguous with ``--hang-timeout``; ``--v`` is
# ``--virtual-local-rank``, not ``--version``).
NUMARUN_ONLY = frozenset({
    "--rank-cpus", "--mem-binding", "--binding-fallback", "--grace-period", "--hang-timeout",
    "--dry-run", "--sysfs-root", "--cpus-allowed", "--quiet", "--version", "--preload",
    "--preload-required", "--preload-late", "--diagnostics-store",
})  # fmt: skip

# Options that a training script hardly ever has itself: after the entry point they are the
# script's (as with torchrun), which :func:`options_after_entrypoint` warns about once.
_LAUNCHER_ONLY = (
    "--nproc-per-node", "--nnodes", "--node-rank", "--master-addr", "--master-port",
    "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf", "--standalone",
    "--max-restarts", "--monitor-interval", "--numa-binding", "--mem-binding", "--rank-cpus",
    "--binding-fallback", "--hang-timeout", "--preload", "--preload-required",
    "--preload-late", "--redirects", "--tee", "--local-ranks-filter", "--diagnostics-store",
    "--no-python", "--nproc_per_node", "--node_rank", "--master_addr", "--master_port",
    "--rdzv_backend", "--rdzv_endpoint", "--rdzv_id", "--rdzv_conf", "--max_restarts",
    "--monitor_interval", "--numa_binding", "--mem_binding", "--rank_cpus",
    "--binding_fallback", "--hang_timeout", "--local_ranks_filter", "--no_python",
)  # fmt: skip


def options_after_entrypoint(entrypoint: str, args: Sequence[str]) -> str | None:
    """A warning when ``args`` (what follows the entry point, passed to it untouched) holds
    launcher options such as ``--nproc-per-node``: torchrun passes them to the script too,
    and so does numarun, but the user probably meant them for the launcher. None otherwise."""
    found = []
    for arg in args:
        name = arg.partition("=")[0]
        if name in _LAUNCHER_ONLY and name not in found:
            found.append(name)
    if not found:
        return None
    return (
        f"{', '.join(found)} after {entrypoint} {'goes' if len(found) == 1 else 'go'} to the "
        "script, as with torchrun, not to numarun; put numarun's options before the script"
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
        torchruns = {
            key: (full, option)
            for key, (full, option) in matches.items()
            if any(
                n.startswith("--") and n.replace("_", "-") not in NUMARUN_ONLY
                for n in option.names
            )
        }
        if len(torchruns) == 1:
            matches = torchruns  # torchrun reads the prefix as this option: so does numarun
        else:
            names = sorted(option.names[0] for _full, option in matches.values())
            raise UsageError(f"ambiguous option: {name} could match {', '.join(names)}")
    if not matches:
        return token
    (full, option), = matches.values()
    spelled = next((n for n in option.names if n.startswith(name)), full)
    return spelled + sep + value


def parse_int(text: object, flag: str, *, low: int | None = None) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise UsageError(f"{flag} must be an integer, not {text!r}") from None
    if low is not None and value < low:
        raise UsageError(f"{flag} must be at least {low}, not {value}")
    return value


def parse_seconds(text: object, flag: str) -> float:
    try:
        value = float(str(text).strip())
    except ValueError:
        raise UsageError(f"{flag} must be a number of seconds, not {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise UsageError(f"{flag} must be a finite number of seconds >= 0, not {text!r}")
    return value


def parse_port(text: object, flag: str) -> int:
    value = parse_int(text, flag, low=0)
    if value > 65535:
        raise UsageError(f"{flag} must be a TCP port 0..65535, not {value}")
    return value

"""The node facts of a launch: how many nodes, which one this is, where the store listens.

:func:`parse_nodes` decides them from the node and rendezvous flags (``--nnodes N`` or
``MIN:MAX``, ``--node-rank``, ``--master-addr``/``--master-port``, ``--rdzv-endpoint``,
``--standalone``), or, when neither ``--nnodes`` nor ``--node-rank`` is given, from Slurm's or
Open MPI's environment (:mod:`numarun.cmdline.clusterenv`, imported only under a scheduler). With
a PyTorch rendezvous backend (``--rdzv-backend c10d``) the rounds decide ranks and addresses
later; here only what can be checked without importing torch is: the backend (and its client
package) exists, the endpoint's port, the ``--rdzv-conf`` values the backend reads, as torch
reads them (:func:`parse_rdzv_conf`). Any malformed or conflicting value is one
:class:`UsageError` line. Starts nothing and never imports torch: a torch backend is only looked
for on ``sys.path`` (a plugin backend among the ``torchrun.handlers`` entry points).
"""

from __future__ import annotations

from numarun.cmdline.options import parse_int, parse_port
from numarun.errors import UsageError
from numarun.machine.model import Value, fill_fields

TYPE_CHECKING = False  # typing is not imported at run time: the launcher's start-up path
if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping

DEFAULT_MULTI_NODE_PORT = 29500  # torchrun's --master-port default


class Nodes(Value):
    """What the node flags (or the scheduler) decide: see
    :class:`numarun.cmdline.config.LaunchConfig`. A :class:`Value`, not a namedtuple: making
    that class costs every launch's start-up about 0.2 ms, typing.NamedTuple ten times as
    much."""

    _fields = (
        "nnodes", "node_rank", "source", "master_addr", "master_port", "backend", "endpoint",
        "conf", "min_nodes", "max_nodes", "warnings",
    )  # fmt: skip
    __slots__ = _fields
    nnodes: int
    node_rank: int
    source: str
    master_addr: str
    master_port: int | None  # None: a free port at start (static, one node)
    backend: str
    endpoint: str
    conf: tuple[tuple[str, str], ...]
    min_nodes: int
    max_nodes: int
    warnings: tuple[str, ...]

    def __init__(
        self,
        nnodes: int,
        node_rank: int,
        source: str,
        master_addr: str,
        master_port: int | None,
        backend: str = "static",
        endpoint: str = "",
        conf: tuple[tuple[str, str], ...] = (),
        min_nodes: int = 1,
        max_nodes: int = 1,
        warnings: tuple[str, ...] = (),
    ) -> None:
        fill_fields(self, locals())


def parse_nodes(ns: argparse.Namespace, env: Mapping[str, str]) -> Nodes:
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
    endpoint_host, endpoint_port = split_endpoint(ns.rdzv_endpoint or "")
    addr = ns.master_addr
    if addr and endpoint_host and _unbracket(addr) != endpoint_host:
        raise UsageError(
            f"--master-addr {addr} and --rdzv-endpoint {ns.rdzv_endpoint} disagree; give one"
        )
    addr = _unbracket(addr) or endpoint_host
    port = parse_port(ns.master_port, "--master-port") if ns.master_port is not None else None
    if port is not None and endpoint_port is not None and port != endpoint_port:
        raise UsageError(
            f"--master-port {port} and --rdzv-endpoint {ns.rdzv_endpoint} disagree; give one"
        )
    port = port if port is not None else endpoint_port

    if ns.standalone:
        if ns.nnodes is not None and min_nodes != 1:
            raise UsageError("--standalone runs on one node; it cannot be used with --nnodes > 1")
        return Nodes(1, 0, "flags", "127.0.0.1", None, conf=conf, warnings=tuple(warnings))

    facts = None
    under_scheduler = "SLURM_JOB_ID" in env or "OMPI_COMM_WORLD_RANK" in env
    if ns.nnodes is None and ns.node_rank is None and under_scheduler:
        from numarun.cmdline.clusterenv import node_facts_from_env

        facts = node_facts_from_env(env)
    if facts is not None:
        nnodes, node_rank, source = facts.nnodes, facts.node_rank, facts.source
        addr = addr or env.get("MASTER_ADDR") or facts.master_addr
        if port is None and env.get("MASTER_PORT"):
            port = parse_port(env["MASTER_PORT"], "MASTER_PORT")
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
        node_rank = parse_int(ns.node_rank, "--node-rank", low=0) if ns.node_rank is not None else 0
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
    return Nodes(
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
) -> Nodes:
    """A torch rendezvous forms the job: ranks, node count and master address come from its
    rounds. Checks what can be checked without importing torch: the backend exists (and its
    client package), the endpoint's port, the --rdzv-conf values the backend reads."""
    _check_backend(backend)
    warnings = list(_check_rdzv_conf(backend, conf))
    endpoint = (ns.rdzv_endpoint or "").strip()
    if dict(conf).get("store_type", "tcp").strip().lower() != "file":
        split_endpoint(endpoint)  # a bad port is one line now, not torch's ValueError later
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
    return Nodes(
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


def _parse_nnodes(text: str) -> tuple[int, int]:
    """``N`` -> (N, N); ``MIN:MAX`` -> (MIN, MAX), torchrun's grammar; one line otherwise."""
    parts = text.strip().split(":")
    if len(parts) == 1:
        count = parse_int(parts[0], "--nnodes", low=1)
        return count, count
    if len(parts) != 2:
        raise UsageError(f"--nnodes {text!r} must be N or MIN:MAX")
    low = parse_int(parts[0], "--nnodes MIN", low=1)
    high = parse_int(parts[1], "--nnodes MAX", low=1)
    if high < low:
        raise UsageError(f"--nnodes {text}: MAX ({high}) must be at least MIN ({low})")
    return low, high


def split_endpoint(endpoint: str) -> tuple[str | None, int | None]:
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
    return host, (parse_port(port, "--rdzv-endpoint port") if port else None)


def _unbracket(host: str | None) -> str | None:
    """``[::1]`` -> ``::1``: torchrun's help asks for brackets around IPv6 addresses, but
    torch's ``env://`` (TCPStore) wants the bare address in MASTER_ADDR, as torchrun gives it."""
    if host is None:
        return None
    host = host.strip()
    if len(host) > 2 and host[0] == "[" and host[-1] == "]":
        return host[1:-1]
    return host


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


# The --rdzv-conf keys each torch backend reads (2.13's, and cas_backoff_max_seconds from 2.15
# on: an older torch ignores it, as it ignores every key it does not know).
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
    "c10d": (*_DYNAMIC_KEYS, "read_timeout", "is_host", "store_type", "cas_backoff_max_seconds"),
    "etcd-v2": (
        *_DYNAMIC_KEYS, "read_timeout", "protocol", "ssl_cert", "ssl_cert_key", "ca_cert",
        "cas_backoff_max_seconds",
    ),
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

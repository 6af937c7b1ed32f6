"""What a launch says before its workers start: the start line, and the checks of where they meet.

:func:`start_line` is the first line numarun prints for a run that starts (on stderr, before any
worker's output)::

    numarun: run 6ae0d1801631: node 0 of 1, 2 workers (ranks 0-1), CPUs: unbound, logs: console only
    numarun: run job42: node 1 of 2, 2 workers (ranks 2-3), meeting at node0:29500,
        CPUs (exclusive): rank 2: 48-55,176-183; rank 3: 56-63,184-191, logs in /logs/job42

:func:`meeting_note` adds, for a static multi-node job, what the wait at the start means: the
workers meet in ``init_process_group`` at ``MASTER_ADDR:MASTER_PORT``, and nothing is printed
until every node's workers are there. :func:`check_host_resolves` and :func:`check_port_free`
refuse, in one :class:`UsageError` line and before anything starts, a master address (or
rendezvous endpoint) that does not resolve and a store port that something on this host
already listens on. Imported on every launch's start-up path: it uses ``_socket``, the C module
under :mod:`socket` (socket.py builds its enums when imported, about 3 ms of every launch), and
:mod:`threading` only for a name to resolve.
"""

from __future__ import annotations

import _socket
import errno

from numarun.errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from numarun.cmdline.config import LaunchConfig
    from numarun.placement.plan import Plan
    from numarun.rendezvous.round import Round

RESOLVE_LIMIT = 10.0  # seconds; a resolver slower than this is left to the workers


def start_line(
    config: LaunchConfig,
    plan: Plan | None,
    *,
    port: int,
    logs: str,
    group: Round | None = None,
    preload: str | None = None,
) -> str:
    """``numarun: run ID: node K of N, W workers (ranks A-B)[, meeting at HOST:PORT],
    CPUs...: ..., LOGS`` for this node's first attempt, no trailing newline.

    ``group`` is the round of a torch rendezvous (its node rank, node count, ranks and store
    address), None for the static rendezvous (``config``'s, the store on ``port``). The
    meeting point is named when the job spans several nodes. CPUs: ``unbound`` when no rank
    is bound, else each rank's in the kernel's compact form (``rank 0: 0-3,8``), the mode in
    brackets. ``logs`` is :func:`numarun.files.logdir.log_dir_note`'s text. Under a torch
    rendezvous without ``--rdzv-id`` the id is torchrun's default ``none``, and the line says
    that it is the default. ``preload``
    (``--preload``: ``preload: torch (on standbys)``, or ``(cold: why)``) comes last.
    """
    if group is None:
        node, nodes = config.node_rank, config.nnodes
        ranks = [config.global_rank(local) for local in range(config.nproc_per_node)]
        addr, meet_port = config.master_addr, port
    else:
        node, nodes = group.group_rank, group.group_world_size
        ranks = [place.rank for place in group.workers]
        addr, meet_port = group.master_addr, group.master_port
    count = config.nproc_per_node
    parts = [
        f"node {node} of {nodes}",
        f"{count} worker{'s' if count != 1 else ''} ({_ranks_text(ranks)})",
    ]
    if nodes > 1 or config.max_nodes > 1:
        parts.append(f"meeting at {host_port(addr, meet_port)}")
    parts.append(_cpus_text(plan, ranks))
    parts.append(logs)
    run = config.run_id
    if config.elastic and run == "none":
        # torchrun's default id, under which every node of the job meets: say so, rather
        # than "run none".
        run = "'none' (torchrun's default --rdzv-id; name the job with --rdzv-id ID)"
    if preload:
        parts.append(preload)
    return f"numarun: run {run}: " + ", ".join(parts)


def start_lines(
    config: LaunchConfig,
    plan: Plan | None,
    port: int,
    logs: str,
    group: Round | None,
    preload: str | None,
) -> str:
    """What a launch prints as its first attempt starts: :func:`start_line` and, for a static
    job over several nodes, :func:`meeting_note`; newline-terminated."""
    lines = [start_line(config, plan, port=port, logs=logs, group=group, preload=preload)]
    note = meeting_note(config, port) if group is None else None
    if note is not None:
        lines.append(note)
    return "\n".join(lines) + "\n"


def meeting_note(config: LaunchConfig, port: int) -> str | None:
    """For a static job over several nodes, one line saying where and how the workers wait for
    each other (numarun itself waits for nothing: its workers meet in ``init_process_group``
    through ``env://``); None otherwise."""
    if config.elastic or config.nnodes < 2:
        return None
    where = host_port(config.master_addr, port)
    from numarun.machine.cpulist import format_cpulist

    others = [rank for rank in range(config.nnodes) if rank != config.node_rank]
    note = (
        f"numarun: the workers wait in init_process_group, silently, until those of all "
        f"{config.nnodes} nodes reach {where}; run this command on the other "
        f"node{'s' if len(others) > 1 else ''} with --node-rank {format_cpulist(others)}"
    )
    if config.master_addr in ("127.0.0.1", "localhost", "::1"):
        note += f" ({config.master_addr} is this host only: give --master-addr HOST)"
    return note


def host_port(host: str, port: int) -> str:
    """``host:port``, an IPv6 address in brackets (``[::1]:29500``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _ranks_text(ranks: Sequence[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    from numarun.machine.cpulist import format_cpulist

    return f"ranks {format_cpulist(ranks)}"


def _cpus_text(plan: Plan | None, ranks: Sequence[int]) -> str:
    if plan is None or not plan.bound:
        return "CPUs: unbound"
    from numarun.machine.cpulist import format_cpulist

    by_local = {binding.local_rank: binding for binding in plan.ranks}
    items = [
        f"rank {rank}: {format_cpulist(by_local[local].cpus)}"
        for local, rank in enumerate(ranks)
        if local in by_local
    ]
    return f"CPUs ({plan.mode}): " + "; ".join(items)


def _is_address(host: str) -> bool:
    for family in (_socket.AF_INET, _socket.AF_INET6):
        try:
            _socket.inet_pton(family, host)
        except (OSError, ValueError):
            continue
        return True
    return False


def check_host_resolves(host: str, what: str, *, limit: float = RESOLVE_LIMIT) -> None:
    """Raise :class:`UsageError` (one line naming ``what``, the flag or variable it came from)
    when ``host`` is a name the resolver says does not exist; return when it resolves, is an
    address, or the resolver gives no answer within ``limit`` seconds (the workers may still
    reach it: they wait for it anyway). The lookup runs in a daemon thread, so a stuck
    resolver never holds the launcher longer than ``limit``."""
    if not host or _is_address(host):
        return
    import threading

    outcome: list[BaseException | None] = []

    def look_up() -> None:
        try:
            _socket.getaddrinfo(host, None, type=_socket.SOCK_STREAM)
        except OSError as error:
            outcome.append(error)
        else:
            outcome.append(None)

    thread = threading.Thread(target=look_up, name="numarun-resolve", daemon=True)
    thread.start()
    thread.join(limit)
    error = outcome[0] if outcome else None
    if isinstance(error, _socket.gaierror):
        reason = error.strerror or str(error)
        raise UsageError(
            f"{what} {host!r} does not resolve ({reason}): the workers could never reach it; "
            "check the host name"
        )


def check_port_free(port: int, what: str) -> None:
    """Raise :class:`UsageError` (one line) when something on this host already listens on TCP
    ``port``, where this node's rank 0 worker is to host the job's store: bound and released
    at once on the IPv4 and IPv6 wildcard addresses, with ``SO_REUSEADDR`` as a store's own
    socket, so a port held only by closed connections (TIME_WAIT) counts as free."""
    for family, address in ((_socket.AF_INET, "0.0.0.0"), (_socket.AF_INET6, "::")):
        try:
            probe = _socket.socket(family, _socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 here
        try:  # a bare _socket.socket is no context manager
            probe.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
            if family == _socket.AF_INET6:
                probe.setsockopt(_socket.IPPROTO_IPV6, _socket.IPV6_V6ONLY, 1)
            try:
                probe.bind((address, port))
            except OSError as error:
                if error.errno == errno.EADDRINUSE:
                    raise UsageError(
                        f"{what} {port} is in use on this host, where rank 0's worker must "
                        "host the job's store: stop what listens there or choose another "
                        "--master-port"
                    ) from None
                # EADDRNOTAVAIL and the like: this family cannot listen here at all.
        finally:
            probe.close()

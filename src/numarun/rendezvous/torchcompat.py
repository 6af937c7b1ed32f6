"""torch's names the rendezvous path uses that torch does not promise, each checked before use.

numarun's torch rendezvous (:mod:`numarun.rendezvous.torchrdzv`) is torch's own code used as a
library, and a few of the names it calls are private or recent. Each is looked up before it is used:

* required -- ``SimpleElasticAgent._assign_worker_ranks(self, store, group_rank,
  group_world_size, spec)`` (rank assignment, torchrun's keys; called without an agent) and
  ``RendezvousInfo.bootstrap_store_info`` (the workers' store): missing, the launch is refused in
  one line naming the torch version (:func:`check_torch`, :func:`assign_ranks`), as is a torch
  older than :data:`OLDEST` (the round's facts came in other shapes before 2.4);
* store errors -- a store call that timed out raises ``DistStoreError`` in the torch versions
  that have it (torch's own barrier relies on it), and is recognised by that type; a torch without
  it raised ``RuntimeError`` with "timeout" in the message, recognised by the text
  (:func:`is_store_timeout`);
* optional -- the handler's ``_state_holder.state`` (``participants``, ``last_heartbeats``:
  torch's own keep-alive of each node, cross-checked before a silent neighbour is taken for
  gone, :func:`keep_alive_fresh`), ``dynamic_rendezvous._delay`` and the state holder's
  ``_cache_duration`` (a quick
  re-join, :func:`rejoin`, and a first join that notices the round sooner, :func:`first_join`),
  ``Store.list_keys`` (emptying the workers' store between rounds,
  :func:`clear_worker_store`), ``Store.clone`` (the watch's own connection,
  :mod:`numarun.rendezvous.storewatch`): missing, torch's own behaviour, a fresh workers' store
  hosted by rank 0's launcher from its second round on, or events read at each look.

Which workers' store a round gets follows torch's handler (:func:`workers_store`), so that a
torchrun node in the same job hands its workers the same one: not shared (torch 2.4,
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, etcd), the one torch's handler built for the round;
shared (2.5 and later), torch's shared store, published again every round, emptied between
rounds where ``Store.list_keys`` is there (2.10 and later) and else replaced, from rank 0's second
round on, by a fresh store its launcher hosts.

The c10d path is tested, by ``tests/run_c10d_tests.py``, with the releases the README's table
names; :data:`TORCH_SUPPORTED` is what a refusal names.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from numarun.errors import UsageError

OLDEST = (2, 4)  # the oldest torch whose rendezvous the c10d path drives
TORCH_SUPPORTED = "2.4 or later"  # what a refusal names
_FIRST_POLL = 0.02  # re-joining: the first wait between polls of the rendezvous state
_FIRST_JOIN_SPREAD = (0, 0.3)  # torch's random sleep before a node's first join
_WAITING_READS = 100.0  # reads of the rendezvous state per second, all waiting nodes together

TYPE_CHECKING = False
if TYPE_CHECKING:
    from numarun.rendezvous.round import Round


def torch_version() -> str:
    torch = sys.modules.get("torch")
    return str(getattr(torch, "__version__", "unknown"))


def unsupported(what: str) -> UsageError:
    return UsageError(
        f"numarun's torch rendezvous needs {what}, which torch {torch_version()} does not "
        f"have; use torch {TORCH_SUPPORTED} (or --rdzv-backend static)"
    )


def quiet_torch() -> None:
    """Before torch loads in the launcher: its C++ log lines, its import-time warning about
    numpy (optional for torch, never used by numarun) and its rendezvous' Python log records
    stay off the launcher's stderr; numarun says what matters in one line. The workers are
    other processes: nothing changes for them."""
    import logging
    import warnings

    # Set before torch loads, in this process only (workers get the environment numarun read).
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
    elastic_logger = logging.getLogger("torch.distributed.elastic")
    if not any(isinstance(h, logging.NullHandler) for h in elastic_logger.handlers):
        elastic_logger.addHandler(logging.NullHandler())
    elastic_logger.propagate = False


def torch_release(version: str) -> tuple[int, int] | None:
    """(major, minor) of a ``torch.__version__`` such as ``2.4.1+cu121`` or ``2.16.0a0+git``;
    None when it does not start with two numbers."""
    parts = version.split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1][:3] if c.isdigit()) or "x")
    except (IndexError, ValueError):
        return None


def keep_alive_fresh(handler: Any, group_rank: int, window: float) -> bool | None:
    """Whether torch's own keep-alive of the node of group rank ``group_rank`` is younger
    than ``window`` seconds in the state torch's handler last synced (no store call): False
    when torch dropped that node from the round (its keep-alive expired); None for a handler
    that keeps no such state (etcd-v2, a plugin, another torch)."""
    state = getattr(getattr(handler, "_state_holder", None), "state", None)
    participants = getattr(state, "participants", None)
    beats = getattr(state, "last_heartbeats", None)
    if not isinstance(participants, dict) or not isinstance(beats, dict):
        return None
    for node, rank in list(participants.items()):
        if rank == group_rank:
            last = beats.get(node)
            if not isinstance(last, datetime):
                return False
            if last.tzinfo is None:
                last = last.replace(tzinfo=timezone.utc)
            return (datetime.now(timezone.utc) - last).total_seconds() < window
    return False


def store_timeout_type() -> type[BaseException] | None:
    """torch's exception type for a store call that timed out (``DistStoreError``), or None
    for a torch without it."""
    distributed = sys.modules.get("torch.distributed")
    if distributed is None:
        import torch.distributed as distributed
    kind = getattr(distributed, "DistStoreError", None)
    return kind if isinstance(kind, type) and issubclass(kind, BaseException) else None


def is_store_timeout(error: BaseException) -> bool:
    """Whether ``error``, raised by a store call, is its timeout: by type where torch gives one
    (:func:`store_timeout_type`), else by the text older torch releases used."""
    kind = store_timeout_type()
    if kind is not None:
        return isinstance(error, kind)
    text = str(error).lower()
    return isinstance(error, RuntimeError) and ("timeout" in text or "timed out" in text)


def check_torch() -> None:
    """Refuse, in one line, a torch without what the rendezvous path needs (checked once the
    handler's modules load, before anything is joined): older than :data:`OLDEST`, or one of
    the required names missing."""
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    from torch.distributed.elastic.rendezvous import api

    release = torch_release(torch_version())
    if release is not None and release < OLDEST:
        raise UsageError(
            f"numarun's torch rendezvous drives torch {TORCH_SUPPORTED}; this is torch "
            f"{torch_version()}: upgrade torch (or use --rdzv-backend static)"
        )
    assign = getattr(SimpleElasticAgent, "_assign_worker_ranks", None)
    if assign is None:
        raise unsupported("SimpleElasticAgent._assign_worker_ranks")
    import inspect

    names = list(inspect.signature(assign).parameters)
    if names[:5] != ["self", "store", "group_rank", "group_world_size", "spec"]:
        raise unsupported("_assign_worker_ranks(self, store, group_rank, group_world_size, spec)")
    if not hasattr(getattr(api, "RendezvousInfo", None), "bootstrap_store_info"):
        raise unsupported("RendezvousInfo.bootstrap_store_info")


def workers_store(
    handler: Any, info: Any, *, first_round: bool, local_addr: str | None
) -> tuple[str, int, bool]:
    """(MASTER_ADDR, MASTER_PORT, shared) of the store this round's workers meet in, after
    ``info = handler.next_rendezvous()``; ``shared`` is ``TORCHELASTIC_USE_AGENT_STORE``;
    ``first_round``: this launcher's first round. Blocks in the round's store (every node but
    rank 0 reads what rank 0 published).

    * torch's handler does not share its store (``use_agent_store`` false: torch 2.4, etcd,
      ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``): the store torch's handler built for this
      round (a free port of rank 0's node, hosted by its rank 0 worker), exactly what
      torchrun's workers get;
    * shared (2.5 and later): rank 0 publishes the workers' store every round under torch's
      own keys (``MASTER_ADDR``, ``MASTER_PORT`` in the round's store, as
      ``RendezvousStoreInfo.build`` does; torch publishes only in the first round a node is
      rank 0 in, and its other nodes read only in their first round, so a node joining a later
      round, numarun's or torchrun's, would wait for the keys forever). In rank 0's first
      round that is torch's shared store (what torch itself published: torchrun nodes agree);
      later, torch's store emptied (:func:`clear_worker_store`, 2.10 and later), or where torch
      cannot list its keys (2.5 to 2.9) a fresh store that this launcher hosts
      (``local_addr``, else its fully qualified name), so that no worker reads a key the last
      round's workers left (gloo: "connectFullMesh failed").
    """
    bootstrap = info.bootstrap_store_info
    if not getattr(handler, "use_agent_store", False):
        return str(bootstrap.master_addr), int(bootstrap.master_port), False
    from torch.distributed.elastic.rendezvous.api import RendezvousStoreInfo

    addr_key = getattr(RendezvousStoreInfo, "MASTER_ADDR_KEY", "MASTER_ADDR")
    port_key = getattr(RendezvousStoreInfo, "MASTER_PORT_KEY", "MASTER_PORT")
    store = info.store
    if info.rank == 0:
        addr, port = str(bootstrap.master_addr), int(bootstrap.master_port)
        if not first_round and not can_clear_worker_store():
            addr, port = _fresh_store(local_addr)
        store.set(addr_key, addr.encode())
        store.set(port_key, str(port).encode())
    return bytes(store.get(addr_key)).decode(), int(bytes(store.get(port_key)).decode()), True


_hosted: list[Any] = []  # the fresh workers' store this launcher hosts, until the next replaces it


def _fresh_store(local_addr: str | None) -> tuple[str, int]:
    """A new TCPStore server in this process on a free port, held until the next one."""
    import socket
    from datetime import timedelta

    from torch.distributed import TCPStore

    server = TCPStore(
        "0.0.0.0", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60)
    )
    _hosted[:] = [server]
    return local_addr or socket.getfqdn(), int(server.port)


def assign_ranks(agent_class: Any, info: Any, spec: Any) -> list[Any]:
    """torch's own rank assignment (and keys in the store), so torchrun nodes in the same round
    agree with ours; called without an agent: its body uses none of the agent's state. A torch
    whose body does is refused in one line."""
    try:
        return agent_class._assign_worker_ranks(None, info.store, info.rank, info.world_size, spec)
    except AttributeError as error:
        if "NoneType" in str(error):
            raise unsupported("_assign_worker_ranks that needs no agent") from None
        raise


def rejoin(handler: Any, nodes: int = 100, between: Callable[[], None] | None = None) -> Any:
    """``handler.next_rendezvous()`` for a node that already ran a round, re-forming quickly.

    Without the random 0-0.3 s sleep torch takes while the rendezvous is in round 0, meant to
    spread the nodes' *first* joins (the round stays 0 until the first re-rendezvous, so every
    job's first restart paid it too); and with torch's one-second waits between polls of the
    rendezvous state (and its one-second cache of that state) replaced by a backoff from
    :data:`_FIRST_POLL` up to ``nodes / 100`` seconds (``nodes``: the most the job may have;
    at least 0.05 s, at most torch's 1 s, as :func:`first_join` waits), so that nodes
    re-forming within milliseconds of each other meet in milliseconds, and a node that waits
    for another (given up by :class:`numarun.rendezvous.liveness.LostNodes`, say) sees the
    round as soon as a node waiting for its first one would, while the waiting nodes of a job
    together read the state at most about 100 times a second. ``between()`` runs before each
    wait (:func:`_next_round_with`). Each name is checked first; without it, torch's own
    behaviour."""
    pause = [_FIRST_POLL]
    longest = _longest_pause(nodes)

    def backoff(original: Callable[[Any], None]) -> Callable[[Any], None]:
        def delay(seconds: float | tuple[float, float]) -> None:
            if isinstance(seconds, tuple):
                if tuple(seconds) != _FIRST_JOIN_SPREAD:
                    original(seconds)  # another random wait (2.15's backoff after a failed write)
                return
            original(min(seconds, pause[0]))
            pause[0] = min(seconds, longest, pause[0] * 2)

        return delay

    return _next_round_with(handler, backoff, lambda cache: 0, between)


def _next_round_with(
    handler: Any,
    make_delay: Callable[[Callable[[Any], None]], Callable[[Any], None]],
    cache_for: Callable[[float], float],
    between: Callable[[], None] | None = None,
) -> Any:
    """``handler.next_rendezvous()`` with torch's ``dynamic_rendezvous._delay`` replaced by
    ``make_delay(torch's own)`` and the state holder's ``_cache_duration`` by
    ``cache_for(its value)``, both put back however the call ends; without ``_delay``, torch's
    own behaviour (a holder without a numeric cache keeps it). ``between()`` is called before
    each of those waits, in the joining thread, where torch's join holds nothing (what it
    raises is said once on stderr and ignored: the join goes on as torch's)."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    original = getattr(dynamic_rendezvous, "_delay", None)
    if original is None or not callable(original):
        return handler.next_rendezvous()
    holder = getattr(handler, "_state_holder", None)
    cache = getattr(holder, "_cache_duration", None)
    delay = make_delay(original)
    if between is not None:
        delay = _after(between, delay)
    dynamic_rendezvous._delay = delay
    if isinstance(cache, int | float):
        holder._cache_duration = cache_for(cache)
    try:
        return handler.next_rendezvous()
    finally:
        dynamic_rendezvous._delay = original
        if isinstance(cache, int | float):
            holder._cache_duration = cache


def _after(between: Callable[[], None], delay: Callable[[Any], None]) -> Callable[[Any], None]:
    failed: list[str] = []

    def call(seconds: float | tuple[float, float]) -> None:
        try:
            between()
        except Exception as error:  # a store call that failed, a torch of another shape
            line = f"{type(error).__name__}: {error}".splitlines()[0][:200] if str(error) else ""
            if not failed:
                failed.append(line)
                sys.stderr.write(
                    "numarun: warning: looking for lost nodes while waiting in the rendezvous "
                    f"failed ({line or type(error).__name__}); torch's keep-alive decides\n"
                )
        delay(seconds)

    return call


def _longest_pause(nodes: int) -> float:
    """The longest wait between polls of the rendezvous state for a job of up to ``nodes``
    nodes: ``nodes / 100`` seconds, at least 0.05 s, at most torch's 1 s."""
    return min(1.0, max(0.05, nodes / _WAITING_READS))


def can_clear_worker_store() -> bool:
    """Whether :func:`clear_worker_store` can empty the workers' store (``Store.list_keys``,
    torch 2.10 and later); without it :func:`workers_store` hosts a fresh one instead."""
    from torch.distributed import TCPStore

    return hasattr(TCPStore, "list_keys")


def clear_worker_store(previous: Round) -> None:
    """Delete every key the last attempt's workers left in the store this node hosts for them
    (torch's shared TCPStore, MASTER_ADDR:MASTER_PORT), before the next round (only for a
    round whose store was shared, see :func:`workers_store`).

    torch gives every attempt the same store without a per-attempt prefix, so without this
    the next attempt's workers can read a dead worker's address (gloo: "Connection refused",
    or a hang). Only the node that hosted the store in the last round does it, before it
    rejoins: no worker of the next round can start before the round completes. Does
    nothing without ``Store.list_keys`` (before torch 2.10: :func:`can_clear_worker_store`)."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    if not can_clear_worker_store():
        return

    store = TCPStore(
        previous.master_addr, previous.master_port, is_master=False, timeout=timedelta(seconds=10)
    )
    for key in store.list_keys():
        store.delete_key(key)


def first_join(handler: Any, nodes: int, between: Callable[[], None] | None = None) -> Any:
    """``handler.next_rendezvous()`` for this node's first round, noticing the round complete
    sooner.

    A node waiting in torch's rendezvous reads its state once a second (a one-second sleep
    between polls, and a one-second cache of the state): when the last node joins, the nodes
    that waited for it go on up to a second later, which is all of a first start whose
    workers were past their imports before (``--preload``). Here a waiting node reads every
    ``nodes / 100`` seconds (``nodes``: the most the job may have; at least 0.05 s, at most
    torch's 1 s), so that the waiting nodes together read the state at most about 100 times a
    second, as torch's do with 100 nodes, and a job of 100 nodes or more waits as torch's
    does. torch's random 0-0.3 s spread of the first joins stays, except for a job of one
    node (``nodes == 1``), which has no other node's join to spread its own from (0.15 s of a
    one-node start on average, issue 32). ``between()`` runs before each wait
    (:func:`_next_round_with`). Each name is checked first; without it, torch's own
    behaviour."""
    pause = _longest_pause(nodes)
    if pause >= 1.0 and between is None:
        return handler.next_rendezvous()

    def shorter(original: Callable[[Any], None]) -> Callable[[Any], None]:
        def delay(seconds: float | tuple[float, float]) -> None:
            if isinstance(seconds, tuple):
                if nodes > 1 or tuple(seconds) != _FIRST_JOIN_SPREAD:
                    original(seconds)
                return
            original(min(seconds, pause))

        return delay

    return _next_round_with(handler, shorter, lambda cache: min(cache, pause), between)

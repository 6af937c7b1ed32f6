"""torch's names the rendezvous path uses that torch does not promise, each checked before use.

numarun's torch rendezvous (:mod:`numarun.launch.elastic`) is torch's own code used as a library,
and a few of the names it calls are private or recent. Each is looked up before it is used:

* required -- ``SimpleElasticAgent._assign_worker_ranks(self, store, group_rank,
  group_world_size, spec)`` (rank assignment, torchrun's keys; called without an agent),
  ``RendezvousStoreInfo.build`` and ``RendezvousInfo.bootstrap_store_info`` (the workers'
  store): missing, the launch is refused in one line naming the torch version
  (:func:`check_torch`, :func:`assign_ranks`);
* store errors -- a store call that timed out raises ``DistStoreError`` in the torch versions
  that have it (torch's own barrier relies on it), and is recognised by that type; a torch without
  it raised ``RuntimeError`` with "timeout" in the message, recognised by the text
  (:func:`is_store_timeout`);
* optional -- ``dynamic_rendezvous._delay`` and the state holder's ``_cache_duration`` (a quick
  re-join, :func:`rejoin`), ``Store.list_keys`` (emptying the workers' store between rounds,
  :func:`clear_worker_store`), ``Store.clone`` (the watch's own connection,
  :mod:`numarun.launch.storewatch`): missing, torch's own behaviour, a fresh workers' store per
  round (hosted by rank 0's worker on a free port, as torch does when the store is not
  shared), or events read at each look.

The c10d path is written for torch :data:`TORCH_SUPPORTED` and tested with 2.13.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from numarun.errors import UsageError

TORCH_SUPPORTED = "2.4 to 2.13"  # the torch versions the c10d path is written for
_FIRST_POLL = 0.02  # re-joining: the first wait between polls of the rendezvous state

TYPE_CHECKING = False
if TYPE_CHECKING:
    from numarun.launch.rendezvous import Round


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
    handler's modules load, before anything is joined)."""
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    from torch.distributed.elastic.rendezvous import api

    assign = getattr(SimpleElasticAgent, "_assign_worker_ranks", None)
    if assign is None:
        raise unsupported("SimpleElasticAgent._assign_worker_ranks")
    import inspect

    names = list(inspect.signature(assign).parameters)
    if names[:5] != ["self", "store", "group_rank", "group_world_size", "spec"]:
        raise unsupported("_assign_worker_ranks(self, store, group_rank, group_world_size, spec)")
    store_info = getattr(api, "RendezvousStoreInfo", None)
    if store_info is None or not hasattr(store_info, "build"):
        raise unsupported("RendezvousStoreInfo.build")
    if not hasattr(getattr(api, "RendezvousInfo", None), "bootstrap_store_info"):
        raise unsupported("RendezvousInfo.bootstrap_store_info")


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


def rejoin(handler: Any) -> Any:
    """``handler.next_rendezvous()`` for a node that already ran a round, re-forming quickly.

    Without the random 0-0.3 s sleep torch takes while the rendezvous is in round 0, meant to
    spread the nodes' *first* joins (the round stays 0 until the first re-rendezvous, so every
    job's first restart paid it too); and with torch's one-second waits between polls of the
    rendezvous state (and its one-second cache of that state) replaced by a backoff from
    :data:`_FIRST_POLL` up to one second, so that nodes re-forming within milliseconds of each
    other meet in milliseconds, while a node that waits long polls as torch does (a handful of
    extra reads of the state per re-form). Each name is checked first; without it, torch's
    own behaviour."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    original = getattr(dynamic_rendezvous, "_delay", None)
    holder = getattr(handler, "_state_holder", None)
    cache = getattr(holder, "_cache_duration", None)
    if original is None or not callable(original):
        return handler.next_rendezvous()
    pause = [_FIRST_POLL]

    def delay(seconds: float | tuple[float, float]) -> None:
        if isinstance(seconds, tuple):
            return  # the first-join spread
        original(min(seconds, pause[0]))
        pause[0] = min(seconds, pause[0] * 2)

    dynamic_rendezvous._delay = delay
    if isinstance(cache, int | float):
        holder._cache_duration = 0
    try:
        return handler.next_rendezvous()
    finally:
        dynamic_rendezvous._delay = original
        if isinstance(cache, int | float):
            holder._cache_duration = cache


def can_clear_worker_store() -> bool:
    """Whether :func:`clear_worker_store` can empty the workers' store (``Store.list_keys``);
    without it each round gets a fresh store (the rendezvous does not share its own)."""
    from torch.distributed import TCPStore

    return hasattr(TCPStore, "list_keys")


def clear_worker_store(previous: Round) -> None:
    """Delete every key the last attempt's workers left in the store this node hosts for them
    (torch's shared TCPStore, MASTER_ADDR:MASTER_PORT), before the next round.

    torch gives every attempt the same store without a per-attempt prefix, so without this
    the next attempt's workers can read a dead worker's address (gloo: "Connection refused",
    or a hang). Only the node that hosted the store in the last round does it, before it
    rejoins: no worker of the next round can start before the round completes. Needs
    ``Store.list_keys`` (torch 2.10 and later; see :func:`can_clear_worker_store`)."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    store = TCPStore(
        previous.master_addr, previous.master_port, is_master=False, timeout=timedelta(seconds=10)
    )
    for key in store.list_keys():
        store.delete_key(key)

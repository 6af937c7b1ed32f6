"""What one round of a rendezvous gives this node's workers: :class:`Round`, :class:`WorkerPlace`.

Built by :mod:`numarun.rendezvous.torchrdzv` from torch's rendezvous (c10d, etcd); the static path
passes no round. Imports nothing of numarun's.
"""

from __future__ import annotations

from typing import NamedTuple


# NamedTuples, not dataclasses: this module is on every launch's start-up path, and a
# dataclass costs ten times as much to define.
class WorkerPlace(NamedTuple):
    """One local worker's ranks in a round, as torch's ``_assign_worker_ranks`` gives them."""

    rank: int
    role_rank: int
    world_size: int
    role_world_size: int


class Round(NamedTuple):
    """One round of the rendezvous, as this node's workers see it: the node's ``group_rank``
    among ``group_world_size`` nodes, where the workers' store listens (``master_addr``,
    ``master_port``), each local rank's :class:`WorkerPlace` (index = local rank), and
    ``use_agent_store``: whether that store is the launcher's own (torch's rendezvous shares
    its TCPStore with the workers)."""

    group_rank: int
    group_world_size: int
    master_addr: str
    master_port: int
    workers: tuple[WorkerPlace, ...]
    use_agent_store: bool = False


"""Pure planning: (Topology, nprocs, mode, options) -> Plan.

No effects: nothing here reads files or changes the process. Most tests live here.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RankBinding:
    """Where one local rank runs."""

    local_rank: int
    gpu: int | None  # visible GPU index, None in CPU-only modes
    numa_node: int | None  # the node the binding is centred on, None when unknown
    cpus: tuple[int, ...]  # sorted logical CPUs
    mems: tuple[int, ...]  # sorted memory nodes for the memory policy
    threads: int  # suggested thread count: physical cores bound


@dataclass(frozen=True)
class Plan:
    """Per-rank bindings plus what every worker's environment needs."""

    mode: str
    ranks: tuple[RankBinding, ...]
    bound: bool = True  # False when the user allowed fallback and binding was impossible
    env: tuple[tuple[str, str], ...] = ()
    warnings: tuple[str, ...] = field(default=())

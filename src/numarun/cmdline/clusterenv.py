"""Node facts from a job scheduler's environment (Slurm, Open MPI): this node's rank, the node
count, the master address; and Slurm's compressed host lists.

The static rendezvous (numarun's default, torch-free): every node is told (by flags, or by the
job scheduler's environment) its node rank, the node count and the master address; the workers
then meet through ``env://`` with global rank 0 hosting the ``TCPStore``. Imported only under a
scheduler (:mod:`numarun.cmdline.nodes`). This module only reads environments and strings; it
starts and opens nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from numarun.errors import UsageError


class NodeFacts(NamedTuple):
    """What the scheduler says about this node, when numarun runs under one.

    ``master_addr`` is ``None`` when the scheduler does not name one (Open MPI); the user must
    then pass ``--master-addr`` or set ``MASTER_ADDR``.
    """

    source: str  # "slurm" or "mpi"
    node_rank: int
    nnodes: int
    master_addr: str | None


def expand_nodelist(text: str) -> list[str]:
    """Expand Slurm's compressed host list, in order: ``gpu[01-03,07],login1`` ->
    ``["gpu01", "gpu02", "gpu03", "gpu07", "login1"]``.

    Zero padding of a range's lower bound is kept (``[08-10]`` -> ``08 09 10``). Several bracket
    groups in one name expand as a product, left to right (``r[1-2]n[1-2]`` -> ``r1n1 r1n2 r2n1
    r2n2``). Raises :class:`UsageError` naming the list for unbalanced brackets, empty items,
    backwards ranges or non-numeric bounds.
    """
    hosts: list[str] = []
    for item in _split_top_level(text.strip(), text):
        hosts.extend(_expand_host(item, text))
    return hosts


def _split_top_level(text: str, whole: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    items: list[str] = []
    depth = 0
    start = 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise UsageError(f"invalid Slurm node list {_quote(whole)}: nested '['")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise UsageError(f"invalid Slurm node list {_quote(whole)}: unmatched ']'")
        elif char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise UsageError(f"invalid Slurm node list {_quote(whole)}: unmatched '['")
    items.append(text[start:])
    if any(not item for item in items):
        raise UsageError(f"invalid Slurm node list {_quote(whole)}: empty host name")
    return items


def first_host(text: str) -> str:
    """The first host of a Slurm host list, without expanding the rest:
    ``gpu[07-10],login1`` -> ``"gpu07"``.

    The whole list is checked as :func:`expand_nodelist` checks it (same :class:`UsageError`),
    in time linear in its length and without building any host name but the first, so a list
    naming a billion nodes costs no more than its text.
    """
    items = _split_top_level(text.strip(), text)
    for item in items:
        _check_host(item, text)
    return _expand_host(items[0], text, first_only=True)[0]


def _check_host(item: str, whole: str) -> None:
    start = 0
    while (open_at := item.find("[", start)) >= 0:
        close_at = item.index("]", open_at)
        _range_bounds(item[open_at + 1 : close_at], whole)
        start = close_at + 1


def _expand_host(item: str, whole: str, *, first_only: bool = False) -> list[str]:
    """Expand the first bracket group of one host pattern, then the rest recursively."""
    open_at = item.find("[")
    if open_at < 0:
        return [item]
    close_at = item.index("]", open_at)
    prefix, body, rest = item[:open_at], item[open_at + 1 : close_at], item[close_at + 1 :]
    tails = _expand_host(rest, whole, first_only=first_only) if rest else [""]
    if first_only:
        lo, _hi = _range_bounds(body, whole)[0]
        return [prefix + lo + tails[0]]
    return [prefix + value + tail for value in _expand_ranges(body, whole) for tail in tails]


def _range_bounds(body: str, whole: str) -> list[tuple[str, str]]:
    """The ``(low, high)`` digit strings of each item of a bracket group, checked."""
    bounds = []
    for part in body.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not _digits(lo) or (sep and not _digits(hi)):
            raise UsageError(f"invalid Slurm node list {_quote(whole)}: bad range {part!r}")
        if sep and int(hi) < int(lo):
            raise UsageError(
                f"invalid Slurm node list {_quote(whole)}: range {part!r} runs backwards"
            )
        bounds.append((lo, hi if sep else lo))
    return bounds


def _digits(text: str) -> bool:
    # ASCII only (int() reads other scripts' digits too); 18 digits keep int() cheap.
    return text.isascii() and text.isdigit() and len(text) <= 18


def _quote(whole: str) -> str:
    """The list for an error message, shortened: the message must stay one readable line."""
    return repr(whole if len(whole) <= 80 else whole[:77] + "...")


def _expand_ranges(body: str, whole: str) -> list[str]:
    values: list[str] = []
    for lo, hi in _range_bounds(body, whole):
        if lo == hi:
            values.append(lo)
        else:
            values.extend(str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1))
    return values


def node_facts_from_env(environ: Mapping[str, str]) -> NodeFacts | None:
    """Node rank, node count and master address from Open MPI or Slurm, or ``None``.

    Open MPI (``mpirun -npernode 1 numarun ...``) wins when ``OMPI_COMM_WORLD_RANK`` and
    ``OMPI_COMM_WORLD_SIZE`` are set, because then mpirun started this process even inside a
    Slurm allocation: node rank = world rank, node count = world size, no master address. A
    non-zero ``OMPI_COMM_WORLD_LOCAL_RANK`` means two numarun instances share a node, which
    would start every worker twice: :class:`UsageError`.

    Slurm is used when ``SLURM_JOB_ID``, ``SLURM_NODEID`` and a node count are set: node rank =
    ``SLURM_NODEID``; node count = ``SLURM_STEP_NUM_NODES`` (inside ``srun``), else
    ``SLURM_NNODES``, else ``SLURM_JOB_NUM_NODES``; master address = the first host of
    ``SLURM_STEP_NODELIST``, else ``SLURM_JOB_NODELIST`` (``None`` when neither is set). A
    non-zero ``SLURM_LOCALID`` (several tasks per node) raises :class:`UsageError`, as for Open
    MPI. A value that is not a plain non-negative integer (``-1``, ``x``), a node count below
    1 and a malformed host list raise :class:`UsageError` naming the variable; only the first
    host of the list is built (:func:`first_host`), however many nodes it names.
    """
    if "OMPI_COMM_WORLD_RANK" in environ and "OMPI_COMM_WORLD_SIZE" in environ:
        local = _env_int(environ, "OMPI_COMM_WORLD_LOCAL_RANK", default=0)
        if local != 0:
            raise UsageError(
                "more than one numarun per node under mpirun "
                f"(OMPI_COMM_WORLD_LOCAL_RANK={local}); start one per node: mpirun -npernode 1"
            )
        return NodeFacts(
            source="mpi",
            node_rank=_env_int(environ, "OMPI_COMM_WORLD_RANK"),
            nnodes=_env_int(environ, "OMPI_COMM_WORLD_SIZE", low=1),
            master_addr=None,
        )
    count_name = next(
        (
            name
            for name in ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
            if name in environ
        ),
        None,
    )
    if "SLURM_JOB_ID" not in environ or "SLURM_NODEID" not in environ or count_name is None:
        return None
    local = _env_int(environ, "SLURM_LOCALID", default=0)
    if local != 0:
        raise UsageError(
            f"more than one numarun per node under srun (SLURM_LOCALID={local}); start one per "
            "node: srun --ntasks-per-node=1"
        )
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST")
    return NodeFacts(
        source="slurm",
        node_rank=_env_int(environ, "SLURM_NODEID"),
        nnodes=_env_int(environ, count_name, low=1),
        master_addr=first_host(nodelist) if nodelist else None,
    )


def _env_int(
    environ: Mapping[str, str], name: str, default: int | None = None, *, low: int = 0
) -> int:
    """``name``'s value as an integer >= ``low``; :class:`UsageError` (one line) otherwise.

    Only ASCII digits count: ``int()`` would also take ``-1``, ``+3``, ``1_0`` and other
    scripts' digits, none of which a scheduler writes.
    """
    text = environ.get(name)
    if text is None and default is not None:
        return default
    word = str(text).strip()
    if not _digits(word):
        shown = word if len(word) <= 40 else word[:37] + "..."
        if word.startswith("-") and _digits(word[1:]):
            raise UsageError(f"{name}={shown} in the environment is negative; it must be >= {low}")
        raise UsageError(f"{name}={shown!r} in the environment is not an integer")
    value = int(word)
    if value < low:
        raise UsageError(f"{name}={value} in the environment must be >= {low}")
    return value

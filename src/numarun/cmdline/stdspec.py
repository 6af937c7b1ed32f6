"""torchrun's ``--redirects``/``--tee`` and ``--local-ranks-filter`` values, read and checked.

:func:`parse_std_spec` and :func:`parse_ranks_filter` read ``-r/--redirects``, ``-t/--tee`` and
``--local-ranks-filter`` (:class:`Std` values follow torchrun: 0 none, 1 stdout, 2 stderr, 3
both). Where the streams then go is :mod:`numarun.launch.output`'s. Pure.
"""

from __future__ import annotations

import enum

from numarun.errors import UsageError

__all__ = ["Std", "parse_ranks_filter", "parse_std_spec", "ranks_filter_warning"]


class Std(enum.IntFlag):
    """Which standard streams a ``--redirects`` / ``--tee`` value covers (torchrun's values)."""

    NONE = 0
    OUT = 1
    ERR = 2
    ALL = 3


_STD_FORMS = (
    "use 0 (none), 1 (stdout), 2 (stderr) or 3 (both) for every rank, "
    "or LOCAL_RANK:VALUE pairs such as 0:3,1:0"
)


def parse_std_spec(text: str, nprocs: int, *, flag: str = "--redirects/--tee") -> dict[int, int]:
    """Parse a ``--redirects`` / ``--tee`` value into ``{local_rank: Std value}`` for every rank.

    ``"0"``..``"3"`` apply to all ``nprocs`` local ranks; ``"0:3,1:0"`` names local ranks one by
    one and ranks not named get 0. Whitespace around the whole value and around items is
    ignored. Anything else -- another number (``"4"``), a non-number, an empty item or value
    (``"0:"``, ``""``), a local rank outside ``0..nprocs-1``, a rank named twice -- raises
    :class:`UsageError` with one line naming ``flag``, the value, and the valid forms.
    """
    value = text.strip()

    def bad(why: str) -> UsageError:
        return UsageError(f"{flag} {text!r} is not valid ({why}): {_STD_FORMS}")

    if ":" not in value:
        level = _std_value(value)
        if level is None:
            raise bad("not a value 0-3")
        return dict.fromkeys(range(nprocs), level)
    spec = dict.fromkeys(range(nprocs), 0)
    named: set[int] = set()
    for item in value.split(","):
        rank_text, sep, level_text = item.strip().partition(":")
        rank_text = rank_text.strip()
        if not sep or not rank_text.isdigit() or not rank_text.isascii():
            raise bad(f"item {item.strip()!r} is not LOCAL_RANK:VALUE")
        rank = int(rank_text)
        level = _std_value(level_text.strip())
        if level is None:
            raise bad(f"item {item.strip()!r} needs a value 0-3 after the colon")
        if rank >= nprocs:
            raise bad(f"local rank {rank} does not exist with {nprocs} processes per node")
        if rank in named:
            raise bad(f"local rank {rank} is given twice")
        named.add(rank)
        spec[rank] = level
    return spec


def _std_value(text: str) -> int | None:
    if len(text) == 1 and text in "0123":
        return int(text)
    return None


def parse_ranks_filter(text: str, nprocs: int) -> set[int]:
    """Parse ``--local-ranks-filter`` (``"0,2"``): the local ranks whose output is shown.

    An empty (or all-blank) value means no filter: every rank ``0..nprocs-1`` is returned. Items
    are comma-separated non-negative integers; spaces around items are ignored, repeats are
    harmless. A rank at or above ``nprocs`` is accepted and left out of the result, as torchrun
    does (scripts pass ``0,1,2,3`` on machines with fewer GPUs): :func:`ranks_filter_warning`
    says so. Anything else raises :class:`UsageError` (one line).
    """
    if not text.strip():
        return set(range(nprocs))
    return {rank for rank in _filter_ranks(text, nprocs) if rank < nprocs}


def ranks_filter_warning(text: str, nprocs: int) -> str | None:
    """The one warning for a ``--local-ranks-filter`` that names local ranks beyond
    ``0..nprocs-1`` (which ranks, and what is shown instead); None when every named rank
    exists. Raises :class:`UsageError` as :func:`parse_ranks_filter` does."""
    if not text.strip():
        return None
    named = _filter_ranks(text, nprocs)
    missing = sorted(rank for rank in named if rank >= nprocs)
    if not missing:
        return None
    shown = sorted(rank for rank in named if rank < nprocs)
    what = (
        f"only local rank{'s' if len(shown) > 1 else ''} {', '.join(map(str, shown))} "
        "will be shown"
        if shown
        else "no rank's output will be shown on the console"
    )
    return (
        f"--local-ranks-filter {text!r} names local rank{'s' if len(missing) > 1 else ''} "
        f"{', '.join(map(str, missing))}, which do{'es' if len(missing) == 1 else ''} not exist "
        f"with {nprocs} process{'es' if nprocs > 1 else ''} per node: {what}"
    )


def _filter_ranks(text: str, nprocs: int) -> set[int]:
    named: set[int] = set()
    for item in text.split(","):
        word = item.strip()
        if not (word.isdigit() and word.isascii()):
            raise UsageError(
                f"--local-ranks-filter {text!r} is not valid: give comma-separated local ranks "
                f"such as 0,2 (0-{nprocs - 1})"
            )
        named.add(int(word))
    return named

"""The kernel's CPU-list syntax: ``0-3,8,10-11``.

The same syntax is used by sysfs (``cpulist``, ``shared_cpu_list``), by ``taskset -c``,
by ``numactl --physcpubind`` and by ``/proc/<pid>/status`` (``Cpus_allowed_list``).
"""

from __future__ import annotations

from numarun.errors import UsageError

TYPE_CHECKING = False  # typing is not imported at run time (machine/model.py)
if TYPE_CHECKING:
    from collections.abc import Iterable

# Above any kernel's NR_CPUS (8192 with CONFIG_MAXSMP); bounds "0-4000000000" before it becomes
# a four-billion-element set.
MAX_CPU = 65535


def parse_cpulist(text: str) -> tuple[int, ...]:
    """Parse ``0-3,8,10-11`` into a sorted tuple of unique integers.

    Whitespace around the list and around items is ignored; an empty string is the empty set
    (the kernel writes an empty line for a NUMA node without CPUs). The kernel's stride form
    ``0-15:2`` (every second CPU) is accepted. Anything else, including a CPU number above
    :data:`MAX_CPU`, raises :class:`UsageError` whose message names the offending item.
    """
    fast = _parse_plain(text)
    if fast is not None:
        return fast
    cpus: set[int] = set()
    for raw in text.strip().split(","):
        item = raw.strip()
        if not item:
            if raw != "" or text.strip():
                raise UsageError(f"invalid CPU list {text.strip()!r}: empty item")
            continue
        stride = 1
        if ":" in item:
            item, _, stride_text = item.partition(":")
            stride = _to_int(stride_text, text)
            if stride < 1:
                raise UsageError(f"invalid CPU list {text.strip()!r}: stride must be >= 1")
        if "-" in item:
            lo_text, _, hi_text = item.partition("-")
            lo, hi = _to_int(lo_text, text), _to_int(hi_text, text)
            if hi < lo:
                raise UsageError(f"invalid CPU list {text.strip()!r}: range {item} runs backwards")
            cpus.update(range(lo, hi + 1, stride))
        else:
            cpus.add(_to_int(item, text))
    return tuple(sorted(cpus))


def format_cpulist(cpus: Iterable[int]) -> str:
    """Format integers as the shortest kernel CPU list: ``[0, 1, 2, 3, 8]`` -> ``0-3,8``.

    Two adjacent CPUs are written ``4-5``, like the kernel does. The empty set is ``""``.
    """
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def _parse_plain(text: str) -> tuple[int, ...] | None:
    """The common sysfs shape (ASCII digits, ranges, commas, no spaces or strides), or None.

    Topology reading parses a few hundred lists; this path skips the per-item checks and
    leaves anything unusual, including every error, to the full parser.
    """
    stripped = text.strip()
    if not stripped:
        return ()
    if "-" not in stripped:
        # The most common shape by far: SMT siblings "3,115". Digits and commas only (so
        # int() sees no sign, space, underscore or non-ASCII digit); "" items fail int().
        if not (stripped.isascii() and stripped.replace(",", "").isdigit()):
            return None
        try:
            values = sorted({int(item) for item in stripped.split(",")})
        except ValueError:
            return None
        return tuple(values) if values[-1] <= MAX_CPU else None
    if not stripped.isascii() or " " in stripped or ":" in stripped or "\t" in stripped:
        return None
    cpus: list[int] = []
    for item in stripped.split(","):
        lo_text, dash, hi_text = item.partition("-")
        if not lo_text.isdigit() or (dash and not hi_text.isdigit()):
            return None
        if dash:
            lo, hi = int(lo_text), int(hi_text)
            if hi < lo or hi > MAX_CPU:
                return None
            cpus.extend(range(lo, hi + 1))
        elif int(lo_text) > MAX_CPU:
            return None
        else:
            cpus.append(int(lo_text))
    return tuple(sorted(set(cpus)))


def _to_int(item: str, whole: str) -> int:
    item = item.strip()
    # isdigit() alone admits "²" and other Unicode digits that int() rejects or misreads.
    if not (item.isascii() and item.isdigit()):
        raise UsageError(f"invalid CPU list {whole.strip()!r}: {item!r} is not a CPU number")
    value = int(item)
    if value > MAX_CPU:
        raise UsageError(f"invalid CPU list {whole.strip()!r}: CPU {value} is above {MAX_CPU}")
    return value

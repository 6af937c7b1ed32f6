"""Every rank's flight-recorder frontier merged into the job's verdict, in torch's analyzer's
terms (``torch.distributed.flight_recorder``: missing ranks, and the first mismatch as a
``MatchState``: ``COLLECTIVE_TYPE_MISMATCH``, ``SIZE_OR_SYNTAX_MISMATCH``,
``COLLECTIVE_DTYPE_MISMATCH``). Pure: no I/O, no torch.

Per process group (:func:`merge`): the ranks are put into *positions*, ranks with the same last
collective entered (sequence number, operation, shapes, dtypes, whether it completed); the
*lead* is the highest sequence number any member entered. Ranks inside a collective not
completed *wait*; members below the lead are *missing* from it (``one collective behind``);
members with no record at all are *unknown* (no dump: the reason is kept). The *first
mismatch* is the lowest sequence number, among those every position still holds (each rank
keeps its last few, :data:`numarun.stacks.flight.ENTRIES_KEPT`), at which the ranks called
different things: another operation, other shapes, other dtypes (as the analyzer, shapes are
not compared for operations whose shapes differ by design: all_to_all, scatter, gather and the
``_v`` variants; point-to-point operations are not matched). A member missing from a group's
lead that waits in another group's collective is named there (``a different process group``).

The *culprits* are the ranks that break the group: those missing from the lead (behind), and
at the first mismatch the ranks on the minority's side (by rank count; a tie names the ranks
that are not at the lead, else every side). A group where nobody waits is idle and not shown
unless every group is.

Cost: O(ranks x groups x kept entries) to fold the records into positions (identical records
first, so 1,024 nodes x 8 ranks in step are a handful of positions), then work per position.
The text (:meth:`Verdict.lines`) is bounded: at most :data:`GROUPS_SHOWN` groups, each one line
naming at most :data:`POSITIONS_SHOWN` positions, ranks as ranges; every name from a dump
escaped by :func:`printable`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from numarun.stacks.flight import Entry, GroupFrontier, RankRecord, dtype_name

__all__ = ["GroupVerdict", "Position", "Verdict", "format_ranks", "merge", "printable"]

GROUPS_SHOWN = 6
POSITIONS_SHOWN = 4
JSON_POSITIONS = 64  # positions per group in to_json (the rest counted): a bounded document
# Operations whose shapes legitimately differ across ranks (the analyzer checks them apart).
_UNEVEN = ("all_to_all", "scatter", "gather", "_v", "coalesced")
MATCH_NAMES = {
    "COLLECTIVE_TYPE_MISMATCH": "collective type mismatch",
    "SIZE_OR_SYNTAX_MISMATCH": "size mismatch",
    "COLLECTIVE_DTYPE_MISMATCH": "dtype mismatch",
}
_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five"}


def printable(text: str) -> str:
    """``text`` with control characters, DEL, C1 controls and bidi controls escaped: names
    come from the user's process."""
    out = []
    for char in text:
        code = ord(char)
        if code < 0x20 or 0x7F <= code < 0xA0 or code in (0x061C, 0x200E, 0x200F) or (
            0x202A <= code <= 0x202E or 0x2066 <= code <= 0x2069
        ):
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(char)
    return "".join(out)


def format_ranks(ranks: Iterable[int]) -> str:
    """``0-2,5`` (sorted, runs as ranges)."""
    ordered = sorted(set(ranks))
    runs: list[str] = []
    start = previous = None
    for rank in ordered:
        if previous is not None and rank == previous + 1:
            previous = rank
            continue
        if start is not None:
            runs.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = rank
    if start is not None:
        runs.append(str(start) if start == previous else f"{start}-{previous}")
    return ",".join(runs)


def _ranks_text(ranks: Iterable[int]) -> str:
    ranks = sorted(set(ranks))
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {format_ranks(ranks)}"


def describe_call(entry: Entry, *, sizes: bool = True) -> str:
    """``all_reduce [8] float32`` (``barrier``: no tensors), escaped."""
    parts = []
    for index, shape in enumerate(entry.in_sizes):
        dtype = entry.in_dtypes[index] if index < len(entry.in_dtypes) else ""
        shown = "[" + ", ".join("?" if d < 0 else str(d) for d in shape) + "]"
        parts.append(f"{shown} {dtype_name(dtype)}".strip())
    text = printable(entry.op)
    if sizes and parts:
        text += " " + ", ".join(parts)
    return text


def _tensors(entry: Entry) -> str:
    return describe_call(entry)[len(printable(entry.op)) :].strip()


class Position:
    """Ranks at the same place in one group: ``seq`` (the last collective entered; 0 none),
    ``entry`` (that collective, when kept), ``waiting`` (inside it, not completed)."""

    __slots__ = ("entry", "frontier", "ranks", "seq", "waiting")

    def __init__(self, frontier: GroupFrontier, ranks: list[int]) -> None:
        self.frontier = frontier
        self.ranks = ranks
        self.seq = frontier.enqueued
        self.entry = frontier.entry(frontier.enqueued)
        self.waiting = frontier.waiting

    def where(self) -> str:
        """``all_reduce #4 ([8] float32)``, or ``#4`` when the entry was not kept."""
        if self.entry is None:
            return f"collective #{self.seq}" if self.seq else "no collective yet"
        tensors = _tensors(self.entry)
        return f"{printable(self.entry.op)} #{self.seq}" + (f" ({tensors})" if tensors else "")


class GroupVerdict:
    """One group's state (module docstring). ``lines`` is its text, one line."""

    __slots__ = ("culprits", "desc", "elsewhere", "lead", "members", "mismatch", "missing",
                 "name", "positions", "unknown")  # fmt: skip

    def __init__(self, name: str, desc: str, members: tuple[int, ...]) -> None:
        self.name = name
        self.desc = desc
        self.members = members
        self.positions: list[Position] = []
        self.lead = 0
        self.missing: list[int] = []
        self.unknown: dict[int, str] = {}
        self.mismatch: dict | None = None
        self.elsewhere: dict[int, str] = {}  # a missing rank -> where it waits instead
        self.culprits: set[int] = set()

    @property
    def stuck(self) -> bool:
        return any(position.waiting for position in self.positions)

    @property
    def label(self) -> str:
        shown = printable(self.name if len(self.name) <= 24 else self.name[:21] + "...")
        desc = printable(self.desc)
        return f"group {shown}" + (f" ({desc})" if desc and desc != "undefined" else "")

    def line(self) -> str:
        """``group 0 (default_pg): ranks 0-2 wait in all_reduce #4 ([8] float32); rank 3 is one
        collective behind, waiting in all_reduce #3 ([8] float32): at #3 ranks 0-2 called
        all_reduce [4] float32, rank 3 called all_reduce [8] float32 (size mismatch)``."""
        shown = self.positions[:POSITIONS_SHOWN]
        parts = [self._position_text(position) for position in shown]
        hidden = len(self.positions) - len(shown)
        if hidden:
            parts.append(f"{hidden} more position{'s' if hidden != 1 else ''}")
        text = f"{self.label}: " + "; ".join(parts)
        if self.mismatch is not None:
            text += f": {self._mismatch_text()}"
        if self.unknown:
            reasons: dict[str, list[int]] = {}
            for rank, reason in self.unknown.items():
                reasons.setdefault(reason, []).append(rank)
            text += "; " + "; ".join(f"{_ranks_text(r)} unknown ({printable(reason)})"
                                     for reason, r in reasons.items())  # fmt: skip
        return text

    def _position_text(self, position: Position) -> str:
        ranks = _ranks_text(position.ranks)
        one = len(position.ranks) == 1
        if position.seq == self.lead:
            verb = ("waits in" if one else "wait in") if position.waiting else "passed"
            return f"{ranks} {verb} {position.where()}"
        lag = self.lead - position.seq
        word = _WORDS.get(lag, str(lag))
        text = f"{ranks} {'is' if one else 'are'} {word} collective{'s' if lag != 1 else ''} behind"
        if not position.seq:
            text += ", in none of its collectives yet"
        elif position.waiting:
            text += f", waiting in {position.where()}"
        else:
            text += f", {'its' if one else 'their'} last, {position.where()}, completed"
        places: dict[str, list[int]] = {}
        for rank in position.ranks:
            if rank in self.elsewhere:
                places.setdefault(self.elsewhere[rank], []).append(rank)
        for place, ranks_there in places.items():
            verb = "waits" if len(ranks_there) == 1 else "wait"
            some = len(ranks_there) != len(position.ranks)
            who = f" ({format_ranks(ranks_there)})" if some else ""
            text += f"; {'it' if one else 'they'}{who} {verb} in {place}"
        return text

    def _mismatch_text(self) -> str:
        mismatch = self.mismatch
        assert mismatch is not None
        sides = ", ".join(f"{_ranks_text(ranks)} called {describe_call(entry)}"
                          for ranks, entry in mismatch["sides"])  # fmt: skip
        return f"at #{mismatch['seq']} {sides} ({MATCH_NAMES[mismatch['kind']]})"

    def to_json(self) -> dict:
        return {
            "group": self.name, "desc": self.desc, "stuck": self.stuck, "lead": self.lead,
            "members": format_ranks(self.members),
            "positions": [{"ranks": format_ranks(p.ranks), "seq": p.seq, "waiting": p.waiting,
                           "op": p.entry.op if p.entry else None,
                           "input_sizes": [list(s) for s in p.entry.in_sizes] if p.entry else None,
                           "input_dtypes": list(p.entry.in_dtypes) if p.entry else None}
                          for p in self.positions[:JSON_POSITIONS]],
            "more_positions": max(0, len(self.positions) - JSON_POSITIONS),
            "missing": format_ranks(self.missing),
            "elsewhere": {str(rank): place for rank, place in self.elsewhere.items()},
            "unknown": {str(rank): reason for rank, reason in self.unknown.items()},
            "mismatch": None if self.mismatch is None else {
                "seq": self.mismatch["seq"], "match_state": self.mismatch["kind"],
                "sides": [{"ranks": format_ranks(r), "op": e.op,
                           "input_sizes": [list(s) for s in e.in_sizes],
                           "input_dtypes": list(e.in_dtypes)} for r, e in self.mismatch["sides"]]},
            "culprits": format_ranks(self.culprits), "line": self.line(),
        }  # fmt: skip


class Verdict:
    """The job's flight recorders merged: ``groups`` (stuck groups first, then by name),
    ``culprits`` (every group's), ``without`` (rank -> why it has no record), ``ranks`` (how
    many ranks had a record)."""

    def __init__(self, groups: list[GroupVerdict], without: dict[int, str], ranks: int) -> None:
        self.groups = groups
        self.without = without
        self.ranks = ranks

    @property
    def culprits(self) -> set[int]:
        found: set[int] = set()
        for group in self.groups:
            if group.stuck:
                found |= group.culprits
        return found

    @property
    def stuck(self) -> list[GroupVerdict]:
        return [group for group in self.groups if group.stuck]

    def lines(self) -> list[str]:
        """The verdict in a few lines: each stuck group's (or, when none is, ``no collective
        in flight``), then the ranks without a record, by reason."""
        lines: list[str] = []
        stuck = self.stuck
        if not self.ranks:
            lines.append("no rank has a flight record")
        elif stuck:
            lines.extend(group.line() for group in stuck[:GROUPS_SHOWN])
            if len(stuck) > GROUPS_SHOWN:
                lines.append(f"... {len(stuck) - GROUPS_SHOWN} more groups wait")
        else:
            lines.append("no collective in flight: every rank's last collective completed")
        reasons: dict[str, list[int]] = {}
        for rank, reason in self.without.items():
            reasons.setdefault(reason, []).append(rank)
        for reason, ranks in sorted(reasons.items(), key=lambda item: min(item[1])):
            lines.append(f"{_ranks_text(ranks)}: no flight record ({printable(reason)})")
        return lines

    def to_json(self) -> dict:
        return {"groups": [group.to_json() for group in self.groups],
                "culprits": format_ranks(self.culprits),
                "without": {str(rank): reason for rank, reason in self.without.items()},
                "ranks_with_records": self.ranks}  # fmt: skip


def merge(
    records: Sequence[RankRecord], without: Mapping[int, str] | None = None,
    *, world: Iterable[int] = (),
) -> Verdict:  # fmt: skip
    """The verdict over ``records`` (one per rank that has one), ``without`` (rank -> why it
    has none) and ``world`` (every rank of the job, when known: the default group's members
    where a dump does not list them)."""
    without = dict(without or {})
    world = tuple(sorted(set(world)))
    by_group: dict[str, dict[GroupFrontier, list[int]]] = {}
    for record in records:
        for frontier in record.groups:
            by_group.setdefault(frontier.name, {}).setdefault(frontier, []).append(record.rank)
    recorded = {record.rank for record in records}
    groups = [_group(name, frontiers, recorded, without, world)
              for name, frontiers in by_group.items()]  # fmt: skip
    _other_groups(groups)
    groups.sort(key=lambda group: (not group.stuck, group.name))
    return Verdict(groups, without, len(recorded))


def _members(frontiers: Mapping[GroupFrontier, list[int]], world: tuple[int, ...]) -> tuple:
    counts: dict[tuple[int, ...], int] = {}
    for frontier, ranks in frontiers.items():
        if frontier.members:
            counts[frontier.members] = counts.get(frontier.members, 0) + len(ranks)
    if counts:
        return max(counts, key=counts.__getitem__)
    if any(f.desc == "default_pg" for f in frontiers) and world:
        return world
    return tuple(sorted({rank for ranks in frontiers.values() for rank in ranks}))


def _group(
    name: str, frontiers: dict[GroupFrontier, list[int]], recorded: set[int],
    without: Mapping[int, str], world: tuple[int, ...],
) -> GroupVerdict:  # fmt: skip
    sample = next(iter(frontiers))
    desc = next((f.desc for f in frontiers if f.desc), sample.desc)
    members = _members(frontiers, world)
    verdict = GroupVerdict(name, desc, members)
    # Ranks at the same place together (their whole frontiers may differ in older entries).
    places: dict[tuple, Position] = {}
    for frontier, ranks in frontiers.items():
        entry = frontier.entry(frontier.enqueued)
        key = (frontier.enqueued, frontier.waiting, entry.call() if entry else None)
        if key in places:
            places[key].ranks.extend(ranks)
        else:
            places[key] = Position(frontier, list(ranks))
    present = {rank for ranks in frontiers.values() for rank in ranks}
    for rank in members:
        if rank in present:
            continue
        if rank in recorded:  # a member whose record lacks the group: it entered none
            empty = GroupFrontier(name, desc, members, 0, -1, -1, ())
            places.setdefault((0, False, None), Position(empty, [])).ranks.append(rank)
        else:
            verdict.unknown[rank] = without.get(rank, "no record")
    positions = sorted(places.values(), key=lambda p: (-p.seq, not p.waiting, -len(p.ranks)))
    for position in positions:
        position.ranks.sort()
    verdict.positions = positions
    verdict.lead = positions[0].seq if positions else 0
    verdict.missing = sorted(r for p in positions if p.seq < verdict.lead for r in p.ranks)
    verdict.mismatch = _first_mismatch(positions, frontiers)
    verdict.culprits = set(verdict.missing)
    if verdict.mismatch is not None:
        verdict.culprits |= _minority(verdict.mismatch["sides"], verdict)
    return verdict


def _first_mismatch(
    positions: list[Position], frontiers: Mapping[GroupFrontier, list[int]]
) -> dict | None:
    """The lowest sequence number every rank's kept entries cover at which their calls differ:
    ``{"seq", "kind", "sides": [(ranks, entry), ...]}`` (the largest side first)."""
    kept = [(f, ranks) for f, ranks in frontiers.items() if f.enqueued > 0]
    if len(kept) < 2:
        return None
    low = max(min((e.seq for e in f.recent if not e.p2p), default=f.enqueued) for f, _ in kept)
    high = min(f.enqueued for f, _ in kept)
    # Only the sequence numbers one rank kept (a forged record cannot make this loop long).
    candidates = sorted({e.seq for e in kept[0][0].recent if not e.p2p and low <= e.seq <= high})
    for seq in candidates:
        calls: dict[tuple, tuple[list[int], Entry]] = {}
        for frontier, ranks in kept:
            entry = frontier.entry(seq)
            if entry is None:
                break
            calls.setdefault(entry.call(), ([], entry))[0].extend(ranks)
        else:
            if len(calls) > 1:
                sides = sorted(calls.values(), key=lambda side: (-len(side[0]), min(side[0])))
                kind = _kind([entry for _, entry in sides])
                if kind is not None:
                    return {"seq": seq, "kind": kind,
                            "sides": [(sorted(r), e) for r, e in sides]}  # fmt: skip
    return None


def _kind(entries: list[Entry]) -> str | None:
    """The analyzer's match state of calls that differ; None when the difference is allowed."""
    first = entries[0]
    if any(entry.op != first.op for entry in entries):
        return "COLLECTIVE_TYPE_MISMATCH"
    if any(part in first.op for part in _UNEVEN):
        return None
    if any((e.in_sizes, e.out_sizes) != (first.in_sizes, first.out_sizes) for e in entries):
        return "SIZE_OR_SYNTAX_MISMATCH"
    if any((e.in_dtypes, e.out_dtypes) != (first.in_dtypes, first.out_dtypes) for e in entries):
        return "COLLECTIVE_DTYPE_MISMATCH"
    return None


def _minority(sides: list[tuple[list[int], Entry]], verdict: GroupVerdict) -> set[int]:
    """The ranks to blame for a mismatch: every side but the largest; between sides of the
    same size, the ranks not at the group's lead (else every side)."""
    largest = len(sides[0][0])
    if sum(1 for ranks, _ in sides if len(ranks) == largest) == 1:
        return {rank for ranks, _ in sides[1:] for rank in ranks}
    behind = set(verdict.missing)
    blamed = {rank for ranks, _ in sides for rank in ranks if rank in behind}
    return blamed or {rank for ranks, _ in sides for rank in ranks}


def _other_groups(groups: list[GroupVerdict]) -> None:
    """Name where a rank missing from one stuck group waits instead, when that is another
    group's collective (the analyzer's "different process group")."""
    waiting: dict[int, tuple[GroupVerdict, Position]] = {}
    for group in groups:
        for position in group.positions:
            if position.waiting and position.seq == group.lead:
                for rank in position.ranks:
                    waiting.setdefault(rank, (group, position))
    for group in groups:
        if not group.stuck:
            continue
        for rank in group.missing:
            found = waiting.get(rank)
            if found is not None and found[0] is not group:
                other, position = found
                group.elsewhere[rank] = f"{other.label} {position.where()}"

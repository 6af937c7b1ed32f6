"""The flight recorder over several nodes: each node's summary, carried in its digest
(:mod:`numarun.stacks.digest`), and the job's verdict merged from every node's. Pure: no I/O.

A node never posts its ranks' dumps (megabytes each): :func:`node_flight` reads them
(:class:`numarun.stacks.flightreport.FlightReport`) and folds them into the compact summary of
:func:`numarun.stacks.flight.node_summary` (each group's frontier and last few collectives, ranks
with the same record as one class: a few hundred bytes for 8 ranks in step), as JSON text of at
most :data:`FLIGHT_LIMIT` characters. A summary over it keeps fewer entries per group
(:data:`CUT_ENTRIES`), then fewer groups (:data:`CUT_GROUPS`), then says only that it was too
large. The raw dumps stay on their node (its log directory's ``flight_recorder/``).

The node that merges the digests (the hang verdict's judge, a whole-job ``numarun stacks``)
calls :func:`job_flight`: each summary read as untrusted (:func:`numarun.stacks.flight.
read_summary`: at most the ranks its own digest names, group members below the job's rank
count, members expanded bounded); a summary that cannot be read is one note and its ranks have
no record; one that names ranks that are not its node's is one note, those ranks left out, and
its node's ranks it does not name have no record (said so); then one
:func:`numarun.stacks.flightverdict.merge` over every rank of the job. The result,
:class:`JobFlight` (the verdict's lines, its culprits, its JSON), travels inside the merged
view (:func:`numarun.stacks.merge.encode_view`), bounded by construction (:data:`LINES_KEPT`
lines of :data:`LINE_LIMIT` characters, :data:`CULPRIT_RUNS` runs of culprits,
:data:`VERDICT_LIMIT` characters of JSON) and is read back checked (:func:`read_flight`). It
is a diagnostic: it never decides a verdict, and what goes wrong in it is a line.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from numarun.stacks.flight import (
    FlightError,
    RankRecord,
    node_summary,
    ranges,
    read_summary,
    unranges,
)
from numarun.stacks.flightreport import NOTHING_RECORDED, FlightReport
from numarun.stacks.flightverdict import format_ranks, merge, printable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from numarun.stacks.rankhelper import FlightAnswer

__all__ = ["FLIGHT_LIMIT", "JobFlight", "job_flight", "node_flight", "read_flight"]

FLIGHT_LIMIT = 16 * 1024  # characters of one node's summary in its digest, JSON-escaped
CUT_ENTRIES = 2  # entries kept per group in a summary over the limit
CUT_GROUPS = 4  # then groups kept per rank
LINES_KEPT = 16  # lines of the job's verdict carried in the view
LINE_LIMIT = 1000  # characters of each
CULPRIT_RUNS = 256  # runs of culprit ranks carried
VERDICT_LIMIT = 32 * 1024  # characters of the verdict's JSON carried (else left out, said)
TOO_LARGE = "its node's flight summary was over {} characters: see that node's dumps"
NO_SUMMARY = "its node sent no flight summary"
STRAYED = "its node's flight summary named other ranks"


# --- one node ------------------------------------------------------------------------------------


def node_flight(answers: Sequence[FlightAnswer]) -> str | None:
    """This node's ranks' flight recorders as one summary's JSON text (module docstring),
    within :data:`FLIGHT_LIMIT` characters once JSON-escaped; None when there is nothing to
    say (no rank has a process group: no line anywhere)."""
    report = FlightReport(answers)
    if not report.shown:
        return None
    problems = dict(report.without)
    for reason, ranks in report.absent.items():
        problems.update(dict.fromkeys(ranks, reason))
    records = report.records
    for cut in (None, _fewer_entries, _fewer_groups):
        if cut is not None:
            records = [cut(record) for record in records]
        data = json.dumps(node_summary(records, problems), separators=(",", ":"))
        if len(json.dumps(data)) <= FLIGHT_LIMIT:
            return data
    ranks = [record.rank for record in records]
    problems.update(dict.fromkeys(ranks, TOO_LARGE.format(FLIGHT_LIMIT)))
    return json.dumps(node_summary([], _bounded(problems)), separators=(",", ":"))


def _fewer_entries(record: RankRecord) -> RankRecord:
    return record.replace(groups=tuple(group.replace(recent=group.recent[-CUT_ENTRIES:])
                                       for group in record.groups))  # fmt: skip


def _fewer_groups(record: RankRecord) -> RankRecord:
    return record.replace(groups=record.groups[:CUT_GROUPS])


def _bounded(problems: dict[int, str]) -> dict[int, str]:
    """At most 16 reasons (the rest under one): a summary of problems alone stays small."""
    reasons = list(dict.fromkeys(problems.values()))
    if len(reasons) <= 16:
        return problems
    kept = set(reasons[:15])
    return {rank: reason if reason in kept else "other reasons" for rank, reason in
            problems.items()}  # fmt: skip


# --- every node ----------------------------------------------------------------------------------


class JobFlight:
    """The job's flight-recorder verdict as the merging node found it: ``lines`` (escaped,
    one screen), ``culprits`` (ranks behind or mismatched in a group where ranks wait: the
    analyzer's culprits), ``verdict`` (:meth:`numarun.stacks.flightverdict.Verdict.to_json` as
    JSON text; None when it had no record or was too large), ``notes`` (summaries left out,
    one line each)."""

    def __init__(
        self, lines: list[str], culprits: list[int], verdict: str | None = None,
        notes: list[str] | None = None, more_culprits: bool = False,
    ) -> None:  # fmt: skip
        self.lines = lines
        self.culprits = culprits
        self.verdict = verdict
        self.notes = notes or []
        self.more_culprits = more_culprits

    def shown_lines(self) -> list[str]:
        """The verdict's lines, then the notes: what a user sees, escaped."""
        notes = [f"left out: {note}" for note in self.notes]
        return [printable(line) for line in [*self.lines, *notes]]

    def to_doc(self) -> dict:
        """A bounded JSON-able document (module docstring)."""
        runs = ranges(self.culprits)
        return {
            "lines": [line[:LINE_LIMIT] for line in self.lines[:LINES_KEPT]],
            "notes": [note[:LINE_LIMIT] for note in self.notes[:LINES_KEPT]],
            "culprits": runs[:CULPRIT_RUNS],
            "more_culprits": self.more_culprits or len(runs) > CULPRIT_RUNS,
            "verdict": self.verdict if self.verdict and len(self.verdict) <= VERDICT_LIMIT
            else None,
        }  # fmt: skip

    def to_json(self) -> dict:
        """What ``numarun stacks --json`` prints: the lines, culprits as ranges, the verdict
        decoded (None when absent or unreadable)."""
        verdict = None
        if self.verdict is not None:
            try:
                verdict = json.loads(self.verdict)
            except (ValueError, RecursionError):
                verdict = None
        return {"lines": self.lines, "notes": self.notes, "culprits": format_ranks(self.culprits),
                "more_culprits": self.more_culprits, "verdict": verdict}  # fmt: skip


def read_flight(doc: object, world: int) -> JobFlight:
    """A :meth:`JobFlight.to_doc` document read back (from the store: untrusted), every field
    checked (culprits below ``world``); :class:`FlightError` in one line."""
    if not isinstance(doc, dict):
        raise FlightError("the flight verdict is not an object")
    lines = _texts(doc.get("lines"), "lines")
    notes = _texts(doc.get("notes", []), "notes")
    runs = doc.get("culprits")
    if not isinstance(runs, list) or len(runs) > CULPRIT_RUNS:
        raise FlightError("the flight verdict's culprits are not a short list of runs")
    culprits = list(unranges(runs, max(world, 0) + 1))
    if culprits and max(culprits) >= world:
        raise FlightError(f"the flight verdict names ranks beyond {world - 1}")
    verdict = doc.get("verdict")
    if verdict is not None and (not isinstance(verdict, str) or len(verdict) > VERDICT_LIMIT):
        raise FlightError("the flight verdict's detail is not a bounded text")
    return JobFlight(lines, culprits, verdict, notes, doc.get("more_culprits") is True)


def _texts(value: object, name: str) -> list[str]:
    if not isinstance(value, list) or len(value) > LINES_KEPT or not all(
        isinstance(line, str) and len(line) <= LINE_LIMIT for line in value
    ):  # fmt: skip
        raise FlightError(f"the flight verdict's {name} are not a few lines of text")
    return list(value)


def job_flight(
    parts: Iterable[tuple[int, list[int], str | None, str | None]], world: int,
    *, whole_job: bool = True,
) -> JobFlight | None:  # fmt: skip
    """The job's verdict from every node's part: (node, the ranks its digest names, its
    summary's text or None, why its summary was refused or None). ``world``: the job's rank
    count (ranks and members below it); ``whole_job``: every rank of the job is expected (a
    hang, ``numarun stacks``; not a failure notice, which carries one node's). None when no
    node sent a summary (no rank has a process group: no line)."""
    known: dict = {}
    records: list[RankRecord] = []
    without: dict[int, str] = {}
    notes: list[str] = []
    silent: list[int] = []
    sent = False
    for node, ranks, text, refused in parts:
        if text is None:
            if refused is not None:
                sent = True
                notes.append(f"node {node}'s flight summary: {refused}")
                without.update(dict.fromkeys(ranks, "its node's flight summary was refused"))
            else:
                silent.extend(ranks)
            continue
        sent = True
        try:
            found, problems = read_summary(text.encode("utf-8", "replace"), max_ranks=len(ranks),
                                           world=world, known=known)  # fmt: skip
        except FlightError as error:
            notes.append(f"node {node}'s flight summary: {error}")
            without.update(dict.fromkeys(ranks, "its node's flight summary was unreadable"))
            continue
        own = set(ranks)
        kept = [record for record in found if record.rank in own]
        strays = len(found) - len(kept) + sum(1 for rank in problems if rank not in own)
        if strays:  # forged: the node's own ranks it does not name get no record, said so
            notes.append(f"node {node}'s flight summary names {strays} rank(s) not its own: "
                         "left out")  # fmt: skip
            named = {record.rank for record in kept} | problems.keys()
            without.update(dict.fromkeys((rank for rank in ranks if rank not in named), STRAYED))
        records.extend(kept)
        without.update({rank: reason for rank, reason in problems.items() if rank in own})
    if not sent:
        return None
    if records:
        without.update(dict.fromkeys((r for r in silent if r not in without), NO_SUMMARY))
    nothing = {r: reason for r, reason in without.items() if reason == NOTHING_RECORDED}
    if records and any(group.enqueued > 0 or group.recent for record in records
                       for group in record.groups):  # fmt: skip
        verdict = merge(records, without, world=range(world) if whole_job else ())
        lines = verdict.lines()
        detail = json.dumps(verdict.to_json(), separators=(",", ":"))
        if len(detail) > VERDICT_LIMIT:
            notes.append(f"the verdict's detail ({len(detail):,} characters) is over "
                         f"{VERDICT_LIMIT:,}: its lines only")  # fmt: skip
            detail = None
        culprits = sorted(verdict.culprits)
        return JobFlight(lines, culprits, detail, notes[:LINES_KEPT])
    reasons: dict[str, list[int]] = {}
    for rank, reason in {**without, **nothing}.items():
        reasons.setdefault(reason, []).append(rank)
    for record in records:  # records without a collective: the recorder is off
        reasons.setdefault(NOTHING_RECORDED, []).append(record.rank)
    lines = [f"{'rank' if len(ranks) == 1 else 'ranks'} {format_ranks(ranks)}: "
             f"no flight record ({printable(reason)})"
             for reason, ranks in sorted(reasons.items(), key=lambda item: min(item[1]))]
    return JobFlight(lines[:LINES_KEPT], [], None, notes[:LINES_KEPT])

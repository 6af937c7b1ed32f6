"""What numarun says and keeps of its ranks' flight recorders, once taken
(:class:`numarun.stacks.rankhelper.FlightAnswer`): the verdict (:mod:`numarun.stacks.flightverdict`)
in the summary's and ``numarun stacks``' words, and the raw dumps kept where torch's analyzer
reads them.

:class:`FlightReport` reads every answer (each dump read as untrusted by
:mod:`numarun.stacks.flight`: one that cannot be read is that rank's line, never an error of
the run) and merges them. It has something to say (:attr:`FlightReport.shown`) when a rank has
a process group: a job that never calls ``init_process_group`` gets no line at all. Where the
ranks' torch has no recorder for their backend, it says so in one line, and the stacks' verdict
stands alone.

Kept dumps (:func:`save_dumps`): each answer with a dump is written, byte for byte as the rank
sent it (torch's pickle; for gloo with ``pg_config`` filled by the rank's helper), to
``<directory>/comm_lib_trace_rank_<rank>``, torch's own file name, 0600, replacing the previous
set (files of that name only), so ``python -m torch.distributed.flight_recorder.fr_trace
<directory>`` reads them; the command shown adds ``--allow-incomplete-ranks`` when a rank of the
job gave none (a rank that died: torch's analyzer otherwise stops on an AssertionError). Errors
(a full disk) are said in one line, never raised.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from numarun.stacks.flight import DUMP_PREFIX, FlightError, load_dump, read_record
from numarun.stacks.flightverdict import Verdict, format_ranks, merge, printable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from numarun.stacks.rankhelper import FlightAnswer

ANALYZER = "python -m torch.distributed.flight_recorder.fr_trace"
NOTHING_RECORDED = (
    "no collective in the flight recorder (none called yet, or the recorder is off: "
    "TORCH_FR_BUFFER_SIZE=0)"
)
# What a rank without collectives says: nothing to report, no line.
_NOTHING = ("torch.distributed not imported", "no process group")


class FlightReport:
    """The ranks' flight recorders read and merged (module docstring). ``world``: every rank
    of the job this node knows (the default group's members where a dump does not say).
    ``saved``: where :meth:`save` kept the dumps; ``save_problem``: why it could not;
    ``incomplete``: a rank asked for or in ``world`` gave no dump."""

    def __init__(self, answers: Sequence[FlightAnswer], world: Iterable[int] = ()) -> None:
        self.answers = [answer for answer in answers if answer is not None]
        world = list(world)
        dumped = {answer.rank for answer in self.answers if answer.status == "ok"}
        self.incomplete = bool(({answer.rank for answer in self.answers} | set(world)) - dumped)
        self.saved: str | None = None
        self.save_problem: str | None = None
        records = []
        without: dict[int, str] = {}
        self.absent: dict[str, list[int]] = {}
        for answer in self.answers:
            if answer.status == "ok":
                try:
                    records.append(read_record(load_dump(answer.data), answer.rank))
                except FlightError as error:
                    without[answer.rank] = f"unreadable dump: {error}"
                continue
            if answer.status == "absent":
                self.absent.setdefault(answer.reason, []).append(answer.rank)
            if not answer.reason.startswith(_NOTHING):
                without[answer.rank] = answer.reason or answer.status
        if records and not any(g.enqueued > 0 or g.recent for r in records for g in r.groups):
            # Dumps without a single collective: the recorder is off, or nothing was called.
            self.absent.setdefault(NOTHING_RECORDED, []).extend(r.rank for r in records)
            records = []
        self.records = records
        self.without = without  # rank -> why it has no record (not: no process group)
        self.verdict: Verdict | None = merge(records, without, world=world) if records else None

    @property
    def shown(self) -> bool:
        """Whether there is anything to say: a rank had a record, lacked a recorder, or
        failed to give one (not: no rank uses ``torch.distributed``)."""
        return self.verdict is not None or bool(self.absent) or any(
            answer.status in ("error", "unanswered") for answer in self.answers
            if not answer.reason.startswith(_NOTHING)
        )  # fmt: skip

    @property
    def culprits(self) -> set[int]:
        return self.verdict.culprits if self.verdict is not None else set()

    def lines(self) -> list[str]:
        """The verdict's lines (escaped), or the one line saying why there is none."""
        if self.verdict is not None:
            return self.verdict.lines()
        if self.absent:
            return [f"{_ranks(ranks)}: {printable(reason)}; the stacks' verdict stands alone"
                    for reason, ranks in self.absent.items()]  # fmt: skip
        reasons: dict[str, list[int]] = {}
        for answer in self.answers:
            if not answer.reason.startswith(_NOTHING):
                reasons.setdefault(answer.reason or answer.status, []).append(answer.rank)
        return [f"{_ranks(ranks)}: no flight record ({printable(reason)})"
                for reason, ranks in reasons.items()]  # fmt: skip

    def where_lines(self, *, partial: bool = False) -> list[str]:
        """Where the dumps were kept and how to read them, or why they were not. ``partial``:
        the job has ranks beyond these (another node's), so the command allows missing ones."""
        if self.saved is not None:
            where = printable(self.saved)
            allow = self.incomplete or partial
            command = f"{ANALYZER} --allow-incomplete-ranks" if allow else ANALYZER
            return [f"dumps: {where}/{DUMP_PREFIX}<rank> (read with: {command} {where})"]
        if self.save_problem is not None:
            return [f"dumps not kept: {printable(self.save_problem)}"]
        return []

    def save(self, directory: str | None, *, why_not: str) -> None:
        """Keep the dumps in ``directory`` (:func:`save_dumps`); None: say ``why_not``."""
        if self.verdict is None:  # no dump with a collective in it: nothing worth keeping
            return
        if directory is None:
            self.save_problem = why_not
            return
        problem = save_dumps(self.answers, directory)
        if problem is None:
            self.saved = directory
        else:
            self.save_problem = problem

    def to_json(self) -> dict:
        return {
            "verdict": self.verdict.to_json() if self.verdict is not None else None,
            "lines": self.lines(),
            "ranks": {str(a.rank): {"status": a.status, "reason": a.reason, "bytes": len(a.data)}
                      for a in self.answers},
            "saved": self.saved,
            "incomplete": self.incomplete,
        }  # fmt: skip


def _ranks(ranks: Sequence[int]) -> str:
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {format_ranks(ranks)}"


def save_dumps(answers: Sequence[FlightAnswer], directory: str) -> str | None:
    """Write each ``ok`` answer's dump to ``<directory>/comm_lib_trace_rank_<rank>`` (the
    directory made 0700 if missing; the previous set of such files removed first); None, or
    what went wrong in one line."""
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        for name in os.listdir(directory):
            if name.startswith(DUMP_PREFIX):
                os.unlink(os.path.join(directory, name))
        for answer in answers:
            if answer.status != "ok":
                continue
            path = os.path.join(directory, f"{DUMP_PREFIX}{answer.rank}")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600)  # fmt: skip
            try:
                view = memoryview(answer.data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
    except OSError as error:
        return f"{directory}: {error.strerror or error}"
    return None

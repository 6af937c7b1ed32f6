"""The hang verdict of ``--hang-timeout``: :class:`HangWatch` samples every rank's stacks through
:class:`numarun.stacks.dumps.RankDumps` on the supervisor's timer and ends the run when nothing
progressed; :class:`HangReport` is what the summary shows.

Hang rule (``--hang-timeout SECONDS``, :class:`HangWatch`): every ``interval`` seconds (``timeout /
100``, between 1 and 2 s; at least 1 s per 8 ranks) the dumps asked for at the previous tick are
read and new ones are asked for: nothing waits. Progress is any of: a rank's stacks differ from its
previous sample (every thread's file, line and function), a byte of output from any rank that
numarun reads (``--redirects``/``--tee``/``--local-ranks-filter``; output that goes straight to the
terminal is invisible to the launcher), a rank that exited, a rank not yet armed. A hang is declared
once nothing progressed for ``timeout`` seconds; a rank whose own code took signal 42 over and a
``--no-python`` rank are judged by their output alone, and a job in which nothing at all can be
observed is never declared hung. A rank that does not answer a dump request by the next sample
(its signal still pending: a rank starved of CPU on a loaded machine, or one blocking the signal)
is *unknown*: not progress, and not stillness either: no verdict is reached (and no node says it
is still) at a sample in which a rank is unknown, so a busy job on a loaded machine is never taken
for a hung one; a rank that never answers keeps its node from ever being judged hung. So is a
rank whose dump shows no Python frame in any thread: its interpreter is starting up or exiting
(a rank whose exit takes longer than the timeout on a loaded machine is not a hang).

Limits, and how to choose the timeout. Samples are instants: a rank that spends a fraction
``p`` of its time on one line (a training step that waits at ``loss.item()`` for the GPU, one
long C call) shows the same stack in all ``n = timeout / interval`` samples of a window with
probability ``p ** n``, and then looks hung. Choose a timeout many steps long (300 s on 8
ranks: 150 samples; ``0.95 ** 150`` is 5e-4 per window), let numarun read the output (``--tee``/
``--redirects``) when the job logs regularly, and expect a single C call longer than the
timeout (a blocking read, a huge matmul) to look hung. Conversely a rank that loops on one
line (``while not ready: time.sleep(1)``) looks still: that is a hang by this rule.

Over several nodes (a torch rendezvous, ``job`` given): a hang is judged over the whole job, no
rank on any numarun node made progress for the timeout (a node whose ranks all ended counts as
still). This node's watch then never ends the run by itself: once its own ranks have been still
for the timeout it takes its ranks' flight recorders once and calls ``job.still(dumps, idle)``
(the last samples of its ranks, unparsed, each with its flight recorder; the launcher posts
their digest, with the recorders' summary, for the other nodes), and ``job.moving()`` when one
of them moves again; the launcher calls :meth:`HangWatch.declare_job` with the job's merged classes
(:class:`numarun.stacks.merge.JobView`) once every numarun node is still, on every node alike.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Sequence

from numarun.stacks.dumps import (
    EXITED,
    HANG_REASON,
    NOT_ARMED,
    NOT_PYTHON,
    PENDING,
    REPLACED,
    UNANSWERED,
    RankDumps,
    Raw,
    normalized,
    warn_failed,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Protocol

    from numarun.process.supervisor import Supervisor
    from numarun.stacks.merge import JobView
    from numarun.stacks.parse import RankStacks
    from numarun.stacks.rankhelper import FlightAnswer

    class JobHang(Protocol):
        """The launcher's side of a hang judged over several nodes."""

        def still(self, dumps: list[Raw], idle: float) -> None: ...
        def moving(self) -> None: ...


MIN_INTERVAL = 1.0  # seconds between two samples of a rank's stacks, at the least


def sampling_interval(timeout: float, ranks: int) -> float:
    """Seconds between two samples of ``ranks`` ranks' stacks under ``--hang-timeout
    timeout``: ``timeout / 100`` between 1 and 2 s, and at least 1 s per 8 ranks, so that the
    launcher's CPU stays near 0.5 ms per second of wall time whatever the number of ranks."""
    return max(min(max(timeout / 100, MIN_INTERVAL), 2.0), ranks / 8)


def timeout_floor(ranks: int) -> float:
    """The shortest ``--hang-timeout`` the sampling can judge on ``ranks`` ranks: one sampling
    interval, the time between the two samples that must agree before a rank counts as still.
    A shorter timeout would mean nothing: the verdict would come at the second agreeing sample
    all the same, after a healthy rank's one-second pause (a unit slip, milliseconds for
    seconds, would stop the job)."""
    return sampling_interval(0.0, ranks)


class HangReport:
    """What :class:`HangWatch` saw when it declared the hang: ``stacks`` of this node's ranks
    (the last samples, parsed when first read), ``idle`` seconds without progress, whether
    output counted, ``nodes``: how many nodes were judged (1: this node alone); over several
    nodes ``view``, the job's merged classes, and ``by``, who declared it: ``"this node"`` or
    the node whose verdict came through the rendezvous store; ``flight``: this node's ranks'
    flight recorders, taken once the rule fired (unparsed)."""

    def __init__(
        self,
        timeout: float,
        idle: float,
        stacks: Sequence[RankStacks] | Callable[[], Sequence[RankStacks]],
        output_watched: bool,
        nodes: int = 1,
        view: JobView | None = None,
        by: str | None = None,
        flight: Sequence[FlightAnswer] = (),
    ) -> None:
        self.timeout = timeout
        self.idle = idle
        self._stacks = stacks
        self.output_watched = output_watched
        self.nodes = nodes
        self.view = view
        self.by = by
        self.flight = list(flight)  # this node's ranks' flight recorders, taken at the verdict

    @property
    def stacks(self) -> Sequence[RankStacks]:
        if callable(self._stacks):
            self._stacks = self._stacks()
        return self._stacks


class HangWatch:
    """``--hang-timeout``: samples every rank's stacks on the supervisor's timer and stops the
    run through :meth:`Supervisor.request_stop` (``"hang: ..."``) when nothing progressed for
    ``timeout`` seconds (the rule is in the module docstring). ``report`` is then set. With
    ``job``, the verdict is the whole job's (module docstring): :meth:`declare`."""

    def __init__(
        self, dumps: RankDumps, timeout: float, *, output_watched: bool, job: JobHang | None = None
    ) -> None:
        self.dumps = dumps
        self.job = job
        self.still = False  # job-wide: this node told the job its ranks are still
        self.timeout = float(timeout)
        self.interval = sampling_interval(self.timeout, len(dumps.local_ranks))
        self.output_watched = output_watched
        self.report: HangReport | None = None
        self._output = 0
        self._seen_output = 0
        self._last: dict[int, bytes] = {}
        self._exited: set[int] = set()
        self._unasked: dict[int, str] = {}  # local rank -> why the last tick did not ask it
        self._progress_at = time.monotonic()
        self._supervisor: Supervisor | None = None
        self._job_failed = False
        self._broken = False  # the watch's own code failed: it stopped (see tick)
        self._declaring = False  # the rule fired: the flight recorders are being taken
        self.flight: list[FlightAnswer] = []  # taken when this node last went still (a job's)

    def count_output(self, sinks: Iterable[Any]) -> None:
        """Count what these output sinks receive as progress. The sink's own ``feed`` is
        wrapped on the instance, so the sink keeps its type
        (:func:`numarun.process.sinks.log_loss`)."""
        for sink in sinks:
            if sink is None:
                continue
            inner = sink.feed

            def feed(data: bytes, inner: Callable[[bytes], None] = inner) -> None:
                self._output += 1
                inner(data)

            sink.feed = feed

    def attach(self, supervisor: Supervisor) -> None:
        self._supervisor = supervisor
        self._progress_at = time.monotonic()
        supervisor.call_every(self.interval, self.tick)

    def tick(self) -> None:
        """Read the dumps asked for at the last tick, judge progress, ask again. An I/O error
        skips this tick; any other error (a bug, a dump no check foresaw) is one line and
        stops the watch: a diagnostic that fails never ends the run it watches."""
        if self._broken:
            return
        try:
            self._tick()
        except OSError:
            pass
        except Exception as error:
            self._broken = True
            self._declaring = False
            warn_failed("the hang watch", error, "no hang will be declared")

    def _tick(self) -> None:
        if self._declaring:
            return
        now = time.monotonic()
        dumps = self.dumps
        progress = self._output != self._seen_output
        self._seen_output = self._output
        observable = self.output_watched
        unknown = False  # a rank did not answer: no verdict at this sample
        signalled: list[int] = []  # ranks whose helper was signalled: read, not asked again
        for local_rank in dumps.local_ranks:
            state = dumps._ranks[local_rank]
            if state.exited:
                if local_rank not in self._exited:
                    self._exited.add(local_rank)
                    progress = True
                continue
            if state.fd is None or (state.replaced and not dumps.has_helper(local_rank)):
                continue  # judged by its output alone
            unasked = self._unasked.get(local_rank)
            if unasked == NOT_ARMED:
                progress = True  # still starting up (or exec'd): not hung
                continue
            if unasked == PENDING:
                unknown = True  # the last signal is still pending: not answered
                continue
            if state.asked_at is None:
                continue  # first tick: nothing asked yet
            data = dumps.read(local_rank)
            if not data and (dumps.nudge(local_rank) or dumps.awaiting_signal(local_rank)):
                unknown = True  # its GIL is held: the dump comes from the signal, next tick
                signalled.append(local_rank)
                continue
            problem = None if data else dumps.answer_problem(local_rank, data, final=True)
            if problem in (PENDING, UNANSWERED):
                unknown = True
                continue
            if not data:
                continue
            if b'File "' not in data:  # no Python frame in any thread: starting or exiting
                unknown = True
                continue
            observable = True
            sample = normalized(data)
            if self._last.get(local_rank) != sample:
                self._last[local_rank] = sample
                progress = True
        if progress or not (observable or unknown):
            self._progress_at = now
            if self.still and self.job is not None:
                self.still = False
                self._tell_job(self.job.moving)
        elif now - self._progress_at >= self.timeout and not unknown:
            if self.job is None:
                self._take_flight(now)
                return
            if not self.still:
                self._go_still(now)
                return
        self._unasked = dumps.ask([r for r in dumps.live() if r not in signalled])

    def _go_still(self, now: float) -> None:
        """Over several nodes, the rule fired on this node: take every live rank's flight
        recorder first (as :meth:`_take_flight`), then tell the job this node is still, its
        ranks' last samples carrying them (the digest carries their summary); sampling goes
        on."""
        self._declaring = True
        live = self.dumps.live()

        def taken(raws: list[Raw]) -> None:
            self._declaring = False
            if self.dumps.live() != live:  # a rank ended meanwhile: progress
                self._progress_at = time.monotonic()
            else:
                flight = {raw.local_rank: raw.flight for raw in raws if raw.flight is not None}
                self.flight = list(flight.values())
                dumps = self.last_raw()
                for raw in dumps:
                    raw.flight = flight.get(raw.local_rank)
                self.still = True
                assert self.job is not None
                self._tell_job(self.job.still, dumps, now - self._progress_at)
            with contextlib.suppress(OSError):
                self._unasked = self.dumps.ask(self.dumps.live())

        try:
            self.dumps.take_async(taken, live, stacks=False, flight=True)
        except OSError:
            taken([])

    def _tell_job(self, call: Callable[..., None], *args: object) -> None:
        """The whole job's side of a hang (a diagnostic of its own): what it raises is one
        line, once, and the run goes on (no verdict is reached without it)."""
        try:
            call(*args)
        except Exception as error:
            if not self._job_failed:
                self._job_failed = True
                warn_failed("the whole job's hang watch", error, "a hang over every node cannot be "
                      "declared")  # fmt: skip

    def idle(self) -> float:
        """Seconds since this node's ranks last made progress."""
        return time.monotonic() - self._progress_at

    def declare_job(self, view: JobView, by: str) -> None:
        """The whole job is hung (every numarun node of ``view`` still, and this node's own
        ranks still or ended when the verdict was acted on: the launcher checks both before it
        calls this): set :attr:`report` with the job's classes and this node's last samples,
        and stop the run, as a local verdict does, on every node alike. ``by`` names who
        declared it. Does nothing once a verdict was given."""
        if self.report is not None:
            return
        self.report = self.job_report(view, by, self.idle())
        assert self._supervisor is not None
        nodes = len(view.answered)
        self._supervisor.request_stop(
            f"{HANG_REASON}no rank of the {nodes} nodes made progress for "
            f"{self.report.idle:.1f} s (--hang-timeout {self.timeout:g})"
        )

    def job_report(self, view: JobView, by: str, idle: float) -> HangReport:
        """The report of a verdict over the job (this node's ranks parsed when read)."""
        return HangReport(self.timeout, idle, self.last_stacks, self.output_watched,
                          len(view.answered), view, by, self.flight)  # fmt: skip

    def last_raw(self) -> list[Raw]:
        """This node's ranks as last sampled, unparsed (a rank without a sample: why)."""
        dumps = self.dumps
        found = []
        for local_rank in dumps.local_ranks:
            state = dumps._ranks[local_rank]
            problem = None
            if state.fd is None:
                problem = NOT_PYTHON
            elif state.exited:
                problem = EXITED
            elif state.replaced and not dumps.has_helper(local_rank):
                problem = REPLACED
            text = self._last.get(local_rank, b"") if problem is None else b""
            if problem is None and not text:
                problem = PENDING
            found.append(Raw(state.rank, local_rank, state.pid or None,
                             text.decode("utf-8", "replace"), problem))  # fmt: skip
        return found

    def last_stacks(self) -> list[RankStacks]:
        """This node's ranks as last sampled (a rank without a sample: why), parsed."""
        from numarun.stacks.parse import rank_stacks

        return [
            rank_stacks(raw.rank, raw.local_rank, raw.pid, raw.text, raw.problem)
            for raw in self.last_raw()
        ]

    def _take_flight(self, now: float) -> None:
        """The rule fired: take every live rank's flight recorder (no stack signal; at most
        :data:`~numarun.stacks.dumps.TAKE_LIMIT` seconds, from the loop's timers), then
        declare the hang with it."""
        self._declaring = True
        live = self.dumps.live()

        def taken(raws: list[Raw]) -> None:
            if self.dumps.live() != live:  # a rank ended meanwhile: progress, no verdict
                self._declaring = False
                self._progress_at = time.monotonic()
                return
            self._declare(now, [raw.flight for raw in raws if raw.flight is not None])

        try:
            self.dumps.take_async(taken, live, stacks=False, flight=True)
        except OSError:
            self._declare(now, [])

    def _declare(self, now: float, flight: Sequence[FlightAnswer] = ()) -> None:
        if self.report is not None:
            return
        stacks = self.last_stacks()
        idle = now - self._progress_at
        self.report = HangReport(self.timeout, idle, stacks, self.output_watched, flight=flight)
        assert self._supervisor is not None
        self._supervisor.request_stop(
            f"{HANG_REASON}no rank made progress for {idle:.1f} s (--hang-timeout {self.timeout:g})"
        )

"""One job's stacks wired into its supervisor: the dump files (:mod:`numarun.stacks.dumps`), the
``numarun stacks`` socket (:mod:`numarun.stacks.channel`), the hang watch
(:mod:`numarun.stacks.hang`), the stacks taken at the first failure, and the files the summary
points to. :func:`for_spawn` does the same for :func:`numarun.spawn`.

Over several nodes (a torch rendezvous) the launcher adds the rest of the job through three
hooks, set before the run: :attr:`JobStacks.job_wide` answers a ``numarun stacks`` request for
the whole job (asynchronously: the answer comes back through the supervisor's loop once every
node answered or about 2 s passed), ``hang_job`` (:mod:`numarun.stacks.hang`) judges a hang over
the whole job, and :meth:`JobStacks.note_notice` records another node's failure with where every
rank of the job was (merged when the summary is written: :meth:`JobStacks.notice_view`).

Nothing here waits on the supervisor's loop but the stacks taken at a failure (the supervisor's
``on_failure`` finishes before the teardown signals anyone): a ``numarun stacks`` request and
another node's notice take the dumps with :meth:`numarun.stacks.dumps.RankDumps.take_async`.
"""

from __future__ import annotations

import os
import sys
import time

from numarun.errors import NumarunError, suppress
from numarun.stacks.dumps import RankDumps, runtime_dir

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from typing import Any

    from numarun.process.spec import WorkerExit
    from numarun.process.supervisor import Supervisor
    from numarun.stacks.digest import Digest
    from numarun.stacks.dumps import Raw
    from numarun.stacks.hang import HangWatch, JobHang
    from numarun.stacks.merge import JobView
    from numarun.stacks.parse import RankStacks
    from numarun.stacks.rankhelper import FlightAnswer

    Reply = Callable[[dict], None]  # hands a JSON-able reply to the waiting client, once


class JobStacks:
    """Everything stacks need for one job: the dump files (:class:`RankDumps`), the
    ``numarun stacks`` socket (:class:`numarun.stacks.channel.JobServer`), the hang watch and the
    stacks taken at the first failure. Made before the workers (their environment needs
    :meth:`worker_env`), attached to the supervisor, closed at the end.

    ``hang_job``: judge ``--hang-timeout`` over the whole job (:mod:`numarun.stacks.hang`).
    :attr:`job_wide`, when set, is called as ``job_wide(reply)`` for a ``numarun stacks``
    request of scope ``"job"`` and calls ``reply(fields)`` once, from the loop (``fields`` joins
    this job's description in the reply). :attr:`scope` says what ``numarun stacks`` can see
    of the job: ``"job"`` (every node), ``"node"`` (a static rendezvous over several nodes:
    this node only) or ``"all"`` (one node: everything). ``made``: the name (in the per-user
    runtime directory) of a dump directory made already, with its files
    (:func:`numarun.stacks.dumps.make_files`: those ``--preload`` standbys were armed on at
    birth), which this job's dumps read and remove at the end; the socket takes that name."""

    def __init__(
        self,
        ranks: Sequence[tuple[int, int]],
        *,
        python: bool,
        describe: Mapping[str, object],
        hang_timeout: float | None = None,
        close_when_done: bool = False,
        hang_job: JobHang | None = None,
        scope: str = "all",
        made: str | None = None,
    ) -> None:
        # Made here, before the workers; channel, the socket's module, only once they started.
        self.runtime_dir = runtime_dir(create=True)
        self.name = made or f"{os.getpid()}-{os.urandom(4).hex()}"
        directory = None
        if python:
            directory = os.path.join(self.runtime_dir, f"{self.name}.d")
            if made is None:
                os.mkdir(directory, 0o700)
        try:
            self.dumps = RankDumps(ranks, directory, made=made is not None)
        except BaseException:
            if directory is not None:
                with suppress(OSError):  # gone already: RankDumps.close removed it
                    os.rmdir(directory)
            raise
        self.describe = {**describe, "name": self.name, "pid": os.getpid(),
                         "started": time.time()}  # fmt: skip
        self.hang: HangWatch | None = None
        if hang_timeout:  # loaded only for --hang-timeout: the launcher's start-up path
            from numarun.stacks.hang import HangWatch

            self.hang = HangWatch(self.dumps, hang_timeout, output_watched=False, job=hang_job)
        self.scope = scope
        self.job_wide: Callable[[Reply], None] | None = None
        self.at_failure: tuple[WorkerExit, list[RankStacks]] | None = None
        self.flight_at_failure: list[FlightAnswer] = []  # the others' flight recorders then
        # Where a `numarun stacks` request keeps the ranks' flight-recorder dumps (the run's
        # log directory, when it stays); None: not kept.
        self.flight_dir: str | None = None
        # Another node's failure: (its notice, its digest, its classes' frames, this node's
        # dumps taken then).
        self.at_notice: tuple[str, Digest | None, dict, list[Raw]] | None = None
        self._close_when_done = close_when_done
        self._server: Any = None
        self._supervisor: Supervisor | None = None

    def worker_env(self, local_rank: int) -> dict[str, str]:
        return self.dumps.worker_env(local_rank)

    def count_output(self, sinks: Iterable[Any]) -> None:
        """Output through these sinks counts as progress for ``--hang-timeout``."""
        if self.hang is not None:
            present = [sink for sink in sinks if sink is not None]
            if present:
                self.hang.output_watched = True
                self.hang.count_output(present)

    def attach(self, supervisor: Supervisor) -> None:
        """Before :meth:`Supervisor.run`: the hang timer; the socket opens in :meth:`listen`."""
        self._supervisor = supervisor
        self.dumps.attach(supervisor)
        if self.hang is not None:
            self.hang.attach(supervisor)

    def call_later(self, delay: float, callback: Callable[[], None]) -> object | None:
        """``callback()`` from the attached supervisor's loop ``delay`` seconds from now; its
        handle (``cancel()`` drops the call), or None when no supervisor is attached."""
        if self._supervisor is None:
            return None
        return self._supervisor.call_later(delay, callback)

    def listen(self) -> None:
        """Open the ``numarun stacks`` socket and watch it from the supervisor's loop (called
        once the workers started: nothing of it delays them)."""
        from numarun.stacks import channel

        assert self._supervisor is not None
        self._server = channel.JobServer(self.runtime_dir, self.name, self._answer)
        self._server.attach(self._supervisor)

    def on_exit(self, ended: WorkerExit) -> None:
        """The supervisor's ``on_exit``; with ``close_when_done``, the last rank's end closes
        everything (the :func:`numarun.spawn` case: no launcher around it to do so)."""
        self.dumps.note_exit(ended)
        if self._close_when_done and not self.dumps.live():
            self.close()

    def on_failure(self, ended: WorkerExit) -> None:
        """The supervisor's ``on_failure``: the other ranks' stacks and flight recorders,
        before anyone is signalled (at most :data:`TAKE_LIMIT` seconds)."""
        self.dumps.note_exit(ended)
        others = [r for r in self.dumps.live() if r != ended.local_rank]
        with suppress(OSError):  # no stacks then: the teardown must go on
            stacks, flight = self.dumps.take_with_flight(others) if others else ([], [])
            self.at_failure = (ended, stacks)
            self.flight_at_failure = flight

    def take_async(self, done: Callable[[list[Raw]], None], *, flight: bool = False) -> None:
        """Every rank's dump, unparsed, to ``done`` from the loop once taken (at most
        :data:`TAKE_LIMIT` seconds; the loop is free meanwhile); an exited rank says so;
        ``flight``: with each rank's flight recorder. An I/O error gives no dumps rather than
        an exception."""
        try:
            self.dumps.take_async(done, flight=flight)
        except OSError:
            done([])

    def note_notice(
        self, notice: str, digest: Digest | None, frames: dict, own: Sequence[Raw]
    ) -> None:
        """Another node's failure (``notice``, that node's ``digest`` and its classes'
        ``frames``) and this node's ranks taken at once, before the teardown; kept for what
        this node prints (the first notice of the run only)."""
        if self.at_notice is None:
            self.at_notice = (notice, digest, frames, list(own))

    def notice_view(self, node: int, host: str, world: int | None = None) -> JobView | None:
        """Where every rank of the job was at another node's notice: its ranks and this
        node's (``node``, ``host``) merged into classes, their flight summaries over the
        job's ``world`` ranks (a group's members reach past the ranks the two digests name: the
        failed rank's node sends no dump of it); None without a notice."""
        if self.at_notice is None:
            return None
        from numarun.stacks.digest import Classes, node_digest
        from numarun.stacks.merge import merge

        _, digest, frames, own = self.at_notice
        mine, posts = node_digest(own, node=node, host=host, pid=os.getpid(), state="notice",
                                  known=Classes())  # fmt: skip
        digests = [digest, mine] if digest is not None else [mine]
        view = merge(digests, kind="notice", by="this node", size=len(digests),
                     world=world)  # fmt: skip
        view.add_posts({**frames, **posts})
        return view

    def note_verdict(self, view: JobView, by: str) -> None:
        """The job's hang verdict reached this node after its run ended (its ranks had all
        ended; it waited in the exit barrier): the report the summary shows."""
        if self.hang is not None and self.hang.report is None:
            self.hang.report = self.hang.job_report(view, by, self.hang.idle())

    def _answer(self, op: str, request: dict, reply: Reply) -> None:
        info: dict[str, object] = {
            **self.describe,
            "scope": self.scope,
            "ranks": [
                {"local_rank": r, "rank": self.dumps._ranks[r].rank,
                 "pid": self.dumps._ranks[r].pid or None}
                for r in self.dumps.local_ranks
            ],
        }  # fmt: skip
        if op != "stacks":
            reply(info)
            return
        if request.get("scope") == "job" and self.job_wide is not None:
            self.job_wide(lambda fields: reply({**info, **fields}))
            return

        def taken(dumps: list[Raw]) -> None:
            info["dumps"] = [
                {"rank": item.rank, "local_rank": item.local_rank, "pid": item.pid,
                 "problem": item.problem, "text": item.text}
                for item in dumps
            ]  # fmt: skip
            report = self.flight_report([item.flight for item in dumps if item.flight])
            if report.shown:
                report.save(self.flight_dir, why_not="the run has no --log-dir")
                info["flight"] = report.to_json()
            reply(info)

        self.take_async(taken, flight=True)

    def keep_flight(self, dumps: list[Raw]) -> list[Raw]:
        """Keep the flight recorders ``dumps`` carry in :attr:`flight_dir` (a whole-job
        ``numarun stacks``: each node keeps its own ranks' dumps; their summary travels in the
        digest); ``dumps``, unchanged. A dump that cannot be kept is a line of this node's
        report, never an error."""
        answers = [item.flight for item in dumps if item.flight is not None]
        if answers and self.flight_dir is not None:
            report = self.flight_report(answers)
            if report.shown:
                report.save(self.flight_dir, why_not="")
        return dumps

    def flight_report(self, answers: Sequence[FlightAnswer]) -> Any:
        """A :class:`numarun.stacks.flightreport.FlightReport` of ``answers``, over this node's
        ranks."""
        from numarun.stacks.flightreport import FlightReport

        return FlightReport(answers, world=[state.rank for state in self.dumps._ranks.values()])

    def summary_fields(self, attempt_dir: str | None) -> dict[str, object]:
        """Keyword arguments for :func:`numarun.launch.summary.format_summary`: the hang report or
        the stacks taken at the first failure, and the ranks' flight recorders then
        (``flight``, a :class:`numarun.stacks.flightreport.FlightReport`, when it has
        something to say); with ``attempt_dir`` (the run's kept log directory) each rank's
        full stacks are written to ``<attempt_dir>/<local rank>/stacks.log`` first, and the
        flight-recorder dumps to ``<attempt_dir>/flight_recorder/``."""
        fields: dict[str, object] = {}
        if self.hang is not None and self.hang.report is not None:
            report = self.hang.report
            fields["hang"] = report
            stacks = report.stacks
            header = f"when --hang-timeout {report.timeout:g} found the job hung"
            flight = report.flight
        elif self.at_failure is not None:
            ended, stacks = self.at_failure
            fields["stacks_at_failure"] = (ended.rank, stacks)
            header = f"when rank {ended.rank} failed"
            flight = self.flight_at_failure
        else:
            return fields
        if flight:
            found = self.flight_report(flight)
            if found.shown:
                kept = os.path.join(attempt_dir, "flight_recorder") if attempt_dir else None
                found.save(kept, why_not="no log directory stays (give --log-dir to keep them)")
                fields["flight"] = found
        # Over several nodes the stacks hold every node's ranks: files for this node's only.
        mine = {self.dumps._ranks[r].rank for r in self.dumps.local_ranks}
        own = [item for item in stacks if item.rank in mine]
        if own and attempt_dir is not None:
            log_dirs = {item.local_rank: os.path.join(attempt_dir, str(item.local_rank))
                        for item in own}  # fmt: skip
            if write_stacks_files(log_dirs, own, header):
                fields["stacks_logs"] = os.path.join(attempt_dir, "<local_rank>", "stacks.log")
        return fields

    def close(self) -> None:
        """Close the socket and remove the dump files; idempotent."""
        if self._close_when_done:
            import atexit

            atexit.unregister(self.close)
        if self._server is not None:
            self._server.close(self._supervisor)
            self._server = None
        self.dumps.close()


def write_stacks_files(
    log_dirs: Mapping[int, str], stacks: Sequence[RankStacks], header: str
) -> list[str]:
    """Each rank's full dump (as faulthandler wrote it) to ``<its log dir>/stacks.log`` after a
    ``# numarun: ...`` header line; returns the paths written. Errors are skipped: a full disk
    must not hide the summary."""
    written = []
    for item in stacks:
        directory = log_dirs.get(item.local_rank)
        if directory is None:
            continue
        path = os.path.join(directory, "stacks.log")
        body = item.text if item.text else f"(no stacks: {item.problem})\n"
        try:
            with open(path, "w", encoding="utf-8") as file:
                file.write(
                    f"# numarun: rank {item.rank} (local_rank {item.local_rank}, pid "
                    f"{item.pid}) {header}\n{body}"
                )
        except OSError:
            continue
        written.append(path)
    return written


def for_spawn(specs: Sequence[Any], fn: object) -> tuple[list[Any], JobStacks | None]:
    """:func:`numarun.spawn`'s workers with their dump files added to their environment, and
    the :class:`JobStacks` to attach (``numarun stacks`` answers while the parent waits in
    ``join``); it closes itself when the last worker ends, or at interpreter exit. Where
    stacks cannot be set up, the specs unchanged, None, and a :class:`RuntimeWarning`."""
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    try:
        job = JobStacks(
            [(spec.local_rank, spec.rank) for spec in specs],
            python=True,
            describe={"run_id": f"spawn-{os.getpid()}", "host": os.uname().nodename,
                      "entrypoint": f"numarun.spawn({name}) in {' '.join(sys.argv)[:150]}"},
            close_when_done=True,
        )  # fmt: skip
    except (NumarunError, OSError) as error:
        import warnings

        warnings.warn(f"`numarun stacks` will not reach these workers: {error}",
                      RuntimeWarning, stacklevel=3)  # fmt: skip
        return list(specs), None
    import atexit

    atexit.register(job.close)
    env = job.worker_env
    return [s.replace(env={**s.env, **env(s.local_rank)}) for s in specs], job


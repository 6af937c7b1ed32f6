"""``--preload MODULES``: standby workers kept ready for a launch's next attempt; the hand-over.

For each local rank a *standby* waits: a worker started exactly as that rank's cold worker
would be (the same argv, CPUs, memory policy, working directory, limits, signal dispositions,
and its environment less :data:`HAND_OVER`), which imports the modules and then waits
(:mod:`numarun.worker.preload`, inside it). When an attempt starts, each standby is handed the
attempt's complete environment and runs the user's script or module as a cold worker would.
:class:`Warm` keeps the sets of standbys (:class:`Standbys`) for the launch's attempts to come:

* :meth:`Warm.start` starts sets until enough wait: at launch the first attempt's, before and
  while the rendezvous forms, and beside it the next attempt's whenever another attempt may
  follow (a restart left, or a torch rendezvous, which may re-form the group at any time; not
  with ``--preload-late``), so that a failure soon after the start restarts warm too; then,
  from each attempt's ``on_started``, one set waits again. Each set is born armed for stack
  dumps, on a directory of its own that the attempt taking it reads
  (:meth:`Warm.dumps_for_next`). A standby is a worker of a
  :class:`numarun.process.standby.StandbySupervisor`: the watchdog forks and binds it, and
  owns it (a launcher killed even by SIGKILL takes it down), and that supervisor runs the
  attempt it is handed (:meth:`Standbys.adopt`, :meth:`Standbys.hand_over`).
* :meth:`Warm.take` gives an attempt the oldest waiting set when it was born for it: as many
  standbys as ranks, each alive, with the same argv, binding, working directory, output streams
  and environment (less :data:`HAND_OVER`) as the attempt's cold worker; otherwise the set is
  discarded, the attempt starts cold and :attr:`Warm.note` says why.
* A module that cannot be imported, or an import that initialised CUDA (or CUDA found at
  the hand-over), is said in one warning line (the first time; what a standby reported is
  escaped); from then on the launch runs cold: no more standbys are started, a set that waits
  is discarded, and a standby handed its attempt already becomes its rank's cold worker by
  itself (``execve`` of the same command line). With ``--preload-required`` it is
  :attr:`Warm.fatal` instead (the launch stops the attempt that runs, and ends).
* :meth:`Warm.close` discards what waits, on every way a launch ends.

Each standby's end of a Unix stream socket is passed to it (``NUMARUN_STANDBY_FD``); the
launcher reads its status line there (in the loop of whichever supervisor runs then) and
writes its hand-over, then end of file. Standbys are started and discarded with the
launcher's teardown signals blocked (:func:`numarun.process.standby.signals_blocked`), so one
that comes meanwhile goes to the launcher's own handling once the call returned.

A waiting standby is not a rank: ``numarun stacks`` and ``--hang-timeout`` see an attempt's
ranks only, from its hand-over on (a rank handed over while it still imports shows them in its
stacks, as a cold worker's would).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import Callable, Mapping, Sequence

from numarun.errors import NumarunError
from numarun.launch.workersetup import (
    ROUND_VARIABLES,
    rank_setups,
)
from numarun.process import forkexec
from numarun.process.spec import RUN_ID_ENV, WorkerSpec
from numarun.process.standby import LateSink, StandbySupervisor, signals_blocked
from numarun.worker.dumphandler import STACKS_FILE_ENV
from numarun.worker.preload import PRELOAD_ENV, READY, STANDBY_FD_ENV

TYPE_CHECKING = False
if TYPE_CHECKING:
    from numarun.cmdline.config import LaunchConfig
    from numarun.placement.plan import Plan
    from numarun.process.spec import WorkerExit
    from numarun.process.supervisor import Supervisor

HAND_OVER = (
    *ROUND_VARIABLES,
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_ERROR_FILE",
    STACKS_FILE_ENV,
)
"""What a standby is handed when its attempt starts: the variables known only then (the
round's ranks and sizes, the store's address, the restart count, the attempt's error file
and stack-dump file). Every other variable of the worker's environment is fixed at birth
(``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``ROLE_NAME``, ``OMP_NUM_THREADS``,
``TORCHELASTIC_RUN_ID``, ``TORCHELASTIC_MAX_RESTARTS``, ``CUDA_VISIBLE_DEVICES``, the
launcher's own environment, ...)."""

_MARKERS = (PRELOAD_ENV, STANDBY_FD_ENV)
_MAX_STATUS = 64 * 1024  # bytes of a standby's status lines kept at most


def birth_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` less :data:`HAND_OVER`: what a standby of that worker is born with."""
    return {name: value for name, value in env.items() if name not in HAND_OVER}


def _one_line(text: str) -> str:
    return " ".join(text.split())


class Standbys:
    """One set of standbys, one per local rank, and the launcher's ends of their sockets."""

    def __init__(
        self,
        supervisor: StandbySupervisor,
        born: list[WorkerSpec],
        channels: list[socket.socket],
        dumps: str | None = None,
    ) -> None:
        self.supervisor = supervisor
        self.born = born
        self.channels = channels
        # The stack-dump directory the standbys were armed on at birth (in the per-user
        # runtime directory), until an attempt's stacks take it (None then, or where it could
        # not be made).
        self.dumps = dumps
        self.lines: dict[int, int] = {}  # local rank -> how many of its lines were read
        self.closed: set[int] = set()  # local ranks whose socket reached end of file
        self.handed = False
        self._partial: dict[int, bytes] = {}
        self._unsent: dict[int, memoryview] = {}  # what a socket did not take at once
        self._writers: dict[int, socket.socket] = {}  # the descriptors the loop writes it to
        self._loop: Supervisor | None = None

    # --- status lines ----------------------------------------------------------------------------

    def read(self, local_rank: int) -> list[bytes]:
        """Read what local rank's socket holds now; the lines completed since the last call
        (its status line, and after a hand-over maybe a second one: CUDA found initialised
        then). End of file is noted in :attr:`closed` (and its socket closed once handed)."""
        channel = self.channels[local_rank]
        if local_rank in self.closed or channel.fileno() < 0:
            return []
        while True:
            try:
                data = channel.recv(4096)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                data = b""
            if not data:
                self._ended(local_rank)
                break
            kept = self._partial.get(local_rank, b"")
            self._partial[local_rank] = (kept + data)[:_MAX_STATUS]  # a standby's lines are short
        *complete, rest = self._partial.get(local_rank, b"").split(b"\n")
        self._partial[local_rank] = rest
        self.lines[local_rank] = self.lines.get(local_rank, 0) + len(complete)
        return complete

    def _ended(self, local_rank: int) -> None:
        self.closed.add(local_rank)
        if self._loop is not None:
            self._loop.remove_reader(self.channels[local_rank].fileno())
        if self.handed:
            self._close(local_rank)

    def _close(self, local_rank: int) -> None:
        channel = self.channels[local_rank]
        if channel.fileno() >= 0:
            forkexec.close_untracked(channel.fileno())
            channel.close()

    def watch(self, supervisor: Supervisor, on_status: Callable[[int, bytes], None]) -> None:
        """Read the status lines in ``supervisor``'s loop, calling ``on_status(local rank,
        line)`` for each (a reader until end of file, or the end of that run)."""
        self._loop = supervisor
        for local_rank, channel in enumerate(self.channels):
            if channel.fileno() >= 0 and local_rank not in self.closed:

                def readable(local_rank: int = local_rank) -> None:
                    for line in self.read(local_rank):
                        on_status(local_rank, line)

                supervisor.add_reader(channel.fileno(), readable)

    def unwatch(self) -> None:
        """That run ended: its loop is gone."""
        self._loop = None

    # --- the hand-over ---------------------------------------------------------------------------

    def mismatch(
        self, specs: Sequence[WorkerSpec], on_status: Callable[[int, bytes], None]
    ) -> str | None:
        """Why these standbys cannot run the attempt of ``specs`` (one per local rank, as the
        cold workers would be started), or None when each was born for it; each status
        line read meanwhile goes to ``on_status(local rank, line)``."""
        if len(specs) != len(self.born):
            return (
                f"the local world size changed from {len(self.born)} to {len(specs)}, "
                "which standbys are born with"
            )
        for born, spec in zip(self.born, sorted(specs, key=lambda s: s.local_rank), strict=True):
            what = _differs(born, spec)
            if what is not None:
                return f"local rank {spec.local_rank}'s {what} is not its standby's"
        for local_rank in range(len(self.born)):
            for line in self.read(local_rank):
                on_status(local_rank, line)
            if local_rank in self.closed:
                return f"local rank {local_rank}'s standby ended before its attempt"
        if self.supervisor.pending_exits():
            return "a standby ended before its attempt"
        return None

    def adopt(
        self,
        specs: Sequence[WorkerSpec],
        on_failure: Callable[[WorkerExit], None] | None,
        on_exit: Callable[[WorkerExit], None] | None,
    ) -> StandbySupervisor:
        """The attempt of ``specs`` runs on these standbys (after :meth:`mismatch` said None):
        their output goes to the attempt's sinks, their ranks and the callbacks are the
        attempt's. Returns the supervisor to run (its ``on_started`` calls
        :meth:`hand_over`)."""
        for born, spec in zip(self.born, sorted(specs, key=lambda s: s.local_rank), strict=True):
            for late, sink in ((born.stdout, spec.stdout), (born.stderr, spec.stderr)):
                if isinstance(late, LateSink) and sink is not None:
                    late.attach(sink)
        self.supervisor.hand_over(
            {spec.local_rank: spec.rank for spec in specs}, on_failure=on_failure, on_exit=on_exit
        )
        return self.supervisor

    def hand_over(self, specs: Sequence[WorkerSpec]) -> None:
        """Write each standby its attempt's environment (the cold worker's, with this
        supervisor's run marker), then end of file. What a socket cannot take at once (an
        environment beyond its buffer, before the standby's imports are done) is written from
        the supervisor's loop, through a second descriptor of the socket (the first is the
        status lines' reader)."""
        self.handed = True
        run_id = self.supervisor.run_id
        for spec in specs:
            if spec.make_dir is not None:
                # A cold worker makes its rank's directory (its error file's) as it starts; a
                # standby started before the attempt's directory existed, so it is made now,
                # before the standby runs anything that could write there.
                try:
                    os.mkdir(spec.make_dir, 0o755)
                except FileExistsError:
                    pass
                except OSError as error:
                    sys.stderr.write(
                        f"numarun: local rank {spec.local_rank}: cannot make its directory "
                        f"{spec.make_dir!r} ({error.strerror}): its error file cannot be "
                        "written\n"
                    )
            env = {**spec.env, RUN_ID_ENV: run_id}
            payload = b"\0".join(os.fsencode(k) + b"=" + os.fsencode(v) for k, v in env.items())
            rest = self._send(self.channels[spec.local_rank], memoryview(payload))
            if rest:
                writer = self.channels[spec.local_rank].dup()
                writer.setblocking(False)
                forkexec.track(writer.fileno())
                self._unsent[spec.local_rank] = rest
                self._writers[spec.local_rank] = writer
                self.supervisor.add_writer(
                    writer.fileno(), lambda r=spec.local_rank, w=writer: self._send_rest(r, w)
                )

    def _send_rest(self, local_rank: int, writer: socket.socket) -> None:
        rest = self._send(writer, self._unsent[local_rank])
        if rest:
            self._unsent[local_rank] = rest
            return
        del self._unsent[local_rank]
        self.supervisor.remove_writer(writer.fileno())
        self._close_writer(local_rank)

    def _close_writer(self, local_rank: int) -> None:
        writer = self._writers.pop(local_rank, None)
        if writer is not None and writer.fileno() >= 0:
            forkexec.close_untracked(writer.fileno())
            writer.close()

    @staticmethod
    def _send(channel: socket.socket, rest: memoryview) -> memoryview | None:
        """Send what ``channel`` takes now; the rest, or None once all is sent (then end of
        file) or the standby is gone (its end comes through the supervisor)."""
        while rest:
            try:
                rest = rest[channel.send(rest) :]
            except (BlockingIOError, InterruptedError):
                return rest
            except OSError:
                return None
        with contextlib.suppress(OSError):
            channel.shutdown(socket.SHUT_WR)
        return None

    def close(self) -> None:
        """Close every socket (after the run that used them, or a discard)."""
        for local_rank in range(len(self.channels)):
            self._close(local_rank)
            self._close_writer(local_rank)
        self._unsent.clear()
        self._loop = None


def _differs(born: WorkerSpec, spec: WorkerSpec) -> str | None:
    """What of ``spec`` (a cold worker) differs from what its standby was ``born`` with."""
    if list(born.argv or ()) != list(spec.argv or ()):
        return "command line"
    if (born.cpus is None) != (spec.cpus is None) or tuple(born.cpus or ()) != tuple(
        spec.cpus or ()
    ):
        return "CPU binding"
    if born.mem != spec.mem:
        return "memory policy"
    if born.cwd != spec.cwd:
        return "working directory"
    wanted = birth_env(spec.env)
    have = {name: value for name, value in birth_env(born.env).items() if name not in _MARKERS}
    if wanted != have:
        names = sorted(n for n in set(wanted) | set(have) if wanted.get(n) != have.get(n))
        return f"environment ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
    for late, sink in ((born.stdout, spec.stdout), (born.stderr, spec.stderr)):
        if (late is None) != (sink is None):
            return "output stream"
        console = getattr(late, "console", None)
        if late is not None and getattr(sink, "console", None) is not console:
            return "console"
    return None


class PreloadFailed(NumarunError):
    """``--preload-required``: a preloaded module could not be imported (or initialised
    CUDA), or the standbys could not start; the job ends (exit status 1)."""

    exit_code = 1


class Warm:
    """``--preload`` for one launch: the standbys for the attempts to come (module docstring).

    ``make_supervisor(specs)`` makes the :class:`StandbySupervisor` with the launch's
    supervisor settings; ``birth_specs()`` is given by the launch through :func:`birth_specs`.
    ``say(line)`` prints a line of numarun's (``-q`` is the caller's business). With
    ``--preload-required`` a failure is :attr:`fatal` instead of a warning, and
    :attr:`on_fatal` (set by the launch) is called with its line once."""

    def __init__(
        self,
        config: LaunchConfig,
        specs: Callable[[], list[WorkerSpec]],
        make_supervisor: Callable[[list[WorkerSpec]], StandbySupervisor],
        say: Callable[[str], None],
    ) -> None:
        self.config = config
        self._specs = specs
        self._make_supervisor = make_supervisor
        self._say = say
        self.sets: list[Standbys] = []  # the sets that wait, the next attempt's first
        self.off: str | None = None  # why the launch runs cold from now on
        self.fatal: str | None = None  # --preload-required: why the job ends
        self.on_fatal: Callable[[str], None] | None = None
        # Why the standbys that waited for the attempt last taken were discarded (None: they
        # ran it, or none waited).
        self.note: str | None = None

    @property
    def modules(self) -> str:
        return ",".join(self.config.preload)

    @property
    def waiting(self) -> Standbys | None:
        """The set the next attempt takes, if any waits."""
        return self.sets[0] if self.sets else None

    def start(self, sets: int = 1) -> None:
        """Start sets of standbys until ``sets`` wait (none while the launch runs cold). A
        set that cannot start (no process or fd left, say) is one warning line; the launch
        then runs cold, and its cold workers report the cause if it is theirs too."""
        while len(self.sets) < sets and self.off is None:
            self._start_set()

    def _start_set(self) -> None:
        channels: list[socket.socket] = []
        ends: list[socket.socket] = []
        dumps: str | None = None
        try:
            born = self._specs()
            dumps, files = _dump_files([spec.local_rank for spec in born])
            for _ in born:
                mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                channels.append(mine)
                ends.append(theirs)
                mine.setblocking(False)
                forkexec.track(mine.fileno())
            born = [
                _with_channel(spec, end.fileno(), files.get(spec.local_rank))
                for spec, end in zip(born, ends, strict=True)
            ]
            supervisor = self._make_supervisor(born)
            with signals_blocked(self.config.teardown_signals):
                supervisor.start()
        except (NumarunError, OSError) as error:
            for channel in channels:
                forkexec.close_untracked(channel.fileno())
                channel.close()
            _remove_dumps(dumps)
            self._turn_off(f"the standbys could not start ({_one_line(str(error))})")
            return
        finally:
            for end in ends:
                end.close()
        self.sets.append(Standbys(supervisor, born, channels, dumps))

    def dumps_for_next(self) -> str | None:
        """The name of the dump directory the next attempt's standbys are armed on, handed to
        that attempt's stacks (which read it, and remove it at their end); None when no set
        waits or it has none. Its cold workers, if it starts cold after all, arm on it too."""
        waiting = self.waiting
        if waiting is None or waiting.dumps is None:
            return None
        directory, waiting.dumps = waiting.dumps, None
        return os.path.basename(directory)[: -len(".d")]

    def take(self, specs: Sequence[WorkerSpec]) -> Standbys | None:
        """The standbys for the attempt of ``specs``, or None (the attempt starts cold, and
        :attr:`note` says why; a set that waited is discarded). The sets behind it wait on."""
        waiting = self.sets.pop(0) if self.sets else None
        self.note = None
        if waiting is not None:
            for local_rank in range(len(waiting.channels)):
                for line in waiting.read(local_rank):
                    self.on_status(local_rank, line)
        if waiting is None or self.off is not None:
            if waiting is not None:
                self.discard(waiting)  # their imports failed: they would run cold
            return None
        problem = waiting.mismatch(specs, self.on_status)
        if problem is not None:
            self.note = problem
            self.discard(waiting)
            return None
        return waiting

    def on_status(self, local_rank: int, line: bytes) -> None:
        """A standby's status line (:mod:`numarun.worker.preload`): anything but ``ready``
        turns the launch cold, with one warning line the first time (or, with
        ``--preload-required``, makes it :attr:`fatal`)."""
        if line == READY or self.off is not None:
            return
        kind, _, rest = line.partition(b"\t")
        module, _, error = rest.decode("utf-8", "replace").partition("\t")
        module = _shown(module)
        if kind == b"cuda" and error == "later":
            reason = f"a thread of the preloaded modules ({module}) initialised CUDA"
            detail = (
                f"CUDA was initialised in local rank {local_rank}'s standby after its imports "
                f"of {module} (by a thread one of them started), found at its hand-over (a "
                "standby must never hold a GPU; that rank started cold)"
            )
        elif kind == b"cuda":
            reason = f"importing {module!r} initialised CUDA"
            detail = (
                f"importing {module!r} initialised CUDA in local rank {local_rank}'s standby "
                "(a standby only imports, it must never hold a GPU)"
            )
        else:
            reason = f"{module!r} could not be imported"
            detail = (
                f"local rank {local_rank} could not import {module!r} "
                f"({_shown(_one_line(error))})"
            )
        self._turn_off(reason, detail)

    def turn_off(self, reason: str) -> None:
        """The launch runs cold from now on (``reason``: one warning line, or with
        ``--preload-required`` :attr:`fatal`), before any set started."""
        self._turn_off(reason)

    def _turn_off(self, reason: str, detail: str | None = None) -> None:
        if self.off is not None:
            return
        self.off = reason
        if self.config.preload_required:
            self.fatal = f"--preload-required: {detail or reason}"
            if self.on_fatal is not None:
                self.on_fatal(self.fatal)
            return
        self._say(f"numarun: warning: --preload: {detail or reason}; the job runs cold")

    def watch(self, supervisor: Supervisor, current: Standbys | None) -> None:
        """In an attempt's ``on_started`` (after :meth:`start` for the next attempt, when
        one may follow): read the status lines of ``current`` (the attempt's own standbys,
        handed over) and of the sets that wait in ``supervisor``'s loop."""
        if current is not None:
            current.watch(supervisor, self.on_status)
        for waiting in self.sets:
            waiting.watch(supervisor, self.on_status)

    def discard(self, standbys: Standbys) -> None:
        """Tear a set down now (SIGTERM, at once SIGKILL: a standby holds nothing to save)
        and close its sockets, and remove its dump files unless an attempt took them;
        bounded by the supervisor's ``kill_wait``. One that could not be killed is one
        warning line."""
        try:
            with signals_blocked(self.config.teardown_signals):
                result = standbys.supervisor.stop(grace_period=0.0)
        finally:
            standbys.close()
            _remove_dumps(standbys.dumps)
            standbys.dumps = None
        if result.unkillable:
            pids = ", ".join(str(ended.pid) for ended in result.unkillable)
            self._say(f"numarun: warning: standby process(es) {pids} could not be killed")

    def release(self, standbys: Standbys) -> None:
        """The run of ``standbys`` (handed over) ended: a status line its loop did not read
        yet is taken now (its warning said), then the sockets are closed."""
        standbys.unwatch()
        for local_rank in range(len(standbys.channels)):
            for line in standbys.read(local_rank):
                self.on_status(local_rank, line)
        standbys.close()

    def unwatch(self) -> None:
        """The run that read the waiting sets' status lines ended."""
        for waiting in self.sets:
            waiting.unwatch()

    def close(self) -> None:
        """The launch ends: discard the sets that wait, if any."""
        waiting, self.sets = self.sets, []
        for standbys in waiting:
            standbys.unwatch()
            self.discard(standbys)


def _shown(text: str) -> str:
    """What a standby reported, safe for the terminal: each character that is not printable
    written as in a Python string literal (``\\x1b``); nothing imported (it is read in the
    loop, which imports nothing while workers run)."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else ascii(char)[1:-1] for char in text)


def _dump_files(local_ranks: list[int]) -> tuple[str | None, dict[int, str]]:
    """A stack-dump directory for a set of standbys (its path, and each local rank's file),
    made in the per-user runtime directory as an attempt's stacks make theirs
    (``<pid>-<random>.d``); (None, {}) where it cannot be made: the standbys are then armed
    at their hand-over (a hang in a preloaded import is not seen before it)."""
    from numarun.stacks import channel, dumps

    try:
        runtime = channel.runtime_dir(create=True)
        directory = os.path.join(runtime, f"{os.getpid()}-{os.urandom(4).hex()}.d")
        paths = dumps.make_files(directory, local_ranks)
    except (NumarunError, OSError):
        return None, {}
    return directory, dict(zip(local_ranks, paths, strict=True))


def _remove_dumps(directory: str | None) -> None:
    if directory is not None:
        from numarun.stacks.dumps import remove_files

        remove_files(directory)


def _with_channel(spec: WorkerSpec, fd: int, dumps: str | None) -> WorkerSpec:
    env = {**spec.env, STANDBY_FD_ENV: str(fd)}
    if dumps is not None:
        env[STACKS_FILE_ENV] = dumps  # armed before its imports (numarun.worker.bootstrap)
    return spec.replace(env=env, pass_fds=(fd,))


def birth_specs(
    config: LaunchConfig,
    plan: Plan | None,
    base: Mapping[str, str],
    binary_path: str | None,
    mem_policies: Sequence[object],
    outputs: tuple[dict[int, int], dict[int, int], set[int]],
) -> list[WorkerSpec]:
    """One standby per local rank, as :meth:`numarun.launch.attempts.Job.run_attempt` would start
    its cold worker, less :data:`HAND_OVER`, plus ``NUMARUN_PRELOAD``; its output streams are
    :class:`LateSink` where the cold worker's would have a sink, with that sink's console."""
    specs = []
    for setup in rank_setups(config, plan, base, binary_path, attempt_dir=None, port=0,
                             mem_policies=mem_policies):  # fmt: skip
        env = birth_env(setup.env)
        env[PRELOAD_ENV] = ",".join(config.preload)
        stdout, stderr = late_sinks(outputs, setup.local_rank)
        specs.append(
            WorkerSpec(
                local_rank=setup.local_rank,
                rank=setup.rank,
                env=env,
                argv=setup.argv,
                cpus=setup.cpus,
                mem=setup.mem,  # type: ignore[arg-type]
                stdout=stdout,
                stderr=stderr,
            )
        )
    return specs


def late_sinks(
    outputs: tuple[dict[int, int], dict[int, int], set[int]], local_rank: int
) -> tuple[LateSink | None, LateSink | None]:
    """A standby's (stdout, stderr): a :class:`LateSink` for a stream its attempt will give a
    sink (:func:`numarun.launch.output.sinks_for`'s rules: tee'd, redirected or hidden), with
    the console a tee'd, shown stream shows on; None for a stream that goes straight to the
    launcher's stdout or stderr."""
    redirects, tee, shown = outputs
    show = local_rank in shown
    streams: list[LateSink | None] = []
    for bit, fd in ((1, 1), (2, 2)):  # output.Std.OUT / Std.ERR
        if not (redirects[local_rank] | tee[local_rank]) & bit and show:
            streams.append(None)
            continue
        console = None
        if tee[local_rank] & bit and show:
            from numarun.process.console import console_for

            console = console_for(fd)
        streams.append(LateSink(console))
    return streams[0], streams[1]


def say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()

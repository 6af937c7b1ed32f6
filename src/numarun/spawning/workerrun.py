"""The caller's side of the workers of one ``numarun.start_processes`` call.

:class:`WorkerRun` holds what the supervisor does not: each worker's result socket
(:class:`ResultReader`: read from the supervisor's loop through ``Supervisor.add_reader``, and
while the caller waits on one worker, here), one sentinel per worker (a pidfd: readable once the
worker has ended, what ``multiprocessing.connection.wait`` users wait on), the exits the
supervisor reported (``on_exit``), and the grace period of ``ProcessContext.join(grace_period=G)``
that ``on_failure`` waits out before the supervisor tears the other workers down (torch's
meaning: G for the others to end on their own, then SIGTERM, then G before SIGKILL).

:class:`WorkerPopen` is what each worker's :class:`multiprocessing.process.BaseProcess` holds as
``_popen`` once started, so that ``pid``, ``sentinel``, ``exitcode``, ``is_alive()``,
``join(timeout)``, ``terminate()``, ``kill()`` and ``close()`` work as for a process that
multiprocessing started, and so does multiprocessing's exit handler (at interpreter exit it
terminates daemon children and joins the others). ``exitcode``, ``is_alive()`` and
``join(timeout)`` of one worker only look, as torch's do: a worker's end (never the caller's
child: its status comes from the supervisor's watchdog or from the fork server) is observed by
stepping the supervisor's loop with ``hold_failure`` (:meth:`Supervisor.wait`), so a failure is
recorded but not acted on: the other workers run on, unsignalled, until
``ProcessContext.join`` (which acts on it as torch's join does). They never block on a
teardown: they step the loop without waiting (the watchdog's report of an ended worker is
awaited for at most a second), so signals go out and deadlines pass as the loop is stepped.
``join(timeout)`` of one worker waits for that worker alone (reading results meanwhile); once
every worker has ended, ``join`` and ``close()`` of any worker also finish the run (SIGTERM,
the grace period, SIGKILL for leftover descendants; reaping; the supervisor's fds), ``join``
within its ``timeout``.

The teardown warning (``Terminating process N via signal SIGTERM``) is logged on torch's logger,
``torch.multiprocessing.spawn``, whether or not torch is loaded: log filters, handlers and
``assertLogs`` written for torch see numarun's too (a logger is only a name: torch is not
imported; when it is, its handler formats the line as its own).
"""

from __future__ import annotations

import array
import contextlib
import logging
import os
import select
import signal
import socket
import time
import weakref
from typing import TYPE_CHECKING, Any

from numarun.process import forkexec
from numarun.spawning import childmain

if TYPE_CHECKING:
    from numarun.process.spec import RunResult, WorkerExit
    from numarun.process.supervisor import Supervisor

log = logging.getLogger("torch.multiprocessing.spawn")  # torch's (module docstring)

_READ_SIZE = 1 << 20
_SOCKET_BUFFER = 1 << 20  # fewer wake-ups per megabyte of result (the kernel may cap it)
_ANCILLARY_SIZE = socket.CMSG_SPACE(childmain.MAX_FDS_PER_MESSAGE * array.array("i").itemsize)
_RECV_FLAGS = getattr(socket, "MSG_CMSG_CLOEXEC", 0)
_NO_PIDFD_TICK = 0.05  # waiting on one worker where pidfds do not work
_REPORT_WAIT = 1.0  # seconds an ended worker's status may take to come from the watchdog


class ResultReader:
    """The caller's end of one worker's result socket and the frame read from it so far (the
    frame's format: :mod:`numarun.spawning.childmain`). The frame's pickle goes straight into a
    buffer of its final size, so a result is held once until it is unpickled."""

    def __init__(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        for sock, option in ((parent, socket.SO_RCVBUF), (child, socket.SO_SNDBUF)):
            forkexec.track(sock.fileno())
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, option, _SOCKET_BUFFER)
        parent.setblocking(False)
        self._sock: socket.socket | None = parent
        self._child: socket.socket | None = child
        self.child_fd = child.fileno()
        self._head = bytearray()
        self._prefix: int | None = None  # header and fd-batch bytes before the pickle
        self._length = 0
        self._nfds = 0
        self._body: bytearray | None = None
        self._filled = 0
        self._fds: list[int] = []
        self._truncated = False
        self._eof = False

    @property
    def is_open(self) -> bool:
        return self._sock is not None

    @property
    def readable(self) -> bool:
        """Worth waiting on: open and not at end of file."""
        return self._sock is not None and not self._eof

    def fileno(self) -> int:
        assert self._sock is not None
        return self._sock.fileno()

    def read(self) -> bool:
        """Read what one call brings; False when nothing more is waiting (or end of file)."""
        sock = self._sock
        if sock is None or self._eof:
            return False
        try:
            if self._body is None:
                data, ancillary, flags, _ = sock.recvmsg(_READ_SIZE, _ANCILLARY_SIZE, _RECV_FLAGS)
                self._keep_fds(ancillary, flags)
                if data:
                    self._head += data
                    self._parse_head()
                count = len(data)
            elif self._filled < len(self._body):
                with memoryview(self._body) as view:
                    count, ancillary, flags, _ = sock.recvmsg_into(
                        [view[self._filled :]], _ANCILLARY_SIZE, _RECV_FLAGS
                    )
                self._keep_fds(ancillary, flags)
                self._filled += count
            else:
                count = len(sock.recv(_READ_SIZE))  # nothing belongs after the frame
        except BlockingIOError:
            return False
        except OSError:
            count = 0
        if count == 0:
            self._eof = True
        return count > 0

    def drain(self) -> None:
        """Read everything waiting now (the worker has ended: all it sent is here)."""
        while self.read():
            pass

    def close_child_end(self) -> None:
        """The worker's end, once the worker has it (or could not start)."""
        if self._child is not None:
            forkexec.close_untracked(self._child.fileno())
            self._child.close()
            self._child = None

    def close_socket(self) -> None:
        self.close_child_end()
        if self._sock is not None:
            forkexec.close_untracked(self._sock.fileno())
            self._sock.close()
            self._sock = None

    def outcome(self) -> tuple[str, Any] | None:
        """The worker's ``(outcome, value)``, unpickled now (once), or None without a whole
        frame. The fds that came with it are given to the objects that ask for them; the
        others are closed. Raises what unpickling raises."""
        body, fds = self._body, self._fds
        complete = (
            body is not None
            and self._filled == len(body)
            and not self._truncated
            and len(fds) == self._nfds
        )
        self._body, self._fds = None, []
        if not complete or body is None:
            for fd in fds:
                os.close(fd)
            return None
        return childmain.load_with_fds(body, fds, close_untaken=True)  # type: ignore[no-any-return]

    def close(self) -> None:
        """Close the socket and any fds received but not given out."""
        self.close_socket()
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._body, self._fds = None, []

    def _parse_head(self) -> None:
        header = childmain.RESULT_HEADER
        if self._prefix is None and len(self._head) >= header.size:
            length, self._nfds = header.unpack_from(self._head)
            batches = -(-self._nfds // childmain.MAX_FDS_PER_MESSAGE)
            self._prefix = header.size + max(0, batches - 1)
            self._length = length
        if self._prefix is not None and len(self._head) >= self._prefix:
            rest = self._head[self._prefix : self._prefix + self._length]
            self._body = bytearray(self._length)
            self._body[: len(rest)] = rest
            self._filled = len(rest)
            self._head = bytearray()

    def _keep_fds(self, ancillary: list[tuple[int, int, bytes]], flags: int) -> None:
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
                self._fds.extend(fds)
        if flags & socket.MSG_CTRUNC:
            self._truncated = True


class WorkerRun:
    """The workers of one call, from the caller's side (module docstring). Created before the
    supervisor starts them (the readers' child ends go into ``WorkerSpec.pass_fds``);
    :meth:`attach` once they run."""

    def __init__(self, nprocs: int, start_method: str) -> None:
        self.nprocs = nprocs
        self.start_method = start_method
        self.readers = [ResultReader() for _ in range(nprocs)]
        self.supervisor: Supervisor | None = None
        self.pids: list[int] = []
        self.exit_codes: dict[int, int | None] = {}
        self.failure_grace: float | None = None
        self.joining = False  # ProcessContext.join is waiting: warn as torch's join does
        self.result: RunResult | None = None
        self._sentinels: dict[int, int] = {}
        self._observed_exit: dict[int, int] = {}  # rank -> pipe write end (no pidfds)
        self._owner = os.getpid()  # the process whose fds the sentinels are

    def watch(self, supervisor: Supervisor) -> None:
        """Read the result sockets from ``supervisor``'s loop; call before it starts."""
        self.supervisor = supervisor
        for rank, reader in enumerate(self.readers):
            supervisor.add_reader(reader.fileno(), lambda rank=rank: self._read_result(rank))

    def attach(self, pids: list[int]) -> list[WorkerPopen]:
        """The workers started with these pids (by local rank): one popen each."""
        self.pids = list(pids)
        for reader in self.readers:
            reader.close_child_end()
        return [
            WorkerPopen(self, rank, pid, self._open_sentinel(rank, pid))
            for rank, pid in enumerate(pids)
        ]

    # --- the supervisor's callbacks ------------------------------------------------------------

    def _read_result(self, rank: int) -> None:
        reader = self.readers[rank]
        reader.read()
        if not reader.readable and reader.is_open and self.supervisor is not None:
            # End of file comes a little before the pidfd turns readable (a dying process
            # closes its fds first): stop watching, or the loop would spin until then.
            self.supervisor.remove_reader(reader.fileno())

    def on_exit(self, ended: WorkerExit) -> None:
        rank = ended.local_rank
        self.exit_codes[rank] = ended.exit_code
        reader = self.readers[rank]
        reader.drain()
        if reader.is_open and self.supervisor is not None:
            self.supervisor.remove_reader(reader.fileno())
        reader.close_socket()
        writer = self._observed_exit.pop(rank, None)
        if writer is not None:
            forkexec.close(writer)

    def on_failure(self, failed: WorkerExit) -> None:
        """torch's grace: let the others end on their own for ``failure_grace`` seconds, then,
        inside ``ProcessContext.join`` (where torch does it), warn which ones the supervisor is
        about to terminate."""
        others = [r for r in range(self.nprocs) if r != failed.local_rank]
        if self.failure_grace:
            deadline = time.monotonic() + self.failure_grace
            while (left := [r for r in others if not self.has_ended(r)]) and (
                (remaining := deadline - time.monotonic()) > 0
            ):
                self._wait_events(left, remaining)
        for rank in others:
            if self.joining and not self.has_ended(rank):
                log.warning("Terminating process %d via signal SIGTERM", self.pids[rank])

    # --- per worker ----------------------------------------------------------------------------

    def has_ended(self, rank: int) -> bool:
        """True once the worker has ended (observed, or its sentinel is ready); never acts."""
        if rank in self.exit_codes:
            return True
        fd = self._sentinels.get(rank)
        return fd is not None and _ready(fd)

    def poll(self, rank: int) -> int | None:
        """The worker's exit code (Popen convention) if it has ended, else None. Steps the
        supervisor's loop without waiting on the teardown (``Process.exitcode`` and
        ``is_alive()`` must not block): at most :data:`_REPORT_WAIT` for an ended worker's
        status; a failure observed is not acted on (:meth:`pump`)."""
        return self._peek(rank)

    def finish_if_ended(self, timeout: float | None) -> None:
        """Once every worker has ended: let the supervisor finish the run (leftover
        descendants torn down, reaping, its fds) for up to ``timeout`` seconds (None: until
        done). Does nothing while a worker runs or after the run."""
        if self.result is None and all(map(self.has_ended, range(self.nprocs))):
            self.join(timeout)

    def _peek(self, rank: int) -> int | None:
        if rank in self.exit_codes:
            return self.exit_codes[rank]
        fd = self._sentinels.get(rank)
        has_pidfd = fd is not None and rank not in self._observed_exit
        if has_pidfd and not _ready(fd):  # type: ignore[arg-type]
            return None
        if has_pidfd:
            # Ended (its pidfd is readable). Its status comes from its parent, the supervisor's
            # watchdog, which reports it within moments: run the supervisor's loop until then.
            deadline = time.monotonic() + _REPORT_WAIT
            self.pump()
            while rank not in self.exit_codes and self.result is None:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.001)
                self.pump()
            return self.exit_codes.get(rank)
        self.pump()
        return self.exit_codes.get(rank)

    def wait_worker(self, rank: int, timeout: float | None) -> int | None:
        """Wait up to ``timeout`` seconds (None: no limit) for one worker; its exit code, or
        None on timeout. Results are read meanwhile. Once every worker has ended, the run is
        also finished within what is left of ``timeout`` (:meth:`finish_if_ended`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            code = self.poll(rank)
            if code is not None:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                self.finish_if_ended(remaining)
                return code
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            self._wait_events([rank], remaining)

    def send_signal(self, rank: int, signum: int) -> None:
        if rank not in self.exit_codes and self.supervisor is not None:
            self.supervisor.send_signal(signum, [rank])

    # --- the whole run -------------------------------------------------------------------------

    def pump(self) -> None:
        """One pass of the supervisor's loop, without waiting, only looking: a failure it
        observes is not acted on (``hold_failure``; the module docstring)."""
        self.join(0, hold_failure=True)

    def join(self, timeout: float | None, *, hold_failure: bool = False) -> RunResult | None:
        """The supervisor's loop for up to ``timeout`` seconds; the run's result once ended.
        ``hold_failure``: see :meth:`Supervisor.wait`."""
        if self.result is None and self.supervisor is not None:
            self.result = self.supervisor.wait(timeout, hold_failure=hold_failure)
        return self.result

    def release_sentinel(self, rank: int) -> None:
        """Close ``rank``'s sentinel (and its exit pipe), once; only in the process that opened
        them. A worker forked while this run was held (a fork worker of a later call) inherits
        this object, and the run's fds were closed at its start (forkexec's registry), so their
        numbers may hold the worker's own files by then: the finalizer of an inherited
        :class:`WorkerPopen`, run there by the garbage collector at any allocation, must not
        close them (it closed a nested run's queue pipe under a worker's feeder thread)."""
        sentinel = self._sentinels.pop(rank, None)
        observed = self._observed_exit.pop(rank, None)
        if os.getpid() == self._owner:
            forkexec.close(sentinel)
            forkexec.close(observed)

    def close(self) -> None:
        """Close the sentinels and the readers (after the run)."""
        for rank in list(self._sentinels):
            self.release_sentinel(rank)
        for reader in self.readers:
            reader.close()

    def _open_sentinel(self, rank: int, pid: int) -> int:
        """A pidfd; for a worker already gone, a pipe at end of file; where pidfds do not
        work, a pipe whose write end is closed when the supervisor reports the exit."""
        try:
            fd = forkexec.track(os.pidfd_open(pid))
        except ProcessLookupError:
            fd, writer = forkexec.parent_pipe(parent_reads=True)
            forkexec.close(writer)
        except (OSError, AttributeError):
            fd, writer = forkexec.parent_pipe(parent_reads=True)
            self._observed_exit[rank] = writer
        self._sentinels[rank] = fd
        return fd

    def _wait_events(self, ranks: list[int], timeout: float | None) -> None:
        """Wait until one of ``ranks`` may have ended or ``timeout`` passed, reading results."""
        sentinels = [self._sentinels[r] for r in ranks if r in self._sentinels]
        if not sentinels or any(r in self._observed_exit for r in ranks):
            timeout = _NO_PIDFD_TICK if timeout is None else min(timeout, _NO_PIDFD_TICK)
        readers = [reader for reader in self.readers if reader.readable]
        ready, _, _ = select.select([*sentinels, *readers], [], [], timeout)
        for item in ready:
            if isinstance(item, ResultReader):
                item.read()


class WorkerPopen:
    """A started worker as multiprocessing's ``Popen`` (what ``BaseProcess`` calls)."""

    def __init__(self, run: WorkerRun, rank: int, pid: int, sentinel: int) -> None:
        self.method = run.start_method
        self.pid = pid
        self.sentinel = sentinel
        self._run = run
        self._rank = rank
        self._release = weakref.finalize(self, run.release_sentinel, rank)
        self._release.atexit = False  # multiprocessing's exit handler still needs the sentinel

    @property
    def returncode(self) -> int | None:
        return self._run.exit_codes.get(self._rank)

    def poll(self, flag: int = os.WNOHANG) -> int | None:
        return self._run.poll(self._rank) if flag == os.WNOHANG else self.wait()

    def wait(self, timeout: float | None = None) -> int | None:
        return self._run.wait_worker(self._rank, timeout)

    def terminate(self) -> None:
        self._run.send_signal(self._rank, signal.SIGTERM)

    def kill(self) -> None:
        self._run.send_signal(self._rank, signal.SIGKILL)

    def close(self) -> None:
        """``Process.close()``: multiprocessing calls it only for an ended worker. The run is
        finished first when every worker has ended (see the module docstring), then the
        sentinel is closed."""
        self._run.finish_if_ended(None)
        self._release()


def _ready(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])

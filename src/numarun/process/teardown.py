"""Tearing a run down: finding its processes, pinning them, signalling, escalating, giving up.

The supervisor (:mod:`numarun.process.supervisor`) decides when a teardown begins, when it
escalates to SIGKILL and when it gives up, with which deadlines; :class:`Teardown` does each
step, on the workers' records and the *owned* processes: the run's live processes other than
the workers (which processes those are: the supervisor's docstring, "Ownership").

Sweeping. :meth:`Teardown.sweep` reads the process table once (the watchdog's subtree; the whole
table when the run has ``"forkserver"`` workers, whose marked processes and sessions may be
anywhere) and finds the owned processes in it with
:func:`numarun.process.proctable.find_run_processes`, the supervisor and its ancestors left out.
Roots: the watchdog (our child: its pid is ours until we reap it), each exec or fork worker (held by
the watchdog until the run ends) and each forkserver worker through its pidfd, while it has one or
is alive. Each process found is pinned by a pidfd (where one can be opened) and stays *tracked*
until it is gone: its pidfd is in the loop (lane :data:`~numarun.process.loop.ENDS`), and one
without a pidfd is checked by pid (:meth:`Teardown.forget_gone`, which the supervisor calls every
:data:`~numarun.process.proctable.FALLBACK_TICK` while :meth:`Teardown.all_pinned` is False). A step
reads the table before it sends anything where the run has forkserver workers (a worker's children
lose their parent link to it as soon as it dies); otherwise the workers' groups are signalled first
and the table read after (the children of an exec or fork worker go up to the watchdog, a
subreaper).

Signalling. A live worker gets a signal through its process group (``kill(-pid)``; its group id
cannot be reused, the watchdog keeps the worker unreaped), or by pid while it is no group leader
yet (before its ``setsid``) or its group is empty; a forkserver worker, whose group nobody
holds, only itself, through its pidfd (one *lost* at its start, never: see
:mod:`numarun.process.starting`). Owned processes get each signal once (not again while it
is the last one they were sent), through their pidfds (by pid where none could be opened);
those in a process group that was just signalled are skipped. Every signal but SIGKILL is
followed by SIGCONT to the same targets, so that a stopped process acts on it now, except a
forkserver worker signalled by pid (no pidfd, or a ``kill`` of the caller's), which gets the
signal alone. With a ``kill`` other than :func:`os.kill` (tests), every signal goes through
``kill(pid, signum)``, owned processes included. A worker that exited is never signalled again;
one given up on gets no more teardown signals.

One thread of a worker. :meth:`Teardown.signal_threads` sends a signal to one thread of each
worker (:func:`send_to_thread`: ``tgkill(2)``, which Python offers only for the caller's own
threads), for numarun's stack dumps: a rank whose helper thread cannot get the GIL is signalled
on its main thread, the likely holder, never on another (see
:mod:`numarun.stacks.rankhelper`). A signal sent to a process goes to a thread of the kernel's
choosing; ``tgkill(tgid, tid, sig)`` reaches thread ``tid`` only while it is a thread of process
``tgid`` (else ``ESRCH``). Through :mod:`ctypes` (loaded by :mod:`numarun.placement.binding` in
every process that starts workers, never in the watchdog's path): glibc's ``tgkill`` (2.30 and
later), else ``syscall(2)`` with this architecture's number; where neither exists,
:func:`send_to_thread` raises ``OSError(ENOSYS)`` and callers signal the process.

Giving up. :meth:`Teardown.give_up_on_survivors` marks every worker still alive ``"unkillable"``
with its ``/proc`` state letter (uninterruptible sleep: ``D``), hands it to ``on_given_up`` (the
supervisor stops watching its exit and its payload and result pipes) and stops tracking every
owned process. :meth:`Teardown.kill_everything` is the teardown of a run that cannot go on (a
failed start, an exception in the loop): SIGKILL to everything at once, then only ends and
output are served until nothing is left or the deadline passed (once every worker has ended and
no owned process is tracked, a fresh sweep SIGKILLs what appeared since), then the survivors are
given up on.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from functools import partial

from numarun.process import forkexec, proctable
from numarun.process.loop import ENDS, OUTPUT, READ
from numarun.process.spec import UNKILLABLE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from numarun.process.loop import Loop
    from numarun.process.record import Worker
    from numarun.process.watchdog import Link


class Teardown:
    """The steps of a teardown over ``workers`` (the supervisor's list, filled as they start)
    and the owned processes (module docstring). ``marker`` is the run's ``NUMARUN_RUN_ID=...``
    environment entry, looked for when ``forkserver`` (the run has forkserver workers)."""

    def __init__(
        self,
        loop: Loop,
        workers: list[Worker],
        link: Link,
        *,
        kill: Callable[[int, int], None],
        forkserver: bool,
        marker: bytes,
        on_given_up: Callable[[Worker], None],
    ) -> None:
        self._loop = loop
        self._workers = workers
        self._link = link
        self._kill = kill
        self._default_kill = kill is os.kill  # then processes are signalled through pidfds
        self._forkserver = forkserver
        self._marker = marker
        self._on_given_up = on_given_up
        self._tracked: dict[int, int | None] = {}  # owned pid -> pidfd (None: no pidfd)
        self._signalled_owned: dict[int, int] = {}  # owned pid -> last signal sent

    @property
    def tracking(self) -> bool:
        """Whether owned processes found alive are not known to be gone yet."""
        return bool(self._tracked)

    def all_pinned(self) -> bool:
        """Whether every tracked process has a pidfd (else they must be polled)."""
        return all(fd is not None for fd in self._tracked.values())

    # --- the steps -----------------------------------------------------------------------------

    def signal_run(self, signum: int) -> None:
        """The first step: ``signum`` to the workers' groups and every owned process."""
        if self._forkserver:
            # The process table is read before any signal: parent links to a worker are lost
            # as soon as it dies, and a forkserver worker's children would then look like
            # strangers.
            owned = self.sweep()
            groups = self.signal_workers(signum)
        else:
            # The workers' groups first, then the table (reading it is most of a teardown's
            # work): the children of an exec or fork worker that dies go up to the watchdog, a
            # subreaper, and are found in its subtree all the same.
            groups = self.signal_workers(signum)
            owned = self.sweep()
        self.signal_owned(signum, owned, signalled_groups=groups)

    def kill_run(self) -> None:
        """SIGKILL to the workers' groups and every owned process."""
        owned = self.sweep()
        self.signal_workers(signal.SIGKILL)
        self.signal_owned(signal.SIGKILL, owned)

    def kill_everything(self, deadline: float, poll_workers: Callable[[], None]) -> None:
        """SIGKILL every worker tree and owned process now, then serve ends and output until
        nothing is left or ``deadline`` (a ``time.monotonic()``), calling ``poll_workers()``
        after each batch; give up on the survivors. Out of fds even for reading /proc (a start
        that failed for want of them), the watchdog, which holds few, is left to kill the run
        as if the supervisor had died (:meth:`Link.abandon`)."""
        try:
            self.kill_run()
        except OSError:
            self._link.abandon()
            return
        opened = self._loop.is_open
        while opened and time.monotonic() < deadline:
            pending = [w for w in self._workers if not w.exited]
            if not pending and not self._tracked:
                break
            timeout = max(0.0, deadline - time.monotonic())
            if not self.all_pinned():
                timeout = min(timeout, proctable.FALLBACK_TICK)
            self._loop.poll(timeout, lanes=(ENDS, OUTPUT))
            poll_workers()
            if all(w.exited for w in self._workers) and not self._tracked:
                self.signal_owned(signal.SIGKILL)
        self.give_up_on_survivors()

    def signal_each(self, signum: int, local_ranks: Sequence[int] | None = None) -> list[int]:
        """Send ``signum`` to each worker process still running (not its group), or to those
        of ``local_ranks``; returns the local ranks reached. A forkserver worker is signalled
        through its pidfd, never by pid; one lost at its start is not signalled."""
        wanted = None if local_ranks is None else set(local_ranks)
        reached = []
        for worker in self._workers:
            rank = worker.spec.local_rank
            if worker.exited or worker.pid <= 0 or (wanted is not None and rank not in wanted):
                continue
            if worker.lost:
                continue
            if worker.process is not None and self._default_kill and worker.pidfd is not None:
                # The fork server reaps it the moment it ends: only its pidfd names it for sure.
                if proctable.send(worker.pid, worker.pidfd, signum):
                    reached.append(rank)
                continue
            try:
                self._kill(worker.pid, signum)
            except ProcessLookupError:
                continue
            reached.append(rank)
        return reached

    def signal_threads(self, signum: int, threads: Mapping[int, int]) -> list[int]:
        """Send ``signum`` to one thread of each worker process still running: ``threads``
        maps a local rank to the thread's id (:func:`send_to_thread`); returns
        the local ranks reached. An exec or fork worker's pid is held by the watchdog until
        its end is read; a forkserver worker is signalled only while its pidfd says it has
        not exited (then ``tgkill`` reaches the thread only while it belongs to that pid)."""
        reached = []
        for worker in self._workers:
            rank = worker.spec.local_rank
            tid = threads.get(rank)
            if tid is None or worker.exited or worker.pid <= 0 or worker.lost:
                continue
            if worker.process is not None and (worker.pidfd is None or
                                               proctable.has_exited(worker.pidfd)):  # fmt: skip
                continue
            if send_to_thread(worker.pid, tid, signum):
                reached.append(rank)
        return reached

    def signal_workers(self, signum: int) -> set[int]:
        """Send ``signum`` (then SIGCONT, unless it is SIGKILL) to each live worker's process
        group (a forkserver worker: to the worker only); returns the groups reached."""
        groups: set[int] = set()
        for worker in self._workers:
            if worker.exited or worker.state == UNKILLABLE or worker.pid <= 0 or worker.lost:
                continue
            if worker.process is None and self._link.released:
                continue  # reaped by the watchdog: its pid and group may be anyone's
            worker.signalled = True
            if worker.process is not None:
                # The fork server reaps it: its group id is not held, its pidfd pins it.
                if self._default_kill and worker.pidfd is not None:
                    proctable.send(worker.pid, worker.pidfd, signum)
                    if signum != signal.SIGKILL:
                        proctable.send(worker.pid, worker.pidfd, signal.SIGCONT)
                    continue
                with contextlib.suppress(ProcessLookupError):
                    self._kill(worker.pid, signum)
                continue
            # The watchdog keeps the worker unreaped until the run ends: its group is its own.
            for sent in (signum, signal.SIGCONT) if signum != signal.SIGKILL else (signum,):
                try:
                    self._kill(-worker.pid, sent)
                    groups.add(worker.pid)
                except ProcessLookupError:
                    # Not yet a group leader (before its setsid) or its group is empty.
                    with contextlib.suppress(ProcessLookupError):
                        self._kill(worker.pid, sent)
        return groups

    def sweep(self) -> dict[int, proctable.ProcInfo]:
        """The run's live processes other than the workers, pinned (and tracked), from one
        read of /proc: pid -> (ppid, pgid, sid, state). See the module docstring."""
        forkserver = self._forkserver
        if not self._link.pid and not any(w.pid > 0 for w in self._workers):
            return {}  # nothing was started (a start that failed at once): nothing to find
        if forkserver or not self._link.pid:  # marked processes and sessions: anywhere
            table = proctable.read_proc_table()
        else:
            table = proctable.read_subtree(self._link.pid)
        roots: dict[int, int | None] = {}
        if self._link.pid:
            # Our child: its pid is ours until we reap it, unless the caller ignores SIGCHLD
            # (then the kernel reaps it): its pidfd says which.
            roots[self._link.pid] = self._link.pidfd
        sessions: dict[int, int | None] = {}
        for worker in self._workers:
            if worker.pid <= 0 or worker.lost:
                continue
            if worker.process is None:
                if not self._link.released:
                    roots[worker.pid] = None  # held by the watchdog until the run ends
            elif worker.pidfd is not None or not worker.exited:
                roots[worker.pid] = worker.pidfd
                sessions[worker.pid] = worker.pidfd
        me = os.getpid()
        pins = dict(self._tracked)
        owned = proctable.find_run_processes(
            table,
            roots=roots,
            pins=pins,
            sessions=sessions if forkserver else None,
            marker=self._marker if forkserver else None,
            uid=os.getuid(),
            since=self._link.started,
            exclude=proctable.ancestors(me, table) | {me},
        )
        for pid, fd in pins.items():
            if pid not in self._tracked:
                self._track(pid, fd)
        return owned

    def signal_owned(
        self,
        signum: int,
        owned: dict[int, proctable.ProcInfo] | None = None,
        signalled_groups: set[int] = frozenset(),
    ) -> bool:
        """Send ``signum`` (then SIGCONT, unless it is SIGKILL) to every live process of
        ``owned`` (default: a fresh sweep) that has not had it yet (members of
        ``signalled_groups`` just had it through their group); they stay tracked until they are
        gone. True if any was found alive."""
        if owned is None:
            owned = self.sweep()
        found = False
        for pid, info in owned.items():
            if not proctable.is_alive(info):
                continue
            found = True
            if self._signalled_owned.get(pid) != signum and info[1] not in signalled_groups:
                sends = (signum,) if signum == signal.SIGKILL else (signum, signal.SIGCONT)
                for sent in sends:
                    if self._default_kill:
                        proctable.send(pid, self._tracked.get(pid), sent)
                    else:
                        with contextlib.suppress(ProcessLookupError):
                            self._kill(pid, sent)
            self._signalled_owned[pid] = signum
        return found

    def give_up_on_survivors(self) -> None:
        """Every worker still alive is unkillable; stop tracking owned processes."""
        for worker in self._workers:
            if not worker.exited:
                info = proctable.read_proc_stat(worker.pid)
                worker.state = UNKILLABLE
                worker.proc_state = info[3] if info is not None else None
                self._on_given_up(worker)
        self.untrack_all()

    # --- tracking ------------------------------------------------------------------------------

    def forget_gone(self) -> None:
        """Stop tracking the processes without a pidfd that are gone (polled, not watched)."""
        for pid, fd in list(self._tracked.items()):
            if fd is None and not proctable.is_alive(proctable.read_proc_stat(pid)):
                self._untrack(pid)

    def untrack_all(self) -> None:
        for pid in list(self._tracked):
            self._untrack(pid)

    def _track(self, pid: int, fd: int | None) -> None:
        self._tracked[pid] = fd
        if fd is not None:
            forkexec.track(fd)
            self._loop.watch(fd, READ, partial(self._untrack, pid), ENDS)

    def _untrack(self, pid: int) -> None:
        fd = self._tracked.pop(pid, None)
        if fd is not None and self._loop.is_open:
            self._loop.unwatch(fd)
            forkexec.close(fd)


# --- one thread of a worker -----------------------------------------------------------------------

# tgkill's system call number per 64-bit architecture (uname -m), where libc has no wrapper.
_TGKILL = {
    "x86_64": 234,
    "aarch64": 131,
    "arm64": 131,
    "riscv64": 131,
    "loongarch64": 131,
    "ppc64le": 250,
    "ppc64": 250,
    "s390x": 241,
}

_tgkill: object = None  # the loaded function: None not tried yet, False unavailable


def _load_tgkill() -> object:
    import ctypes  # loaded already where workers start (numarun.placement.binding)

    global _tgkill
    if _tgkill is None:
        _tgkill = False
        try:
            libc = ctypes.CDLL(None, use_errno=True)
        except OSError:
            return _tgkill
        wrapper = getattr(libc, "tgkill", None)
        if wrapper is not None:
            wrapper.restype = ctypes.c_int
            wrapper.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int)
            _tgkill = wrapper
        else:
            number = _TGKILL.get(os.uname().machine)
            syscall = getattr(libc, "syscall", None)
            if number is not None and syscall is not None and ctypes.sizeof(ctypes.c_void_p) == 8:
                syscall.restype = ctypes.c_long

                def via_syscall(tgid: int, tid: int, signum: int) -> int:
                    return int(syscall(ctypes.c_long(number), ctypes.c_long(tgid),
                                       ctypes.c_long(tid), ctypes.c_long(signum)))  # fmt: skip

                _tgkill = via_syscall
    return _tgkill


def send_to_thread(pid: int, tid: int, signum: int) -> bool:
    """Send ``signum`` to thread ``tid`` of process ``pid``; False when that thread is not
    (or no longer) one of that process's. Raises OSError for anything else (``EPERM``, or
    ``ENOSYS`` where this system offers no ``tgkill``)."""
    import ctypes

    call = _load_tgkill()
    if not call:
        raise OSError(errno.ENOSYS, "tgkill is not available")
    if call(pid, tid, signum) == 0:  # type: ignore[operator]
        return True
    code = ctypes.get_errno()
    if code == errno.ESRCH:
        return False
    raise OSError(code, os.strerror(code))

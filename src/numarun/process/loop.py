"""The supervisor's event loop, apart from what it serves: one selector, the signal wakeup
socket, timers and the callers' readers.

As asyncio keeps its loop (``base_events``) apart from its selector transports and trio its run
loop (``_run.py``) apart from its epoll I/O, this module knows fds, callbacks and times, and
nothing of workers: the supervisor and its parts register what they watch, each with a callback.

Registrations. :meth:`Loop.watch` registers an fd for :data:`READ` or :data:`WRITE` (those of
:mod:`selectors`) with a callback, which :meth:`Loop.poll` calls with no argument whenever the fd is
ready: level-triggered, so an event not served stays ready for the next poll. Each registration
carries a *lane*, a label the loop never interprets except that ``poll(timeout, lanes)`` serves only
the events of those lanes and leaves the others ready. The lanes in use: :data:`ENDS` (a process
ended: a forkserver worker's sentinel, the watchdog's status pipe, the pidfd of a process being torn
down), :data:`OUTPUT` (the workers' stdout/stderr pipes), :data:`TRANSFERS` (payload and result
pipes), :data:`CONSOLES` (a console written to when it is writable), :data:`READERS` (the callers')
and :data:`SIGNALS` (the wakeup socket). The supervisor serves every lane while it watches a run,
only transfers, output and readers while it delivers payloads, and only ends and output while it
kills everything.

A poll waits at most ``timeout`` seconds (None: until an event), then calls the callbacks of the
ready events in the order the selector returned them, except one whose registration an earlier
callback of the same batch removed or replaced (its fd may already be another's). An exception
from a callback propagates from :meth:`Loop.poll`; the batch's other events are not served
then (they stay ready).

Signals. :meth:`Loop.open` makes a socket pair; its write end, :attr:`Loop.wakeup`, is the fd
``signal.set_wakeup_fd`` writes to (:mod:`numarun.process.signals`), and a poll that finds its
read end ready calls ``on_signal(signum)`` for each signal number read, in order.

Timers. :meth:`Loop.call_every` adds a timer, due one interval after it is added; they cannot be
cancelled; :meth:`Loop.call_later` adds one called once, which can be cancelled.
:meth:`Loop.next_due` is the earliest due time (a ``time.monotonic()``), for the caller's select
timeout; :meth:`Loop.run_due` calls each due timer in the order they were added, while ``go_on()``
holds (checked before each: a timer may end the run), and makes its next call
due one interval after this one ends, so a slow callback never makes calls pile up.

Readers and writers. :meth:`Loop.add_reader` watches an fd of the caller's (never closed here) in
the lane :data:`READERS`, from :meth:`Loop.open` on when added before it, until
:meth:`Loop.remove_reader` or :meth:`Loop.close`, which forgets them all; :meth:`Loop.add_writer`
the same for an fd to be written when it can take data (a reply to a slow client, say). An fd has
a reader or a writer, not both.

fds. The selector's fd and both sockets are in the fd registry of
:mod:`numarun.process.forkexec` while open, so that ``"fork"`` workers close them.
:meth:`Loop.open` and :meth:`Loop.close` are idempotent; a loop that was closed is not opened
again by the supervisor.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import time

from numarun.errors import UsageError
from numarun.process import forkexec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Container

READ = selectors.EVENT_READ
WRITE = selectors.EVENT_WRITE

# Lanes (module docstring): what each registration is, so that a poll can serve only some.
ENDS = "ends"
OUTPUT = "output"
TRANSFERS = "transfers"
CONSOLES = "consoles"
READERS = "readers"
SIGNALS = "signals"


class _Timer:
    """One :meth:`Loop.call_every` registration; ``due`` is a ``time.monotonic()``."""

    __slots__ = ("callback", "cancelled", "due", "interval", "once")

    def __init__(
        self, interval: float, callback: Callable[[], None], due: float, once: bool = False
    ) -> None:
        self.interval = interval
        self.callback = callback
        self.due = due
        self.once = once
        self.cancelled = False

    def cancel(self) -> None:
        """A :meth:`Loop.call_later` timer not called yet never is."""
        self.cancelled = True


class Loop:
    """One selector with its registrations, the signal wakeup socket, timers and readers
    (module docstring). ``on_signal(signum)`` is called from :meth:`poll` for each signal."""

    def __init__(self, on_signal: Callable[[int], None]) -> None:
        self._on_signal = on_signal
        self._selector: selectors.BaseSelector | None = None
        self._wakeup_r: socket.socket | None = None
        self.wakeup: socket.socket | None = None  # for signal.set_wakeup_fd, while open
        self._timers: list[_Timer] = []
        self._readers: dict[int, Callable[[], None]] = {}
        self._writers: dict[int, Callable[[], None]] = {}

    @property
    def is_open(self) -> bool:
        return self._selector is not None

    def open(self) -> None:
        """The selector and the signal wakeup socket; idempotent. Raises OSError (out of fds)
        with nothing left open."""
        if self._selector is not None:
            return
        self._selector = selectors.DefaultSelector()
        forkexec.track(self._selector.fileno())
        try:
            self._wakeup_r, self.wakeup = socket.socketpair()
        except BaseException:
            self.close()
            raise
        for sock in (self._wakeup_r, self.wakeup):
            sock.setblocking(False)
            forkexec.track(sock.fileno())
        self._selector.register(self._wakeup_r, READ, (SIGNALS, self._read_signals))
        for fd, callback in self._readers.items():
            self._selector.register(fd, READ, (READERS, callback))
        for fd, callback in self._writers.items():
            self._selector.register(fd, WRITE, (READERS, callback))

    def close(self) -> None:
        """Forget the readers and writers, close the selector and the sockets; idempotent."""
        if self._selector is not None:
            for fd in list(self._readers):
                self.remove_reader(fd)
            for fd in list(self._writers):
                self.remove_writer(fd)
            forkexec.close_untracked(self._selector.fileno())
            self._selector.close()
            self._selector = None
        for sock in (self._wakeup_r, self.wakeup):
            if sock is not None:
                forkexec.close_untracked(sock.fileno())
                sock.close()
        self._wakeup_r = self.wakeup = None

    # --- registrations -------------------------------------------------------------------------

    def watch(self, fd: int, events: int, callback: Callable[[], None], lane: str) -> None:
        """Call ``callback()`` from :meth:`poll` while ``fd`` is ready for ``events`` (:data:`READ`
        or :data:`WRITE`) in ``lane``. The loop must be open."""
        assert self._selector is not None
        self._selector.register(fd, events, (lane, callback))

    def unwatch(self, fd: int) -> None:
        """Stop watching ``fd``, which must be watched (KeyError otherwise); nothing happens
        once the loop is closed."""
        if self._selector is not None:
            self._selector.unregister(fd)

    def discard(self, fd: int) -> None:
        """Stop watching ``fd`` if it is watched."""
        if self._selector is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(fd)

    def poll(self, timeout: float | None, lanes: Container[str] | None = None) -> None:
        """Wait up to ``timeout`` seconds for events, then serve those of ``lanes`` (default:
        all), in order (module docstring)."""
        assert self._selector is not None
        for key, _mask in self._selector.select(timeout):
            assert self._selector is not None
            if self._selector.get_map().get(key.fd) is not key:
                continue  # unregistered by an earlier callback of this batch: its fd may be reused
            lane, callback = key.data
            if lanes is None or lane in lanes:
                callback()

    @property
    def signal_fd(self) -> int | None:
        """The read end of the wakeup socket (readable when a signal came), while open."""
        return None if self._wakeup_r is None else self._wakeup_r.fileno()

    def take_signals(self) -> list[int]:
        """The signal numbers the wakeup socket holds now, read, in order, without calling
        ``on_signal`` (outside :meth:`poll`: while the workers start, say); never blocks."""
        taken: list[int] = []
        while self._wakeup_r is not None:
            try:
                data = self._wakeup_r.recv(4096)
            except (BlockingIOError, InterruptedError):
                break
            if not data:
                break
            taken += data
        return taken

    def _read_signals(self) -> None:
        assert self._wakeup_r is not None
        try:
            data = self._wakeup_r.recv(4096)
        except BlockingIOError:
            return
        for signum in data:
            self._on_signal(signum)

    # --- timers --------------------------------------------------------------------------------

    def call_every(self, interval: float, callback: Callable[[], None]) -> None:
        """Call ``callback()`` from :meth:`run_due` every ``interval`` seconds (> 0, else
        UsageError), first one interval from now."""
        if not interval > 0:
            raise UsageError(f"call_every needs an interval > 0 seconds, got {interval!r}")
        self._timers.append(_Timer(float(interval), callback, time.monotonic() + interval))

    def call_later(self, delay: float, callback: Callable[[], None]) -> _Timer:
        """Call ``callback()`` once from :meth:`run_due`, ``delay`` seconds (>= 0) from now;
        returns the timer (``cancel()`` it to drop the call)."""
        timer = _Timer(0.0, callback, time.monotonic() + max(0.0, delay), once=True)
        self._timers.append(timer)
        return timer

    def next_due(self) -> float | None:
        """When the next timer is due (``time.monotonic()``); None without timers."""
        if not self._timers:
            return None
        return min(timer.due for timer in self._timers)

    def run_due(self, go_on: Callable[[], bool]) -> None:
        """Call every timer that is due, while ``go_on()`` holds."""
        now = time.monotonic()
        if any(timer.cancelled for timer in self._timers):
            self._timers = [timer for timer in self._timers if not timer.cancelled]
        for timer in list(self._timers):
            if not go_on():
                return
            if timer.due <= now and not timer.cancelled:
                if timer.once:
                    timer.cancelled = True
                    self._timers.remove(timer)
                timer.callback()
                # The next call is one interval after this one ends: a slow callback never
                # makes calls pile up.
                timer.due = time.monotonic() + timer.interval

    # --- the callers' readers ------------------------------------------------------------------

    def add_reader(self, fd: int, callback: Callable[[], None]) -> None:
        """Call ``callback()`` whenever ``fd`` (the caller's) is readable; UsageError when
        ``fd`` already has a reader."""
        if fd in self._readers:
            raise UsageError(f"fd {fd} already has a reader; remove it first")
        self._readers[fd] = callback
        if self._selector is not None:
            self._selector.register(fd, READ, (READERS, callback))

    def remove_reader(self, fd: int) -> None:
        """Stop watching ``fd``; nothing happens when it is not watched."""
        if self._readers.pop(fd, None) is not None and self._selector is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(fd)

    def add_writer(self, fd: int, callback: Callable[[], None]) -> None:
        """Call ``callback()`` whenever ``fd`` (the caller's) can be written to without
        blocking; UsageError when ``fd`` already has a reader or a writer."""
        if fd in self._writers or fd in self._readers:
            raise UsageError(f"fd {fd} is already watched; remove it first")
        self._writers[fd] = callback
        if self._selector is not None:
            self._selector.register(fd, WRITE, (READERS, callback))

    def remove_writer(self, fd: int) -> None:
        """Stop watching ``fd`` for writing; nothing happens when it is not watched."""
        if self._writers.pop(fd, None) is not None and self._selector is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(fd)

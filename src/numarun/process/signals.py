"""The supervisor's signal handling while it watches a run: a scope that installs it and puts
the caller's back.

A :class:`SignalScope` is entered by :meth:`Supervisor.start`, :meth:`Supervisor.wait` and
:meth:`Supervisor.run` (which one when is the supervisor's contract, in
:mod:`numarun.process.supervisor`). Entered in the main thread with a wakeup socket, it:

* points ``signal.set_wakeup_fd`` at the socket (``warn_on_full_buffer=False``), remembering
  the previous wakeup fd;
* installs, for each teardown and forward signal, a Python handler that does nothing: the C
  level handler has already written the signal number to the socket, which is all the
  supervisor's loop needs (it reads the numbers from the socket). No supervisor code runs
  inside a handler, so a signal never interrupts the supervisor's own bookkeeping half-way;
* leaves alone a signal whose handler was not installed from Python (``signal.getsignal`` is
  None: it could not be restored exactly), and a signal the caller ignores (``SIG_IGN``) when
  it is in ``keep_ignored`` (default: every teardown signal), such as SIGHUP under ``nohup``.
  An ignored signal not in ``keep_ignored`` is handled anyway, and exec'd workers then start
  with its default action, not the caller's ``SIG_IGN``.

On exit it restores the handlers it replaced and the previous wakeup fd. Entering and leaving
are all or nothing: the scope's signals are blocked in the calling thread meanwhile
(``pthread_sigmask``), so that one arriving then is delivered once the scope is whole (entering:
to the supervisor, through the socket) or gone (leaving: to the caller's handlers); an
exception raised meanwhile by a handler (a signal delivered to another thread, whose Python
handler still runs in the main thread) undoes every step taken before it propagates, and
leaving completes every step whatever such a handler raises, then raises its exception. Scopes
nest: an inner one restores the outer one's handlers. Outside the main thread, or without a
socket, entering and leaving do nothing (Python delivers signals to the main thread only).

:meth:`SignalScope.restore_callers_handlers` is for a ``"fork"`` worker, which starts as a copy
of a process with scopes entered: it puts back the handlers the caller had before any scope.
"""

from __future__ import annotations

import _signal as signal  # not signal.py, whose enums cost a launch ~2 ms (DESIGN.md)
import sys
from _functools import partial  # functools.partial, without functools.py (DESIGN.md)

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from collections.abc import Callable, Sequence
    from typing import Any, ClassVar


def in_main_thread() -> bool:
    """Whether the calling thread is the main thread (the only one Python runs signal handlers
    in), as :mod:`threading` says; without importing it, which costs every launch's start-up
    about a millisecond. Before anything imported it no thread was started through it, and
    importing it now would make the calling thread its main thread: true then."""
    threading = sys.modules.get("threading")
    return threading is None or threading.current_thread() is threading.main_thread()


class SignalScope:
    """Installs the supervisor's signal handling in the main thread and restores the previous
    handlers and wakeup fd on exit (module docstring)."""

    def __init__(
        self,
        wakeup: socket.socket | None,
        teardown: Sequence[int],
        forward: Sequence[int],
        keep_ignored: Sequence[int] | None = None,
    ) -> None:
        self._wakeup = wakeup
        self._keep_ignored = tuple(teardown if keep_ignored is None else keep_ignored)
        self._signals = [*teardown, *forward]
        self._previous: dict[int, Any] = {}
        self._previous_wakeup: int | None = None
        self._wakeup_pending = False  # set_wakeup_fd() called, its answer maybe not kept

    _active: ClassVar[list[SignalScope]] = []  # the scopes now entered, outermost first

    @classmethod
    def restore_callers_handlers(cls) -> None:
        """In a forked worker: put back the handlers the caller had before any scope."""
        callers: dict[int, Any] = {}
        for scope in reversed(cls._active):  # outer scopes know the caller's own handlers
            callers.update(scope._previous)
        for signum, handler in callers.items():
            signal.signal(signum, handler)

    def __enter__(self) -> SignalScope:
        if self._wakeup is None or not in_main_thread():
            return self
        # Entering is all or nothing. The scope's signals are blocked in this thread meanwhile,
        # so one that arrives now waits and then finds the scope whole; a handler that still
        # raises in between (a KeyboardInterrupt tripped on another thread) undoes every step.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, self._signals)
        try:
            try:
                self._install()
            except BaseException as exc:
                # The exception that stopped the entry is the one raised; another that a
                # handler raises during the rollback is its context.
                error = self._restore(raise_error=False)
                if error is not None and error is not exc:
                    exc.__context__ = error
                raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self not in SignalScope._active:
            return  # never entered (another thread, no socket), or left already
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, self._signals)
        try:
            self._restore()
        finally:
            # What arrived meanwhile goes to the caller's handlers, now back in place.
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def _install(self) -> None:
        # Each step is recorded before it is taken, so that an exception raised between the
        # two (a handler of a signal that arrived on another thread) never hides one.
        SignalScope._active.append(self)
        for signum in self._signals:
            previous = signal.getsignal(signum)
            if previous is None:
                continue  # installed outside Python: we could not restore it exactly
            if previous == signal.SIG_IGN and signum in self._keep_ignored:
                continue  # ignored by the caller (SIGHUP under nohup): the job must survive it
            self._previous[signum] = previous
            signal.signal(signum, _note_signal)
        self._wakeup_pending = True
        self._previous_wakeup = signal.set_wakeup_fd(
            self._wakeup.fileno(),  # type: ignore[union-attr]
            warn_on_full_buffer=False,
        )

    def _restore(self, *, raise_error: bool = True) -> BaseException | None:
        """Put back every handler replaced, then the previous wakeup fd, whatever a handler
        raises meanwhile (each step is retried); the first such exception is raised at the end
        (returned, with ``raise_error=False``)."""
        steps: list[Callable[[], object]] = [
            partial(signal.signal, signum, previous)
            for signum, previous in reversed(self._previous.items())
        ]
        steps.append(self._restore_wakeup)
        error = _run_all(steps)
        self._previous.clear()
        if self in SignalScope._active:
            SignalScope._active.remove(self)
        if error is not None and raise_error:
            raise error
        return error

    def _restore_wakeup(self) -> None:
        if self._previous_wakeup is not None:
            signal.set_wakeup_fd(self._previous_wakeup)
        elif self._wakeup_pending and self._wakeup is not None:
            # set_wakeup_fd() may have acted, its answer lost to an exception: ours is unset,
            # anything else stays.
            current = signal.set_wakeup_fd(-1)
            if current != self._wakeup.fileno():
                signal.set_wakeup_fd(current)
        self._previous_wakeup = None
        self._wakeup_pending = False


def _run_all(steps: list[Callable[[], object]]) -> BaseException | None:
    """Run each step in order; one interrupted by an exception (a signal handler raising) is
    tried again, up to a few times. Returns the first exception, None if none."""
    error: BaseException | None = None
    tries = 0
    while steps:
        try:
            while steps:
                steps[0]()
                steps.pop(0)
                tries = 0
        except BaseException as exc:  # kept, raised once everything is back
            if error is None:
                error = exc
            tries += 1
            if tries > _RETRIES and steps:
                steps.pop(0)  # it fails by itself, not because of a signal
                tries = 0
    return error


_RETRIES = 4


def _note_signal(signum: int, frame: object) -> None:
    """Python-level handler: the C handler already wrote ``signum`` to the wakeup fd."""

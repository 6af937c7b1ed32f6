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

On exit it restores the handlers it replaced and the previous wakeup fd. Scopes nest: an inner
one restores the outer one's handlers. Outside the main thread, or without a socket, entering
and leaving do nothing (Python delivers signals to the main thread only).

:meth:`SignalScope.restore_callers_handlers` is for a ``"fork"`` worker, which starts as a copy
of a process with scopes entered: it puts back the handlers the caller had before any scope.
"""

from __future__ import annotations

import signal
import threading

TYPE_CHECKING = False  # typing is not imported at run time: the launcher's start-up path
if TYPE_CHECKING:
    import socket
    from collections.abc import Sequence
    from typing import Any, ClassVar


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
        if self._wakeup is None or threading.current_thread() is not threading.main_thread():
            return self
        SignalScope._active.append(self)
        signals = list(self._signals)
        self._previous_wakeup = signal.set_wakeup_fd(
            self._wakeup.fileno(), warn_on_full_buffer=False
        )
        for signum in signals:
            previous = signal.getsignal(signum)
            if previous is None:
                continue  # installed outside Python: we could not restore it exactly
            if previous == signal.SIG_IGN and signum in self._keep_ignored:
                continue  # ignored by the caller (SIGHUP under nohup): the job must survive it
            self._previous[signum] = previous
            signal.signal(signum, _note_signal)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self in SignalScope._active:
            SignalScope._active.remove(self)
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        if self._previous_wakeup is not None:
            signal.set_wakeup_fd(self._previous_wakeup)


def _note_signal(signum: int, frame: object) -> None:
    """Python-level handler: the C handler already wrote ``signum`` to the wakeup fd."""

"""SignalScope's entry and exit with a signal or an exception forced into the middle, for
tests/process/test_signals_inherited.py. Run in a fresh interpreter (one thread, so that a signal
sent to this process is delivered to the main thread): ``python signal_scope_interrupted.py
SCENARIO``; prints one JSON line.

The caller's state before the scope: SIGINT on Python's ``default_int_handler``, SIGTERM on a
handler of its own, SIGHUP at its default, and a wakeup fd of its own. Scenarios, each forced
through a wrapper around the ``signal`` function of the module the scope calls (``_signal``, the
C module under :mod:`signal`; its only way to install a handler):

* ``signal-entering``: SIGINT is sent to this process just before the scope installs its first
  handler (SIGINT's).
* ``raise-entering``: a KeyboardInterrupt is raised where the scope installs SIGTERM's handler,
  as a caller's handler would raise it between two steps.
* ``signal-leaving``: SIGINT is sent to this process just before the scope puts SIGTERM's
  handler back.

The line: ``raised`` (the exception's class name, or None), ``noted`` (the signal numbers the
scope's wakeup socket received), ``inside`` and ``after`` (``handlers``: signal -> name,
``wakeup``: the wakeup fd is the caller's / the scope's / another, ``active``: scopes entered),
``before`` the same, taken before the scope.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys

from numarun.process import signals as scope_module
from numarun.process.signals import SignalScope

TEARDOWN = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
CALLED = scope_module.signal  # what the scope calls: _signal, not signal.py (DESIGN.md)
REAL_SIGNAL = CALLED.signal


def callers_term(signum: int, frame: object) -> None:
    pass


def name(handler: object) -> str:
    if handler is signal.default_int_handler:
        return "default_int_handler"
    if handler is callers_term:
        return "callers_term"
    if handler is scope_module._note_signal:
        return "scope"
    return str(handler)


def state(caller_fd: int, scope_fd: int) -> dict[str, object]:
    current = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(current)
    wakeup = {caller_fd: "caller", scope_fd: "scope"}.get(current, str(current))
    handlers = {signal.Signals(s).name: name(signal.getsignal(s)) for s in TEARDOWN}
    return {"handlers": handlers, "wakeup": wakeup, "active": len(SignalScope._active)}


def main(scenario: str) -> None:
    caller_r, caller_w = socket.socketpair()
    scope_r, scope_w = socket.socketpair()
    for sock in (caller_r, caller_w, scope_r, scope_w):
        sock.setblocking(False)
    signal.signal(signal.SIGTERM, callers_term)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)  # the caller's own, even under nohup
    signal.set_wakeup_fd(caller_w.fileno())
    caller_fd, scope_fd = caller_w.fileno(), scope_w.fileno()
    line: dict[str, object] = {"before": state(caller_fd, scope_fd), "inside": None}
    leaving = False

    def forced(signum: int, handler: object) -> object:
        entering_now = handler is scope_module._note_signal
        if scenario == "signal-entering" and entering_now and signum == signal.SIGINT:
            os.kill(os.getpid(), signal.SIGINT)
        if scenario == "raise-entering" and entering_now and signum == signal.SIGTERM:
            raise KeyboardInterrupt
        if scenario == "signal-leaving" and leaving and signum == signal.SIGTERM:
            os.kill(os.getpid(), signal.SIGINT)
        return REAL_SIGNAL(signum, handler)

    CALLED.signal = forced  # type: ignore[assignment]
    raised = None
    try:
        with SignalScope(scope_w, TEARDOWN, ()):
            line["inside"] = state(caller_fd, scope_fd)
            leaving = True
    except BaseException as exc:  # reported
        raised = type(exc).__name__
    CALLED.signal = REAL_SIGNAL  # type: ignore[assignment]
    line["after"] = state(caller_fd, scope_fd)
    line["raised"] = raised
    try:
        line["noted"] = list(scope_r.recv(64))
    except BlockingIOError:
        line["noted"] = []
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])

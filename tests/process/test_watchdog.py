"""numarun.process.watchdog: ending the watchdog link is bounded even when its process does not
die (its SIGKILL never delivered: the kill calls replaced)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from numarun.process import forkexec as children
from numarun.process import proctable, watchdog

SRC = Path(__file__).resolve().parents[2] / "src"
LIMIT = 30.0  # what a bounded call gets before the test calls it blocked (a loaded machine)


# --- reaping the watchdog is bounded -------------------------------------------------------------


def test_ending_the_watchdog_link_is_bounded_when_its_process_does_not_die(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The supervisor's last step reaps the watchdog: it waits, SIGKILLs it, and must not then
    wait forever for a process stuck in the kernel. Here the SIGKILL never arrives (both ways
    of sending it replaced): ``Link.end`` still returns, and the child is reaped once it does
    end."""
    monkeypatch.setattr(watchdog, "_END_WAIT", 0.2)
    child = os.posix_spawn("/bin/sleep", ["sleep", "120"], dict(os.environ))
    pin = os.pidfd_open(child)
    real_kill, real_pidfd_send = os.kill, signal.pidfd_send_signal
    command_r, command_w = os.pipe()
    status_r, status_w = os.pipe()
    link = watchdog.Link()
    try:
        link.attach(child, children.track(command_w), children.track(status_r))
        monkeypatch.setattr(os, "kill", lambda pid, signum: None)
        monkeypatch.setattr(proctable.signal, "pidfd_send_signal", lambda fd, signum, *rest: None)
        call = threading.Thread(target=link.end, daemon=True)
        started = time.monotonic()
        call.start()
        call.join(LIMIT)
        returned = not call.is_alive()
        waited = time.monotonic() - started
    finally:
        monkeypatch.undo()
        real_pidfd_send(pin, signal.SIGKILL)
        for fd in (command_r, status_w):
            os.close(fd)
    assert returned, "Link.end() waited for an unkillable watchdog without bound"
    assert waited < LIMIT
    # Reaped when it finally ends (a daemon thread took it over): no zombie is left.
    deadline = time.monotonic() + LIMIT
    while time.monotonic() < deadline:
        if not Path(f"/proc/{child}").exists():
            break
        time.sleep(0.05)
    os.close(pin)
    assert not Path(f"/proc/{child}").exists()
    assert real_kill is os.kill

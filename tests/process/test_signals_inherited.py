"""Signal state that crosses process boundaries: what workers inherit of a caller that ignores
SIGCHLD (or blocks signals), and the supervisor's signal scope entered and left whole.

Each test runs its caller in a fresh interpreter (``tests/programs/inherited_signal_funcs.py``,
``tests/programs/signal_scope_interrupted.py``, or ``python -m numarun``), so that an ignored
SIGCHLD or a signal sent to the caller never touches pytest's own process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
SRC = Path(__file__).resolve().parents[2] / "src"
LIMIT = 120.0  # the machine is shared: starts can be slow


def _env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "NUMARUN_RUN_ID"}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(PROGRAMS), env.get("PYTHONPATH", "")])
    env.pop("PET_NPROC_PER_NODE", None)
    return env


def _ignoring_sigchld() -> None:
    """preexec_fn: the launcher starts as a child of a caller that ignores SIGCHLD (a daemon
    that reaps nothing), and inherits that through exec."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)


def _json_line(done: subprocess.CompletedProcess[str]) -> object:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


# --- issue 20 item 3: a caller that ignores SIGCHLD ----------------------------------------------


def test_a_caller_ignoring_sigchld_still_gets_the_workers_exit_status(tmp_path: Path) -> None:
    """16 workers, rank 0 exits 3 at once: the watchdog must not let the kernel reap it (the
    exit status would be lost and reported as SIGKILL). Three runs of three."""
    script = tmp_path / "worker.sh"
    script.write_text('#!/bin/sh\n[ "$RANK" = 0 ] && exit 3\nexec sleep 30\n')
    script.chmod(0o755)
    for _ in range(3):
        done = subprocess.run(
            [sys.executable, "-m", "numarun", "--nproc-per-node", "16", "--no-python", str(script)],
            capture_output=True,
            text=True,
            env=_env(),
            preexec_fn=_ignoring_sigchld,
            timeout=LIMIT,
        )
        assert done.returncode == 3, done.stderr
        assert "rank 0 (local_rank 0, pid" in done.stderr
        assert "failed with exit code 3" in done.stderr
        assert "SIGKILL" not in done.stderr


def test_a_workers_own_child_reports_its_exit_status_under_a_caller_ignoring_sigchld(
    tmp_path: Path,
) -> None:
    """Inside a worker, ``subprocess.run(['sh', '-c', 'exit 5'])`` returns 5 (an inherited
    SIG_IGN makes the kernel reap the child, and subprocess then reports 0)."""
    script = tmp_path / "child.py"
    script.write_text(
        "import subprocess, sys\nsys.exit(subprocess.run(['sh', '-c', 'exit 5']).returncode)\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "numarun", "--nproc-per-node", "2", str(script)],
        capture_output=True,
        text=True,
        env=_env(),
        preexec_fn=_ignoring_sigchld,
        timeout=LIMIT,
    )
    assert done.returncode == 5, done.stderr
    assert "failed with exit code 5" in done.stderr


@pytest.mark.parametrize("method", ["spawn", "fork", "forkserver"])
def test_spawn_workers_get_their_childrens_exit_status_under_a_caller_ignoring_sigchld(
    method: str,
) -> None:
    done = subprocess.run(
        [sys.executable, str(PROGRAMS / "inherited_signal_funcs.py"), "spawn", method],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=LIMIT,
    )
    assert _json_line(done) == [5, 5]


def test_exec_workers_start_with_default_actions_but_the_kept_ignored_signals() -> None:
    """The caller ignores SIGCHLD, SIGUSR1 and SIGHUP and blocks SIGUSR2 in its thread; the
    supervisor keeps SIGHUP ignored on purpose (nohup). The exec'd worker ignores SIGHUP only
    (not even Python's own SIGPIPE) and blocks nothing."""
    done = subprocess.run(
        [sys.executable, str(PROGRAMS / "inherited_signal_funcs.py"), "dispositions"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=LIMIT,
    )
    assert _json_line(done) == {"ignored": [signal.SIGHUP], "blocked": []}


# --- issue 20 item 4: the signal scope is entered and left whole ---------------------------------


def _scope(scenario: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, str(PROGRAMS / "signal_scope_interrupted.py"), scenario],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=LIMIT,
    )
    line = _json_line(done)
    assert isinstance(line, dict)
    return line


def test_a_signal_arriving_while_the_scope_is_entered_is_noted_by_it() -> None:
    """SIGINT sent just before the scope installs its first handler: it waits until the scope
    is whole and reaches the supervisor through the wakeup socket, instead of raising
    KeyboardInterrupt out of a half-entered scope."""
    line = _scope("signal-entering")
    assert line["raised"] is None, line
    assert line["noted"] == [signal.SIGINT], line
    assert line["inside"] == {
        "handlers": {"SIGINT": "scope", "SIGTERM": "scope", "SIGHUP": "scope"},
        "wakeup": "scope",
        "active": 1,
    }, line
    assert line["after"] == line["before"], line


def test_an_exception_while_the_scope_is_entered_undoes_every_step() -> None:
    """A KeyboardInterrupt raised half-way (after SIGINT's handler was installed): it
    propagates, and the caller's handlers and wakeup fd are all back, no scope left active."""
    line = _scope("raise-entering")
    assert line["raised"] == "KeyboardInterrupt", line
    assert line["inside"] is None, line
    assert line["after"] == line["before"], line


def test_a_signal_arriving_while_the_scope_is_left_goes_to_the_callers_handler() -> None:
    """SIGINT sent half-way through leaving: every handler and the wakeup fd are put back
    first, then the caller's own handler (Python's) raises KeyboardInterrupt."""
    line = _scope("signal-leaving")
    assert line["raised"] == "KeyboardInterrupt", line
    assert line["after"] == line["before"], line
    assert line["noted"] == [], line

"""numarun.process.forkexec: forking without touching the process's warning filters (no
``catch_warnings`` around the fork, another thread's filters never swapped), native threads
counted as Python's own fork warning counts them, and the fork warning filter that matches only
numarun's own fork (issue 20, item 8). Sweeps are ``test_proctable.py``'s, the watchdog's
bounded end ``test_watchdog.py``'s."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest

from numarun.process import forkexec as children
from numarun.process.spec import WorkerSpec
from numarun.process.supervisor import Supervisor

SRC = Path(__file__).resolve().parents[2] / "src"
LIMIT = 30.0  # what a bounded call gets before the test calls it blocked (a loaded machine)

# --- forking: no catch_warnings, native threads count ---------------------------------------


def test_starting_a_run_beside_other_threads_never_swaps_the_warning_filters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """warnings.catch_warnings() replaces the process-wide filter list for as long as it is
    entered: another thread's warnings meanwhile see numarun's filters, and two threads that
    overlap restore each other's lists. numarun must not enter it around its fork, threads or
    not (the standard library's own uses, such as os.get_exec_path's, are not numarun's)."""
    entered = []

    class Recording(warnings.catch_warnings):
        def __enter__(self):  # type: ignore[no-untyped-def]
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if caller.startswith("numarun"):
                entered.append(caller)
            return super().__enter__()

    monkeypatch.setattr(warnings, "catch_warnings", Recording)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, args=(LIMIT,), name="other")
    other.start()
    before = list(warnings.filters)
    try:
        spec = WorkerSpec(local_rank=0, rank=0, env={"PATH": os.defpath}, argv=["true"])
        result = Supervisor([spec]).run()
    finally:
        stop.set()
        other.join(LIMIT)
    assert result.workers[0].exit_code == 0
    assert entered == []
    added = [entry for entry in warnings.filters if entry not in before]
    # At most the one filter for numarun's own fork (Python 3.12+), nothing else changed.
    assert all(entry[0] == "ignore" and entry[2] is DeprecationWarning for entry in added)
    assert [entry for entry in before if entry not in warnings.filters] == []


NATIVE_THREAD_FORK = """
import faulthandler, os, warnings
faulthandler.dump_traceback_later(600)  # a native thread: threading never sees it
from numarun.process.spec import WorkerSpec
from numarun.process.supervisor import Supervisor
spec = WorkerSpec(local_rank=0, rank=0, env={"PATH": os.defpath}, argv=["true"])
print(Supervisor([spec]).run().workers[0].exit_code, flush=True)
"""


def _interpreter(version: str) -> str | None:
    """A working ``python<version>`` on this machine (PATH, or a pyenv build), else None."""
    candidates = [shutil.which(f"python{version}")]
    candidates += sorted(
        glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python3"))
    )
    for candidate in candidates:
        if candidate is None:
            continue
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            check = subprocess.run(
                [candidate, "-c", "import sys; print(sys.version_info[:2])"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            if check.returncode == 0 and check.stdout.strip() == str(
                tuple(map(int, version.split(".")))
            ):
                return candidate
    return None


@pytest.mark.parametrize("version", ["3.12", "3.13"])
def test_a_native_thread_does_not_make_the_fork_warn(version: str) -> None:
    """Python 3.12+ counts the kernel's threads (faulthandler's watchdog thread here) and warns
    at every os.fork(); threading.active_count() is 1 all the same. Run with -W always under
    each such interpreter found on this machine (numarun is pure Python)."""
    interpreter = _interpreter(version)
    if interpreter is None:
        pytest.skip(f"no Python {version} here; the warning exists from 3.12 on")
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run(
        [interpreter, "-W", "always::DeprecationWarning", "-c", NATIVE_THREAD_FORK],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.stdout.strip() == "0", done.stderr
    assert "multi-threaded" not in done.stderr, done.stderr


def test_the_fork_warning_filter_matches_only_numarun_s_own_fork() -> None:
    """The filter added on Python 3.12+ ignores the fork warning raised from numarun's own
    fork() only: the same warning raised from the caller's code is untouched."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        children._filter_fork_warning()
        message = f"This process (pid={os.getpid()}) is multi-threaded, use of fork() may lead"
        warnings.warn_explicit(
            message, DeprecationWarning, "children.py", 1, module="numarun.process.forkexec"
        )
        warnings.warn_explicit(message, DeprecationWarning, "user.py", 1, module="user_code")
    assert [str(w.message) for w in seen] == [message]
    assert sys.modules["numarun.process.forkexec"] is children


def test_suppress_swallows_what_contextlib_suppress_swallows() -> None:
    """numarun.errors.suppress stands in for contextlib.suppress on the start-up path."""
    import contextlib

    from numarun.errors import suppress

    for kinds, raised in (
        ((OSError,), FileNotFoundError("x")),
        ((KeyError, ValueError), ValueError("x")),
        ((OSError,), KeyError("x")),
        ((), RuntimeError("x")),
    ):
        outcomes = []
        for manager in (contextlib.suppress, suppress):
            try:
                with manager(*kinds):
                    raise raised
                outcomes.append("swallowed")
            except BaseException as error:  # compared below
                outcomes.append(type(error).__name__)
        assert outcomes[0] == outcomes[1], (kinds, raised, outcomes)
    with suppress(OSError):
        pass  # nothing raised: nothing to do


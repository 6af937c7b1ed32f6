"""Shared test setup: tests/ is importable (fixtures such as ``sysfs_fixtures`` live there); the
node stand-ins of the rendezvous and whole-job tests (``make_job``); a two-node GPU machine
(``gpu_root``); real faulthandler dumps (``dumps``); the suite side by side (pytest-xdist: how many
workers, the tests marked ``slow`` first, those marked ``alone`` by themselves; tests/README.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

if TYPE_CHECKING:
    from standin_job import Job

# A test run started in the background of a non-interactive shell (`cmd &` in a script, some CI
# runners) inherits SIGINT ignored, and so would every process the tests start: the tests of
# Ctrl-C would then test that disposition instead. Python's own handler gives the processes
# started here the default a terminal's user has.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def make_job() -> Iterator[Callable[..., Job]]:
    """``make(count)``: ``count`` node stand-ins on one real torch store, closed after."""
    from standin_job import Job  # torch: only for the tests that ask for it

    jobs: list[Job] = []

    def make(count: int, **kwargs: object) -> Job:
        jobs.append(Job(count, **kwargs))  # type: ignore[arg-type]
        return jobs[-1]

    yield make
    for job in jobs:
        job.close()


@pytest.fixture(scope="module")
def gpu_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two nodes x 16 cores, SMT off, GPUs 0-1 on node 0 and 2-3 on node 1."""
    from sysfs_fixtures import smt_off, write_sysfs

    return write_sysfs(smt_off(), tmp_path_factory.mktemp("gpus"))


# One set of real dumps for every test file that reads them (each costs a worker start).
@pytest.fixture(scope="session")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, bytes]]:
    """Real faulthandler dumps of workers in several states, by name: (what the worker saw,
    its dump)."""
    from faulthandler_dumps import real_dump

    tmp = tmp_path_factory.mktemp("dumps")
    return {
        name: real_dump(tmp, mode, name)
        for name, mode in [
            ("a", "main"),
            ("b", "main"),
            ("c", "elsewhere"),
            ("deep", "deep"),
            ("many", "many-threads"),
        ]
    }


# --- side by side ---------------------------------------------------------------------------------


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: two workers per CPU this process may use, from 2 to 8. Most tests start real
    jobs and wait on them (a rendezvous, a worker's signal, a timeout), so more workers than
    CPUs keep the CPUs busy; past 8 the CPU-bound tests only slow each other down."""
    cpus = len(os.sched_getaffinity(0))
    return max(2, min(8, 2 * cpus))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests marked ``slow`` first (each keeps its place among them): xdist hands out the
    first quarter of the tests round robin, so the longest ones start at once, each on its own
    worker, instead of one of them starting last and ending the suite late."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


class _Turnstile:
    """The workers' shared lock (``flock``) of one run: every test holds it shared, a test
    marked ``alone`` holds it alone. A ``gate`` taken first keeps new tests from starting while
    one marked ``alone`` waits for those running to end (else it could wait forever)."""

    def __init__(self, folder: str) -> None:
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
        self._gate = os.open(os.path.join(folder, "alone.gate"), flags, 0o600)
        self._room = os.open(os.path.join(folder, "alone.room"), flags, 0o600)

    @contextlib.contextmanager
    def entered(self, alone: bool) -> Iterator[None]:
        fcntl.flock(self._gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(self._gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(self._room, fcntl.LOCK_UN)


_turnstile: list[_Turnstile] = []


@pytest.fixture(autouse=True)
def _side_by_side(request: pytest.FixtureRequest) -> Iterator[None]:
    """Under xdist, each test in the run's turnstile: alone when marked ``alone``."""
    if not hasattr(request.config, "workerinput"):  # one process: nothing runs beside it
        yield
        return
    if not _turnstile:
        base = request.getfixturevalue("tmp_path_factory").getbasetemp()
        _turnstile.append(_Turnstile(str(base.parent)))  # the run's, shared by its workers
    with _turnstile[0].entered(request.node.get_closest_marker("alone") is not None):
        yield

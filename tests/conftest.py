"""Shared test setup: tests/ is importable (fixtures such as ``sysfs_fixtures`` live there); the
node stand-ins of the rendezvous and whole-job tests (``make_job``); a two-node GPU machine
(``gpu_root``); real faulthandler dumps (``dumps``)."""

from __future__ import annotations

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

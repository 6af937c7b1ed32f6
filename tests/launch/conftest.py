"""Fixtures of the launch wing's tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from standin_job import Job


@pytest.fixture
def make_job() -> Iterator[Callable[..., Job]]:
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

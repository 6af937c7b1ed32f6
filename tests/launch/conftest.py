"""Fixtures of the launch wing's tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
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

"""Fixtures of the stacks wing's tests."""

from __future__ import annotations

import pytest

from faulthandler_dumps import real_dump


# One set of real dumps for every test file here that reads them (each costs a worker start).
@pytest.fixture(scope="session")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, bytes]]:
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

"""Fixtures of the machine wing's tests."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sysfs_fixtures import SHAPES, amd_instinct, scratch_dir, write_sysfs


@pytest.fixture(scope="module")
def tree() -> Iterator[Callable[[str], Path]]:
    """shape name -> root of its fake sysfs tree (SHAPES plus amd_instinct), written once."""
    base = Path(scratch_dir())
    roots: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in roots:
            factory = SHAPES.get(name) or {"amd_instinct": amd_instinct}[name]
            roots[name] = write_sysfs(factory(), base / name)
        return roots[name]

    yield get
    shutil.rmtree(base, ignore_errors=True)

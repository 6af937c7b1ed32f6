"""The interpreter the tests that start torch-rendezvous jobs run their launchers with.

``NUMARUN_TEST_TORCH_PYTHON=/path/to/python`` names any Python with any torch (its launchers
and so its workers run there, with this checkout's ``src`` first on ``PYTHONPATH``); unset, the
interpreter running the tests. ``tests/run_c10d_tests.py`` runs these tests for one or more
interpreters and prints the torch version table of the README.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import pytest

TORCH_PYTHON = os.environ.get("NUMARUN_TEST_TORCH_PYTHON") or sys.executable


@functools.cache
def torch_version() -> str | None:
    """``torch.__version__`` in :data:`TORCH_PYTHON`, None without torch there."""
    if sys.executable == TORCH_PYTHON:
        try:
            import torch
        except ImportError:
            return None
        return str(torch.__version__)
    done = subprocess.run(
        [TORCH_PYTHON, "-c", "import torch; print(torch.__version__)"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TORCH_CPP_LOG_LEVEL": "FATAL"},
    )
    if done.returncode != 0:
        if not os.access(TORCH_PYTHON, os.X_OK):
            raise RuntimeError(f"NUMARUN_TEST_TORCH_PYTHON={TORCH_PYTHON}: not executable")
        return None
    return done.stdout.strip().splitlines()[-1]


def require_torch() -> str:
    """Skip the calling module unless :data:`TORCH_PYTHON` has torch; its version."""
    version = torch_version()
    if version is None:
        pytest.skip(f"torch is not installed for {TORCH_PYTHON}", allow_module_level=True)
    return version


def torch_release(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string (``2.4.1+cu121`` -> ``(2, 4)``)."""
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()))

"""``numarun check`` run as a user runs it (the real command in a subprocess, short and small),
for the tests of the check wing (``tests/check/``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest

CPUS = sorted(os.sched_getaffinity(0))
TWO_CPUS = pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs this process may use")
QUICK = ["--seconds", "0.2", "--buffer-mib", "4"]


def run_check(
    *args: str,
    cpus: list[int] | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``numarun check ARGS`` in a subprocess (under ``taskset -c CPUS`` when given)."""
    argv = [sys.executable, "-m", "numarun", "check", *args]
    if cpus is not None:
        taskset = shutil.which("taskset")
        if taskset is None:
            pytest.skip("taskset is not installed")
        argv = [taskset, "-c", ",".join(map(str, cpus)), *argv]
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def run_json(*args: str, **kwargs: Any) -> tuple[int, dict[str, Any], str]:
    done = run_check(*args, "--json", *QUICK, **kwargs)
    try:
        document = json.loads(done.stdout)
    except ValueError:
        raise AssertionError(f"not JSON: {done.stdout!r}\nstderr: {done.stderr}") from None
    return done.returncode, document, done.stderr


def assert_bound_as_planned(document: dict[str, Any], nprocs: int) -> None:
    assert document["exit_code"] == 0
    assert len(document["ranks"]) == nprocs
    for entry in document["ranks"]:
        assert entry["actual"]["cpus"] == entry["planned"]["cpus"], entry
        assert entry["bound_as_planned"] is True
        assert entry["actual"]["policy"] == entry["planned"]["policy"]
        # Its memory node(s): where the plan puts it and where its pages really are.
        assert entry["planned"]["local_nodes"]
        assert entry["actual"]["pages"]["nodes"]
        nodes = entry["actual"]["memory_nodes"]
        assert nodes and set(nodes) <= set(entry["planned"]["local_nodes"])
        assert entry["memory_local"] is True
        assert entry["memory_gbs"]["local"]["gbs"] > 0
    assert document["verdict"].startswith(f"bound as planned: {nprocs}/{nprocs} ranks")

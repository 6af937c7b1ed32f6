"""The suite runs side by side (tests/README.md): a test marked ``alone`` runs while no other test
does, and the tests marked ``slow`` start first. Checked on a small suite of its own, run by
pytest-xdist with this suite's conftest."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

SUITE = '''
import os, time
import pytest

def _stay(name):
    with open(os.environ["SBS_LOG"], "a") as log:
        log.write(f"{name} start {time.monotonic()}\\n")
    time.sleep(0.4)
    with open(os.environ["SBS_LOG"], "a") as log:
        log.write(f"{name} end {time.monotonic()}\\n")

@pytest.mark.parametrize("n", range(8))
def test_together(n):
    _stay(f"together{n}")

@pytest.mark.alone
@pytest.mark.parametrize("n", range(2))
def test_by_itself(n):
    _stay(f"alone{n}")

@pytest.mark.slow
def test_long():
    _stay("long")
'''

INI = """[pytest]
markers =
    slow: slow
    alone: alone
"""


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(CONFTEST.read_text())
    (tmp_path / "test_suite.py").write_text(SUITE)
    (tmp_path / "pytest.ini").write_text(INI)
    env = {**os.environ, "SBS_LOG": str(tmp_path / "log")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip


def test_a_test_marked_alone_runs_while_no_other_test_does(tmp_path: Path) -> None:
    done = _run(tmp_path, "-n", "3", f"--basetemp={tmp_path / 'base'}")
    assert done.returncode == 0, done.stdout + done.stderr
    spans: dict[str, list[float]] = {}
    for line in (tmp_path / "log").read_text().splitlines():
        name, _, when = line.split()
        spans.setdefault(name, []).append(float(when))
    assert len(spans) == 11 and all(len(span) == 2 for span in spans.values()), spans

    def overlap(a: str, b: str) -> bool:
        return spans[a][0] < spans[b][1] and spans[b][0] < spans[a][1]

    # Three workers: the others do run side by side ...
    together = [name for name in spans if not name.startswith("alone")]
    assert any(overlap(a, b) for a in together for b in together if a < b), spans
    # ... but never beside a test marked alone.
    for alone in ("alone0", "alone1"):
        assert not [name for name in spans if name != alone and overlap(alone, name)], spans


def test_the_tests_marked_slow_are_collected_first(tmp_path: Path) -> None:
    done = _run(tmp_path, "-n", "0", "--collect-only")
    assert done.returncode == 0, done.stdout + done.stderr
    collected = [line for line in done.stdout.splitlines() if "::" in line]
    assert len(collected) == 11 and collected[0] == "test_suite.py::test_long", collected

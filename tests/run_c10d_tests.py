"""Run the tests that start torch-rendezvous (c10d) jobs against one or more torch installs.

    python tests/run_c10d_tests.py [PYTHON ...]

Each PYTHON (default: the interpreter running this script) is any Python with any torch; its
launchers and workers run there (``NUMARUN_TEST_TORCH_PYTHON``, read by ``tests/torch_python.py``)
with this checkout's ``src`` first on ``PYTHONPATH``, while pytest runs in the interpreter
running this script, which needs only pytest (hypothesis is optional: without it its
property tests are reported as skipped). Nothing is installed. Prints one row per PYTHON of the
README's torch version table (torch version, passed, failed, skipped, expected failures,
seconds) and the failing tests' ids; the exit status is 0 when no test failed anywhere.

On a machine with only a Python that has torch and pytest::

    PYTHONPATH=src python tests/run_c10d_tests.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"
FILES = [
    "e2e/test_torchrdzv_jobs.py",
    "e2e/test_jobwide_jobs.py",
    "e2e/test_logdir_shared_nodes.py",
    "rendezvous/test_torchcompat.py",
]

# Stands in for hypothesis where it is not installed: its tests skip, saying why.
_NO_HYPOTHESIS = '''
import pytest

def given(*args, **kwargs):
    def mark(test):
        return pytest.mark.skip(reason="hypothesis is not installed")(test)
    return mark

def settings(*args, **kwargs):
    return lambda test: test

class _Strategies:
    def __getattr__(self, name):
        return lambda *args, **kwargs: None

strategies = _Strategies()
'''


def torch_version(python: str) -> str:
    done = subprocess.run(
        [python, "-c", "import torch; print(torch.__version__)"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TORCH_CPP_LOG_LEVEL": "FATAL"},
    )
    lines = done.stdout.split()
    return lines[-1] if done.returncode == 0 and lines else "no torch"


def run(python: str, extra_path: str | None) -> tuple[str, dict[str, int], float, list[str]]:
    """pytest over :data:`FILES` with ``python``'s torch: (version, counts, seconds, failed)."""
    version = torch_version(python)
    path = [str(SRC), str(TESTS), *([extra_path] if extra_path else [])]
    env = {
        **os.environ,
        "NUMARUN_TEST_TORCH_PYTHON": python,
        "PYTHONPATH": os.pathsep.join([*path, os.environ.get("PYTHONPATH", "")]),
    }
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider",
         *(str(TESTS / name) for name in FILES)],
        cwd=TESTS.parent, env=env, capture_output=True, text=True,
    )  # fmt: skip
    seconds = time.monotonic() - started
    counts = {
        word: int(number)
        for number, word in re.findall(
            r"(\d+) (passed|failed|skipped|xfailed|xpassed|errors?)", done.stdout
        )
    }
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", done.stdout, re.MULTILINE)
    if done.returncode not in (0, 1) or not counts:
        failed.append(f"pytest exit status {done.returncode}: {done.stdout[-2000:]}")
    return version, counts, seconds, failed


def main(argv: list[str]) -> int:
    pythons = argv or [sys.executable]
    extra = None
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        extra = tempfile.mkdtemp(prefix="numarun-no-hypothesis-")
        Path(extra, "hypothesis.py").write_text(_NO_HYPOTHESIS)
    print("| torch | passed | failed | skipped | expected failures | seconds |")
    print("|---|---|---|---|---|---|")
    failures = []
    for python in pythons:
        version, counts, seconds, failed = run(python, extra)
        print(
            f"| {version} | {counts.get('passed', 0)} | "
            f"{counts.get('failed', 0) + counts.get('error', 0) + counts.get('errors', 0)} | "
            f"{counts.get('skipped', 0)} | {counts.get('xfailed', 0)} | {seconds:.0f} |",
            flush=True,
        )
        failures += [f"{version}: {test}" for test in failed]
    for line in failures:
        print(line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""``numarun`` run as a newcomer runs it (a subprocess in the directory of a tiny script), for
the tests of what it says first: the start line, near misses, the plan without flags."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

LIMIT = 60
# One write per line: workers run unbuffered (python -u), and print's pieces from two workers
# sharing a pipe would interleave.
HELLO = (
    "import os\n"
    "os.write(1, f\"hello from {os.environ['RANK']} {os.environ['WORLD_SIZE']}\\n\".encode())\n"
)
START = re.compile(r"numarun: run (?P<run>[\w-]+|'none' \([^)]*\)): (?P<rest>.*)")
def numarun(*argv: str, cwd: Path, merge: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "numarun", *argv],
        cwd=cwd,
        capture_output=not merge,
        stdout=subprocess.PIPE if merge else None,
        stderr=subprocess.STDOUT if merge else None,
        text=True,
        timeout=LIMIT,
    )


def write_hello(directory: Path) -> str:
    """``train.py`` in ``directory``: each rank says hello with its rank and the world size."""
    (directory / "train.py").write_text(HELLO)
    return "train.py"


def write_marker_script(directory: Path) -> tuple[str, Path]:
    """A worker that leaves a file behind: proof that something started."""
    marker = directory / "started"
    (directory / "mark.py").write_text(f"open({str(marker)!r}, 'a').close()\n")
    return "mark.py", marker

"""Starting at the machine's limits: out of file descriptors, absurd worker counts, a SIGTERM
while thousands of workers start. Each ends in one line (or 128+N for the signal), with nothing
left behind: no process, no temporary directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKERS = Path(__file__).resolve().parent / "workers"
SRC = Path(__file__).resolve().parents[1] / "src"
LIMIT = 120.0


def _env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "NUMARUN_RUN_ID"}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    env.pop("PET_NPROC_PER_NODE", None)
    env.update(extra)
    return env


# --- issue 16, item 4: absurd counts, a SIGTERM while thousands start ----------------------------


def test_an_absurd_worker_count_is_one_line_before_anything_is_made(tmp_path: Path) -> None:
    """``--nproc-per-node 1000000000`` used to build a billion environments until the OOM
    killer came: it is bounded by what the machine can start (kernel.pid_max here)."""
    script = tmp_path / "hello.py"
    script.write_text("print('hello')\n")
    done = subprocess.run(
        [sys.executable, "-m", "numarun", "--nproc-per-node", "1000000000", str(script)],
        capture_output=True,
        text=True,
        env=_env(TMPDIR=str(tmp_path)),
        timeout=LIMIT,
    )
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("numarun: error:")]
    assert len(errors) == 1, done.stderr
    assert "--nproc-per-node 1000000000: more workers than this machine can start" in errors[0]
    assert "Traceback" not in done.stderr
    assert [path.name for path in tmp_path.iterdir()] == ["hello.py"]


def test_spawn_refuses_an_absurd_nprocs_naming_the_keyword() -> None:
    import numarun
    from numarun.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match=r"^nprocs=1000000000: more workers than"):
        numarun.spawn(print, nprocs=1_000_000_000)


def test_the_launcher_and_spawn_share_one_bound() -> None:
    """Both ask numarun.process.capacity; the bound is the smallest of the machine's limits."""
    from numarun.process import capacity

    limit, reason = capacity.worker_limit()
    with open("/proc/sys/kernel/pid_max") as pid_max:
        assert limit < int(pid_max.read())
    assert reason
    assert capacity.worker_count_problem(limit) is None
    assert capacity.worker_count_problem(limit + 1) is not None
    assert capacity.worker_count_problem(capacity.ALWAYS_FINE) is None

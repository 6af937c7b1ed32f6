"""numarun.stacks.channel: which job ``numarun stacks`` means when a user runs several on one host
(issue 32 item 7): the caller's own are marked (its session or controlling terminal), and a run
id shared by several running jobs is said, with how to name one (its pid)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from numarun.errors import UsageError
from numarun.stacks import channel


def job(name: str, run_id: str, pid: int) -> channel.FoundJob:
    info = {"run_id": run_id, "pid": pid, "ranks": [{}, {}], "started": time.time(),
            "entrypoint": f"{name}.py"}  # fmt: skip
    return channel.FoundJob(f"/run/numarun/{name}.sock", info)


@pytest.fixture
def elsewhere() -> subprocess.Popen[bytes]:
    """A process in a session of its own, with no controlling terminal (another shell's job)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    yield proc
    proc.kill()
    proc.wait()


def test_the_callers_own_jobs_are_marked(elsewhere: subprocess.Popen[bytes]) -> None:
    mine, theirs = job("a", "train42", os.getpid()), job("b", "other", elsewhere.pid)
    assert channel.started_here(mine) and not channel.started_here(theirs)
    assert not channel.started_here(job("c", "gone", 0))
    lines = channel.format_job_list([mine, theirs]).splitlines()
    assert lines[1].startswith("* train42 ") and lines[2].startswith("  other ")
    assert lines[3] == "  (*: started from this session or terminal)"
    assert len(lines) == 4
    # Nothing marked: no legend.
    assert len(channel.format_job_list([theirs]).splitlines()) == 2


def test_a_shared_run_id_is_said_in_the_list(elsewhere: subprocess.Popen[bytes]) -> None:
    jobs = [job("a", "train42", os.getpid()), job("b", "train42", elsewhere.pid),
            job("c", "solo", elsewhere.pid)]  # fmt: skip
    listed = channel.format_job_list(jobs)
    assert listed.splitlines()[-1] == (
        f"  run id train42 is shared by 2 running jobs (pids {os.getpid()}, {elsewhere.pid}): "
        f"name one by its pid, numarun stacks {os.getpid()}"
    )
    assert "run id solo" not in listed


def test_naming_a_shared_run_id_asks_for_a_pid(elsewhere: subprocess.Popen[bytes]) -> None:
    jobs = [job("a", "train42", os.getpid()), job("b", "train42", elsewhere.pid)]
    with pytest.raises(UsageError) as refused:
        channel.choose_job(jobs, "train42")
    first = str(refused.value).splitlines()[0]
    assert first == "2 running jobs share the run id 'train42'; name one by its pid: " + (
        "numarun stacks PID"
    )
    assert channel.choose_job(jobs, str(elsewhere.pid)) is jobs[1]
    with pytest.raises(UsageError, match=r"^2 jobs running; name one: numarun stacks RUN_ID\n"):
        channel.choose_job(jobs, None)

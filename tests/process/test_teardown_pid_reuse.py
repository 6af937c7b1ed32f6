"""A worker's pid taken by a stranger before the supervisor knew the worker had ended: the
stranger (a session leader with a member, as a shell or another job's worker) gets nothing.

Each case runs ``tests/programs/pidns_pid_reuse.py`` as pid 1 of a new pid namespace (``unshare``),
where ``/proc/sys/kernel/ns_last_pid`` forces a stranger onto the ended worker's pid whenever that
pid is free; whatever happens stays inside the namespace, which ends with its pid 1.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
SRC = Path(__file__).resolve().parents[2] / "src"


def _unshare() -> list[str]:
    unshare = shutil.which("unshare")
    assert unshare is not None, "util-linux's unshare builds the pid namespace fixture"
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return [unshare, *user, "--pid", "--fork", "--mount-proc"]


def _in_pid_namespace(mode: str, directory: Path) -> dict[str, list[dict[str, object]]]:
    env = {key: value for key, value in os.environ.items() if key != "NUMARUN_RUN_ID"}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [*_unshare(), sys.executable, str(PROGRAMS / "pidns_pid_reuse.py"), mode, str(directory)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_ended_workers_stay_unreaped_until_the_run_is_over(tmp_path: Path) -> None:
    """Issue 20, item 6: three exec workers end at once; before the supervisor has read their
    ends, it signals them (``send_signal``) and stops the run (their process groups). The
    watchdog must still hold them as zombies: no stranger can have their pids, none is hit."""
    result = _in_pid_namespace("reaped", tmp_path)
    assert len(result["strangers"]) == 6
    for stranger in result["strangers"]:
        assert stranger["signals"] == [] and stranger["alive"], result
        assert stranger["pid"] != stranger["wanted"], result  # the zombie still held it
    assert result["job_left"] == []


@pytest.mark.parametrize("mode", ["forkserver-fail", "forkserver-kill"])
def test_a_forkserver_worker_that_dies_before_it_is_pinned_is_never_mistaken(
    mode: str, tmp_path: Path
) -> None:
    """Issue 20, item 5: the fork server reaps rank 0, which failed at once, and a stranger
    takes its pid before the supervisor opens its pidfd. Neither the supervisor's teardown
    (rank 0's failure) nor the watchdog's (the supervisor SIGKILLed) touches the stranger or
    the member of its session."""
    result = _in_pid_namespace(mode, tmp_path)
    assert len(result["strangers"]) == 2
    # The fixture held rank 0's pinning back until the stranger (the leader) had its pid.
    assert result["strangers"][0]["pid"] == result["strangers"][0]["wanted"], result
    for stranger in result["strangers"]:
        assert stranger["signals"] == [] and stranger["alive"], result
    assert result["job_left"] == []

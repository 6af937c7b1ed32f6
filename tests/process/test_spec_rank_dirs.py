"""Each rank's directory is made when something first goes there (issue 24 item 7): by the
launcher as it opens the rank's log files, else by the rank's own process as it starts
(``WorkerSpec.make_dir``), before the program that may write its error file runs. torchrun's
layout holds for everyone who looks after the run, torch's ``@record`` finds its directory, and
a rank never started (a SIGTERM during a start of thousands) costs no directory to make or to
remove."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from numarun.errors import UsageError
from numarun.process.spec import WorkerSpec
from numarun.process.supervisor import Supervisor

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
TIMEOUT = 240


def _env() -> dict[str, str]:
    return {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PET_", "SLURM_", "OMPI_", "TORCHELASTIC_"))
        and key not in ("MASTER_ADDR", "MASTER_PORT", "PYTHON_EXEC", "NUMARUN_RUN_ID")
    }


def test_an_exec_worker_makes_its_directory_before_its_program_runs(tmp_path: Path) -> None:
    test = shutil.which("test")
    assert test is not None
    (tmp_path / "r1").mkdir()  # one already there is fine
    specs = [
        WorkerSpec(local_rank=rank, rank=rank, env={}, make_dir=str(tmp_path / f"r{rank}"),
                   argv=[test, "-d", str(tmp_path / f"r{rank}")])
        for rank in range(3)
    ]  # fmt: skip
    result = Supervisor(specs, grace_period=5).run()
    assert [w.exit_code for w in result.workers] == [0, 0, 0]  # `test -d` found it
    assert sorted(path.name for path in tmp_path.iterdir()) == ["r0", "r1", "r2"]
    assert oct((tmp_path / "r0").stat().st_mode & 0o777) == oct(0o755 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_directory_that_cannot_be_made_is_one_line_and_nothing_runs(tmp_path: Path) -> None:
    true = shutil.which("true")
    assert true is not None
    where = str(tmp_path / "no" / "such")
    spec = WorkerSpec(local_rank=0, rank=0, env={}, argv=[true], make_dir=where)
    with pytest.raises(UsageError, match="local rank 0: cannot make its directory .*/no/such' "
                                         r"\(No such file"):  # fmt: skip
        Supervisor([spec], grace_period=5).run()


def test_make_dir_is_for_exec_workers_only() -> None:
    spec = WorkerSpec(local_rank=0, rank=0, env={}, start="fork", fork_target=lambda p, r: 0,
                      make_dir="x")  # fmt: skip
    with pytest.raises(UsageError, match="make_dir is for start='exec' workers only"):
        Supervisor([spec]).run()


RECORDED = """
import os, sys, time
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    path = os.environ["TORCHELASTIC_ERROR_FILE"]
    os.write(1, f"dir there: {os.path.isdir(os.path.dirname(path))}\\n".encode())  # one write
    with open(os.path.join(sys.argv[1], "said." + os.environ["RANK"]), "w"):
        pass
    if os.environ["RANK"] == "1":
        # Only once every rank said it (the teardown that follows would cut one short).
        deadline = time.monotonic() + 120
        while len(os.listdir(sys.argv[1])) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        raise ValueError("recorded by torch")
    time.sleep(120)

main()
"""


@pytest.mark.parametrize(
    "flags",
    [[], ["--redirects", "0:3"], ["--preload", "json"]],
    ids=["console", "rank 0 to files", "console, handed to standbys"],
)
def test_torchs_record_writes_its_error_file_into_torchruns_layout(
    tmp_path: Path, flags: list[str]
) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "recorded.py"
    script.write_text(RECORDED)
    logs, said = tmp_path / "logs", tmp_path / "said"
    said.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "numarun", "--nproc-per-node", "3", "--log-dir", str(logs),
         "--rdzv-id", "job", *flags, str(script), str(said)],
        capture_output=True, text=True, timeout=TIMEOUT, env=_env(), cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    attempt = logs / "job" / "attempt_0"
    assert sorted(path.name for path in attempt.iterdir()) == ["0", "1", "2"]
    recorded = json.loads((attempt / "1" / "error.json").read_text())
    assert recorded["message"]["message"] == "ValueError: recorded by torch"
    assert "error    : ValueError: recorded by torch" in done.stderr
    if "--redirects" in flags:
        assert (attempt / "0" / "stdout.log").read_text() == "dir there: True\n"
    else:
        assert done.stdout.count("dir there: True") == 3


def _unshare() -> list[str]:
    unshare = shutil.which("unshare")
    assert unshare is not None, "util-linux's unshare builds the pid namespace fixture"
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return [unshare, *user, "--pid", "--fork", "--mount-proc"]


def test_a_sigterm_during_a_large_start_leaves_no_directory_for_ranks_never_started(
    tmp_path: Path,
) -> None:
    count = 600
    sleep = shutil.which("sleep")
    assert sleep is not None
    logs = tmp_path / "logs"
    done = subprocess.run(
        [*_unshare(), sys.executable, str(PROGRAMS / "pidns_sigterm_mid_start.py"), str(count),
         sleep, "--log-dir", str(logs), "--rdzv-id", "job"],
        capture_output=True, text=True, timeout=600, env=_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["code"] == 143, result["stderr"]
    found = re.search(r"ranks? (\d+)(?:-(\d+))?: not started", result["stderr"])
    assert found is not None, result["stderr"]  # the signal came while they started
    never = int(found.group(2) or found.group(1)) - int(found.group(1)) + 1
    made = {int(path.name) for path in (logs / "job" / "attempt_0").iterdir()}
    # Every directory is a started rank's (each rank makes its own as it starts; one killed
    # by the teardown before it got there has none): none of the ranks never started.
    assert made and max(made) < int(found.group(1)), (sorted(made)[-5:], found.group(0))
    assert len(made) <= count - never

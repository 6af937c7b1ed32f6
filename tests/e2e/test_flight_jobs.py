"""The flight recorder in real gloo jobs (torch 2.13, one node, ``tests/programs/flight_cases.py``):
the hang verdict names the rank behind, the collective, its sequence number and the mismatch; the
dumps are kept where torch's analyzer reads them; a failure names where the others were in their
collectives; a job without a process group gets no flight-recorder line; two ranks, one hang,
the culprit named; ``numarun stacks --json`` carries the same facts; and sampling the stacks
every second interrupts none of torch's system calls. Every job runs with its own
``NUMARUN_RUNTIME_DIR``."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

PROGRAM = str(Path(__file__).resolve().parents[1] / "programs" / "flight_cases.py")
ANALYZER = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace"]


@pytest.fixture
def runtime() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="numarun-rt-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _env(runtime: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("PET_", "TORCHELASTIC_", "NUMARUN_", "TORCH_FR", "TORCH_NCCL"))}
    env.update(NUMARUN_RUNTIME_DIR=str(runtime), OMP_NUM_THREADS="1")
    return env  # fmt: skip


def run_case(
    runtime: Path, ranks: int, case: str, *flags: str, program: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "numarun", "--nproc-per-node", str(ranks), *flags, PROGRAM,
         "--case", case, *program],
        env=_env(runtime), capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def flight_dir(logs: Path) -> Path:
    (found,) = logs.glob("*/attempt_0/flight_recorder")
    return found


def analyzer(directory: Path) -> str:
    done = subprocess.run([*ANALYZER, str(directory)], capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


def test_a_skipped_collective_is_named_and_torchs_analyzer_reads_the_dumps(
    runtime: Path, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    done = run_case(runtime, 4, "skip", "--hang-timeout", "4", "--log-dir", str(logs))
    err = done.stderr
    assert done.returncode == 124, err[-3000:]
    assert (
        "group 0 (default_pg): ranks 0-2 wait in all_reduce #4 ([8] float32); rank 3 is one "
        "collective behind, waiting in all_reduce #3 ([8] float32): at #3 ranks 0-2 called "
        "all_reduce [4] float32, rank 3 called all_reduce [8] float32 (size mismatch)"
    ) in err
    assert "Likely culprit (flight recorder: behind, or calling something else, where the " \
        "others wait):\n  rank 3 (pid " in err  # fmt: skip
    kept = flight_dir(logs)
    assert sorted(path.name for path in kept.iterdir()) == [
        f"comm_lib_trace_rank_{rank}" for rank in range(4)
    ]
    assert f"dumps: {kept}/comm_lib_trace_rank_<rank>" in err
    report = analyzer(kept)
    # Its "Culprit rank" is whichever side it read second (files in directory order).
    assert "SIZE_OR_SYNTAX_MISMATCH" in report and "missing ranks: {3}" in report


def test_a_broadcast_among_all_reduces_is_a_type_mismatch(runtime: Path) -> None:
    done = run_case(runtime, 3, "type", "--hang-timeout", "4")
    assert done.returncode == 124, done.stderr[-3000:]
    expected = ("rank 1 waits in broadcast #4 ([4] float32): at #4 ranks 0,2 called all_reduce "
                "[4] float32, rank 1 called broadcast [4] float32 (collective type mismatch)")
    assert expected in done.stderr
    assert "dumps not kept: no log directory stays (give --log-dir to keep them)" in done.stderr


def test_a_subgroup_and_the_default_group_are_both_named(runtime: Path) -> None:
    done = run_case(runtime, 3, "subgroup", "--hang-timeout", "4")
    err = done.stderr
    assert done.returncode == 124, err[-3000:]
    default = ("group 0 (default_pg): ranks 1-2 wait in all_reduce #4 ([4] float32); rank 0 is "
               "one collective behind")
    assert default in err and "it waits in group 1 all_reduce #1 ([2] float64)" in err
    pair = ("group 1: rank 0 waits in all_reduce #1 ([2] float64); rank 1 is one collective "
            "behind, in none of its collectives yet; it waits in group 0 (default_pg) ")
    assert pair in err
    assert "Likely culprits (flight recorder" in err


def test_a_failure_names_the_collective_the_others_were_in(runtime: Path) -> None:
    done = run_case(runtime, 3, "raise")
    err = done.stderr
    assert done.returncode == 1, err[-3000:]
    assert "Root cause: rank 2 " in err and "rank 2 gave up mid-job" in err
    assert "Flight recorder (their collectives when rank 2 failed, as torch recorded them):\n" \
        "  group 1: rank 0 waits in all_reduce #1 ([4] float32); rank 1 is one collective " \
        "behind, in none of its collectives yet\n" in err  # fmt: skip


def test_a_job_without_a_process_group_gets_the_stacks_verdict_only(runtime: Path) -> None:
    done = run_case(runtime, 2, "noinit", "--hang-timeout", "3")
    err = done.stderr
    assert done.returncode == 124, err[-3000:]
    assert "Every rank with stacks is in the same place" in err
    assert "Flight recorder" not in err and "flight record" not in err
    assert "Traceback" not in err and "error" not in err.lower()


def test_two_ranks_one_hang_the_rank_in_its_data_loader_is_named(runtime: Path) -> None:
    done = run_case(runtime, 2, "ddp", "--hang-timeout", "4")
    err = done.stderr
    assert done.returncode == 124, err[-3000:]
    assert "No single culprit" not in err
    assert "Likely culprit (in its own code while the others wait inside torch for it):\n" \
        "  rank 1 (pid " in err and "in sleep_in_the_data_loader (" in err  # fmt: skip
    assert "while rank 0: in main (" in err and "innermost _engine_run_backward" in err
    assert "group 0 (default_pg): rank 0 waits in all_reduce #" in err
    assert "rank 1 is one collective behind, its last, all_reduce #" in err


def test_sampling_every_second_interrupts_none_of_torchs_calls(runtime: Path) -> None:
    # Rank 1 waits for rank 0's store (torch's TCPStore client retrying its connection) for
    # 6 s while --hang-timeout 30 samples every rank's stacks every second.
    done = run_case(runtime, 2, "late-store", "--hang-timeout", "30", program=("--sleep", "6"))
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "ready 0" in output and "ready 1" in output
    assert "Interrupted system call" not in output
    assert "retrying" not in output


def _ready(proc: subprocess.Popen[str], count: int, limit: float = 120.0) -> set[int]:
    assert proc.stdout is not None
    fd, seen, pending = proc.stdout.fileno(), set(), b""
    deadline = time.monotonic() + limit
    while len(seen) < count:
        readable, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        assert readable, f"only {sorted(seen)} ready after {limit} s"
        chunk = os.read(fd, 1)
        assert chunk, f"launcher ended: {proc.wait()}"
        pending += chunk
        if chunk == b"\n":
            if pending.startswith(b"ready "):
                seen.add(int(pending.split()[1]))
            pending = b""
    return seen


def test_numarun_stacks_json_carries_the_flight_verdict(runtime: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    proc = subprocess.Popen(
        [sys.executable, "-m", "numarun", "--nproc-per-node", "3", "--log-dir", str(logs),
         PROGRAM, "--case", "type"],
        env=_env(runtime), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _ready(proc, 3)
        deadline = time.monotonic() + 60
        while True:
            done = subprocess.run([sys.executable, "-m", "numarun", "stacks", "--json"],
                                  env=_env(runtime), capture_output=True, text=True,
                                  timeout=60, check=False)  # fmt: skip
            assert done.returncode == 0, done.stderr
            document = json.loads(done.stdout)
            groups = ((document.get("flight") or {}).get("verdict") or {}).get("groups") or []
            if (groups and groups[0]["mismatch"]) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        text = subprocess.run([sys.executable, "-m", "numarun", "stacks"], env=_env(runtime),
                              capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    group = groups[0]
    assert group["mismatch"]["match_state"] == "COLLECTIVE_TYPE_MISMATCH"
    assert group["mismatch"]["seq"] == 4 and group["culprits"] == "1"
    assert document["flight"]["saved"] == str(flight_dir(logs))
    assert "Flight recorder (each rank's collectives, as torch recorded them):" in text.stdout
    assert "(collective type mismatch)" in text.stdout

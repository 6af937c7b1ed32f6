"""The flight recorder over two c10d nodes (two numarun launchers on this machine, each with its
own runtime directory and log directory; ``tests/programs/flight_cases.py``, gloo, torch 2.13's
recorder at its default): the hang verdict every node prints names the rank behind, the
collective and its sequence number; a dtype mismatch across the nodes is named as such; every
node keeps its own ranks' dumps where torch's analyzer reads them."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rdzv_jobs import PROGRAMS, Job, finish, gone, read_ready, started_job
from torch_python import TORCH_PYTHON, require_torch

require_torch()

PROGRAM = str(PROGRAMS / "flight_cases.py")


@pytest.fixture
def job(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Job]:
    yield from started_job(request, tmp_path)


def run_two_nodes(job: Job, case: str, logs: Path) -> list[tuple[int, str, str]]:
    nodes = [
        job.start(n, *job.flags(), "--hang-timeout", "4", "--log-dir", str(logs / f"node{n}"),
                  PROGRAM, "--case", case)
        for n in (0, 1)
    ]  # fmt: skip
    pids = read_ready(nodes, 4)
    results = [finish(node) for node in nodes]
    assert gone(list(pids.values()))
    return results


@pytest.mark.slow
def test_a_rank_that_skipped_a_collective_is_named_on_every_node(job: Job, tmp_path: Path) -> None:
    # Rank 3 (on whichever node holds it) skips one all_reduce of [4]; then every rank calls
    # all_reduce on [8]: every stack is at the same line, only the collectives differ.
    logs = tmp_path / "logs"
    results = run_two_nodes(job, "skip", logs)
    for code, _, err in results:
        assert code == 124, err[-4000:]
        assert "no rank on any of the 2 nodes made progress" in err
        assert (
            "group 0 (default_pg): ranks 0-2 wait in all_reduce #4 ([8] float32); rank 3 is one "
            "collective behind, waiting in all_reduce #3 ([8] float32): at #3 ranks 0-2 called "
            "all_reduce [4] float32, rank 3 called all_reduce [8] float32 (size mismatch)"
        ) in err, err[-4000:]
        assert "Likely culprit (flight recorder: behind, or calling something else, where the " \
            "others wait):\n  rank 3 (on node " in err  # fmt: skip
        assert "this node's dumps: " in err and "Traceback" not in err
    # Each node kept its own ranks' dumps; together torch's analyzer reads them.
    together = tmp_path / "together"
    together.mkdir()
    kept = []
    for node in (0, 1):
        (found,) = (logs / f"node{node}").glob("*/attempt_0/flight_recorder")
        kept += sorted(path.name for path in found.iterdir())
        for path in found.iterdir():
            shutil.copy(path, together / path.name)
    assert sorted(kept) == [f"comm_lib_trace_rank_{rank}" for rank in range(4)]
    report = subprocess.run(
        [TORCH_PYTHON, "-m", "torch.distributed.flight_recorder.fr_trace", str(together)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert report.returncode == 0, report.stderr[-3000:]
    text = report.stdout + report.stderr
    assert "SIZE_OR_SYNTAX_MISMATCH" in text and "missing ranks: {3}" in text


@pytest.mark.slow
def test_a_dtype_mismatch_across_the_nodes_is_named(job: Job, tmp_path: Path) -> None:
    # Rank 3 passes int64 where ranks 0-2 pass float64 (same bytes: gloo goes on), then sleeps
    # while the others wait in the next all_reduce.
    results = run_two_nodes(job, "dtype", tmp_path / "logs")
    for code, _, err in results:
        assert code == 124, err[-4000:]
        assert (
            "rank 3 is one collective behind, its last, all_reduce #4 ([4] int64), completed: at "
            "#4 ranks 0-2 called all_reduce [4] float64, rank 3 called all_reduce [4] int64 "
            "(dtype mismatch)"
        ) in err, err[-4000:]

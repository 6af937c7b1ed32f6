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


def run_two_nodes(
    job: Job, case: str, logs: Path, *program: str, ready: int = 4, hang: bool = True
) -> list[tuple[int, str, str]]:
    """Two launchers of 2 ranks each (node 0: ranks 0-1, node 1: ranks 2-3) running ``case``
    (``program``: more of its arguments) to their end, with ``--hang-timeout 4`` unless not
    ``hang``; each node's (exit status, stdout, stderr) once ``ready`` ranks said so and every
    worker is gone."""
    timeout = ("--hang-timeout", "4") if hang else ()
    nodes = [
        job.start(n, *job.flags(), *timeout, "--log-dir", str(logs / f"node{n}"),
                  PROGRAM, "--case", case, *program)
        for n in (0, 1)
    ]  # fmt: skip
    pids = read_ready(nodes, ready)
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


@pytest.mark.slow
def test_a_broadcast_among_all_reduces_is_a_type_mismatch(job: Job, tmp_path: Path) -> None:
    # Rank 1 (node 0) calls broadcast from rank 0 where ranks 0, 2 and 3 call all_reduce, same
    # [4] tensor. gloo neither aborts nor notices: its broadcast waits for a message from rank 0
    # under its own tag, its all_reduce for rank 1's part of the ring: every rank waits.
    results = run_two_nodes(job, "type", tmp_path / "logs")
    for code, _, err in results:
        assert code == 124, err[-4000:]
        assert (
            "group 0 (default_pg): ranks 0,2-3 wait in all_reduce #4 ([4] float32); rank 1 waits "
            "in broadcast #4 ([4] float32): at #4 ranks 0,2-3 called all_reduce [4] float32, "
            "rank 1 called broadcast [4] float32 (collective type mismatch)"
        ) in err, err[-4000:]
        assert "Likely culprit (flight recorder: behind, or calling something else, where the " \
            "others wait):\n  rank 1 (on node 0 " in err  # fmt: skip


@pytest.mark.slow
def test_a_subgroup_across_the_nodes_and_the_default_group_are_both_named(
    job: Job, tmp_path: Path
) -> None:
    # The subgroup is ranks 0 (node 0) and 2 (node 1): rank 0 waits in its all_reduce, which
    # rank 2 never enters; ranks 1-3 wait in the default group's, which rank 0 never enters.
    results = run_two_nodes(job, "subgroup", tmp_path / "logs", "--pair", "0,2")
    for code, _, err in results:
        assert code == 124, err[-4000:]
        assert (
            "group 0 (default_pg): ranks 1-3 wait in all_reduce #4 ([4] float32); rank 0 is one "
            "collective behind, its last, all_reduce #3 ([4] float32), completed; it waits in "
            "group 1 all_reduce #1 ([2] float64)"
        ) in err, err[-4000:]
        assert (
            "group 1: rank 0 waits in all_reduce #1 ([2] float64); rank 2 is one collective "
            "behind, in none of its collectives yet; it waits in group 0 (default_pg) all_reduce "
            "#4 ([4] float32)"
        ) in err, err[-4000:]
        assert "Likely culprits (flight recorder: behind, or calling something else, where the " \
            "others wait):\n  rank 0 (on node 0 " in err and "\n  rank 2 (on node 1 " in err


@pytest.mark.slow
def test_a_failure_on_one_node_names_the_collectives_of_the_other(
    job: Job, tmp_path: Path
) -> None:
    # Rank 0 (node 0) waits in an all_reduce of the subgroup of ranks 0 and 1, which rank 1
    # (node 0, asleep) never enters, when rank 3 (node 1) raises: node 0 stops on node 1's
    # notice and merges its own ranks' recorders with node 1's summary (rank 2's). The subgroup
    # stays on node 0: node 1 ends rank 2 at once, and gloo would fail rank 0's all_reduce on
    # the closed connection before node 0 reads the notice.
    logs = tmp_path / "logs"
    results = run_two_nodes(job, "raise", logs, ready=3, hang=False)
    (code0, _, err0), (code1, _, err1) = results
    assert code1 == 1 and "rank 3 gave up mid-job" in err1, err1[-4000:]
    assert code0 == 1, err0[-4000:]
    assert (
        "Flight recorder (the collectives of the ranks above, as torch recorded them on every "
        "node):\n  group 1: rank 0 waits in all_reduce #1 ([4] float32); rank 1 is one "
        "collective behind, in none of its collectives yet\n"
    ) in err0, err0[-4000:]
    assert "left out:" not in err0 and "Traceback" not in err0
    # Node 0 kept its own ranks' dumps at the notice.
    (kept,) = (logs / "node0").glob("*/attempt_0/flight_recorder")
    assert sorted(path.name for path in kept.iterdir()) == [
        "comm_lib_trace_rank_0", "comm_lib_trace_rank_1"
    ]


@pytest.mark.slow
def test_a_job_without_a_process_group_gets_the_stacks_verdict_only(
    job: Job, tmp_path: Path
) -> None:
    results = run_two_nodes(job, "noinit", tmp_path / "logs")
    for code, _, err in results:
        assert code == 124, err[-4000:]
        assert "Every rank with stacks is in the same place: ranks 0-3 (4)" in err, err[-4000:]
        assert "Flight recorder" not in err and "flight record" not in err
        assert "Traceback" not in err and "error" not in err.lower()

"""The flight recorder over two c10d nodes (two numarun launchers on this machine, each with its
own runtime directory and log directory; ``tests/programs/flight_cases.py``, gloo, torch 2.13's
recorder at its default): the hang verdict every node prints names the rank behind, the
collective and its sequence number; a dtype mismatch across the nodes is named as such; every
node keeps its own ranks' dumps where torch's analyzer reads them."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rdzv_jobs import (
    PROGRAMS,
    Job,
    finish,
    gone,
    read_ready,
    stacks,
    stacks_until,
    started_job,
    view_store,
)
from torch_python import TORCH_PYTHON, require_torch

require_torch()

PROGRAM = str(PROGRAMS / "flight_cases.py")


@pytest.fixture
def job(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Job]:
    yield from started_job(request, tmp_path)


def start_two_nodes(
    job: Job, case: str, logs: Path, *program: str, hang: bool = True
) -> list[subprocess.Popen]:
    """Two launchers of 2 ranks each (node 0: ranks 0-1, node 1: ranks 2-3) running ``case``
    (``program``: more of its arguments), with ``--hang-timeout 4`` unless not ``hang``."""
    timeout = ("--hang-timeout", "4") if hang else ()
    return [
        job.start(n, *job.flags(), *timeout, "--log-dir", str(logs / f"node{n}"),
                  PROGRAM, "--case", case, *program)
        for n in (0, 1)
    ]  # fmt: skip


def finish_all(nodes: list[subprocess.Popen], pids: dict[int, int]) -> list[tuple[int, str, str]]:
    """Each node's (exit status, stdout, stderr), once every worker (``pids``) is gone."""
    results = [finish(node) for node in nodes]
    assert gone(list(pids.values()))
    return results


def run_two_nodes(
    job: Job, case: str, logs: Path, *program: str, ready: int = 4, hang: bool = True
) -> list[tuple[int, str, str]]:
    """:func:`start_two_nodes` run to its end, once ``ready`` ranks said so."""
    nodes = start_two_nodes(job, case, logs, *program, hang=hang)
    return finish_all(nodes, read_ready(nodes, ready))


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
        # numarun's own report: a rank of the node that tears down last may print gloo's
        # error (its peer on the other node ended first) before it.
        report = err[err.index(" HUNG on "):]
        assert "this node's dumps: " in report and "Traceback" not in report
        assert "--allow-incomplete-ranks" in report  # one node's dumps are not every rank's
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
    # [4] tensor. gloo compares neither the operations nor anything else here: no rank aborts,
    # every one waits in its collective for messages that never come (torch 2.13's gloo).
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
    report = err0[err0.index("numarun: attempt_0: stopped"):]
    assert "left out:" not in report and "Traceback" not in report
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


def replies_of_the_last_request(store: object) -> dict[int, dict]:
    """node -> its digest (decoded) in the replies of the job's last ``numarun stacks``."""
    number = store.add("numarun/events", 0)  # type: ignore[attr-defined]
    lines = store.get(f"numarun/replies/{number}").split(b"\n")  # type: ignore[attr-defined]
    return {post["node"]: post for post in map(json.loads, filter(None, lines))}


def stacks_after_a_forged_reply(job: Job, store: object, forged: dict) -> str:
    """``numarun stacks`` for the whole job, asked of node 0, with ``forged`` (a digest)
    appended to the replies of its request before it is asked: read first, as node 1's."""
    number = store.add("numarun/events", 0) + 1  # type: ignore[attr-defined]
    key = f"numarun/replies/{number}"
    store.append(key, json.dumps(forged).encode() + b"\n")  # type: ignore[attr-defined]
    done = stacks(job.runtime(0))
    assert done.returncode == 0, done.stderr
    replies = store.get(key).split(b"\n")  # type: ignore[attr-defined]
    assert len([line for line in replies if line]) == 3, "the request took another number"
    return done.stdout


def stacks_part(text: str) -> list[str]:
    """The classes of a ``numarun stacks`` answer (its flight-recorder part and notes cut)."""
    kept = text.split("Flight recorder (", 1)[0].splitlines()
    return [line for line in kept if not line.startswith("  left out: ")]


@pytest.mark.slow
def test_a_forged_flight_summary_costs_its_nodes_record_and_nothing_else(
    job: Job, tmp_path: Path
) -> None:
    # Deterministic, no race with the nodes' own posts: a whole-job numarun stacks request k
    # reads the digests appended to numarun/replies/<k> in order and keeps a node's first
    # (docs/protocol.md); k is the event counter's next value (no other event is posted in
    # this job), so the forged digest, node 1's honest one with another "flight" field, is
    # there before the nodes answer. Rank 3 holds back until the test releases it.
    release = tmp_path / "release"
    nodes = start_two_nodes(job, "held", tmp_path / "logs", "--until", str(release), hang=False)
    pids = read_ready(nodes, 4)
    honest = stacks_until(job.runtime(0), "rank 3 is one collective behind")
    assert (
        "group 0 (default_pg): ranks 0-2 wait in all_reduce #4 ([4] float32); rank 3 is one "
        "collective behind, its last, all_reduce #3 ([4] float32), completed"
    ) in honest, honest
    store = view_store(job)  # the whole-job view's store (its own, by default)
    posts = replies_of_the_last_request(store)
    # Node 1's summary replaced by node 0's (it names ranks 0-1, not node 1's own).
    text = stacks_after_a_forged_reply(job, store, dict(posts[1], flight=posts[0]["flight"]))
    assert stacks_part(text) == stacks_part(honest), text
    assert (
        "group 0 (default_pg): ranks 0-1 wait in all_reduce #4 ([4] float32); ranks 2-3 "
        "unknown (its node's flight summary named other ranks)"
    ) in text, text
    assert "left out: node 1's flight summary names 2 rank(s) not its own: left out" in text
    # Garbage with a terminal escape: one line, nothing of it printed raw.
    garbage = "\x1b[2J{not json"
    text = stacks_after_a_forged_reply(job, store, dict(posts[1], flight=garbage))
    assert stacks_part(text) == stacks_part(honest), text
    assert "left out: node 1's flight summary: unreadable summary: JSONDecodeError" in text, text
    assert "ranks 2-3 unknown (its node's flight summary was unreadable)" in text, text
    assert "\x1b" not in text
    # Training's outcome: rank 3 released, every rank ends, both launchers exit 0.
    release.touch()
    for code, _, err in finish_all(nodes, pids):
        assert code == 0, err[-4000:]
        assert "Traceback" not in err and "left out" not in err

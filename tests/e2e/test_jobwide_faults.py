"""Faults in the whole-job view of real c10d jobs (two and four launchers on this machine): the
view's code raising, a store that refuses or times out numarun's keys only, the merging node
killed once its count completed, a node of the round that registers late, a failure cascade.
Diagnostics never end training: only the rendezvous's own health does (DESIGN.md).

The faults are armed in each launcher by ``tests/programs/faultshim/sitecustomize.py`` (on
``PYTHONPATH`` for these launchers only; ``NUMARUN_TEST_FAULTS`` says which). Workers:
``tests/programs/gloo_multinode.py``, ``uneven_data_hang.py``, ``cascade_failure.py``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from job_processes import processes_with_run_id
from rdzv_jobs import (
    LIMIT,
    PROGRAMS,
    Job,
    finish,
    gone,
    numarun_lines,
    read_ready,
    stacks,
    started_job,
)
from torch_python import require_torch

require_torch()

SHIM = (str(PROGRAMS / "faultshim"),)
JW = str(PROGRAMS / "gloo_multinode.py")
UNEVEN = str(PROGRAMS / "uneven_data_hang.py")
CASCADE = str(PROGRAMS / "cascade_failure.py")


@pytest.fixture
def job(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Job]:
    yield from started_job(request, tmp_path)


def faulty(job: Job, nodes: int, faults: str, *argv: str) -> list:
    return [
        job.start(n, *job.flags(str(nodes), nproc=1), "--monitor-interval", "0.5", *argv,
                  path=SHIM, NUMARUN_TEST_FAULTS=faults)
        for n in range(nodes)
    ]  # fmt: skip


def warnings(err: str) -> list[str]:
    return [line for line in numarun_lines(err) if line.startswith("numarun: warning: ")]


def ask_once(job: Job, node: int) -> str:
    """One whole-job ``numarun stacks`` on ``node``: what it said, on either stream."""
    done = stacks(job.runtime(node))
    return done.stdout + done.stderr


# --- (a) every diagnostic path raising, or the store refusing numarun's keys: exit 0 ------------


@pytest.mark.parametrize(
    ("nodes", "faults", "unavailable"),
    [
        (2, "raise", "injected fault in"),
        (2, "refuse", "unavailable on this node (RuntimeError: injected: the store refuses"),
        (4, "timeout", "unavailable on this node (DistStoreError: injected: numarun's"),
    ],
)
def test_a_failing_whole_job_view_never_ends_the_training(
    job: Job, nodes: int, faults: str, unavailable: str
) -> None:
    # The reviewer's case: the view's digest and merge raising in both launchers, one `numarun
    # stacks`: both nodes ended with exit 1, "lost the c10d rendezvous". Here rank 1 computes
    # for 6 s while the others wait in all_reduce, still for longer than --hang-timeout (their
    # hang marks go through the faults), and `numarun stacks` is asked on every node.
    procs = faulty(job, nodes, faults, "--hang-timeout", "2", JW, "compute", "1", "6")
    read_ready(procs, nodes)
    said = [ask_once(job, node) for node in range(nodes)]
    assert all("Traceback" not in text for text in said), said
    results = [finish(proc) for proc in procs]
    for code, out, err in results:
        assert code == 0, err
        assert "done " in out
        assert "lost the" not in err and "Traceback" not in err and "HUNG" not in err
    lines = [line for _, _, err in results for line in warnings(err)]
    assert any(unavailable in line and line.endswith("the training goes on")
               for line in lines), lines  # fmt: skip
    assert processes_with_run_id(job.run_id) == []


# --- (b) the merging node dies once its count completed ------------------------------------------


def test_the_judge_killed_after_its_count_completes_is_taken_over(job: Job) -> None:
    # Node 1 goes still last (a longer --hang-timeout), so its add completes the still count,
    # and it is SIGKILLed right there, before it judges. Before, no verdict was ever posted:
    # node 0 waited for the heartbeat silence and re-formed a group that could not form. Now
    # node 0 takes over within two look intervals and declares the hang, naming it.
    flags = [*job.flags(nproc=1), "--monitor-interval", "1"]
    node0 = job.start(0, *flags, "--rdzv-conf", "is_host=1", "--hang-timeout", "2", UNEVEN,
                      "parked", "9")  # fmt: skip
    node1 = job.start(1, *flags, "--rdzv-conf", "is_host=0", "--hang-timeout", "5", UNEVEN,
                      "parked", "9", path=SHIM, NUMARUN_TEST_FAULTS="kill-judge")  # fmt: skip
    pids = read_ready([node0, node1], 2)
    code1, _, _ = finish(node1)
    assert code1 == -signal.SIGKILL
    killed = time.monotonic()
    code0, _, err0 = finish(node0)
    took = time.monotonic() - killed
    assert code0 == 124, err0
    assert "HUNG on" in err0 and "no rank on any of the 2 nodes made progress" in err0, err0
    assert "Declared by this node." in err0, err0
    assert took < LIMIT
    assert gone(list(pids.values()))


# --- (c) a node of the round registers late while a request is open ------------------------------


def test_a_request_open_while_a_node_registers_late_counts_it(job: Job) -> None:
    # Node 1 says it is a numarun node 4 s after the round formed (a slow launcher). A request
    # made meanwhile used to read one numarun node, complete with node 0's answer alone and
    # call that the job. Now the round's own size counts: node 1 is in the answer, or named
    # as not having answered, and the request waited for it.
    flags = job.flags(nproc=1)
    node0 = job.start(0, *flags, UNEVEN, "parked", "9")
    node1 = job.start(1, *flags, UNEVEN, "parked", "9", path=SHIM,
                      NUMARUN_TEST_FAULTS="late-register=4")  # fmt: skip
    read_ready([node0], 1)
    asked = time.monotonic()
    text = ask_once(job, 0)
    took = time.monotonic() - asked
    assert "on 1 of 1 nodes" not in text, text
    first = text.splitlines()[0] if text else ""
    if "on 2 of 2 nodes" not in first:
        assert "on 1 of 2 nodes" in first, text
        assert "node 1: did not answer within 2 s" in text, text
        assert took >= 2.0, took  # it waited for node 1: nothing completed early
    read_ready([node1], 1)
    deadline = time.monotonic() + LIMIT
    while "on 2 of 2 nodes" not in text and time.monotonic() < deadline:
        time.sleep(0.5)
        text = ask_once(job, 1)
    assert "(2 ranks on 2 of 2 nodes)" in text, text
    for proc in (node0, node1):
        proc.send_signal(signal.SIGTERM)
    for proc in (node0, node1):
        code, _, err = finish(proc)
        assert code == 128 + signal.SIGTERM, err


# --- (d) a failure cascade: every rank of four nodes raises within a second ----------------------


def test_a_failure_cascade_costs_each_node_a_constant_number_of_reads(job: Job) -> None:
    go = job.tmp / "go"
    counts = [job.tmp / f"counts{node}.json" for node in range(4)]
    procs = [
        job.start(n, *job.flags("4", nproc=2), "--monitor-interval", "0.5", CASCADE, str(go),
                  path=SHIM, NUMARUN_TEST_FAULTS=f"count={counts[n]}")
        for n in range(4)
    ]  # fmt: skip
    read_ready(procs, 8)
    go.touch()
    results = [finish(proc) for proc in procs]
    for code, _, err in results:
        assert code == 1, err
        assert "the collective timed out" in err
        assert "Traceback (most recent call last)" not in "\n".join(numarun_lines(err))
    for path in counts:
        spent = json.loads(path.read_text())
        # Each node reads the events up to the first notice it hears (its own included) and
        # the frames that notice names, never every other node's notice and frames.
        events = spent.get("get numarun/event", 0)
        frames = spent.get("multi_get numarun/frames", 0) + spent.get("get numarun/frames", 0)
        assert events <= 2, spent  # four notices posted: every node used to read all four
        assert frames <= 1, spent
    assert processes_with_run_id(job.run_id) == []
    assert all(os.listdir(job.runtime(node)) == [] for node in range(4))

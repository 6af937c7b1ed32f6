"""The whole-job view's store of its own (``--diagnostics-store own``, the default with c10d) in
real 2-node c10d jobs on this machine: ``numarun stacks`` for the whole job through it, none of the
view's keys on the rendezvous store; a store that refuses every node (its address forged to a
closed port by ``tests/programs/faultshim``'s ``diag-refused``): the job completes with 0 and each
node says in one line that the view is unavailable; ``--diagnostics-store rendezvous`` as before.
Worker: ``tests/programs/gloo_multinode.py``."""

from __future__ import annotations

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
    numarun_lines,
    read_ready,
    stacks,
    stacks_until,
    started_job,
)
from torch_python import require_torch

require_torch()

JW = str(PROGRAMS / "gloo_multinode.py")
SHIM = (str(PROGRAMS / "faultshim"),)
UNAVAILABLE = "numarun: whole-job diagnostics unavailable this round: "


@pytest.fixture
def job(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Job]:
    yield from started_job(request, tmp_path)


def store_keys(job: Job) -> list[str]:
    """Every key of the job's rendezvous store, as anyone who reaches its port sees them."""
    from datetime import timedelta

    import torch.distributed as dist

    client = dist.TCPStore("127.0.0.1", job.port, is_master=False, wait_for_workers=False,
                           timeout=timedelta(seconds=30))  # fmt: skip
    return list(client.list_keys())


def run_parked(job: Job, flag: Path, *argv: str, **extra: object) -> list:
    return [job.start(n, *job.flags(), *argv, JW, "flag", str(flag), **extra)  # type: ignore[arg-type]
            for n in (0, 1)]  # fmt: skip


def end_well(procs: list, flag: Path) -> list[str]:
    flag.touch()
    errs = []
    for proc in procs:
        code, out, err = finish(proc)
        assert code == 0, err
        assert out.count("done ") == 2
        errs.append(err)
    return errs


def test_whole_job_stacks_go_through_the_store_of_their_own(job: Job, tmp_path: Path) -> None:
    flag = tmp_path / "go"
    procs = run_parked(job, flag)
    try:
        read_ready(procs, 4)
        for node in (0, 1):
            text = stacks_until(job.runtime(node), "(4 ranks on 2 of 2 nodes)")
            assert f"numarun stacks: job {job.run_id} (4 ranks on 2 of 2 nodes)" in text, text
            assert "in parked_until_the_flag (" in text
        keys = store_keys(job)
        assert any(key.endswith("/numarun/diagstore") for key in keys), keys
        assert any(key.endswith("/numarun/alive/1") for key in keys), keys  # health stays
        # The view's keys (events, replies, frames) are not on the rendezvous store.
        views = [key for key in keys
                 if "/numarun/" in key and not key.rsplit("/numarun/", 1)[1].startswith(
                     ("alive/", "nodes", "diagstore"))]  # fmt: skip
        assert views == [], views
    finally:
        errs = end_well(procs, flag)
    for err in errs:
        assert UNAVAILABLE not in err, err
    assert processes_with_run_id(job.run_id) == []


def test_a_refused_diagnostics_store_never_stops_the_job(job: Job, tmp_path: Path) -> None:
    flag = tmp_path / "go"
    procs = run_parked(job, flag, "--monitor-interval", "0.5", path=SHIM,
                       NUMARUN_TEST_FAULTS="diag-refused")  # fmt: skip
    try:
        read_ready(procs, 4)
        deadline = time.monotonic() + LIMIT
        while True:  # answered in one line once the node's connect thread gave up (refused)
            said = stacks(job.runtime(0))
            text = said.stdout + said.stderr
            if "refused" in text or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert "whole-job diagnostics unavailable this round: its store at 127.0.0.1:" in text
        assert "refused the connection" in text, text
        assert "Traceback" not in text
    finally:
        errs = end_well(procs, flag)
    for err in errs:
        lines = [line for line in numarun_lines(err) if line.startswith(UNAVAILABLE)]
        assert len(lines) == 1, err  # one line per node and round
        assert "refused the connection" in lines[0] and lines[0].endswith("training goes on")
        assert "lost the" not in err and "Traceback" not in err
    assert processes_with_run_id(job.run_id) == []


def test_the_rendezvous_store_as_before(job: Job, tmp_path: Path) -> None:
    flag = tmp_path / "go"
    procs = run_parked(job, flag, "--diagnostics-store", "rendezvous")
    try:
        read_ready(procs, 4)
        text = stacks_until(job.runtime(1), "(4 ranks on 2 of 2 nodes)")
        assert f"numarun stacks: job {job.run_id} (4 ranks on 2 of 2 nodes)" in text, text
        keys = store_keys(job)
        assert not any(key.endswith("/numarun/diagstore") for key in keys), keys
        assert any("/numarun/event/" in key for key in keys), keys  # the request's event
    finally:
        errs = end_well(procs, flag)
    for err in errs:
        assert UNAVAILABLE not in err, err
    assert processes_with_run_id(job.run_id) == []

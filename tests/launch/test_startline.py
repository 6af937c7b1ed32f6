"""numarun.launch.startline: every run begins with numarun's own line (run id, node k of n,
workers and ranks, the meeting point of a multi-node job, each rank's CPUs or "unbound", the log
directory); ``-q`` keeps numarun to errors and the failure summary; under a torch rendezvous the
line comes from the round. A master address that does not resolve is one line before anything
starts. Run as ``python -m numarun`` in a subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import sysfs_fixtures
from newcomer_runs import LIMIT, START, numarun, write_hello, write_marker_script
from numarun.machine.cpulist import format_cpulist
from numarun.placement.workerenv import free_port

shape_root = sysfs_fixtures.shape_root


@pytest.fixture
def hello(tmp_path: Path) -> str:
    return write_hello(tmp_path)


@pytest.fixture
def marker_script(tmp_path: Path) -> tuple[str, Path]:
    return write_marker_script(tmp_path)


# --- item 3: the start line ---------------------------------------------------------------------


def test_the_first_line_of_a_run_is_numaruns_and_says_what_started(
    tmp_path: Path, hello: str
) -> None:
    done = numarun("--nproc-per-node", "2", hello, cwd=tmp_path, merge=True)
    assert done.returncode == 0, done.stdout
    first, *rest = done.stdout.splitlines()
    match = START.fullmatch(first)
    assert match, first  # before any worker's line, though they share the pipe
    assert re.fullmatch(r"[0-9a-f]{12}", match["run"])
    assert match["rest"] == (
        "node 0 of 1, 2 workers (ranks 0-1), CPUs: unbound, logs: console only"
    )
    assert sorted(rest) == ["hello from 0 2", "hello from 1 2"]


def test_the_start_line_gives_each_ranks_cpus_and_the_log_directory(
    tmp_path: Path, hello: str
) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    first, second = allowed[0], allowed[-1]
    done = numarun(
        "--rank-cpus", str(first), "--rank-cpus", str(second), "--rdzv-id", "job7",
        "--log-dir", str(tmp_path / "logs"), "--redirects", "3", hello, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (line,) = done.stderr.splitlines()
    assert line == (
        f"numarun: run job7: node 0 of 1, 2 workers (ranks 0-1), CPUs (explicit): "
        f"rank 0: {first}; rank 1: {second}, logs in {tmp_path / 'logs' / 'job7'}"
    )
    bound = numarun("--numa-binding", "cpu", hello, cwd=tmp_path)
    assert f"CPUs (cpu): rank 0: {format_cpulist(allowed)}," in bound.stderr.splitlines()[0]


def test_quiet_keeps_numarun_to_errors_and_the_failure_summary(tmp_path: Path, hello: str) -> None:
    done = numarun("-q", "--nproc-per-node", "2", hello, cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    assert sorted(done.stdout.splitlines()) == ["hello from 0 2", "hello from 1 2"]
    (tmp_path / "fail.py").write_text("import sys\nsys.exit(3)\n")
    failed = numarun("--quiet", "fail.py", cwd=tmp_path)
    assert failed.returncode == 3
    assert failed.stderr.startswith("=" * 72 + "\nnumarun: fail.py FAILED on ")
    assert "numarun: run " not in failed.stderr
    usage = numarun("-q", "--nproc-per-node", "x", hello, cwd=tmp_path)
    assert usage.returncode == 2 and usage.stderr.startswith("numarun: error: ")


# --- item 4: where the workers of several nodes meet -------------------------------------------


def test_a_static_multi_node_job_says_where_its_workers_meet(tmp_path: Path, hello: str) -> None:
    port = str(free_port())
    argv = [sys.executable, "-m", "numarun", "--nnodes", "2", "--master-port", port, hello]
    nodes = [
        subprocess.Popen(
            [*argv[:3], "--node-rank", str(rank), *argv[3:]],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (1, 0)
    ]
    try:
        outputs = [node.communicate(timeout=LIMIT) for node in nodes]
    finally:
        for node in nodes:
            node.kill()
            node.wait()
    for rank, (stdout, stderr) in zip((1, 0), outputs, strict=True):
        start, note = stderr.splitlines()
        assert START.fullmatch(start)["rest"].startswith(  # type: ignore[index]
            f"node {rank} of 2, 1 worker (rank {rank}), meeting at 127.0.0.1:{port}, "
        ), start
        assert note.startswith(
            "numarun: the workers wait in init_process_group, silently, until those of all 2 "
            f"nodes reach 127.0.0.1:{port}; run this command on the other node with "
            f"--node-rank {1 - rank}"
        ), note
        assert "(127.0.0.1 is this host only: give --master-addr HOST)" in note
        assert stdout == f"hello from {rank} 2\n"


@pytest.mark.slow
def test_under_a_torch_rendezvous_the_start_line_comes_from_the_round(
    tmp_path: Path, hello: str
) -> None:
    # --nnodes 1:2: the round (formed after last_call_timeout) decides the node and its ranks.
    done = numarun(
        "--nnodes", "1:2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", "localhost:0", "--rdzv-conf", "last_call_timeout=1", hello,
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    starts = [line for line in done.stderr.splitlines() if line.startswith("numarun: run ")]
    assert len(starts) == 1, done.stderr
    # No --rdzv-id: the job meets under torchrun's default id, and the line says so.
    assert starts[0].startswith(
        "numarun: run 'none' (torchrun's default --rdzv-id; name the job with --rdzv-id ID): "
    ), starts[0]
    rest = START.fullmatch(starts[0])["rest"]  # type: ignore[index]
    assert re.fullmatch(
        r"node 0 of 1, 2 workers \(ranks 0-1\), meeting at \S+:\d+, CPUs: unbound, "
        r"logs: console only",
        rest,
    ), rest
    assert sorted(done.stdout.splitlines()) == ["hello from 0 2", "hello from 1 2"]


def test_a_master_address_that_does_not_resolve_is_one_line_before_anything_starts(
    tmp_path: Path, marker_script: tuple[str, Path]
) -> None:
    script, marker = marker_script
    done = numarun(
        "--nnodes", "2", "--master-addr", "nosuchhost.invalid", script, cwd=tmp_path
    )
    assert done.returncode == 2
    assert done.stderr.startswith(
        "numarun: error: --master-addr 'nosuchhost.invalid' does not resolve ("
    )
    assert done.stderr.count("\n") == 1 and done.stdout == ""
    assert not marker.exists()

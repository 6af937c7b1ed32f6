"""Real torch.distributed (gloo) jobs started by ``numarun``, as a user would start them.

Each test launches ``python -m numarun ... gloo_allreduce.py`` and checks the collective's
result on every rank, where each rank ran, and that nothing is left behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from job_processes import processes_with_run_id
from numarun.placement.workerenv import free_port

pytest.importorskip("torch")

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
ALLREDUCE = str(PROGRAMS / "gloo_allreduce.py")


def _env() -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PET_", "SLURM_", "OMPI_", "TORCHELASTIC_"))
        and key not in ("MASTER_ADDR", "MASTER_PORT", "PYTHON_EXEC")
    }
    # gloo on loopback only: the test must not depend on the host's network setup.
    env["GLOO_SOCKET_IFNAME"] = "lo"
    return env


def _numarun(*argv: str) -> list[str]:
    return [sys.executable, "-m", "numarun", *argv]


def _results(stdout: str) -> dict[int, dict]:
    found = {}
    for line in stdout.splitlines():
        if line.startswith("{"):
            result = json.loads(line)
            found[result["rank"]] = result
    return found


def test_four_rank_allreduce_bound_as_planned() -> None:
    cpus = ["0", "1", "0", "1"]
    binding = [arg for cpu in cpus for arg in ("--rank-cpus", cpu)]
    done = subprocess.run(
        _numarun("--nproc-per-node", "4", *binding, ALLREDUCE),
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert done.returncode == 0, done.stderr
    results = _results(done.stdout)
    assert sorted(results) == [0, 1, 2, 3]
    for rank, result in results.items():
        assert result["sum"] == 10.0  # 1 + 2 + 3 + 4
        assert result["world_size"] == 4
        assert result["cpus"] == cpus[rank]


def test_two_launchers_on_loopback_act_as_two_nodes() -> None:
    port = str(free_port())
    common = ["--nnodes", "2", "--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
    nodes = [
        subprocess.Popen(
            _numarun(*common, "--master-port", port, "--node-rank", str(node), ALLREDUCE),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        for node in (0, 1)
    ]
    outputs = [node.communicate(timeout=120) for node in nodes]
    for node, (_, stderr) in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, stderr
    node0, node1 = (_results(stdout) for stdout, _ in outputs)
    assert sorted(node0) == [0, 1] and sorted(node1) == [2, 3]
    assert all(result["sum"] == 10.0 for result in (*node0.values(), *node1.values()))


def test_a_rank_raising_mid_job_ends_the_job_with_its_summary() -> None:
    run_id = f"e2e-raise-{os.getpid()}"
    done = subprocess.run(
        _numarun(
            "--nproc-per-node",
            "3",
            "--grace-period",
            "5",
            "--rdzv-id",
            run_id,
            ALLREDUCE,
            "--raise-at",
            "1",
        ),
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert done.returncode == 1, done.stderr
    tail = done.stderr[done.stderr.rindex("Root cause") :]
    assert "rank 1" in tail.splitlines()[0]
    assert "RuntimeError: rank 1 gave up mid-job" in tail
    assert done.stderr.rstrip().endswith("=" * 20)
    assert processes_with_run_id(run_id) == []

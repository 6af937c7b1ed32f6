"""Scheduler environments that are wrong or huge: one line, exit 2, bounded time and memory."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from numarun.cmdline.clusterenv import expand_nodelist, first_host, node_facts_from_env
from numarun.errors import UsageError
from numarun.launch.launcher import parse_args

SLURM = {
    "SLURM_JOB_ID": "42",
    "SLURM_NODEID": "2",
    "SLURM_NNODES": "4",
    "SLURM_JOB_NODELIST": "gpu[07-10]",
}
MPI = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "3"}


@pytest.mark.parametrize(
    ("env", "name"),
    [
        ({**SLURM, "SLURM_NODEID": "-1"}, "SLURM_NODEID"),
        ({**SLURM, "SLURM_NODEID": "+1"}, "SLURM_NODEID"),
        ({**SLURM, "SLURM_NODEID": "1_0"}, "SLURM_NODEID"),
        ({**SLURM, "SLURM_NODEID": "\u0661"}, "SLURM_NODEID"),  # ARABIC-INDIC DIGIT ONE
        ({**SLURM, "SLURM_NNODES": "0"}, "SLURM_NNODES"),
        ({**SLURM, "SLURM_NNODES": "-4"}, "SLURM_NNODES"),
        ({**SLURM, "SLURM_LOCALID": "-1"}, "SLURM_LOCALID"),
        ({**MPI, "OMPI_COMM_WORLD_RANK": "-2"}, "OMPI_COMM_WORLD_RANK"),
        ({**MPI, "OMPI_COMM_WORLD_SIZE": "0"}, "OMPI_COMM_WORLD_SIZE"),
        ({**MPI, "OMPI_COMM_WORLD_LOCAL_RANK": "-1"}, "OMPI_COMM_WORLD_LOCAL_RANK"),
    ],
)
def test_negative_or_odd_scheduler_numbers_are_refused(env: dict[str, str], name: str) -> None:
    with pytest.raises(UsageError, match=name) as caught:
        node_facts_from_env(env)
    assert "\n" not in str(caught.value)


def test_a_negative_mpi_rank_never_becomes_a_negative_rank() -> None:
    with pytest.raises(UsageError, match=r"OMPI_COMM_WORLD_RANK=-2 .*negative"):
        parse_args(
            ["--master-addr", "h0", "t.py"],
            {"PATH": os.defpath, **MPI, "OMPI_COMM_WORLD_RANK": "-2"},
        )


def test_first_host_matches_the_full_expansion() -> None:
    for text in ["login1", "gpu[01-04,07],login1", "n[08-10]", "r[1-2]n[3-4]", "a[5],b[1-2]"]:
        assert first_host(text) == expand_nodelist(text)[0]


@pytest.mark.parametrize(
    "text", ["gpu[01-04", "gpu]1", "a,,b", "n[x-2]", "n[3-1]", "n[[1]]", "", "a,b[2-1]"]
)
def test_first_host_checks_the_whole_list(text: str) -> None:
    with pytest.raises(UsageError, match="Slurm node list"):
        first_host(text)


def test_a_huge_node_list_is_not_expanded() -> None:
    # 10**15 hosts, then 200,000 more items: expanding any of it would exhaust memory.
    text = "n[000000000000000-999999999999999]," + ",".join(f"m{i}" for i in range(200_000))
    assert first_host(text) == "n000000000000000"
    facts = node_facts_from_env({**SLURM, "SLURM_JOB_NODELIST": text})
    assert facts is not None and facts.master_addr == "n000000000000000"


def test_a_huge_bad_list_gives_a_short_line() -> None:
    with pytest.raises(UsageError) as caught:
        first_host("n[1-2]," * 100_000 + "x[")
    assert len(str(caught.value)) < 200


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def test_launcher_with_a_huge_node_list_dry_runs_in_bounded_memory(tmp_path: Path) -> None:
    script = tmp_path / "t.py"
    script.write_text("")
    env = {
        **os.environ,
        **SLURM,
        "SLURM_NODEID": "0",
        "SLURM_JOB_NODELIST": "n[0-99999999999]",
    }
    done = subprocess.run(
        [sys.executable, "-m", "numarun", "--dry-run", "--nproc-per-node", "1", str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_limit_memory,
    )
    assert done.returncode == 0, done.stderr
    assert "MASTER_ADDR=n0" in done.stdout


def test_launcher_refuses_a_negative_node_id_in_one_line(tmp_path: Path) -> None:
    script = tmp_path / "t.py"
    script.write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "numarun", "--dry-run", str(script)],
        env={**os.environ, **SLURM, "SLURM_NODEID": "-1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "SLURM_NODEID=-1" in done.stderr
    assert "Traceback" not in done.stderr

"""numarun.cmdline.clusterenv: node facts from a Slurm job step or an Open MPI job (node rank,
node count, the master host from the node list), and what flags win over them."""

from __future__ import annotations

import os

import pytest

from numarun.cmdline.clusterenv import expand_nodelist, node_facts_from_env
from numarun.errors import UsageError
from numarun.launch.launcher import LaunchConfig, parse_args

CLEAN_ENV: dict[str, str] = {"PATH": os.environ.get("PATH", os.defpath)}


def parse(*argv: str, **environ: str) -> LaunchConfig:
    return parse_args(list(argv), {**CLEAN_ENV, **environ})


# --- Slurm and Open MPI ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("login1", ["login1"]),
        ("gpu[01-04,07],login1", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "login1"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("a,b[1-2],c[5]", ["a", "b1", "b2", "c5"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("node-a[1,3]-ib", ["node-a1-ib", "node-a3-ib"]),
    ],
)
def test_expand_nodelist(text: str, hosts: list[str]) -> None:
    assert expand_nodelist(text) == hosts


@pytest.mark.parametrize("text", ["gpu[01-04", "gpu]1", "a,,b", "n[x-2]", "n[3-1]", "n[[1]]", ""])
def test_expand_nodelist_refuses_malformed_lists(text: str) -> None:
    with pytest.raises(UsageError, match="Slurm node list"):
        expand_nodelist(text)


SLURM = {
    "SLURM_JOB_ID": "42",
    "SLURM_NODEID": "2",
    "SLURM_NNODES": "4",
    "SLURM_JOB_NODELIST": "gpu[07-10]",
}


def test_slurm_environment_gives_node_facts() -> None:
    config = parse("--nproc-per-node", "8", "t.py", **SLURM)
    assert (config.node_source, config.nnodes, config.node_rank) == ("slurm", 4, 2)
    assert config.master_addr == "gpu07"
    assert config.master_port == 29500
    assert config.global_rank(3) == 19 and config.world_size == 32


def test_slurm_step_values_and_explicit_flags_win() -> None:
    step = {**SLURM, "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NODELIST": "gpu[09-10]"}
    config = parse("t.py", **{**step, "SLURM_NODEID": "1"})
    assert (config.nnodes, config.master_addr) == (2, "gpu09")
    assert parse("--master-addr", "head", "t.py", **SLURM).master_addr == "head"
    assert parse("t.py", **SLURM, MASTER_ADDR="ib-head", MASTER_PORT="7000").master_port == 7000
    flags = parse("--nnodes", "1", "t.py", **SLURM)
    assert (flags.node_source, flags.nnodes, flags.node_rank) == ("flags", 1, 0)
    assert parse("--standalone", "t.py", **SLURM).nnodes == 1


def test_slurm_needs_job_id_node_id_and_count() -> None:
    partial = {key: value for key, value in SLURM.items() if key != "SLURM_JOB_ID"}
    assert parse("t.py", **partial).node_source == "flags"
    assert node_facts_from_env({"SLURM_JOB_ID": "1", "SLURM_NODEID": "0"}) is None
    with pytest.raises(UsageError, match="SLURM_NODEID"):
        parse("t.py", **{**SLURM, "SLURM_NODEID": "x"})


def test_slurm_with_several_tasks_per_node_is_refused() -> None:
    with pytest.raises(UsageError, match="--ntasks-per-node=1"):
        parse("t.py", **SLURM, SLURM_LOCALID="3")
    assert parse("t.py", **SLURM, SLURM_LOCALID="0").node_rank == 2


def test_slurm_without_a_node_list_needs_master_addr() -> None:
    no_list = {key: value for key, value in SLURM.items() if key != "SLURM_JOB_NODELIST"}
    with pytest.raises(UsageError, match=r"Slurm without SLURM_JOB_NODELIST.*--master-addr"):
        parse("t.py", **no_list)


def test_open_mpi_environment_gives_node_facts_but_needs_master_addr() -> None:
    mpi = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "3"}
    config = parse("--master-addr", "h0", "--nproc-per-node", "2", "t.py", **mpi)
    assert (config.node_source, config.nnodes, config.node_rank) == ("mpi", 3, 1)
    assert config.global_rank(1) == 3
    assert parse("t.py", **mpi, MASTER_ADDR="h1").master_addr == "h1"
    with pytest.raises(UsageError, match="--master-addr"):
        parse("t.py", **mpi)
    with pytest.raises(UsageError, match="-npernode 1"):
        parse("--master-addr", "h0", "t.py", **mpi, OMPI_COMM_WORLD_LOCAL_RANK="1")
    # mpirun inside a Slurm allocation: mpirun started us, its numbering wins.
    assert parse("--master-addr", "h0", "t.py", **mpi, **SLURM).node_source == "mpi"

"""The ``numarun`` launcher: torchrun's flags, worker environment, node facts, exit codes.

Pure parts (``parse_args``, ``rank_env``, ``exit_code_for``, node-list expansion) are tested
directly; the rest through ``python -m numarun`` with tiny workers from ``tests/programs/``.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from numarun.errors import UsageError
from numarun.launch import launcher
from numarun.launch.launcher import LaunchConfig, parse_args
from numarun.launch.rendezvous import expand_nodelist, node_facts_from_env
from numarun.launch.report import exit_code_for
from numarun.launch.workers import rank_env, worker_argv

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
REPORT = str(PROGRAMS / "rank_report.py")
EXIT = str(PROGRAMS / "rank_exit.py")
WAIT = str(PROGRAMS / "signal_forward_wait.py")
CLEAN_ENV: dict[str, str] = {"PATH": os.environ.get("PATH", os.defpath)}


def parse(*argv: str, **environ: str) -> LaunchConfig:
    return parse_args(list(argv), {**CLEAN_ENV, **environ})


# --- flags ----------------------------------------------------------------------------------------


def test_defaults_for_a_script() -> None:
    config = parse("train.py")
    assert config.entrypoint == "train.py"
    assert config.entrypoint_kind == "script"
    assert config.args == ()
    assert (config.nproc_per_node, config.nnodes, config.node_rank) == (1, 1, 0)
    assert config.master_addr == "127.0.0.1"
    assert config.master_port is None  # a free port is picked at start on one node
    assert config.grace_period == 30.0
    assert config.numa_binding is None and config.mem_binding == "none"
    assert config.role == "default"
    assert config.teardown_signals == (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
    assert config.forward_signals == (signal.SIGUSR1, signal.SIGUSR2)
    assert config.python_exec == sys.executable
    assert len(config.run_id) == 12 and config.run_id != parse("train.py").run_id


@pytest.mark.parametrize(
    ("dash", "underscore", "value", "field", "expected"),
    [
        ("--nproc-per-node", "--nproc_per_node", "3", "nproc_per_node", 3),
        ("--node-rank", "--node_rank", "1", "node_rank", 1),
        ("--master-addr", "--master_addr", "10.0.0.1", "master_addr", "10.0.0.1"),
        ("--master-port", "--master_port", "1234", "master_port", 1234),
        ("--rdzv-id", "--rdzv_id", "job7", "run_id", "job7"),
        ("--log-dir", "--log_dir", "/tmp/x", "log_dir", "/tmp/x"),
        ("--local-ranks-filter", "--local_ranks_filter", "0", "local_ranks_filter", "0"),
        ("--numa-binding", "--numa_binding", "cpu", "numa_binding", "cpu"),
        ("--mem-binding", "--mem_binding", "local", "mem_binding", "local"),
        ("--start-method", "--start_method", "fork", "start_method", "fork"),
        ("--grace-period", "--grace_period", "7.5", "grace_period", 7.5),
        ("--shutdown-timeout", "--shutdown_timeout", "9", "grace_period", 9.0),
        ("--cpus-allowed", "--cpus_allowed", "1", "cpus_allowed", "1"),
    ],
)
def test_both_spellings_of_each_flag(
    dash: str, underscore: str, value: str, field: str, expected: object
) -> None:
    extra = ["--numa-binding", "cpu"] if field in ("mem_binding", "cpus_allowed") else []
    extra += ["--nnodes", "2"] if field == "node_rank" else []
    for spelling in (dash, underscore):
        for argv in ([spelling, value], [f"{spelling}={value}"]):
            config = parse(*extra, *argv, "train.py")
            assert getattr(config, field) == expected, (spelling, argv)


def test_boolean_flags_in_both_spellings(tmp_path: Path) -> None:
    assert parse("--no-python", "bin").entrypoint_kind == "binary"
    assert parse("--no_python", "bin").entrypoint_kind == "binary"
    assert parse("-m", "pkg.mod").entrypoint_kind == "module"
    assert parse("--module", "pkg.mod").entrypoint_kind == "module"
    assert parse("--run-path", "t.py").entrypoint_kind == "script"
    assert parse("--run_path", "t.py").entrypoint_kind == "script"
    assert parse("--dry_run", "t.py").dry_run
    assert parse("--binding_fallback", "t.py").binding_fallback
    assert parse("--standalone", "t.py").master_addr == "127.0.0.1"


def test_short_redirect_and_tee_flags() -> None:
    config = parse("--nproc-per-node", "2", "-r", "3", "-t", "0:1", "train.py")
    assert (config.redirects, config.tee) == ("3", "0:1")
    config = parse("--redirects=2", "--tee=3", "train.py")
    assert (config.redirects, config.tee) == ("2", "3")


def test_pet_variables_are_defaults_and_flags_win() -> None:
    config = parse(
        "train.py",
        PET_NPROC_PER_NODE="4",
        PET_NNODES="2",
        PET_NODE_RANK="1",
        PET_MASTER_ADDR="h0",
        PET_MASTER_PORT="2345",
        PET_ROLE="trainer",
        PET_TEE="3",
        PET_MODULE="1",
    )
    assert (config.nproc_per_node, config.nnodes, config.node_rank) == (4, 2, 1)
    assert (config.master_addr, config.master_port, config.role) == ("h0", 2345, "trainer")
    assert config.tee == "3"
    assert config.entrypoint_kind == "module"
    assert parse("--nproc-per-node", "2", "t.py", PET_NPROC_PER_NODE="4").nproc_per_node == 2
    assert parse("t.py", PET_STANDALONE="0").master_port is None
    assert parse("t.py", PET_SHUTDOWN_TIMEOUT="5").grace_period == 5.0
    with pytest.raises(UsageError, match="PET_NO_PYTHON"):
        parse("t.py", PET_NO_PYTHON="yes")


def test_worker_arguments_are_never_read_as_launcher_flags() -> None:
    # torchrun's prefix matching turns --node into --node-rank, --sig into --signals-to-handle...
    worker = ["--node", "3", "--sig", "x", "--master", "y", "--log", "z", "-m", "--", "-r", "9"]
    config = parse("--nproc-per-node", "2", "train.py", *worker)
    assert config.args == tuple(worker)
    assert config.nproc_per_node == 2 and config.node_rank == 0
    assert worker_argv(config)[-len(worker) - 1 :] == ["train.py", *worker]


def test_odd_arguments_reach_the_worker_unchanged() -> None:
    odd = ["a b", "'q'", '"dq"', "$HOME", "`id`", "line1\nline2", "", "*", "--x=y z", "é"]
    config = parse("train.py", *odd)
    assert config.args == tuple(odd)


def test_double_dash_ends_launcher_options() -> None:
    config = parse("--nproc-per-node", "2", "--", "--weird-name.py", "--flag")
    assert (config.entrypoint, config.args) == ("--weird-name.py", ("--flag",))


def test_unambiguous_prefixes_of_launcher_flags_are_spelled_out() -> None:
    config = parse("--nnode", "2", "--node_r", "1", "--nproc", "3", "--dry", "t.py", "--nnode")
    assert (config.nnodes, config.node_rank, config.nproc_per_node) == (2, 1, 3)
    assert config.dry_run
    assert config.args == ("--nnode",)  # after the script: the worker's, untouched
    assert parse("--nnode=2", "--master-p=7", "t.py").master_port == 7
    assert parse("--virt", "t.py").virtual_local_rank
    with pytest.raises(UsageError, match="ambiguous option: --master could match"):
        parse("--master", "h", "t.py")
    with pytest.raises(UsageError, match="unrecognized arguments: --nprocs"):
        parse("--nprocs", "2", "t.py")


def test_worker_argv_for_each_kind() -> None:
    bootstrap = "from numarun.launch.bootstrap import main; main()"
    script = parse("t.py", "a")
    assert worker_argv(script) == [sys.executable, "-u", "-c", bootstrap, "--", "t.py", "a"]
    module = parse("-m", "pkg.mod", "a")
    assert worker_argv(module) == [sys.executable, "-u", "-c", bootstrap, "-m", "pkg.mod", "a"]
    binary = parse("--no-python", "prog", "a")
    assert worker_argv(binary, "/usr/bin/prog") == ["/usr/bin/prog", "a"]
    assert parse("t.py", PYTHON_EXEC="/opt/py").python_exec == "/opt/py"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nproc-per-node", "0", "t.py"], "at least 1"),
        (["--nproc-per-node", "many", "t.py"], "positive integer"),
        (["--nproc-per-node", "xpu", "t.py"], "'gpu', 'cpu' or 'auto'"),
        (["--nnodes", "2:1", "t.py"], "MAX (1) must be at least MIN (2)"),
        (["--nnodes", "1:2:3", "t.py"], "N or MIN:MAX"),
        (["--nnodes", "0", "t.py"], "at least 1"),
        (["--nnodes", "2", "--node-rank", "2", "t.py"], "out of range"),
        (["--nnodes", "1:2", "--node-rank", "2", "t.py"], "out of range"),
        (["--max-restarts", "-1", "t.py"], "at least 0"),
        (["--rdzv-backend", "zookeeper", "t.py"], "unknown --rdzv-backend 'zookeeper'"),
        (["--rdzv-backend", "etcd", "t.py"], "python-etcd"),
        (["--rdzv-backend", "etcd-v2", "t.py"], "python-etcd"),
        (["--rdzv-backend", "", "t.py"], "needs a name"),
        (["--rdzv-conf", "a", "t.py"], "'a' has no value"),
        (["--rdzv-conf", "=1", "t.py"], "KEY=VALUE"),
        (["--rdzv-conf", "timeout=soon", "t.py"], "timeout=soon: must be a whole number"),
        (["--rdzv-backend", "c10d", "--rdzv-conf", "join_timeout=0", "t.py"], "whole number"),
        (["--rdzv-backend", "c10d", "--rdzv-conf", "is_host=maybe", "t.py"], "true or false"),
        (["--rdzv-backend", "c10d", "--rdzv-conf", "store_type=redis", "t.py"], "tcp or file"),
        (["--rdzv-backend", "c10d", "--rdzv-endpoint", "h:99999", "t.py"], "0..65535"),
        (["--monitor-interval", "0", "t.py"], "> 0 seconds"),
        (["--master-port", "70000", "t.py"], "0..65535"),
        (["--rdzv-id", "../up", "t.py"], "cannot name a log directory"),
        (["--master-port", "0", "--nnodes", "2", "t.py"], "fixed port"),
        (["--master-addr", "a", "--rdzv-endpoint", "b:1", "t.py"], "disagree"),
        (["-m", "--no-python", "x"], "cannot be combined"),
        (["--nproc-per-node", "2", "--rank-cpus", "0", "t.py"], "exactly one per local rank"),
        (["--rank-cpus", "0", "--numa-binding", "cpu", "t.py"], "cannot be combined"),
        (["--numa-binding", "explicit", "t.py"], "--rank-cpus"),
        (["--numa-binding", "diagonal", "t.py"], "unknown --numa-binding"),
        (["--rank-cpus", "0-", "t.py"], "invalid CPU list"),
        (["--mem-binding", "bind", "t.py"], "needs a CPU binding"),
        (["--mem-binding", "strict", "--numa-binding", "cpu", "t.py"], "unknown --mem-binding"),
        (["-r", "5", "t.py"], "--redirects"),
        (["--tee", "0:", "t.py"], "--tee"),
        (["--local-ranks-filter", "0;1", "t.py"], "--local-ranks-filter"),
        (["--grace-period", "-1", "t.py"], "seconds"),
        (["--signals-to-handle", "SIGNOPE", "t.py"], "unknown signal"),
        (["--signals-to-handle", "SIGKILL", "t.py"], "cannot be caught"),
        (["--start-method", "thread", "t.py"], "--start-method"),
        (["--sysfs-root", "/tmp", "t.py"], "--dry-run"),
        (["--cpus-allowed", "0", "t.py"], "add --numa-binding"),
        (["--standalone", "--nnodes", "2", "t.py"], "one node"),
        (["--nproc-per-node", "2"], "missing the training script"),
        ([], "missing the training script"),
        (["--bogus", "t.py"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_input_raises_one_line_usage_error(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError) as raised:
        parse(*argv)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_nproc_per_node_words() -> None:
    assert parse("--nproc-per-node", "cpu", "t.py").nproc_per_node == os.cpu_count()
    # No GPU here: 'auto' falls back to the CPU count and 'gpu' refuses.
    assert parse("--nproc-per-node", "auto", "t.py").nproc_per_node == os.cpu_count()
    with pytest.raises(UsageError, match="no visible GPUs"):
        parse("--nproc-per-node", "gpu", "t.py")


@pytest.fixture(scope="module")
def gpu_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two nodes x 16 cores, SMT off, GPUs 0-1 on node 0 and 2-3 on node 1."""
    from sysfs_fixtures import smt_off, write_sysfs

    return write_sysfs(smt_off(), tmp_path_factory.mktemp("gpus"))


def test_nproc_per_node_gpu_counts_the_gpus_of_a_fake_machine(gpu_root: Path) -> None:
    root = gpu_root
    config = parse("--dry-run", "--sysfs-root", str(root), "--nproc-per-node", "gpu", "t.py")
    assert config.nproc_per_node == 4
    config = parse("--dry-run", "--sysfs-root", str(root), "--nproc-per-node", "auto", "t.py")
    assert config.nproc_per_node == 4
    config = parse("--dry-run", "--sysfs-root", str(root), "--nproc-per-node", "cpu", "t.py")
    assert config.nproc_per_node == 32


def test_rank_cpus_set_nproc_and_explicit_binding() -> None:
    config = parse("--rank-cpus", "1", "--rank-cpus", "0", "t.py")
    assert config.nproc_per_node == 2
    assert config.rank_cpus == ((1,), (0,))
    assert config.numa_binding == "explicit"


def test_rdzv_endpoint_is_master_addr_and_port() -> None:
    config = parse("--rdzv-endpoint", "node7:4000", "--nnodes", "2", "t.py")
    assert (config.master_addr, config.master_port) == ("node7", 4000)
    config = parse("--rdzv_endpoint=[fe80::1]:4001", "t.py")
    assert (config.master_addr, config.master_port) == ("fe80::1", 4001)
    assert parse("--rdzv-endpoint", "node7", "t.py").master_addr == "node7"


def test_master_port_0_on_one_node_means_a_free_port() -> None:
    assert parse("--master-port", "0", "t.py").master_port is None
    assert parse("--master-port", "29511", "t.py").master_port == 29511


def test_multi_node_defaults_to_port_29500() -> None:
    config = parse("--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "4", "t.py")
    assert config.master_port == 29500
    assert config.world_size == 8
    assert [config.global_rank(i) for i in range(4)] == [4, 5, 6, 7]
    assert parse("--nnodes", "2:2", "t.py").nnodes == 2


def test_monitor_interval_and_start_method_are_accepted() -> None:
    config = parse("--monitor-interval", "5", "--start-method", "forkserver", "t.py")
    assert config.start_method == "forkserver"
    with pytest.raises(UsageError, match="--monitor-interval"):
        parse("--monitor-interval", "soon", "t.py")


def test_grace_period_from_torch_elastic_shutdown_timeout() -> None:
    assert parse("t.py", TORCH_ELASTIC_SHUTDOWN_TIMEOUT="600").grace_period == 600.0
    config = parse("--grace-period", "3", "t.py", TORCH_ELASTIC_SHUTDOWN_TIMEOUT="600")
    assert config.grace_period == 3.0


def test_signals_to_handle_has_torchruns_meaning_and_keeps_forwarding_unlisted_usr() -> None:
    config = parse("--signals-to-handle", "SIGTERM,SIGINT,SIGHUP,SIGQUIT", "t.py")
    assert signal.SIGQUIT in config.teardown_signals
    assert config.forward_signals == (signal.SIGUSR1, signal.SIGUSR2)
    assert config.signals_to_handle == "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
    config = parse("t.py", TORCHELASTIC_SIGNALS_TO_HANDLE="SIGQUIT")
    assert signal.SIGQUIT in config.teardown_signals
    # Listed SIGUSR1 stops the job (torchrun: the workers get SIGUSR1, then SIGKILL); the
    # unlisted SIGUSR2 keeps numarun's forward-and-go-on; SIGQUIT left out no longer stops it.
    config = parse("--signals-to-handle", "USR1, 15", "t.py")
    assert config.teardown_signals == (
        signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1
    )  # fmt: skip
    assert config.forward_signals == (signal.SIGUSR2,)
    assert config.signals_to_handle == "USR1, 15"
    config = parse("t.py", PET_SIGNALS_TO_HANDLE="SIGUSR2")
    assert signal.SIGUSR2 in config.teardown_signals
    assert signal.SIGQUIT not in config.teardown_signals


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


def test_help_prints_usage_and_returns_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert launcher.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: numarun [options]")
    assert "--nproc-per-node" in out and "--mem-binding" in out


def test_main_turns_bad_input_into_one_line_and_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert launcher.main(["--nproc-per-node", "two", "t.py"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("numarun: error: --nproc-per-node must be a positive integer")
    assert err.endswith("not 'two'\n") and err.count("\n") == 1


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


# --- worker environment ---------------------------------------------------------------------------


def _env(config: LaunchConfig, local_rank: int, base: dict[str, str] | None = None, **kw):
    return rank_env(
        config, local_rank, base=base or {}, master_port=1234, error_file="/e.json", **kw
    )


def test_rank_env_is_torchruns_set() -> None:
    config = parse(
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--nproc-per-node",
        "3",
        "--role",
        "trainer",
        "--master-addr",
        "h0",
        "--rdzv-id",
        "run9",
        "t.py",
    )
    env = _env(config, 2)
    assert env == {
        "LOCAL_RANK": "2",
        "RANK": "5",
        "GROUP_RANK": "1",
        "ROLE_RANK": "5",
        "ROLE_NAME": "trainer",
        "LOCAL_WORLD_SIZE": "3",
        "WORLD_SIZE": "6",
        "GROUP_WORLD_SIZE": "2",
        "ROLE_WORLD_SIZE": "6",
        "MASTER_ADDR": "h0",
        "MASTER_PORT": "1234",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": "run9",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_ERROR_FILE": "/e.json",
        "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "OMP_NUM_THREADS": "1",
    }


def test_rank_env_keeps_user_omp_and_nccl_settings_and_applies_plan_env() -> None:
    config = parse("t.py")
    base = {
        "OMP_NUM_THREADS": "7",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
        "CUDA_DEVICE_ORDER": "FASTEST_FIRST",
    }
    env = _env(config, 0, base, plan_env=(("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),))
    assert "OMP_NUM_THREADS" not in env and "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in env
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_omp_threads_follow_the_binding_else_the_unbound_share() -> None:
    config = parse("t.py")
    binding = SimpleNamespace(threads=6)
    assert _env(config, 0, binding=binding)["OMP_NUM_THREADS"] == "6"
    assert _env(config, 0, unbound_threads=4)["OMP_NUM_THREADS"] == "4"
    assert _env(config, 0, unbound_threads=0)["OMP_NUM_THREADS"] == "1"


def test_unbound_threads_count_physical_cores_once(tmp_path: Path) -> None:
    from numarun.placement import workerenv

    for cpu, siblings in ((4, "4,68"), (68, "4,68"), (5, "5")):
        topo = tmp_path / f"sys/devices/system/cpu/cpu{cpu}/topology"
        topo.mkdir(parents=True)
        (topo / "thread_siblings_list").write_text(siblings + "\n")
    assert workerenv.allowed_physical_cores(str(tmp_path), {4, 68, 5}) == 2
    assert workerenv.allowed_physical_cores(str(tmp_path), {4, 5, 6, 7}) == 4  # 6, 7 unreadable
    assert workerenv.allowed_physical_cores(str(tmp_path), set()) == 1


# --- exit codes -----------------------------------------------------------------------------------


def _result(
    exit_code: int | None = None, received: int | None = None, stop_reason: str | None = None
) -> SimpleNamespace:
    failure = None if exit_code is None else SimpleNamespace(exit_code=exit_code)
    return SimpleNamespace(
        workers=[], first_failure=failure, received_signal=received, stop_reason=stop_reason
    )


@pytest.mark.parametrize(
    ("exit_code", "received", "expected"),
    [
        (None, None, 0),
        (3, None, 3),
        (-9, None, 137),
        (-11, None, 139),
        (None, signal.SIGINT, 130),
        (-15, signal.SIGTERM, 143),
        (1, signal.SIGHUP, 129),
    ],
)
def test_exit_code_for(exit_code: int | None, received: int | None, expected: int) -> None:
    assert exit_code_for(_result(exit_code, received)) == expected


def test_a_run_stopped_through_request_stop_is_a_failure() -> None:
    # A hang (--hang-timeout) or the rendezvous ends a run through Supervisor.request_stop:
    # no worker failed, but the run did not succeed.
    assert exit_code_for(_result(None, None, stop_reason="rendezvous closed")) == 1
    assert exit_code_for(_result(3, None, stop_reason="rendezvous closed")) == 3
    assert exit_code_for(_result(None, signal.SIGINT, stop_reason="x")) == 130
    # A hang is 124 (as timeout(1)), even when a rank then exits non-zero in the teardown.
    assert exit_code_for(_result(None, None, stop_reason="hang: rank 1")) == 124
    assert exit_code_for(_result(3, None, stop_reason="hang: rank 1")) == 124


# --- real runs through ``python -m numarun`` ------------------------------------------------


def _child_env(**extra: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PET_", "SLURM_", "OMPI_", "TORCHELASTIC_"))
        and key not in ("OMP_NUM_THREADS", "MASTER_ADDR", "MASTER_PORT", "PYTHON_EXEC")
    }
    env.update(extra)
    return env


def launch(
    *argv: str, cwd: Path | None = None, timeout: float = 60, **extra: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "numarun", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=_child_env(**extra),
    )


def reports(stdout: str) -> dict[int, dict]:
    """The rank_report.py lines of a run, by global rank (prefixed tee lines included)."""
    found = {}
    for line in stdout.splitlines():
        start = line.find("{")
        if start >= 0:
            report = json.loads(line[start:])
            found[report["rank"]] = report
    return found


def test_workers_get_the_environment_and_their_arguments(tmp_path: Path) -> None:
    odd = ["--node", "1", "a b", "$HOME", "it's", "two\nlines", ""]
    done = launch("--nproc-per-node", "2", "--rdzv-id", "envtest", REPORT, *odd, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    found = reports(done.stdout)
    assert sorted(found) == [0, 1]
    ports = {found[rank]["env"]["MASTER_PORT"] for rank in found}
    assert len(ports) == 1 and int(ports.pop()) > 0
    for rank, report in found.items():
        env = report["env"]
        assert report["argv"] == odd
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == (str(rank), str(rank), "2")
        assert env["LOCAL_WORLD_SIZE"] == "2" and env["GROUP_RANK"] == "0"
        assert env["TORCHELASTIC_RUN_ID"] == "envtest"
        assert env["TORCHELASTIC_USE_AGENT_STORE"] == "False"
        assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
        assert int(env["OMP_NUM_THREADS"]) >= 1
        error_file = env["TORCHELASTIC_ERROR_FILE"]
        assert error_file.endswith(f"/envtest/attempt_0/{rank}/error.json")
        # No --log-dir: the temporary directory is gone after the run.
        assert not Path(error_file).parent.exists()


def test_a_slurm_job_step_sets_node_facts_from_the_environment(tmp_path: Path) -> None:
    slurm = {"SLURM_JOB_ID": "77", "SLURM_NODEID": "0", "SLURM_NNODES": "1"}
    done = launch(REPORT, cwd=tmp_path, SLURM_JOB_NODELIST="localhost,n[1-2]", **slurm)
    assert done.returncode == 0, done.stderr
    env = reports(done.stdout)[0]["env"]
    assert (env["MASTER_ADDR"], env["GROUP_WORLD_SIZE"], env["WORLD_SIZE"]) == (
        "localhost",
        "1",
        "1",
    )


def test_user_omp_num_threads_is_kept(tmp_path: Path) -> None:
    done = launch(REPORT, cwd=tmp_path, OMP_NUM_THREADS="5")
    assert done.returncode == 0, done.stderr
    assert reports(done.stdout)[0]["env"]["OMP_NUM_THREADS"] == "5"


def test_module_and_binary_entry_points(tmp_path: Path) -> None:
    done = launch("--nproc-per-node", "2", "-m", "rank_report", "x", cwd=PROGRAMS)
    assert done.returncode == 0, done.stderr
    assert sorted(reports(done.stdout)) == [0, 1]
    assert reports(done.stdout)[1]["argv"] == ["x"]
    shell = launch(
        "--nproc-per-node", "2", "--no-python", "sh", "-c", 'echo "r=$RANK"', cwd=tmp_path
    )
    assert shell.returncode == 0, shell.stderr
    assert sorted(shell.stdout.split()) == ["r=0", "r=1"]


def test_each_worker_is_bound_as_planned(tmp_path: Path) -> None:
    done = launch("--rank-cpus", "1", "--rank-cpus", "0", REPORT, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    found = reports(done.stdout)
    assert (found[0]["cpus"], found[1]["cpus"]) == ("1", "0")
    assert found[0]["env"]["OMP_NUM_THREADS"] == "1"


def test_cpu_mode_splits_the_cores_and_applies_the_memory_policy(tmp_path: Path) -> None:
    done = launch(
        "--nproc-per-node", "2", "--numa-binding", "cpu", "--mem-binding", "bind", REPORT,
        cwd=tmp_path, NUMARUN_TEST_MEMPOLICY="1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = reports(done.stdout)
    assert sorted(report["cpus"] for report in found.values()) == ["0", "1"]
    assert all(report["mem"] == ["bind", [0]] for report in found.values())
    unbound = launch(REPORT, cwd=tmp_path, NUMARUN_TEST_MEMPOLICY="1")
    assert reports(unbound.stdout)[0]["mem"] == ["default", []]


def test_redirects_write_files_in_torchruns_layout(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    done = launch(
        "--nproc-per-node",
        "2",
        "--log-dir",
        str(logs),
        "--rdzv-id",
        "job1",
        "-r",
        "0:1,1:3",
        REPORT,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert reports(done.stdout) == {}  # both ranks' stdout went to files
    for rank in (0, 1):
        stdout = (logs / "job1/attempt_0" / str(rank) / "stdout.log").read_text()
        assert reports(stdout)[rank]["env"]["TORCHELASTIC_ERROR_FILE"] == str(
            logs / "job1/attempt_0" / str(rank) / "error.json"
        )
    assert (logs / "job1/attempt_0/1/stderr.log").exists()
    assert not (logs / "job1/attempt_0/0/stderr.log").exists()


def test_tee_prefixes_console_lines_and_filter_hides_ranks(tmp_path: Path) -> None:
    done = launch("--nproc-per-node", "2", "--tee", "3", REPORT, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if "{" in line]
    assert sorted(line.split("{", 1)[0] for line in lines) == ["[default0]:", "[default1]:"]
    # tee'd files live in a temporary dir, kept after a failure: the start line says where
    (start,) = done.stderr.splitlines()
    assert re.search(r", logs in \S+/numarun_\w+ \(removed if the run succeeds", start), start
    shown = launch("--nproc-per-node", "2", "--local-ranks-filter", "1", REPORT, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert sorted(reports(shown.stdout)) == [1]


def test_a_ranks_filter_beyond_the_local_ranks_runs_with_one_warning(tmp_path: Path) -> None:
    # torchrun accepts --local-ranks-filter 0,1,2,3 with 2 processes (torchchat's scripts pass
    # it on machines with fewer GPUs); numarun used to refuse it.
    config = parse("--nproc-per-node", "2", "--local-ranks-filter", "0,1,2,3", "t.py")
    assert len(config.warnings) == 1 and "local ranks 2, 3" in config.warnings[0]
    done = launch(
        "--nproc-per-node", "2", "--local-ranks-filter", "1,2,3", REPORT, cwd=tmp_path
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(reports(done.stdout)) == [1]
    warnings = [line for line in done.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1, done.stderr
    assert warnings[0].startswith("numarun: warning: --local-ranks-filter '1,2,3' names local")


def _last_block(stderr: str) -> str:
    """The failure summary: from the last '====' rule that opens a block to the end."""
    lines = stderr.rstrip("\n").splitlines()
    assert lines and lines[-1].startswith("====="), stderr
    start = max(i for i, line in enumerate(lines[:-1]) if line.startswith("====="))
    return "\n".join(lines[start:])


def test_worker_exit_code_becomes_the_launchers_and_summary_comes_last(tmp_path: Path) -> None:
    done = launch("--nproc-per-node", "2", EXIT, "1", "code", "3", cwd=tmp_path)
    assert done.returncode == 3
    summary = _last_block(done.stderr)
    assert "rank 1" in summary and "exit code 3" in summary


def test_worker_killed_by_signal_gives_128_plus_n(tmp_path: Path) -> None:
    done = launch("--nproc-per-node", "2", EXIT, "0", "signal", "9", cwd=tmp_path)
    assert done.returncode == 137
    assert "SIGKILL" in _last_block(done.stderr)


def test_raising_worker_summary_has_rank_and_traceback(tmp_path: Path) -> None:
    done = launch("--nproc-per-node", "2", EXIT, "1", "raise", "boom-from-rank-one", cwd=tmp_path)
    assert done.returncode == 1
    summary = _last_block(done.stderr)
    assert "rank 1" in summary
    assert "RuntimeError: boom-from-rank-one" in summary
    assert "Traceback" in summary and "rank_exit.py" in summary


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["missing.py"], "not found"),
        (["-m", "no_such_module_here"], "module 'no_such_module_here' not found"),
        (["--no-python", "./not-executable.txt"], "not executable"),
        (["--nproc-per-node", "0", REPORT], "at least 1"),
        (["--redirects", "0:9", REPORT], "--redirects"),
        (["-m", "--no-python", REPORT], "cannot be combined"),
        (["--nproc-per-node", "2", "--rank-cpus", "0", REPORT], "one per local rank"),
        (["--rank-cpus", "0", "--rank-cpus", "64", REPORT], "64"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_starts_nothing(
    tmp_path: Path, argv: list[str], message: str
) -> None:
    (tmp_path / "not-executable.txt").write_text("echo hi\n")
    done = launch(*argv, cwd=tmp_path, NUMARUN_TEST_REPORT_DIR=str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("numarun: error: ")
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert list(tmp_path.glob("*.json")) == []  # no worker ran
    assert done.stdout == ""


def test_dry_run_prints_plan_env_and_argv_and_starts_nothing(tmp_path: Path) -> None:
    done = launch(
        "--dry-run",
        "--rank-cpus",
        "1",
        "--rank-cpus",
        "0",
        REPORT,
        "--lr",
        "a b",
        cwd=tmp_path,
        NUMARUN_TEST_REPORT_DIR=str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    assert "explicit" in done.stdout
    assert "local rank 1 (rank 1, cpus 0):" in done.stdout
    bootstrap = "-c 'from numarun.launch.bootstrap import main; main()'"
    assert f"{bootstrap} -- {REPORT} --lr 'a b'" in done.stdout
    assert "env:  RANK=1" in done.stdout and "env:  WORLD_SIZE=2" in done.stdout
    assert list(tmp_path.glob("*.json")) == []


def test_dry_run_plans_for_a_fake_machine(tmp_path: Path, gpu_root: Path) -> None:
    root = gpu_root
    done = launch(
        "--dry-run",
        "--sysfs-root",
        str(root),
        "--nproc-per-node",
        "gpu",
        "--numa-binding",
        "exclusive",
        REPORT,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "local rank 3 (rank 3, cpus 24-31):" in done.stdout
    assert "local rank 0 (rank 0, cpus 0-7):" in done.stdout
    assert "env:  CUDA_DEVICE_ORDER=PCI_BUS_ID" in done.stdout
    assert "env:  OMP_NUM_THREADS=8" in done.stdout


def _complete(path: Path) -> bool:
    """The file exists and ends a line: the worker appends a whole line, but not atomically."""
    return path.exists() and path.read_text().endswith("\n")


def _wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _start_waiting_job(
    tmp_path: Path, nproc: int = 2, **popen: object
) -> tuple[subprocess.Popen[str], list[int]]:
    job = subprocess.Popen(
        [sys.executable, "-m", "numarun", "--nproc-per-node", str(nproc), WAIT, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_child_env(),
        **popen,
    )
    pid_files = [tmp_path / f"{rank}.pid" for rank in range(nproc)]
    try:
        _wait_for(lambda: all(path.exists() for path in pid_files) or job.poll() is not None)
        assert job.poll() is None, job.communicate()
    except BaseException:
        _end_job(job, tmp_path)
        raise
    return job, [int(path.read_text()) for path in pid_files]


def _end_job(job: subprocess.Popen[str], tmp_path: Path) -> str:
    """Let the workers finish; kill the launcher if it does not end (no test leaves one)."""
    (tmp_path / "stop").touch()
    try:
        return job.communicate(timeout=30)[1]
    except subprocess.TimeoutExpired:
        job.kill()
        return job.communicate()[1]


@pytest.mark.parametrize(("signum", "expected"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_to_launcher_tears_down_and_exits_128_plus_n(
    tmp_path: Path, signum: int, expected: int
) -> None:
    job, pids = _start_waiting_job(tmp_path)
    try:
        job.send_signal(signum)
        _, stderr = job.communicate(timeout=30)
    finally:
        _end_job(job, tmp_path)
    assert job.returncode == expected, stderr
    assert not any(_alive(pid) for pid in pids)


def test_sigusr1_is_forwarded_and_the_job_keeps_running(tmp_path: Path) -> None:
    job, _ = _start_waiting_job(tmp_path)
    try:
        job.send_signal(signal.SIGUSR1)
        marks = [tmp_path / f"{rank}.signals" for rank in (0, 1)]
        _wait_for(lambda: all(_complete(path) for path in marks))
        assert job.poll() is None
        assert all(path.read_text() == "SIGUSR1\n" for path in marks)
    finally:
        stderr = _end_job(job, tmp_path)
    assert job.returncode == 0, stderr


def _ignore_sighup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def test_a_hangup_ignored_as_under_nohup_leaves_the_job_running(tmp_path: Path) -> None:
    # pytorch/pytorch#76894: under nohup, torchrun's workers "Received 1 death signal".
    job, pids = _start_waiting_job(tmp_path, preexec_fn=_ignore_sighup)
    try:
        job.send_signal(signal.SIGHUP)
        time.sleep(0.5)  # a teardown would have begun by now
        assert job.poll() is None
        assert all(_alive(pid) for pid in pids)
    finally:
        stderr = _end_job(job, tmp_path)
    assert job.returncode == 0, stderr


def test_tee_through_the_launcher_loses_nothing(tmp_path: Path) -> None:
    # 1,000,000 lines across 4 ranks, each line written in two halves.
    per_rank = 250_000
    console = tmp_path / "console.txt"
    with console.open("wb") as out:
        job = subprocess.run(
            [sys.executable, "-m", "numarun", "--nproc-per-node", "4", "--tee", "3",
             "--log-dir", str(tmp_path / "logs"), str(PROGRAMS / "half_line_writer.py"),
             str(per_rank)],
            stdout=out, stderr=subprocess.PIPE, env=_child_env(), timeout=300,
        )  # fmt: skip
    assert job.returncode == 0, job.stderr
    lines = console.read_bytes().split(b"\n")
    assert lines.pop() == b""
    assert len(lines) == 4 * per_rank
    next_line = [0, 0, 0, 0]
    for line in lines:
        prefix, _, text = line.partition(b"]:")
        rank = int(prefix.removeprefix(b"[default"))
        assert text == b"r%d line %d" % (rank, next_line[rank]), line[:200]
        next_line[rank] += 1
    assert next_line == [per_rank] * 4
    logs = sorted((tmp_path / "logs").glob("*/attempt_0/*/stdout.log"))
    assert len(logs) == 4
    for rank, log in enumerate(logs):
        assert log.read_bytes() == b"".join(b"r%d line %d\n" % (rank, i) for i in range(per_rank))


def test_tee_shows_a_line_while_its_worker_still_runs(tmp_path: Path) -> None:
    # Live, not at exit: the worker waits for the test to have seen its line on the console.
    worker = tmp_path / "live.py"
    worker.write_text(
        "import os, sys, time\n"
        "print('hello', flush=True)\n"
        "while not os.path.exists(sys.argv[1]):\n"
        "    time.sleep(0.01)\n"
    )
    go = tmp_path / "go"
    job = subprocess.Popen(
        [sys.executable, "-m", "numarun", "--tee", "3", str(worker), str(go)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_child_env(),
    )
    try:
        assert job.stdout is not None
        ready, _, _ = select.select([job.stdout], [], [], 30)
        assert ready, "the tee'd line did not reach the console while the worker ran"
        assert job.stdout.readline() == b"[default0]:hello\n"
        assert job.poll() is None
    finally:
        go.touch()
        _, stderr = job.communicate(timeout=30)
    assert job.returncode == 0, stderr

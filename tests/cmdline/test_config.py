"""numarun.cmdline.config: torchrun's flags parsed as torchrun parses them (both spellings,
prefixes, PET_* defaults, the worker's arguments left alone), and numarun's own; bad input is
one line."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from numarun.errors import UsageError
from numarun.launch.launcher import LaunchConfig, parse_args
from numarun.launch.workersetup import worker_argv

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


def test_hang_timeout_option() -> None:
    from numarun.cmdline.config import parse_args
    from numarun.errors import UsageError

    assert parse_args(["t.py"]).hang_timeout is None
    assert parse_args(["--hang-timeout", "7.5", "t.py"]).hang_timeout == 7.5
    assert parse_args(["--hang_timeout=0", "t.py"]).hang_timeout is None  # 0: off
    assert parse_args(["t.py"], environ={"PET_HANG_TIMEOUT": "30"}).hang_timeout == 30.0
    assert parse_args(["--hang-t", "3", "t.py"]).hang_timeout == 3.0  # a prefix, as torchrun's
    for bad in ("-1", "soon", "inf"):
        with pytest.raises(UsageError, match="--hang-timeout must be"):
            parse_args(["--hang-timeout", bad, "t.py"])
    with pytest.raises(UsageError, match="add --redirects 3 or --tee 3"):
        parse_args(["--hang-timeout", "5", "--no-python", "prog"])
    assert parse_args(["--hang-timeout", "5", "--tee", "3", "--no-python", "prog"]).hang_timeout


@pytest.mark.parametrize(
    ("nproc", "timeout", "floor"),
    [("1", "0.001", "1"), ("4", "0.5", "1"), ("16", "1.5", "2"), ("64", "7", "8")],
)
def test_a_hang_timeout_below_the_sampling_floor_is_one_line(
    nproc: str, timeout: str, floor: str
) -> None:
    # Every rank is sampled once a second at the most often (and once per second per 8 ranks):
    # a shorter timeout would declare a healthy rank hung at its second unchanged sample.
    from numarun.stacks.hang import sampling_interval, timeout_floor

    with pytest.raises(UsageError) as refused:
        parse("--nproc-per-node", nproc, "--hang-timeout", timeout, "t.py")
    line = str(refused.value)
    assert "\n" not in line
    assert line.startswith(f"--hang-timeout {timeout} is shorter than the stack sampling can")
    assert f"sampled every {floor} s" in line and f"give at least {floor} s" in line
    # The floor is the watch's own interval, and the floor itself is accepted.
    assert timeout_floor(int(nproc)) == float(floor)
    assert sampling_interval(float(floor), int(nproc)) == float(floor)
    config = parse("--nproc-per-node", nproc, "--hang-timeout", floor, "t.py")
    assert config.hang_timeout == float(floor)

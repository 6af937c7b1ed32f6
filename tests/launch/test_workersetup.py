"""numarun.launch.workersetup: what each worker of a launch gets: its argv for each kind of
entry point, and torchrun's environment (ranks, master, OMP threads after the binding)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

from numarun.launch.launcher import LaunchConfig, parse_args
from numarun.launch.workersetup import rank_env, worker_argv

CLEAN_ENV: dict[str, str] = {"PATH": os.environ.get("PATH", os.defpath)}


def parse(*argv: str, **environ: str) -> LaunchConfig:
    return parse_args(list(argv), {**CLEAN_ENV, **environ})


def test_worker_argv_for_each_kind() -> None:
    bootstrap = "from numarun.worker.bootstrap import main; main()"
    script = parse("t.py", "a")
    assert worker_argv(script) == [sys.executable, "-u", "-c", bootstrap, "--", "t.py", "a"]
    module = parse("-m", "pkg.mod", "a")
    assert worker_argv(module) == [sys.executable, "-u", "-c", bootstrap, "-m", "pkg.mod", "a"]
    binary = parse("--no-python", "prog", "a")
    assert worker_argv(binary, "/usr/bin/prog") == ["/usr/bin/prog", "a"]
    assert parse("t.py", PYTHON_EXEC="/opt/py").python_exec == "/opt/py"


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

"""Several numarun nodes sharing one ``--log-dir`` (a network file system): one run directory
per node, named by node rank and host, torchrun's layout inside, no "already exists" lines, and
the start line and the summary say where every node's logs are. Each "node" is one launcher on
this machine; static nodes need no torch, c10d ones run under ``tests/torch_python.py``'s
interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from job_processes import processes_with_run_id
from numarun.files.logdir import host_label
from numarun.placement.workerenv import free_port
from torch_python import TORCH_PYTHON, torch_version

SRC = str(Path(__file__).resolve().parents[2] / "src")
LIMIT = 120.0
HOST = host_label()


def _env() -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PET_", "TORCHELASTIC_", "TORCH_", "NUMARUN_"))
        and key not in ("MASTER_ADDR", "MASTER_PORT")
    }
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    env["GLOO_SOCKET_IFNAME"] = "lo"
    return env


def _worker(tmp_path: Path) -> str:
    script = tmp_path / "w.py"
    # The failing rank fails once every rank of its node printed (else, under load, its
    # failure stops a slower rank before its line: nothing in its log, rightly).
    script.write_text(
        "import os, sys, time\n"
        "print('hello from rank', os.environ['RANK'], flush=True)\n"
        f"marks = {str(tmp_path)!r}\n"
        "open(os.path.join(marks, 'printed-' + os.environ['RANK']), 'w').close()\n"
        "if os.environ.get('FAIL_RANK', '-1') == os.environ['RANK']:\n"
        "    size = int(os.environ['LOCAL_WORLD_SIZE'])\n"
        "    first = int(os.environ['GROUP_RANK']) * size\n"
        "    deadline = time.monotonic() + 60\n"
        "    while time.monotonic() < deadline and not all(os.path.exists(os.path.join(\n"
        "            marks, f'printed-{r}')) for r in range(first, first + size)):\n"
        "        time.sleep(0.01)\n"
        "    sys.exit(3)\n"
    )
    return str(script)


def _start(python: str, *argv: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [python, "-m", "numarun", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**_env(), **env},
    )


def _finish(procs: list[subprocess.Popen[str]]) -> list[tuple[int, str]]:
    ended = []
    try:
        for proc in procs:
            _, stderr = proc.communicate(timeout=LIMIT)
            ended.append((proc.returncode, stderr))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return ended


def _check_layout(logs: Path, run_id: str, nproc: int) -> None:
    names = sorted(path.name for path in logs.iterdir())
    assert names == [f"{run_id}_node0_{HOST}", f"{run_id}_node1_{HOST}"]
    for node, name in enumerate(names):
        attempt = logs / name / "attempt_0"
        assert sorted(p.name for p in attempt.iterdir()) == [str(r) for r in range(nproc)]
        for local in range(nproc):
            out = (attempt / str(local) / "stdout.log").read_text()
            assert out == f"hello from rank {node * nproc + local}\n"


def test_two_static_nodes_sharing_a_log_dir_get_a_directory_each(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    run_id = f"sld-static-{os.getpid()}"
    worker = _worker(tmp_path)
    flags = ["--nnodes", "2", "--nproc-per-node", "2", "--log-dir", str(logs), "--rdzv-id",
             run_id, "--redirects", "3"]  # fmt: skip

    def node_argv(node: int) -> list[str]:
        # A port of its own per run: node 0 refuses one that something already listens on.
        return [*flags, "--master-port", str(port), "--node-rank", str(node), worker]

    port = free_port()
    procs = [_start(sys.executable, *node_argv(node), FAIL_RANK="3") for node in (0, 1)]
    (code0, err0), (code1, err1) = _finish(procs)
    assert code0 == 0, err0
    assert code1 == 3, err1
    _check_layout(logs, run_id, 2)
    for node, err in enumerate((err0, err1)):
        assert "already exists" not in err
        start = next(line for line in err.splitlines() if line.startswith(f"numarun: run {run_id}"))
        assert start.endswith(
            f"logs in {logs}/{run_id}_node{node}_{HOST} (this node; every node's: "
            f"{run_id}_node<K>_<HOST>[_<random>] beside it)"
        )
    assert (
        f"Logs: {logs}/{run_id}_node1_{HOST} (this node; every node's: "
        f"{run_id}_node<K>_<HOST>[_<random>] beside it)"
    ) in err1
    # The same job again: new directories beside the old ones, still named by node, silently.
    port = free_port()
    again = _finish([_start(sys.executable, *node_argv(node)) for node in (0, 1)])
    assert [code for code, _ in again] == [0, 0], again
    assert not any("already exists" in err for _, err in again)
    for node in (0, 1):
        named = sorted(logs.glob(f"{run_id}_node{node}_{HOST}*"))
        assert len(named) == 2 and named[1].name.startswith(f"{run_id}_node{node}_{HOST}_")


def test_two_c10d_nodes_sharing_a_log_dir_are_named_after_their_first_round(
    tmp_path: Path,
) -> None:
    if torch_version() is None:
        pytest.skip(f"torch is not installed for {TORCH_PYTHON}")
    logs = tmp_path / "logs"
    run_id = f"sld-c10d-{os.getpid()}"
    worker = _worker(tmp_path)
    flags = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
             "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", run_id,
             "--log-dir", str(logs), "--redirects", "3"]  # fmt: skip
    try:
        ended = _finish([_start(TORCH_PYTHON, *flags, worker) for _ in range(2)])
    finally:
        assert processes_with_run_id(run_id) == []
    for code, err in ended:
        assert code == 0, err
        assert "already exists" not in err
    _check_layout(logs, run_id, 1)
    starts = sorted(
        line for _, err in ended for line in err.splitlines() if line.startswith("numarun: run ")
    )
    for node, line in enumerate(starts):
        assert f"node {node} of 2" in line
        assert f"logs in {logs}/{run_id}_node{node}_{HOST} (this node;" in line

"""Rendezvous through PyTorch's own backends and restarts, as real gloo jobs on loopback.

Each "node" is one launcher process (``python -m numarun`` or ``python -m torch.distributed.run``)
on this machine; the nodes meet in a c10d rendezvous on 127.0.0.1. The worker is
``tests/programs/rdzv_restart_modes.py``. Every test ends the processes it started in ``finally``
and checks that none is left (each job has its own ``--rdzv-id``, carried by every worker as
TORCHELASTIC_RUN_ID).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from job_processes import processes_with_run_id
from numarun.cmdline import nodes as launch_nodes
from numarun.errors import UsageError
from numarun.placement.workerenv import free_port
from torch_python import TORCH_PYTHON, require_torch, torch_release

TORCH_VERSION = require_torch()
TORCH_RELEASE = torch_release(TORCH_VERSION)

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
ELASTIC = str(PROGRAMS / "rdzv_restart_modes.py")
INTERRUPT = str(PROGRAMS / "first_signal_record.py")
NUMARUN = [TORCH_PYTHON, "-m", "numarun"]
TORCHRUN = [TORCH_PYTHON, "-m", "torch.distributed.run"]
LIMIT = 120.0  # generous: turns a hang into a failure on a shared, slow machine


def _env(**extra: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PET_", "SLURM_", "OMPI_", "TORCHELASTIC_", "TORCH_"))
        and key not in ("MASTER_ADDR", "MASTER_PORT", "PYTHON_EXEC", "OMP_NUM_THREADS")
    }
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    env["GLOO_SOCKET_IFNAME"] = "lo"
    env.update(extra)
    return env


class Nodes:
    """The launchers a test starts; :meth:`close` kills what is left, workers included."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.started: list[subprocess.Popen[str]] = []

    def start(self, launcher: list[str], *argv: str, **env: str) -> subprocess.Popen[str]:
        node = subprocess.Popen(
            [*launcher, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(**env),
        )
        self.started.append(node)
        return node

    def close(self) -> None:
        for node in self.started:
            if node.poll() is None:
                node.kill()
        # Workers first: a torchrun agent killed leaves its workers running (they hold the
        # node's output pipes open, so reading them to the end would wait for them forever).
        for pid in processes_with_run_id(self.run_id):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for node in self.started:
            node.communicate()


@pytest.fixture
def nodes(request: pytest.FixtureRequest) -> Iterator[Nodes]:
    started = Nodes(f"el-{request.node.name[:40]}-{os.getpid()}".replace("[", "-").strip("]"))
    try:
        yield started
    finally:
        started.close()


def _finish(node: subprocess.Popen[str], limit: float = LIMIT) -> tuple[int, str, str]:
    try:
        stdout, stderr = node.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        node.kill()
        try:
            stdout, stderr = node.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # its workers hold the pipes (a killed torchrun's)
            stdout, stderr = "(unread: the node's workers hold its output)", ""
        raise AssertionError(f"{node.args} did not end: {stdout}\n{stderr}") from None
    return node.returncode, stdout, stderr


def _reports(stdout: str) -> dict[int, dict]:
    return {
        (line := json.loads(text))["rank"]: line
        for text in stdout.splitlines()
        if text.startswith("{")
    }


def _numarun_lines(stderr: str) -> list[str]:
    """numarun's own lines of a launcher's stderr (not the workers', not other libraries')."""
    return [line for line in stderr.splitlines() if line.startswith("numarun: ")]


def _wait_for(condition: Callable[[], bool], limit: float = LIMIT) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.05)


def _c10d(port: int, run_id: str, *more: str) -> list[str]:
    return [
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id,
        *more,
    ]  # fmt: skip


# --- one node ------------------------------------------------------------------------------------

# Values that differ from run to run or by design (README: "Where numarun deliberately differs").
_ENV_IGNORED = {
    "MASTER_PORT",  # a free port of this run's store
    "TORCHELASTIC_ERROR_FILE",  # a path under each launcher's own log directory
    "NUMARUN_RUN_ID",  # numarun's teardown marker
    "OMP_NUM_THREADS",  # numarun: the rank's cores, torchrun: 1
}


def test_c10d_on_one_node_gives_the_workers_torchruns_environment_across_a_restart(
    tmp_path: Path, nodes: Nodes
) -> None:
    # torchrun's own recipe for one node: c10d on localhost:0. Rank 1 fails on the first
    # attempt, so the environments of both attempts are compared.
    flags = [
        "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0",
        "--rdzv-id", nodes.run_id, "--max-restarts", "1", "--role", "trainer",
    ]  # fmt: skip
    environments = {}
    for name, launcher in (("numarun", NUMARUN), ("torchrun", TORCHRUN)):
        out = tmp_path / name
        out.mkdir()
        code, stdout, stderr = _finish(nodes.start(launcher, *flags, ELASTIC, "flaky", str(out)))
        assert code == 0, (name, stderr)
        assert sorted(_reports(stdout)) == [0, 1], (name, stdout)
        environments[name] = {
            path.name: json.loads(path.read_text()) for path in out.glob("env.*.json")
        }
    mine, theirs = environments["numarun"], environments["torchrun"]
    assert {"env.0.1.json", "env.1.1.json", "env.1.0.json"} <= set(mine) & set(theirs)
    # torch 2.4's handler shares no store with the workers (rank 0's worker hosts one); the
    # signal list reaches workers from the torchrun of torch 2.10 on, from numarun always.
    shared = "False" if TORCH_RELEASE < (2, 5) else "True"
    extra = {"NUMARUN_RUN_ID"}
    for name in sorted(set(mine) & set(theirs)):
        ours, peer = mine[name], theirs[name]
        if "TORCHELASTIC_SIGNALS_TO_HANDLE" not in peer:
            extra.add("TORCHELASTIC_SIGNALS_TO_HANDLE")
        differing = {
            key: (ours.get(key), peer.get(key))
            for key in set(ours) | set(peer)
            if ours.get(key) != peer.get(key) and key not in _ENV_IGNORED | extra
        }
        assert differing == {}, name
        assert ours["TORCHELASTIC_USE_AGENT_STORE"] == shared
        assert ours["TORCHELASTIC_MAX_RESTARTS"] == "1"
        assert ours["TORCHELASTIC_RESTART_COUNT"] == name.split(".")[2]
        assert set(ours) - set(peer) == extra


def test_max_restarts_a_gloo_worker_failing_once_keeps_every_attempts_logs(
    tmp_path: Path, nodes: Nodes
) -> None:
    logs = tmp_path / "logs"
    out = tmp_path / "out"
    out.mkdir()
    node = nodes.start(
        NUMARUN, "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
        "localhost:0", "--rdzv-id", nodes.run_id, "--max-restarts", "2", "--redirects", "3",
        "--log-dir", str(logs), ELASTIC, "flaky-gloo", str(out),
    )  # fmt: skip
    code, _, stderr = _finish(node)
    assert code == 0, stderr
    run_dir = logs / nodes.run_id
    assert sorted(path.name for path in run_dir.iterdir()) == ["attempt_0", "attempt_1"]
    for attempt in ("attempt_0", "attempt_1"):
        for local_rank in ("0", "1"):
            assert (run_dir / attempt / local_rank / "stdout.log").is_file()
    assert "first attempt" in (run_dir / "attempt_0/1/error.json").read_text()
    reports = [
        json.loads((run_dir / f"attempt_1/{rank}/stdout.log").read_text()) for rank in (0, 1)
    ]
    assert [(r["rank"], r["sum"], r["restart"]) for r in reports] == [(0, 3.0, "1"), (1, 3.0, "1")]
    # The restart is announced when it happens and the first attempt's root cause is in the
    # report at the end, though the job succeeded.
    assert "numarun: attempt_0: rank 1 (local_rank 1" in stderr
    assert "restarting (restart 1 of 2)" in stderr
    tail = stderr[stderr.rindex("the job succeeded") :]
    assert "attempt_0: rank 1 (local_rank 1" in tail
    assert "RuntimeError: rank 1 fails on the first attempt" in tail
    assert processes_with_run_id(nodes.run_id) == []


def test_static_max_restarts_restarts_locally_without_torch(tmp_path: Path) -> None:
    # The static rendezvous restarts on one node as torchrun does; the launcher never
    # imports torch for it.
    out = tmp_path / "out"
    out.mkdir()
    code = (
        "import sys\n"
        "from numarun.launch.launcher import main\n"
        f"status = main(['--nproc-per-node', '2', '--max-restarts', '1', {ELASTIC!r}, 'flaky', "
        f"{str(out)!r}])\n"
        "print(status, sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=LIMIT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "0 []"
    assert "attempt_0: rank 1 (local_rank 1" in done.stderr
    assert "failed with exit code 3; restarting (restart 1 of 1)" in done.stderr
    restarted = json.loads((out / "env.1.1.json").read_text())
    assert restarted["TORCHELASTIC_RESTART_COUNT"] == "1"
    assert restarted["TORCHELASTIC_MAX_RESTARTS"] == "1"
    assert restarted["TORCHELASTIC_USE_AGENT_STORE"] == "False"


def test_static_restarts_end_with_the_last_failure_and_every_attempt_listed(
    tmp_path: Path,
) -> None:
    worker = tmp_path / "always.py"
    worker.write_text("import os, sys\nif os.environ['RANK'] == '0':\n    sys.exit(5)\n")
    done = subprocess.run(
        [*NUMARUN, "--nproc-per-node", "2", "--max-restarts", "2", str(worker)],
        capture_output=True, text=True, env=_env(), timeout=LIMIT,
    )  # fmt: skip
    assert done.returncode == 5, done.stderr
    summary = done.stderr[done.stderr.rindex("=" * 72 + "\nnumarun:") :]
    assert "Root cause: rank 0 (local_rank 0" in summary
    earlier = summary[summary.index("Earlier attempts:") :].splitlines()[1:3]
    assert [line.split(":")[0].strip() for line in earlier] == ["attempt_0", "attempt_1"]
    assert all("failed with exit code 5" in line for line in earlier)


# --- several nodes -------------------------------------------------------------------------------


def test_a_numarun_node_and_a_torchrun_node_train_together(tmp_path: Path, nodes: Nodes) -> None:
    port = free_port()
    flags = ["--nnodes", "2", "--nproc-per-node", "2", *_c10d(port, nodes.run_id)]
    mine = nodes.start(NUMARUN, *flags, ELASTIC, "grow", str(tmp_path), "4")
    theirs = nodes.start(TORCHRUN, *flags, ELASTIC, "grow", str(tmp_path), "4")
    results = [_finish(mine), _finish(theirs)]
    for code, _, stderr in results:
        assert code == 0, stderr
    ours, peer = (_reports(stdout) for _, stdout, _ in results)
    assert sorted([*ours, *peer]) == [0, 1, 2, 3]  # one world of 4 ranks, 2 on each node
    assert len(ours) == len(peer) == 2
    assert {report["sum"] for report in [*ours.values(), *peer.values()]} == {10.0}


def test_two_numarun_nodes_a_failure_reaches_the_healthy_node_within_seconds(
    tmp_path: Path, nodes: Nodes
) -> None:
    # After a world-of-2 all_reduce, node B's worker exits 3 while A's blocks (as in a
    # collective whose peer is gone). B has no restart left: it ends with its summary; A must
    # learn of it through the rendezvous within seconds, not after a collective timeout, and
    # stop with one line naming the failure. (One worker per node keeps the test short.)
    port = free_port()
    flags = [
        "--nnodes", "2", "--nproc-per-node", "1", "--monitor-interval", "0.5",
        *_c10d(port, nodes.run_id),
    ]  # fmt: skip
    node_a = nodes.start(
        NUMARUN, *flags, "--rdzv-conf", "is_host=1", ELASTIC, "fail-after", str(tmp_path)
    )
    node_b = nodes.start(
        NUMARUN, *flags, "--rdzv-conf", "is_host=0", ELASTIC, "fail-after", str(tmp_path),
        EL_FAIL="1",
    )  # fmt: skip
    code_b, out_b, err_b = _finish(node_b)
    code_a, out_a, err_a = _finish(node_a)
    ended_a = time.time()
    failed_at = float((tmp_path / "failed").read_text())
    assert code_b == 3, err_b
    assert "Root cause: rank " in err_b and "failed with exit code 3" in err_b
    assert {r["sum"] for r in [*_reports(out_a).values(), *_reports(out_b).values()]} == {3.0}
    assert code_a == 1, err_a
    last = err_a.strip().splitlines()[-1]
    assert last.startswith("numarun: ") and "failed with exit code 3" in last, err_a
    assert ended_a - failed_at < 15.0  # a look every 0.5 s; the rest is start-up noise
    assert processes_with_run_id(nodes.run_id) == []


@pytest.mark.parametrize("host", ["the finished node", "the failed node"])
def test_a_finished_node_ends_at_once_when_the_other_fails_naming_it(
    tmp_path: Path, nodes: Nodes, host: str
) -> None:
    # Issue 32, item 1: node A's rank ends with 0 (A waits in the exit barrier), then node B's
    # rank fails with no restart left. A must not wait out torch's 300 s barrier (nor end
    # with 0 and "Broken pipe" when B hosted the store): it hears B's notice and ends with
    # exit status 1 and one line naming B's failed rank, within seconds.
    port = free_port()
    flags = ["--nnodes", "2", "--nproc-per-node", "1", *_c10d(port, nodes.run_id)]
    a_hosts = "1" if host == "the finished node" else "0"
    node_a = nodes.start(NUMARUN, *flags, "--rdzv-conf", f"is_host={a_hosts}", ELASTIC,
                         "finish-or-fail", str(tmp_path))  # fmt: skip
    node_b = nodes.start(NUMARUN, *flags, "--rdzv-conf", f"is_host={1 - int(a_hosts)}",
                         ELASTIC, "finish-or-fail", str(tmp_path), EL_FAIL="1")  # fmt: skip
    code_b, _, err_b = _finish(node_b)
    code_a, _, err_a = _finish(node_a)
    ended_a = time.time()
    failed_at, failed_rank = (tmp_path / "failed").read_text().split()
    assert code_b == 3, err_b
    assert code_a == 1, err_a
    last = _numarun_lines(err_a)[-1]
    assert last.startswith("numarun: the job failed after this node's ranks finished: "
                           f"node {failed_rank} ("), err_a  # fmt: skip
    assert f"rank {failed_rank} (local_rank 0) failed with exit code 3" in last, err_a
    assert ended_a - float(failed_at) < 30.0, err_a
    for text in ("Broken pipe", "Failed to recv", "Traceback", "warning"):
        assert text not in err_a, err_a
        assert text not in err_b, err_b  # nor on the failed node, whichever hosted the store
    assert processes_with_run_id(nodes.run_id) == []


def test_a_late_node_is_admitted_and_the_world_grows(tmp_path: Path, nodes: Nodes) -> None:
    port = free_port()
    flags = [
        "--nnodes", "1:2", "--nproc-per-node", "1", "--monitor-interval", "0.5",
        *_c10d(port, nodes.run_id, "--rdzv-conf", "last_call_timeout=1"),
    ]  # fmt: skip
    first = nodes.start(NUMARUN, *flags, ELASTIC, "grow", str(tmp_path), "2")
    _wait_for(lambda: (tmp_path / "small.0").exists() or first.poll() is not None)
    assert first.poll() is None, first.communicate()
    late = nodes.start(NUMARUN, *flags, ELASTIC, "grow", str(tmp_path), "2")
    results = [_finish(first), _finish(late)]
    for code, _, stderr in results:
        assert code == 0, stderr
    reports = {**_reports(results[0][1]), **_reports(results[1][1])}
    assert sorted(reports) == [0, 1]
    assert {(r["world_size"], r["sum"], r["restart"]) for r in reports.values()} == {
        (2, 3.0, "0")  # a joining node re-forms the group without using a restart
    }
    assert "1 node(s) waiting to join; re-forming the group (no restart used)" in results[0][2]


def _parent_pid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rfind(")") + 2 :].split()[1])


@pytest.mark.parametrize("killed", ["peer", "store host"])
def test_a_sigkilled_launcher_is_dropped_and_the_other_node_goes_on_or_stops(
    tmp_path: Path, nodes: Nodes, killed: str
) -> None:
    # Both nodes run a world of 2 whose workers wait (as in a collective). One launcher is
    # SIGKILLed: its worker dies with it. When it is the peer (B), node A must notice within
    # the keep-alive window (here 2 s x 3), re-form the group alone (--nnodes 1:2) and finish
    # in a world of 1. When it is the node hosting the rendezvous store (A), B cannot go on:
    # it stops with one line, its worker torn down.
    port = free_port()
    # Not 1 s x 2: at load 14 a launcher's keep-alive thread can miss 2 s, the nodes drop
    # each other, and the full world never formed within the test's limit.
    conf = "last_call_timeout=1,keep_alive_interval=2,keep_alive_max_attempt=3"
    flags = [
        "--nnodes", "1:2", "--nproc-per-node", "1", "--monitor-interval", "0.5",
        *_c10d(port, nodes.run_id),
    ]  # fmt: skip
    node_a = nodes.start(
        NUMARUN, *flags, "--rdzv-conf", f"{conf},is_host=1", ELASTIC, "shrink", str(tmp_path), "2"
    )
    node_b = nodes.start(
        NUMARUN, *flags, "--rdzv-conf", f"{conf},is_host=0", ELASTIC, "shrink", str(tmp_path), "2"
    )
    full = [tmp_path / f"full.{rank}" for rank in range(2)]
    _wait_for(lambda: all(path.exists() for path in full) or node_a.poll() is not None)
    assert node_a.poll() is None, node_a.communicate()
    victim, survivor = (node_b, node_a) if killed == "peer" else (node_a, node_b)
    placed = [path.read_text().split() for path in full]
    # Each worker's parent is its launcher's watchdog, a child of the launcher.
    workers = {_parent_pid(int(parent)): int(pid) for pid, parent in placed}
    assert sorted(workers) == sorted([node_a.pid, node_b.pid])
    killed_at = time.monotonic()
    victim.kill()
    code, stdout, stderr = _finish(survivor)
    assert time.monotonic() - killed_at < 60.0
    if killed == "peer":
        assert code == 0, stderr
        assert "stopped answering" in stderr
        assert {(r["world_size"], r["restart"]) for r in _reports(stdout).values()} == {(1, "0")}
    else:
        assert code == 1, stderr
        assert stderr.strip().splitlines()[-1].startswith(
            f"numarun: lost the c10d rendezvous {nodes.run_id!r} at 127.0.0.1:{port}: "
        )
        assert stderr.rstrip().endswith("; this node stops")
    _wait_for(lambda: not any(os.path.exists(f"/proc/{pid}/stat") for pid in workers.values()), 10)


# --- signals -------------------------------------------------------------------------------------


def test_ctrl_c_while_training_under_c10d(tmp_path: Path, nodes: Nodes) -> None:
    node = nodes.start(
        NUMARUN, "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
        "localhost:0", "--rdzv-id", nodes.run_id, "--max-restarts", "3", INTERRUPT,
        str(tmp_path),
    )  # fmt: skip
    pid_files = [tmp_path / f"{rank}.pid" for rank in (0, 1)]
    _wait_for(lambda: all(path.exists() for path in pid_files) or node.poll() is not None)
    assert node.poll() is None, node.communicate()
    pids = [int(path.read_text()) for path in pid_files]
    node.send_signal(signal.SIGINT)
    code, _, stderr = _finish(node, 60)
    assert code == 130, stderr
    for rank in (0, 1):  # each worker's `except KeyboardInterrupt` ran; no restart followed
        assert (tmp_path / f"{rank}.saved").read_text() == "KeyboardInterrupt"
    assert "restarting" not in stderr
    assert "numarun stopped the run on SIGINT" in stderr
    assert not any(os.path.exists(f"/proc/{pid}/stat") for pid in pids)
    assert processes_with_run_id(nodes.run_id) == []


def test_ctrl_c_while_waiting_in_the_rendezvous_stops_at_once(
    tmp_path: Path, nodes: Nodes
) -> None:
    # torchrun hangs here (pytorch/pytorch#63802): torch's store calls hold signals off.
    port = free_port()
    node = nodes.start(
        NUMARUN, "--nnodes", "2", *_c10d(port, nodes.run_id, "--rdzv-conf", "is_host=1"),
        ELASTIC, "grow", str(tmp_path), "4",
    )  # fmt: skip

    def listening() -> bool:
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", port)) == 0

    _wait_for(lambda: listening() or node.poll() is not None)
    time.sleep(0.5)  # into next_rendezvous(): waiting for the second node
    sent = time.monotonic()
    node.send_signal(signal.SIGINT)
    code, stdout, stderr = _finish(node, 30)
    assert code == 130, stderr
    assert time.monotonic() - sent < 10.0
    # numarun's own lines: the last one says why it stopped (torch's import-time noise about
    # optional packages is not numarun's to print, and this test does not depend on it).
    assert _numarun_lines(stderr)[-1] == (
        f"numarun: stopped on SIGINT while waiting for the c10d rendezvous {nodes.run_id!r} at "
        f"127.0.0.1:{port}; no worker was running"
    ), stderr
    assert "Traceback" not in stderr and "Failed to initialize NumPy" not in stderr, stderr
    assert stdout == ""


# --- bad input -----------------------------------------------------------------------------------


def test_an_unreachable_endpoint_is_one_line_and_leaves_nothing(
    tmp_path: Path, nodes: Nodes
) -> None:
    port = free_port()  # nothing listens there, and this node may not host it
    node = nodes.start(
        NUMARUN, *_c10d(port, nodes.run_id, "--rdzv-conf", "is_host=0,read_timeout=1"),
        ELASTIC, "grow", str(tmp_path), "1",
    )  # fmt: skip
    code, stdout, stderr = _finish(node, 60)
    assert code == 1
    lines = _numarun_lines(stderr)
    assert lines[-1].startswith(
        f"numarun: error: cannot reach the c10d rendezvous {nodes.run_id!r} at 127.0.0.1:{port}"
    ), stderr
    assert [line for line in lines if "error" in line] == lines[-1:]
    assert "Traceback" not in stderr and "Failed to initialize NumPy" not in stderr, stderr
    assert stdout == "" and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rdzv-conf", "join_timeout"], "--rdzv-conf option 'join_timeout' has no value"),
        (["--rdzv-backend", "c10d", "--rdzv-conf", "join_timeout=soon"], "whole number"),
        (["--nnodes", "2:1"], "--nnodes 2:1: MAX (1) must be at least MIN (2)"),
        (["--rdzv-backend", "zookeeper"], "unknown --rdzv-backend 'zookeeper'"),
        (["--rdzv-backend", "etcd"], "python-etcd"),
        (["--max-restarts", "-1"], "--max-restarts must be at least 0"),
    ],
)
def test_bad_rendezvous_input_is_one_line_and_exit_2(
    tmp_path: Path, argv: list[str], message: str
) -> None:
    done = subprocess.run(
        [*NUMARUN, *argv, ELASTIC, "grow", str(tmp_path), "1"],
        capture_output=True, text=True, env=_env(), timeout=LIMIT,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []


# --- --rdzv-conf against torch's own parser ------------------------------------------------------


@settings(deadline=None)  # the first example imports torch: seconds on a loaded machine
@given(st.text(alphabet="ab= ,\t1", max_size=16))
def test_rdzv_conf_grammar_matches_torchs_parser(text: str) -> None:
    from torch.distributed.elastic.rendezvous.utils import _parse_rendezvous_config

    try:
        expected: object = _parse_rendezvous_config(text)
    except ValueError:
        expected = ValueError
    try:
        got: object = dict(launch_nodes.parse_rdzv_conf(text))
    except UsageError:
        got = ValueError
    assert got == expected


@pytest.mark.parametrize(
    "value", ["1", "0", "true", "False", "T", "yes", "N", "on", "2", "maybe", "", "01"]
)
def test_is_host_values_are_read_as_torch_reads_them(value: str) -> None:
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    parameters = RendezvousParameters("c10d", "", "x", 1, 1, is_host=value)
    try:
        parameters.get_as_bool("is_host")
        torch_accepts = True
    except ValueError:
        torch_accepts = False
    try:
        launch_nodes._check_rdzv_conf("c10d", (("is_host", value),))
        accepted = True
    except UsageError:
        accepted = False
    assert accepted == torch_accepts

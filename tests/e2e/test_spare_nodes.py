"""A spare node on torch's c10d rendezvous: started with the same command as the others, it waits
(said once), its standbys import torch meanwhile, and when a node is lost (its launcher and
workers SIGKILLed, as a machine that dies) the survivor and the spare form the next round and
run, warm; nothing of the lost node is left. Three launchers for ``--nnodes 2`` on this
machine, gloo workers looping on ``all_reduce`` (``tests/programs/gloo_spare.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from job_processes import processes_with_env
from numarun.placement.workerenv import free_port
from torch_python import TORCH_PYTHON, require_torch

require_torch()

PROGRAM = str(Path(__file__).resolve().parents[1] / "programs" / "gloo_spare.py")
SRC = str(Path(__file__).resolve().parents[2] / "src")
LIMIT = 240.0  # generous: three launchers and their standbys import torch on a loaded machine


def _env(node: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PET_", "SLURM_", "OMPI_", "TORCHELASTIC_", "TORCH_", "NUMARUN_"))
        and key not in ("MASTER_ADDR", "MASTER_PORT", "PYTHON_EXEC", "OMP_NUM_THREADS")
    }
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    env.update(GLOO_SOCKET_IFNAME="lo", SPARE_NODE=node)
    return env


def _wait_for(condition: Callable[[], bool], what: str, limit: float = LIMIT) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _ready(out: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in out.glob("ready.*")]


def _of(node: str) -> list[int]:
    """Every live process of a node: its launcher and all it started carry its marker."""
    return processes_with_env(f"SPARE_NODE={node}")


def test_a_lost_node_is_replaced_by_the_spare_and_nothing_of_it_is_left(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    run_id = f"spare-{os.getpid()}"
    port = free_port()
    # The rendezvous' store lives apart (a machine of its own, as a job's endpoint would):
    # whichever node is lost, the store stays.
    store = subprocess.Popen(
        [TORCH_PYTHON, "-c", STORE, str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, env=_env("store"),
    )  # fmt: skip
    command = [
        TORCH_PYTHON, "-m", "numarun", "--nnodes", "2", "--nproc-per-node", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id,
        "--rdzv-conf", "is_host=0", "--max-restarts", "3", "--preload", "torch", PROGRAM,
        str(out),
    ]  # fmt: skip
    markers = {name: f"{name}-{run_id}" for name in ("stays", "lost", "spare")}
    nodes: dict[str, subprocess.Popen[str]] = {}
    said: dict[str, list[str]] = {}  # each node's stderr lines, read as they come

    def start(name: str) -> None:
        node = nodes[name] = subprocess.Popen(
            command, env=_env(markers[name]), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        lines = said[name] = []
        assert node.stderr is not None
        threading.Thread(target=lambda: lines.extend(node.stderr), daemon=True).start()

    try:
        assert store.stdout is not None and store.stdout.readline() == "up\n"
        start("stays")
        start("lost")
        _wait_for(lambda: len(_ready(out)) == 2, "the first round's workers")
        start("spare")
        # The spare says once that it waits as one (a line would come every 10 s), its
        # standbys importing torch meanwhile; then a node is lost: its launcher and its
        # worker SIGKILLed at once.
        _wait_for(lambda: _spare_lines(said["spare"]) == 1, "the spare's line")
        time.sleep(12.0)
        first = {entry["pid"] for entry in _ready(out)}
        lost = [entry["pid"] for entry in _ready(out) if entry["node"] == markers["lost"]]
        for pid in [nodes["lost"].pid, *lost]:
            os.kill(pid, signal.SIGKILL)
        nodes["lost"].wait(timeout=LIMIT)

        def regrouped() -> list[dict]:
            return [entry for entry in _ready(out) if entry["pid"] not in first]

        try:
            _wait_for(lambda: len(regrouped()) == 2, "the group of the survivor and the spare")
        except AssertionError as error:
            left = {name: [(pid, _state(pid)) for pid in _of(marker)]
                    for name, marker in markers.items()}  # fmt: skip
            raise AssertionError(f"{error}: {_ready(out)} {left} {said}") from None
        group = sorted(regrouped(), key=lambda entry: entry["rank"])
        assert {entry["node"] for entry in group} == {markers["stays"], markers["spare"]}
        assert [entry["world"] for entry in group] == [2, 2]
        assert all(entry["warm"] for entry in group), group  # on standbys, past import torch
        _wait_for(lambda: not _of(markers["lost"]), "nothing of the lost node", 60)
        (out / "stop").touch()
        for name in ("stays", "spare"):
            nodes[name].wait(timeout=LIMIT)
    finally:
        for name, node in nodes.items():
            if node.poll() is None:
                node.kill()
            for pid in _of(markers[name]):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            node.wait()
        store.kill()
        store.communicate()
    time.sleep(0.5)  # the reading threads take the last lines
    for name in ("stays", "spare"):
        assert nodes[name].returncode == 0, (name, said[name])
    assert _spare_lines(said["spare"]) == 1, said["spare"]
    given_up = "stopped beating (no heartbeat for 4 s: its launcher is gone); given up"
    assert any(given_up in line for line in said["stays"] + said["spare"]), said
    assert not _of(markers["stays"]) and not _of(markers["spare"])


STORE = (
    "import sys\n"
    "from torch.distributed import TCPStore\n"
    "store = TCPStore('127.0.0.1', int(sys.argv[1]), is_master=True, wait_for_workers=False)\n"
    "print('up', flush=True)\n"
    "sys.stdin.read()\n"
)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline, open(f"/proc/{pid}/wchan") as wchan:
            return f"{cmdline.read()[-80:]!r} {wchan.read()}"
    except OSError:
        return "gone"


def _spare_lines(lines: list[str]) -> int:
    return sum("this node waits as a spare" in line for line in list(lines))

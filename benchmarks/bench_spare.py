"""A lost node replaced by a spare: numarun next to torchrun, two nodes and one spare, side by side.

    python benchmarks/bench_spare.py [--runs 3] [--nproc 1] [--launchers numarun,torchrun]
        [--limit 60] [--json FILE]

Three launchers for ``--nnodes 2`` in one c10d rendezvous on this machine (its store hosted by
this script, every launcher joining with ``is_host=0``, ``--max-restarts 3``): two form the
first round, the third is started once their workers run and waits as a spare (numarun's
with ``--preload torch``: its standbys import torch while it waits). The workers (gloo) loop
on ``all_reduce``; each writes when it is past the first collective of its group. Then one
participant node is lost: its launcher and every process of it (workers, standbys, watchdog)
SIGKILLed at once, as a machine that dies. The figure is from that moment to every rank of
the new group (the survivor's and the spare's) past its first collective; a launcher that
does not get there within ``--limit`` seconds counts as "not recovered".

Where the time goes, read from the rendezvous state in the store (polled every 10 ms):
``detected`` (the lost node no longer a participant: torch's rendezvous removed it, on its own
keep-alive expiry or on numarun's word), ``formed`` (the next round complete), ``ran`` (every
new rank past its first collective). Same interpreter and torch for both launchers
(``python -m torch.distributed.run``); the runs of the launchers interleaved; the load
average before and after is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

WORKER = """\
import os, sys, time
import torch
import torch.distributed as dist

folder = sys.argv[1]
dist.init_process_group("gloo")
value = torch.ones(1)
dist.all_reduce(value)
with open(os.path.join(folder, f"first.{os.getpid()}"), "w") as out:
    out.write(f"{time.clock_gettime(time.CLOCK_MONOTONIC)!r} {os.environ['BENCH_NODE']}")
while True:
    dist.all_reduce(value)
    time.sleep(0.05)
"""


def _env(folder: Path, node: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PET_", "TORCHELASTIC_", "NUMARUN_"))}  # fmt: skip
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", BENCH_NODE=node,
               TORCH_CPP_LOG_LEVEL="ERROR")  # fmt: skip
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    return env


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _processes_of(node: str) -> list[int]:
    """Every live process carrying ``BENCH_NODE=node`` (a launcher and all it started)."""
    wanted = f"BENCH_NODE={node}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as environ:
                if wanted in environ.read().split(b"\0"):
                    found.append(int(name))
        except OSError:
            continue
    return found


def _state(backend: object) -> object | None:
    got = backend.get_state()  # type: ignore[attr-defined]
    return pickle.loads(got[0]) if got is not None else None


def _wait(condition, what: str, limit: float, nodes: dict) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + limit
    while not condition():
        for name, proc in nodes.items():
            if proc.poll() is not None:
                raise RuntimeError(f"node {name} ended ({proc.returncode}) waiting for {what}: "
                                   f"{proc.stderr.read()[-1500:]}")  # fmt: skip
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {limit:g} s")
        time.sleep(0.01)


def one_loss(launcher: str, folder: Path, nproc: int, limit: float) -> dict[str, float | None]:
    """One run: the figures (seconds from the loss) of one launcher; None where not reached
    within ``limit`` seconds."""
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
        C10dRendezvousBackend,
    )

    for path in folder.glob("first.*"):
        path.unlink()
    port, run_id = _free_port(), f"spare{os.getpid()}{time.monotonic_ns()}"
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    backend = C10dRendezvousBackend(store, run_id)
    module = "numarun" if launcher == "numarun" else "torch.distributed.run"
    command = [
        sys.executable, "-m", module, "--nnodes", "2", "--nproc-per-node", str(nproc),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id,
        "--rdzv-conf", "is_host=0", "--max-restarts", "3",
        *(["--preload", "torch"] if launcher == "numarun" else []),
        str(folder / "worker.py"), str(folder),
    ]  # fmt: skip
    nodes: dict[str, subprocess.Popen[str]] = {}

    def start(name: str) -> None:
        nodes[name] = subprocess.Popen(
            command, env=_env(folder, name), text=True, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip

    def firsts() -> dict[int, tuple[float, str]]:
        found = {}
        for path in folder.glob("first.*"):
            text = path.read_text().split()
            if len(text) == 2:
                found[int(path.name[6:])] = (float(text[0]), text[1])
        return found

    result: dict[str, float | None] = {"detected": None, "formed": None, "ran": None}
    try:
        start("a")
        start("b")
        _wait(lambda: len(firsts()) == 2 * nproc, "the first group", 600, nodes)
        start("spare")
        # The spare waits: in torch's redundancy list (the round is full), its standbys ready.
        _wait(lambda: len(getattr(_state(backend), "redundancy_list", ())) == 1,
              "the spare in the redundancy list", 600, nodes)  # fmt: skip
        time.sleep(10.0 if launcher == "numarun" else 2.0)  # the spare's standbys import torch
        before = set(firsts())
        state = _state(backend)
        pids = {desc.pid: rank for desc, rank in state.participants.items()}  # type: ignore[attr-defined]
        lost = next(name for name in ("a", "b") if nodes[name].pid in pids)
        if nodes["a"].pid in pids and nodes["b"].pid in pids:
            lost = "b"
        round_ = state.round  # type: ignore[attr-defined]
        victims = _processes_of(lost)
        lost_at = time.clock_gettime(time.CLOCK_MONOTONIC)
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + limit
        lost_pid = nodes[lost].pid
        while time.monotonic() < deadline:
            now = time.clock_gettime(time.CLOCK_MONOTONIC)
            state = _state(backend)
            members = {desc.pid for desc in getattr(state, "participants", {})}
            if result["detected"] is None and lost_pid not in members:
                result["detected"] = now - lost_at
            if (result["formed"] is None and getattr(state, "round", 0) > round_
                    and state.complete and len(members) == 2):  # type: ignore[union-attr]
                result["formed"] = now - lost_at
            new = {pid: when for pid, (when, _) in firsts().items() if pid not in before}
            if len(new) == 2 * nproc:
                result["ran"] = max(new.values()) - lost_at
                break
            time.sleep(0.01)
        result["left_of_lost_node"] = float(len(_processes_of(lost)))
    finally:
        for name, proc in nodes.items():
            if proc.poll() is None:
                proc.kill()
            for pid in _processes_of(name):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.communicate()
        del store
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=1, help="workers per node")
    parser.add_argument("--launchers", default="numarun,torchrun")
    parser.add_argument("--limit", type=float, default=60.0,
                        help="seconds after the loss before a run counts as not recovered")
    parser.add_argument("--json", help="also write every sample to this file")
    args = parser.parse_args()
    launchers = args.launchers.split(",")
    load_before = os.getloadavg()
    samples: dict[str, list[dict[str, float | None]]] = {name: [] for name in launchers}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench_spare_") as tmp:
        folder = Path(tmp)
        (folder / "worker.py").write_text(WORKER)
        for _ in range(args.runs):
            for name in launchers:
                samples[name].append(one_loss(name, folder, args.nproc, args.limit))
                print(name, samples[name][-1], file=sys.stderr, flush=True)
    load_after = os.getloadavg()
    import torch

    lines = [
        f"## a lost node replaced by a spare ({args.nproc} worker(s) per node, 2 nodes + 1 "
        f"spare, {len(os.sched_getaffinity(0))} CPUs, torch {torch.__version__}; load average "
        f"{load_before[0]:.1f} before, {load_after[0]:.1f} after; "
        f"{time.monotonic() - started:.0f} s)",
        "",
        "| launcher | loss -> lost node dropped s | -> next round formed s | "
        "-> every new rank past its first collective s | recovered |",
        "|---|---|---|---|---|",
    ]
    for name, runs in samples.items():
        def median(key: str, runs: list = runs) -> str:
            values = [run[key] for run in runs if run[key] is not None]
            return f"{statistics.median(values):.2f}" if values else f"> {args.limit:g}"

        recovered = sum(run["ran"] is not None for run in runs)
        label = f"{name}{' --preload torch' if name == 'numarun' else ''}"
        lines.append(f"| {label} | {median('detected')} | {median('formed')} | "
                     f"{median('ran')} | {recovered} of {len(runs)} |")  # fmt: skip
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps({"samples": samples, "load_before": load_before,
                                               "load_after": load_after}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The whole job at scale: N node stand-ins running numarun's real protocol against one real store.

    python benchmarks/bench_jobwide_scale.py --nodes 1024 --ranks-per-node 8 [--json]
        [--protocol new|old] [--pattern block|strided] [--interval 2] [--limit 120]

Each stand-in is an :class:`ElasticNode` with its ``numarun-store`` thread, :class:`JobStacks` and
:class:`HangWatch`, on a connection of its own to one torch ``TCPStore`` (libuv, in a process of
its own): ``benchmarks/jobwide_standins.py`` says what is real (the protocol, the decoding, the
loop) and what stands in (torch's handler, the supervisor's workers: synthetic dumps of 8 ranks
per node, three behaviour classes, 4 threads of about 40 frames per rank, one odd rank).
Node 0 runs alone in one process (the merging node: its peak memory is measured there); the
others share processes of 64 stand-ins each (at least two; ``--procs``), each process with one
real supervisor loop for all its stand-ins.

Three events, one after the other, each timed from its trigger until every stand-in's loop has
the result (``time.monotonic()``, the same clock in every process):

* ``stacks_s``: ``numarun stacks`` for the whole job asked on node 0 -> every node has the
  job's merged stacks (``--protocol old``: node 0 has every node's posts);
* ``verdict_s``: every node but node 0 is still; node 0 goes still -> every node's loop has the
  verdict (``request_stop``), the look interval included (a still mark waits for the thread's
  next look);
* ``notice_s``: the last node's rank fails -> every other node's loop has the notice.

Bytes and requests are counted by a ``torch.distributed.Store`` in front of each node's store
(``CountingStore``: keys and values both ways, every request; clones count too), all traffic in
the event's window included (the looks' heartbeats too), divided by the nodes; the classes'
frames posts (each class's full frames, posted once per round) are counted apart.
``max_loop_blocked_s``: the longest CPU time a loop's thread spent in one callback
(``time.thread_time``; ``max_loop_blocked_wall_s``: its wall time, which also counts waits for
the GIL held by the other stand-ins' threads, an artefact of 500 launchers in one process).
``merger_peak_mib``: node 0's process, peak resident memory during the events over its
resident memory before them (``/proc/self/clear_refs``, ``VmHWM``).

``--protocol old`` runs the same stand-ins on numarun as it was at ``main``'s commit ff42185
(exported with ``git archive`` into a temporary directory).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OLD_COMMIT = "ff42185"
# Stand-ins per process: each a launcher's threads in one interpreter. Packing more makes their
# threads queue for one GIL (a cost no launcher, alone in its process, pays) and that cost grow
# with the job; a fixed number per process keeps it the same at every size.
PER_PROCESS = 64


# --- the stand-ins' processes --------------------------------------------------------------------


def _status(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])  # kB
    return 0


def serve(port: int, first: int, last: int, nodes: int, ranks: int, interval: float,
          pattern: str) -> None:  # fmt: skip
    """A worker process: stand-ins ``first`` to ``last - 1`` on one loop, driven by JSON
    commands on stdin, answering on stdout."""
    import jobwide_standins as js

    tally = js.Tally()
    host = js.LoopHost()
    stand_ins: dict[int, js.StandIn] = {}
    pending = b""
    out = sys.stdout

    def answer(value: object) -> None:
        out.write(json.dumps(value) + "\n")
        out.flush()

    def command(request: dict) -> bool:
        op = request["op"]
        if op == "setup":
            for index in range(first, last):
                stand_ins[index] = js.StandIn(host, js.connect(port, tally), index, nodes, ranks,
                                              interval=interval, pattern=pattern)  # fmt: skip
            for stand_in in stand_ins.values():
                stand_in.register()
            for stand_in in stand_ins.values():
                stand_in.watch()
            import gc

            gc.collect()
            gc.freeze()  # as the launcher does before each attempt (launch/attempts.py)
            answer({"ok": True})
        elif op == "snapshot":
            if request.get("reset"):
                with open("/proc/self/clear_refs", "w") as refs:
                    refs.write("5")  # the peak resident size starts again from here
                host.max_cpu = host.max_wall = host.max_gc = 0.0
            answer({**tally.snapshot(), "rss_kb": _status("VmRSS"), "hwm_kb": _status("VmHWM"),
                    "max_cpu": host.max_cpu, "max_wall": host.max_wall,
                    "max_gc": host.max_gc})  # fmt: skip
        elif op == "ask":
            start = time.monotonic()
            stand_ins[request["node"]].ask()
            answer({"t0": start})
        elif op == "still":
            start = time.monotonic()
            for index in request["nodes"]:
                if index in stand_ins:
                    stand_ins[index].go_still()
            answer({"t0": start})
        elif op == "fail":
            start = time.monotonic()
            stand_ins[request["node"]].fail()
            answer({"t0": start})
        elif op == "stops":
            answer(sorted({s.stop_reason() or "" for s in stand_ins.values()} - {""}))
        elif op == "times":
            kind = request["kind"]
            found = {
                index: (s.verdict_at() if kind == "verdict" else s.times.get(kind))
                for index, s in stand_ins.items()
            }
            answer(found)
        elif op == "quit":
            for stand_in in stand_ins.values():
                stand_in.close()
            answer({"ok": True})
            os._exit(0)  # threads blocked in torch's C++ calls: no interpreter shutdown
        return True

    fd = sys.stdin.fileno()
    os.set_blocking(fd, False)
    running = [True]

    def read_commands() -> None:
        nonlocal pending
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return
        if not chunk:
            running[0] = False
            return
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if not command(json.loads(line)):
                running[0] = False

    host.loop.add_reader(fd, read_commands)
    while running[0]:
        host.poll(0.05)


def serve_store() -> None:
    """The store's process: torch's TCPStore server (libuv), its port on stdout, until stdin
    closes."""
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=300))  # fmt: skip
    print(store.port, flush=True)
    sys.stdin.read()


# --- the controller ------------------------------------------------------------------------------


class Worker:
    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=env, text=True)  # fmt: skip

    def ask(self, request: dict, limit: float = 600.0) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], limit)
        if not ready:
            raise TimeoutError(f"no answer to {request['op']} within {limit} s")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"a stand-in process ended ({self.proc.wait()})")
        return json.loads(line)


def _old_source(folder: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", OLD_COMMIT, "src"],
                             check=True, capture_output=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder / "src"


def _wait_all(workers: list[Worker], kind: str, count: int, limit: float) -> dict[int, float]:
    """When each stand-in's loop had ``kind``, until all ``count`` had it or ``limit`` seconds
    passed; TimeoutError when a loop was too busy to answer meanwhile (main's protocol decodes
    every node's post on each loop)."""
    deadline = time.monotonic() + limit
    while True:
        found: dict[int, float] = {}
        for worker in workers:
            left = max(1.0, deadline - time.monotonic())
            for index, when in worker.ask({"op": "times", "kind": kind}, left).items():
                if when is not None:
                    found[int(index)] = when
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def _sum(snapshots: list[dict]) -> dict[str, int]:
    return {key: sum(s[key] for s in snapshots) for key in ("requests", "bytes", "frames")}


def run(args: argparse.Namespace) -> dict:
    # torch's client looks up the name of the address it connects to at each connection; this
    # machine's resolver answers some of those lookups after its 5 s timeout: 1 s at most here.
    env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "FATAL", "OMP_NUM_THREADS": "1",
           "RES_OPTIONS": "timeout:1 attempts:1"}  # fmt: skip
    env.pop("NUMARUN_RUNTIME_DIR", None)
    temp = tempfile.TemporaryDirectory()
    source = ROOT / "src" if args.protocol == "new" else _old_source(Path(temp.name))
    env["PYTHONPATH"] = os.pathsep.join([str(source), str(HERE)])
    env["NUMARUN_RUNTIME_DIR"] = temp.name
    os.chmod(temp.name, 0o700)
    me = [sys.executable, str(Path(__file__).resolve())]
    store = subprocess.Popen([*me, "--serve-store"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, env=env, text=True)  # fmt: skip
    assert store.stdout is not None
    port = int(store.stdout.readline())
    nodes = args.nodes
    procs = args.procs or max(2, -(-(nodes - 1) // PER_PROCESS))
    share = -(-(nodes - 1) // procs)  # the other nodes, spread over that many processes
    spans = [(0, 1)] + [(first, min(nodes, first + share)) for first in range(1, nodes, share)]
    workers = [
        Worker([*me, "--serve", str(port), str(first), str(last), str(nodes),
                str(args.ranks_per_node), str(args.interval), args.pattern], env)
        for first, last in spans if last > first
    ]  # fmt: skip
    try:
        for worker in workers:
            worker.ask({"op": "setup"})
        time.sleep(args.interval + 0.5)  # every thread in its wait
        merger, others = workers[0], workers[1:]
        results: dict = {"nodes": nodes, "ranks_per_node": args.ranks_per_node,
                         "protocol": args.protocol, "pattern": args.pattern,
                         "interval_s": args.interval, "processes": len(workers)}  # fmt: skip
        events = {}

        def window(name: str, trigger: dict, target: Worker, kind: str, count: int) -> None:
            if "stopped_at" in results:
                events[name] = {"s": None, "reached": 0, "of": count}
                return
            before = [w.ask({"op": "snapshot", "reset": True}) for w in workers]
            start = target.ask(trigger)["t0"]
            try:
                times = _wait_all(workers, kind, count, args.limit)
            except TimeoutError:
                results["stopped_at"] = f"{name}: a loop did not answer within {args.limit} s"
                events[name] = {"s": None, "reached": 0, "of": count}
                return
            after = [w.ask({"op": "snapshot"}) for w in workers]
            spent = {k: v - _sum(before)[k] for k, v in _sum(after).items()}
            events[name] = {
                "s": (max(times.values()) - start) if len(times) >= count else None,
                "reached": len(times), "of": count, **spent,
                "max_cpu": max(a["max_cpu"] for a in after),
                "max_wall": max(a["max_wall"] for a in after),
                "max_gc": max(a["max_gc"] for a in after),
                "merger_peak_kb": after[0]["hwm_kb"] - before[0]["rss_kb"],
            }  # fmt: skip

        new = args.protocol == "new"
        window("stacks", {"op": "ask", "node": 0}, merger,
               "merged" if new else "reply", 1)  # fmt: skip  (the asking node alone merges)
        for worker in others:
            worker.ask({"op": "still", "nodes": list(range(1, nodes))})
        _wait_stills(port, nodes - 1, args.limit)
        window("verdict", {"op": "still", "nodes": [0]}, merger, "verdict", nodes)
        target = workers[-1] if nodes > 1 else merger
        window("notice", {"op": "fail", "node": nodes - 1}, target, "notice", nodes - 1)
        for name, event in events.items():
            results[f"{name}_s"] = event["s"]
        done = [e for e in events.values() if "bytes" in e]

        def most(key: str) -> float:
            return max(e[key] for e in done)

        results["bytes_per_node_per_event"] = most("bytes") / nodes
        results["frames_bytes_per_event"] = most("frames")
        results["requests_per_node_per_event"] = most("requests") / nodes
        results["max_loop_blocked_s"] = most("max_cpu")
        results["max_loop_blocked_wall_s"] = most("max_wall")
        results["max_gc_pause_s"] = most("max_gc")
        results["merger_peak_mib"] = most("merger_peak_kb") / 1024
        results["events"] = events
        results["load_average"] = os.getloadavg()
        if "stopped_at" not in results:
            results["stop_reasons"] = sorted({r for w in workers for r in w.ask({"op": "stops"})})
            for worker in workers:
                worker.ask({"op": "quit"}, limit=60)
        return results
    finally:
        for worker in workers:
            if worker.proc.poll() is None:
                worker.proc.kill()
            worker.proc.wait()
        store.kill()
        store.wait()
        temp.cleanup()


def _wait_stills(port: int, count: int, limit: float) -> None:
    """Until ``count`` nodes said they are still (their marks wait for their next look)."""
    from datetime import timedelta

    import torch.distributed as dist

    sys.path.insert(0, str(HERE))
    from jobwide_standins import PREFIX

    client = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                           timeout=timedelta(seconds=60))  # fmt: skip
    store = dist.PrefixStore(PREFIX, client)
    deadline = time.monotonic() + limit
    while store.add("numarun/stills", 0) < count and time.monotonic() < deadline:
        time.sleep(0.1)


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        port, first, last, nodes, ranks, interval, pattern = sys.argv[2:9]
        serve(int(port), int(first), int(last), int(nodes), int(ranks), float(interval), pattern)
        return
    if sys.argv[1:2] == ["--serve-store"]:
        serve_store()
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--ranks-per-node", type=int, default=8)
    parser.add_argument("--protocol", choices=("new", "old"), default="new")
    parser.add_argument("--pattern", choices=("block", "strided"), default="block")
    parser.add_argument("--interval", type=float, default=2.0,
                        help="--monitor-interval of every node (the look interval)")
    parser.add_argument("--procs", type=int, default=0,
                        help="processes sharing the nodes other than node 0 (node 0 has its "
                        f"own); default: one per {PER_PROCESS} nodes, at least 2")
    parser.add_argument("--limit", type=float, default=120.0,
                        help="seconds an event may take before it is reported as not reached")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.ranks_per_node != 8:
        parser.error("the synthetic job has 8 ranks per node")
    results = run(args)
    if args.json:
        print(json.dumps(results))
        return
    for key, value in results.items():
        if key != "events":
            print(f"{key:>30}: {value}")


if __name__ == "__main__":
    main()

"""The whole job at scale: N node stand-ins running numarun's real protocol against one real store.

    python benchmarks/bench_jobwide_scale.py --nodes 1024 --ranks-per-node 8 [--json]
        [--pattern block|strided] [--interval 2] [--hang-timeout 10] [--faults all|none|a,b]
        [--torch traffic|off] [--per-process 64] [--limit 120] [--no-view-8192]
        [--diagnostics-store own|rendezvous]

Each stand-in (``benchmarks/jobwide_standins.py``, which says what is real and what stands in,
each stand-in's cost measured by ``benchmarks/jobwide_costs.py``) is an :class:`ElasticNode`
with its ``numarun-store`` thread, :class:`JobStacks` and :class:`HangWatch` (its ticks running),
torch's rendezvous traffic of a node (:class:`TorchTraffic`: its state sync at each look and its
keep-alive every 5 s, of the real state's size at N nodes), on torch's connection of its own to
one torch ``TCPStore`` (libuv, in a process of its own). Node 0 runs alone in one process (the
merging node: its CPU and peak memory are measured there); the others share processes of
``--per-process`` stand-ins each (``jobwide_standin_process.py``), each process one interpreter
with one real supervisor loop for all its stand-ins.

Rounds, each formed as torch forms one (every node's watch begins at once: ``round_start_s`` is
the connect storm, until every node's store thread has its two connections):

1. ``stacks_s``: ``numarun stacks`` for the whole job asked on node 0 -> every node has the
   job's merged stacks; ``verdict_s``: every node's ranks stop moving at once; each node's hang
   watch finds them still after ``--hang-timeout`` (N still posts within about a second) ->
   every node's loop has the verdict, from when the last node went still (the look interval
   included: a still mark waits for the thread's next wake-up); ``notice_s``: the last node's
   rank fails -> every other node's loop has the notice.
2. ``cascade``: every node's rank 0 fails within 1 s (an NCCL timeout) -> every node has a
   notice; what each node read until every node read every notice.
3. ``faults`` (each in a round of its own; ``FAULTS`` says what dies where): seconds from the
   death until every surviving node has a verdict, a notice or its result (``s``; null with
   ``why`` when not within ``--limit``), and what each got.

Bytes and requests are counted by a ``torch.distributed.Store`` in front of each node's store
(keys and values both ways, every request; clones count too), by key family, net of what the
nodes send when nothing happens (looks, beats: measured in each round before its events) over
the event's window, divided by the nodes; classes' frames (posted once per round) apart; torch's
traffic apart (``torch``). CPU: every stand-in process's CPU over the window, net of its idle
rate, over the nodes (``cpu_s_per_node_per_event``); ``cpu_busy``: all stand-ins' and the
store's CPU over the window's wall time and the machine's cores: near 1, the 2 cores, not the
protocol, set the latency. ``merger_cpu_s``: node 0's process for the stacks event, net.
``max_loop_blocked_s``: the longest CPU time a loop's thread spent in one callback;
``max_loop_blocked_wall_s`` its wall time, in any process (up to 128 stand-ins' threads wait for
one GIL there: a cost no launcher pays); ``max_loop_blocked_wall_alone_s`` in node 0's process,
a loop alone in its interpreter as a launcher's is (the 2 cores still shared by every process);
``view_bytes_8192_irregular``: the merged view of 8,192 nodes x 8 ranks whose ranks each take one
of four behaviours at random, encoded by numarun's encoder (stacks/merge.py).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# Stand-ins per process: each a launcher's threads in one interpreter. Packing more makes their
# threads queue for one GIL (a cost no launcher, alone in its process, pays); fewer makes more
# interpreters (about 90 MiB each, torch imported) than memory holds at thousands of nodes.
PER_PROCESS = 64
FAULTS = {
    "merger_dies": "the node whose still completes the count (the judge) dies before it reads "
                   "the still posts: no verdict unless another node takes it over",
    "asker_dies": "the node asking numarun stacks dies after its request and its own answer, "
                  "before it merges",
    "claim_dies": "node 1 dies between its claim of its classes' frames and their set; node 0, "
                  "then node 2, ask numarun stacks (every reader waits for frames never set)",
    "poster_dies": "node 2's poster dies between adding to the event counter and setting its "
                   "event; node 0 asks numarun stacks (its event is behind the hole)",
}  # fmt: skip


def _proc_cpu(pid: int) -> float:
    """A process's CPU seconds, its threads' (the store's server: long-lived threads), exact
    (``/proc/<pid>/task/*/schedstat``)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as stat:
                total += int(stat.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9


def serve_store() -> None:
    """The store's process: torch's TCPStore server (libuv), its port on stdout, until stdin
    closes."""
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=300))  # fmt: skip
    print(store.port, flush=True)
    sys.stdin.read()


class Worker:
    """One stand-in process, driven by one JSON command a line."""

    def __init__(self, argv: list[str], env: dict[str, str], first: int, last: int) -> None:
        self.first, self.last = first, last
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=env, text=True)  # fmt: skip

    def send(self, request: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()

    def answer(self, limit: float = 600.0, what: str = "") -> object:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], limit)
        if not ready:
            raise TimeoutError(f"no answer to {what} within {limit:g} s")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"a stand-in process ended ({self.proc.wait()})")
        return json.loads(line)

    def ask(self, request: dict, limit: float = 600.0) -> object:
        self.send(request)
        return self.answer(limit, request["op"])


def _sum(snapshots: list[dict], key: str) -> float:
    return sum(s[key] for s in snapshots)


class Bench:
    """The store, the stand-in processes, and the rounds (module docstring)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.nodes = args.nodes
        self.results: dict = {"nodes": args.nodes, "ranks_per_node": args.ranks_per_node,
                              "pattern": args.pattern, "interval_s": args.interval,
                              "hang_timeout_s": args.hang_timeout, "torch": args.torch,
                              "diagnostics_store": args.diagnostics_store,
                              "cores": os.cpu_count()}  # fmt: skip
        self.temp = tempfile.TemporaryDirectory()
        # torch's client looks up the name of the address it connects to at each connection;
        # this machine's resolver answers some of those lookups after its 5 s timeout.
        env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "FATAL", "OMP_NUM_THREADS": "1",
               "RES_OPTIONS": "timeout:1 attempts:1", "NUMARUN_RUNTIME_DIR": self.temp.name,
               "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(HERE)])}  # fmt: skip
        os.chmod(self.temp.name, 0o700)
        self.env = env
        me = [sys.executable, str(Path(__file__).resolve())]
        self.store = subprocess.Popen([*me, "--serve-store"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, env=env, text=True)  # fmt: skip
        assert self.store.stdout is not None
        self.port = int(self.store.stdout.readline())
        self.workers: list[Worker] = []
        self.idle: dict = {}
        from datetime import timedelta

        import torch.distributed as dist

        self.probe = dist.TCPStore("127.0.0.1", self.port, is_master=False,
                                   wait_for_workers=False, timeout=timedelta(seconds=300))

    # --- processes --------------------------------------------------------------------------------

    def start(self, options: dict) -> None:
        nodes, per = self.nodes, self.args.per_process
        procs = max(2, -(-(nodes - 1) // per)) if nodes > 1 else 0
        share = -(-(nodes - 1) // procs) if procs else 1
        spans = [(0, 1)] + [(first, min(nodes, first + share)) for first in range(1, nodes, share)]
        program = str(HERE / "jobwide_standin_process.py")
        for first, last in spans:
            argv = [sys.executable, program, str(self.port), str(first), str(last), str(nodes),
                    json.dumps(options)]  # fmt: skip
            self.workers.append(Worker(argv, self.env, first, last))
        self.results["processes"] = len(self.workers)
        self.broadcast({"op": "setup"}, limit=1800)
        if options["torch"]:
            self._torch_state()

    def _torch_state(self) -> None:
        """torch's rendezvous state of this round, as its c10d backend keeps it (the real
        state's size at N nodes: jobwide_costs.state_text)."""
        import jobwide_costs
        import jobwide_standins

        text = jobwide_costs.state_text(self.nodes)
        assert jobwide_standins.waiting_in(text) == 0  # nobody waits yet
        self.probe.set("torch.rendezvous.bench", text)
        self.results["torch_state_bytes"] = len(text)

    def broadcast(self, request: dict, limit: float = 600.0) -> list:
        """Send ``request`` to every process, then read every answer (all start at once)."""
        for worker in self.workers:
            worker.send(request)
        return [worker.answer(limit, request["op"]) for worker in self.workers]

    def worker_of(self, node: int) -> Worker:
        return next(w for w in self.workers if w.first <= node < w.last)

    def times(self, kind: str) -> dict[int, float | None]:
        found: dict[int, float | None] = {}
        for answer in self.broadcast({"op": "times", "kind": kind}):
            found.update({int(k): v for k, v in answer.items()})  # type: ignore[union-attr]
        return found

    def wait_for(self, kind: str, count: int, limit: float) -> dict[int, float]:
        """When each stand-in had ``kind``, once ``count`` had it or ``limit`` seconds passed."""
        deadline = time.monotonic() + limit
        while True:
            found = {k: v for k, v in self.times(kind).items() if v is not None}
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.2)

    def state(self) -> dict:
        merged: dict = {"dead": [], "reasons": {}, "notices": [], "seen": [], "torch_retries": 0}
        for answer in self.broadcast({"op": "state"}):
            merged["dead"] += answer["dead"]
            merged["notices"] += answer["notices"]
            merged["seen"] += answer["seen"]
            merged["torch_retries"] += answer["torch_retries"]
            for reason, count in answer["reasons"].items():
                merged["reasons"][reason] = merged["reasons"].get(reason, 0) + count
        return merged

    def close(self) -> None:
        for worker in self.workers:
            if worker.proc.poll() is None:
                worker.proc.kill()
            worker.proc.wait()
        self.store.kill()
        self.store.wait()
        self.temp.cleanup()

    # --- rounds and windows -----------------------------------------------------------------------

    def new_round(self, number: int) -> dict:
        """Round ``number`` forms; every node's watch begins at once; then the nodes' idle
        traffic and CPU are measured (``idle`` seconds)."""
        if self.args.torch == "traffic" and number:
            self._torch_state()  # a round formed: torch's wait list is empty again
        self.broadcast({"op": "round", "number": number}, limit=1800)
        started = time.monotonic()
        answers = self.broadcast({"op": "begin", "limit": self.args.limit})
        storm = {"s": max(a["last"] for a in answers) - started,
                 "unconnected": sum(a["unconnected"] for a in answers)}  # fmt: skip
        time.sleep(self.args.interval + 0.5)  # every thread past its first look
        before = self.broadcast({"op": "snapshot", "reset": True})
        server = _proc_cpu(self.store.pid)
        time.sleep(self.args.idle)
        after = self.broadcast({"op": "snapshot"})
        spent = after[0]["now"] - before[0]["now"]
        self.idle = {
            "s": spent,
            "store_round_trip_ms": self._round_trip() * 1e3,
            "cpu_per_s": (_sum(after, "cpu") - _sum(before, "cpu")) / spent,
            "merger_cpu_per_s": (after[0]["cpu"] - before[0]["cpu"]) / spent,
            "server_cpu_per_s": (_proc_cpu(self.store.pid) - server) / spent,
            "requests_per_s": (_sum(after, "requests") - _sum(before, "requests")) / spent,
            "bytes_per_s": (_sum(after, "bytes") - _sum(before, "bytes")) / spent,
            "torch_requests_per_s": (_sum(after, "torch_requests")
                                     - _sum(before, "torch_requests")) / spent,
            "torch_bytes_per_s": (_sum(after, "torch_bytes") - _sum(before, "torch_bytes")) / spent,
            "threads": _sum(after, "threads"),
            "rss_mib": _sum(after, "rss_kb") / 1024,
        }  # fmt: skip
        return storm

    def _round_trip(self, count: int = 9) -> float:
        """The store's median round trip for a small request (``add`` of a probe key) from a
        client of its own, now: what every request waits behind (torch's traffic included)."""
        spent = []
        for _ in range(count):
            start = time.monotonic()
            self.probe.add("bench/probe", 1)
            spent.append(time.monotonic() - start)
        return sorted(spent)[count // 2]

    def window(self, trigger: callable, kind: str, count: int, limit: float,  # type: ignore[valid-type]
               settle: float = 0.0) -> dict:  # fmt: skip
        """Measure one event: ``trigger()`` (its start time), counted from ``settle`` seconds
        after it (the verdict: from shortly before the first node can go still), until
        ``count`` nodes had ``kind``."""
        if settle:
            start = trigger()
            time.sleep(settle)
        before = self.broadcast({"op": "snapshot", "reset": True})
        server = _proc_cpu(self.store.pid)
        if not settle:
            start = trigger()
        times = self.wait_for(kind, count, limit)
        after = self.broadcast({"op": "snapshot"})
        wall = after[0]["now"] - before[0]["now"]
        nodes, idle = self.nodes, self.idle
        server_cpu = _proc_cpu(self.store.pid) - server
        cpu = _sum(after, "cpu") - _sum(before, "cpu")
        families: dict[str, list[int]] = {}
        for snaps, sign in ((after, 1), (before, -1)):
            for snap in snaps:
                for family, (requests, size) in snap["families"].items():
                    entry = families.setdefault(family, [0, 0])
                    entry[0] += sign * requests
                    entry[1] += sign * size
        delta = {key: _sum(after, key) - _sum(before, key)
                 for key in ("requests", "bytes", "frames", "torch_requests", "torch_bytes")}
        early = sum(1 for when in times.values() if when < start)
        found = {
            "s": (max(times.values()) - start) if len(times) >= count and not early else None,
            "t0": start, "times": times, "reached": len(times), "of": count, "wall_s": wall,
            **delta,
            "net_requests": delta["requests"] - idle["requests_per_s"] * wall,
            "net_bytes": delta["bytes"] - idle["bytes_per_s"] * wall,
            "families": {k: v for k, v in sorted(families.items(), key=lambda kv: -kv[1][1])
                         if v[0]},
            "cpu_s": cpu, "server_cpu_s": server_cpu,
            "cpu_s_per_node": (cpu - idle["cpu_per_s"] * wall) / nodes,
            "cpu_busy": (cpu + server_cpu) / (wall * (os.cpu_count() or 1)),
            "merger_cpu_s": (after[0]["cpu"] - before[0]["cpu"]) - idle["merger_cpu_per_s"] * wall,
            "max_cpu": max(a["max_cpu"] for a in after),
            "max_wall": max(a["max_wall"] for a in after),
            # Node 0's process holds it alone, as a launcher's loop is: no other stand-in's
            # threads wait for its GIL (the machine's 2 cores are still shared by all).
            "max_wall_alone": after[0]["max_wall"],
            "max_gc": max(a["max_gc"] for a in after),
            "merger_peak_kb": after[0]["hwm_kb"] - before[0]["rss_kb"],
            "load_average": os.getloadavg(),
        }  # fmt: skip
        if early:
            found["why"] = f"{early} node(s) had {kind!r} before the event (an earlier stop)"
        elif found["s"] is None:
            found["why"] = f"{len(times)} of {count} nodes had {kind!r} within {limit:g} s"
        return found

    def trigger(self, request: dict, node: int | None = None) -> callable:  # type: ignore[valid-type]
        def run() -> float:
            if node is None:
                return min(a["t0"] for a in self.broadcast(request))
            return self.worker_of(node).ask(request)["t0"]  # type: ignore[index]

        return run

    # --- the scenarios ----------------------------------------------------------------------------

    def events(self) -> dict:
        """Round 0: the connect storm, then stacks, the hang verdict, one notice."""
        nodes, limit = self.nodes, self.args.limit
        events: dict = {}
        self.results["round_start_s"] = self.new_round(0)
        self.results["idle"] = self.idle
        # The asking node alone merges and reads the result (no other node hears of it).
        events["stacks"] = self.window(self.trigger({"op": "ask", "node": 0}, 0), "merged",
                                       1, limit)  # fmt: skip
        self.results["stacks_reply"] = self.worker_of(0).ask({"op": "reply", "node": 0})
        verdict = self.window(self.trigger({"op": "freeze"}), "verdict", nodes, limit,
                              settle=max(0.0, self.args.hang_timeout - 1.5))  # fmt: skip
        stills = {k: v for k, v in self.times("still").items() if v is not None}
        if stills and verdict["s"] is not None:
            verdict["from_freeze_s"] = verdict["s"]
            verdict["s"] = max(verdict["times"].values()) - max(stills.values())
            verdict["still_spread_s"] = max(stills.values()) - min(stills.values())
        events["verdict"] = verdict
        last = nodes - 1
        events["notice"] = self.window(self.trigger({"op": "fail", "node": last}, last),
                                       "notice", nodes - 1, limit)  # fmt: skip
        self.results["stop_reasons"] = self.state()["reasons"]
        return events

    def cascade(self, number: int) -> dict:
        """Every node's rank 0 fails within 1 s: until every node had another's notice, then
        until every node read every notice (what each read, per node)."""
        self.new_round(number)
        # Until the round is over for every node: another's notice, or its own failure (a
        # node reads no notice after its own).
        event = self.window(self.trigger({"op": "cascade", "window": 1.0}), "over",
                            self.nodes, self.args.limit)  # fmt: skip
        # A node reads the round's first notice (and its frames) and no later event: what it
        # reads is done within two looks of the last node's notice (no node reads them all).
        deadline = time.monotonic() + self.args.limit
        settled = time.monotonic() + 2 * self.args.interval + 1.0
        while time.monotonic() < deadline:
            state = self.state()
            if (state["seen"] and min(state["seen"]) >= self.nodes) or time.monotonic() > settled:
                break
            time.sleep(0.5)
        after = self.broadcast({"op": "snapshot"})
        state = self.state()
        notices = sorted(state["notices"])
        event["read_all_s"] = after[0]["now"] - event["t0"]
        event["requests_until_all_read"] = _sum(after, "requests") - event["requests"]
        event["notices_read_per_node"] = {"min": notices[0], "median": notices[len(notices) // 2],
                                          "max": notices[-1]}  # fmt: skip
        return event

    def fault(self, name: str, number: int) -> dict:
        """One fault in round ``number`` (FAULTS): seconds from the death until every
        surviving node has an outcome."""
        self.new_round(number)
        nodes, limit = self.nodes, self.args.limit
        found: dict = {"what": FAULTS[name]}
        if name == "merger_dies":
            self.broadcast({"op": "fault", "kind": "judge"})
            self.broadcast({"op": "freeze"})
            kind = "stopped"
        elif name == "asker_dies":
            self.worker_of(0).ask({"op": "fault", "kind": "asker", "node": 0})
            self.worker_of(0).ask({"op": "ask", "node": 0})
            kind = "stopped"
        elif name == "claim_dies":
            self.broadcast({"op": "freeze"})  # every node's samples alike: node 1's classes
            self.worker_of(1).ask({"op": "fault", "kind": "claim", "node": 1})
            self.worker_of(1).ask({"op": "claim", "node": 1})
            kind = "merged"
        else:
            self.worker_of(2).ask({"op": "fault", "kind": "poster", "node": 2})
            self.worker_of(2).ask({"op": "ask", "node": 2})
            kind = "outcome"
        died = self._death(limit + self.args.hang_timeout)
        if died is None:
            return {**found, "s": None, "why": "the injected death never happened"}
        found["died"] = {"node": died[0], "before": died[2]}
        if name in ("claim_dies", "poster_dies"):
            found.update(self._requests_after(name, nodes, limit))
            return found
        # The judge's death is armed once per process: a node of another process that reads
        # the still nodes (a still node's wave, checking every post) dies too, maybe later.
        deadline = time.monotonic() + limit + 30
        while True:
            survivors = nodes - len(self.state()["dead"])
            times = {k: v for k, v in self.times(kind).items() if v is not None}
            if len(times) >= survivors or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        found["s"] = max(times.values()) - died[1] if len(times) >= survivors else None
        if times:  # the first node's outcome (a dead node's neighbour: its silence seen)
            found["first_s"] = min(times.values()) - died[1]
        early = sum(1 for when in times.values() if when < died[1])
        if early:  # stopped by something else than the death: not this fault's outcome
            found["s"] = None
            found["why"] = f"{early} node(s) stopped before the death"
        elif found["s"] is None:
            found["why"] = f"{len(times)} of {survivors} surviving nodes had an outcome within " \
                           f"{limit + 30:g} s"  # fmt: skip
            found["without"] = sorted(k for k, v in self.times(kind).items() if v is None)[:8]
        found["outcomes"] = self.state()["reasons"]
        return found

    def _merged_at(self, node: int, limit: float) -> float | None:
        """When node ``node`` had its merged result (None: not within ``limit`` seconds)."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            when = self.times("merged").get(node)
            if when is not None:
                return when
            time.sleep(0.1)
        return None

    def _death(self, limit: float) -> tuple[int, float, str] | None:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            dead = self.state()["dead"]
            if dead:
                return dead[0]
            time.sleep(0.2)
        return None

    def _requests_after(self, name: str, nodes: int, limit: float) -> dict:
        """``numarun stacks`` asked on node 0 (and again on node 3 for claim_dies) after the
        death: seconds until the asking node has its merged result (it alone merges and reads
        it)."""
        found: dict = {}
        askers = [0, 3] if name == "claim_dies" else [0]
        for turn, asker in enumerate(askers):
            if turn:
                self.broadcast({"op": "forget", "kinds": ["merged", "reply"]})
            start = self.worker_of(asker).ask({"op": "ask", "node": asker})["t0"]  # type: ignore[index]
            # The merged result itself (the dead node's silence, named after 3 keep-alives,
            # must not count).
            when = self._merged_at(asker, limit)
            key = "s" if not turn else "second_request_s"
            found[key] = when - start if when is not None else None
            merged = {k: v for k, v in self.times("merged").items() if v is not None}
            found[f"merged_{turn}"] = len(merged)
            found[f"reply_{turn}"] = self.worker_of(asker).ask({"op": "reply", "node": asker})
        found["outcomes"] = self.state()["reasons"]
        if found["s"] is None:
            found["why"] = f"the asking node had no merged result within {limit:g} s"
        return found


def view_bytes_irregular(nodes: int = 8192, ranks: int = 8) -> dict:
    """The merged view of ``nodes`` x ``ranks`` whose ranks each take one of four behaviours at
    random (seeded), built as the merging node builds it (each node's digest, the merge) and
    encoded by numarun's encoder; whether numarun's reader takes it back."""
    import jobwide_product as product
    import jobwide_standins as js

    known = product.Classes()
    digests = []
    for node in range(nodes):
        dumps = []
        for local in range(ranks):
            rank = node * ranks + local
            kind = js.behaviour(rank, local, node, nodes, "random4")
            dumps.append(product.Raw(rank, local, 10_000 + local, js.synthetic_dump(kind, rank),
                                     None))  # fmt: skip
        digest, _ = product.node_digest(dumps, node=node, host=f"gpu-node{node:05d}",
                                        pid=4242, state="answer", known=known)  # fmt: skip
        digests.append(digest)
    view = product.merge(digests, kind="stacks", by="node 0 (gpu-node00000)", size=nodes)
    encoded = product.encode_view(view)
    try:
        product.read_view(encoded)
        readable = "yes"
    except Exception as error:  # PostError: what numarun's reader says
        readable = str(error)
    return {"bytes": len(encoded), "limit": product.VIEW_LIMIT, "classes": len(view.classes),
            "read_back": readable}  # fmt: skip


def summarize(results: dict, events: dict) -> None:
    """The top-level figures: each the largest over the round's three events."""
    done = [e for e in events.values() if "bytes" in e]
    nodes = results["nodes"]
    for name, event in events.items():
        results[f"{name}_s"] = event["s"]
    if not done:
        results["stopped_at"] = "no event was measured"
        return

    def most(key: str) -> float:
        return max(e[key] for e in done)

    results["bytes_per_node_per_event"] = most("net_bytes") / nodes
    results["frames_bytes_per_event"] = most("frames")
    results["requests_per_node_per_event"] = most("net_requests") / nodes
    results["max_loop_blocked_s"] = most("max_cpu")
    results["max_loop_blocked_wall_s"] = most("max_wall")
    results["max_loop_blocked_wall_alone_s"] = most("max_wall_alone")
    results["max_gc_pause_s"] = most("max_gc")
    results["merger_peak_mib"] = most("merger_peak_kb") / 1024
    results["merger_cpu_s"] = events["stacks"]["merger_cpu_s"]
    results["cpu_s_per_node_per_event"] = most("cpu_s_per_node")
    results["cpu_busy"] = {name: round(e["cpu_busy"], 2) for name, e in events.items()}
    idle = results.get("idle", {})
    if idle:
        results["torch_bytes_per_node_s"] = idle["torch_bytes_per_s"] / nodes
        results["torch_requests_per_node_s"] = idle["torch_requests_per_s"] / nodes
    for event in events.values():
        event.pop("times", None)


def run(args: argparse.Namespace) -> dict:
    bench = Bench(args)
    options = {"ranks": args.ranks_per_node, "interval": args.interval,
               "hang_timeout": args.hang_timeout, "pattern": args.pattern,
               "keep_alive": args.keep_alive, "torch": args.torch == "traffic",
               "latencies": _latencies(args),
               "diagnostics_store": args.diagnostics_store}  # fmt: skip
    results = bench.results
    started = time.monotonic()
    results["load_average_start"] = os.getloadavg()

    def stage(name: str) -> None:  # what is known so far, for a run cut short
        results.setdefault("stages_s", {})[name] = time.monotonic() - started
        if args.out:
            with open(args.out, "w") as file:
                json.dump(results, file)

    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(f"stopped by signal {signum}"))
    try:
        bench.start(options)
        results["setup_s"] = time.monotonic() - started
        events = bench.events()
        summarize(results, events)
        results["events"] = events
        stage("events")
        number = 1
        if args.cascade:
            results["cascade"] = bench.cascade(number)
            results["cascade"].pop("times", None)
            stage("cascade")
            number += 1
        names = list(FAULTS) if args.faults == "all" else [
            f for f in args.faults.split(",") if f and f != "none"]  # fmt: skip
        results["faults"] = {}
        for name in names:
            results["faults"][name] = bench.fault(name, number)
            stage(name)
            number += 1
        results["load_average"] = os.getloadavg()
        bench.broadcast({"op": "quit"}, limit=60)
    finally:
        bench.close()
    if args.view_8192:
        view = view_bytes_irregular()
        results["view_bytes_8192_irregular"] = view["bytes"]
        results["view_8192_irregular"] = view
    results["run_s"] = time.monotonic() - started
    stage("end")
    return results


def _latencies(args: argparse.Namespace) -> list[float] | None:
    """The dump latencies the stand-ins draw from: measured now on 8 real ranks (40 asks), or
    the ones in ``--dump-latencies`` (a JSON file of jobwide_costs.py's output)."""
    if args.dump_latencies:
        with open(args.dump_latencies) as file:
            return json.load(file)["dump"]["latencies_s"]
    import jobwide_costs

    return jobwide_costs.dump_latency(8, 40)["latencies_s"]


def main() -> None:
    if sys.argv[1:2] == ["--serve-store"]:
        serve_store()
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--ranks-per-node", type=int, default=8)
    parser.add_argument("--pattern", choices=("block", "strided", "random4"), default="block")
    parser.add_argument("--interval", type=float, default=2.0,
                        help="--monitor-interval of every node (the look interval)")
    parser.add_argument("--hang-timeout", type=float, default=10.0)
    parser.add_argument("--torch", choices=("traffic", "off"), default="traffic",
                        help="torch's rendezvous traffic of every node (off: none)")
    parser.add_argument("--keep-alive", type=int, default=5,
                        help="torch's keep_alive_interval (its default: 5 s); numarun declares "
                        "a node gone after 3 of them without its heartbeat")
    parser.add_argument("--faults", default="all",
                        help=f"all, none, or some of {','.join(FAULTS)}")
    parser.add_argument("--no-cascade", dest="cascade", action="store_false")
    parser.add_argument("--no-view-8192", dest="view_8192", action="store_false")
    parser.add_argument("--per-process", type=int, default=PER_PROCESS,
                        help="stand-ins per process (node 0 has one of its own)")
    parser.add_argument("--idle", type=float, default=5.0,
                        help="seconds of each round's idle measurement")
    parser.add_argument("--dump-latencies", default="",
                        help="a JSON file from jobwide_costs.py --json (else measured now)")
    parser.add_argument("--limit", type=float, default=120.0,
                        help="seconds an event may take before it is reported as not reached")
    parser.add_argument("--out", default="",
                        help="also write the results so far to this file after each stage")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--diagnostics-store", choices=("own", "rendezvous"), default="own",
                        help="the whole-job view's keys on a store of their own, hosted by "
                        "node 0's stand-in (the launcher's default), or on the rendezvous "
                        "store with torch's traffic")
    args = parser.parse_args()
    if args.ranks_per_node != 8:
        parser.error("the synthetic job has 8 ranks per node")
    if args.nodes < 4:
        parser.error("--nodes must be at least 4 (the faults name nodes 0 to 3)")
    unknown = set(args.faults.split(",")) - set(FAULTS) - {"all", "none", ""}
    if unknown:
        parser.error(f"unknown fault(s): {', '.join(sorted(unknown))}")
    results = run(args)
    if args.json:
        print(json.dumps(results))
        return
    for key, value in results.items():
        if key not in ("events", "faults", "cascade", "idle"):
            print(f"{key:>30}: {value}")
    for key in ("cascade", "faults"):
        print(f"{key:>30}: {json.dumps(results.get(key))}")


if __name__ == "__main__":
    main()

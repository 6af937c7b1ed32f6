"""One process of node stand-ins for ``bench_jobwide_scale.py``: stand-ins ``first`` to ``last - 1``
(``benchmarks/jobwide_standins.py``) on one real supervisor loop, driven by JSON commands on stdin,
one JSON answer per command on stdout.

    python benchmarks/jobwide_standin_process.py PORT FIRST LAST NODES OPTIONS_JSON

Each stand-in has torch's connection of its own (one ``TCPStore`` client, as torch's handler
makes one per node), its round's store under torch's per-round prefix over it, its
:class:`TorchTraffic` on that connection, its store thread's two connections per round. The
loop serves the stand-ins' callbacks (their results, the hang watch's ticks, dumps taken) and
the commands, one at a time; nothing here waits for the stand-ins but :meth:`begin` (for their
connections, the loop running meanwhile).
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from typing import Any

import torch.distributed as dist

import jobwide_product as product
import jobwide_standins as js


def _status(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])  # kB
    return 0


def _thread_cpu(native: int | None) -> float:
    try:
        with open(f"/proc/self/task/{native}/schedstat") as stat:
            return int(stat.read().split()[0]) / 1e9  # ns on a CPU, exact
    except (OSError, IndexError, ValueError):
        return 0.0


def cpu_by_role() -> dict[str, float]:
    """This process's CPU seconds: in all, in the loop's thread, in the store threads."""
    store = sum(_thread_cpu(t.native_id) for t in threading.enumerate()
                if t.name == "numarun-store")  # fmt: skip
    return {"cpu": time.process_time(), "store_cpu": store,
            "loop_cpu": _thread_cpu(threading.main_thread().native_id)}  # fmt: skip


class StandInProcess:
    """The stand-ins of this process and the commands that drive them (module docstring)."""

    def __init__(self, port: int, first: int, last: int, nodes: int, options: dict) -> None:
        self.port = port
        self.first = first
        self.last = last
        self.nodes = nodes
        self.options = options
        self.tally = js.Tally()
        self.torch_tally = js.Tally()
        self.host = js.LoopHost()
        self.stand_ins: dict[int, js.StandIn] = {}
        self.clients: dict[int, Any] = {}
        self.round = 0
        self.began: dict[str, float] = {}
        js.count_diagnostics(self.tally)  # the diagnostics store's calls are numarun's too

    # --- building ---------------------------------------------------------------------------------

    def _make(self, index: int) -> js.StandIn:
        options = self.options
        client = js.client(self.port)
        self.clients[index] = client
        fate = js.Fate()
        store = js.CountingStore(dist.PrefixStore(js.round_prefix(self.round), client),
                                 self.tally, fate)  # fmt: skip
        torch = None
        if options["torch"]:
            torch = js.TorchTraffic(client, index, self.nodes, self.torch_tally, fate,
                                    keep_alive=float(options["keep_alive"]))  # fmt: skip
        stand_in = js.StandIn(
            self.host, store, index, self.nodes, options["ranks"],
            interval=options["interval"], hang_timeout=options["hang_timeout"],
            pattern=options["pattern"], keep_alive=options["keep_alive"], torch=torch,
            ticks=True, latency=js.latency_sampler(options.get("latencies"), index),
            hostname=f"gpu-node{index:05d}.cluster.internal",
            diagnostics_store=options.get("diagnostics_store", "rendezvous"),
        )  # fmt: skip
        if torch is not None:
            torch.start()
        return stand_in

    def setup(self) -> dict:
        for index in range(self.first, self.last):
            self.stand_ins[index] = self._make(index)
        return {"ok": True}

    def new_round(self, number: int) -> dict:
        """Every stand-in's run ends and round ``number`` forms: a launcher that died is
        started again (a new one, its own connection); each says it is a numarun node."""
        self.round = number
        for index, stand_in in list(self.stand_ins.items()):
            stand_in.end_round()
            if stand_in.fate.dead.is_set():
                self.stand_ins[index] = self._make(index)
                continue
            stand_in.fate.when = None
            store = js.CountingStore(dist.PrefixStore(js.round_prefix(number),
                                                      self.clients[index]),
                                     self.tally, stand_in.fate)  # fmt: skip
            stand_in.start_round(store, number)
        # Each node registers on its own (on torch's connection, behind its keep-alive's
        # writes): in parallel, as on separate machines.
        threads = [threading.Thread(target=s.register) for s in self.stand_ins.values()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        import gc

        gc.collect()
        gc.freeze()  # as the launcher does before each attempt (launch/attempts.py)
        return {"ok": True}

    def begin(self, limit: float) -> dict:
        """Every stand-in's watch begins at once (their connections: the connect storm); the
        answer once all are connected (or ``limit`` seconds passed): when the last was."""
        start = time.monotonic()
        for stand_in in self.stand_ins.values():
            stand_in.begin()
        waiting = set(self.stand_ins)
        last = start
        while waiting and time.monotonic() - start < limit:
            for index in [i for i in waiting if self.stand_ins[i].connected()]:
                waiting.discard(index)
                last = time.monotonic()
            if waiting:
                self.host.poll(0.005)
        return {"t0": start, "last": last, "unconnected": len(waiting)}

    # --- measuring --------------------------------------------------------------------------------

    def snapshot(self, reset: bool) -> dict:
        host = self.host
        if reset:
            with open("/proc/self/clear_refs", "w") as refs:
                refs.write("5")  # the peak resident size starts again from here
            host.max_cpu = host.max_wall = host.max_gc = 0.0
        torch = self.torch_tally.snapshot()
        return {**self.tally.snapshot(), "rss_kb": _status("VmRSS"), "hwm_kb": _status("VmHWM"),
                "max_cpu": host.max_cpu, "max_wall": host.max_wall, "max_gc": host.max_gc,
                "torch_requests": torch["requests"], "torch_bytes": torch["bytes"],
                "threads": threading.active_count(), "now": time.monotonic(),
                **cpu_by_role()}  # fmt: skip

    def times(self, kind: str) -> dict[int, float | None]:
        """When each live stand-in's loop first had ``kind`` in this round: a result kind,
        ``verdict`` (a hang stop), ``still`` (its hang watch said still), ``stopped`` (any
        stop request: a verdict, a notice, its own look), ``outcome`` (stopped or merged),
        ``over`` (another node's notice, or its own failure: a node reads no notice after its
        own)."""
        found: dict[int, float | None] = {}
        for index, stand_in in self.stand_ins.items():
            if stand_in.fate.dead.is_set():
                continue
            stopped = stand_in.supervisor.stopped
            if kind == "verdict":
                found[index] = stand_in.verdict_at()
            elif kind == "stopped":
                found[index] = stopped[0] if stopped else None
            elif kind == "over":  # the round is over for it: another's notice, or its own
                found[index] = min([t for t in (stand_in.times.get("notice"),
                                                stand_in.times.get("failed")) if t] or [None])  # type: ignore[type-var]
            elif kind == "outcome":
                found[index] = min([t for t in (stopped[0] if stopped else None,
                                                stand_in.times.get("merged")) if t] or [None])  # type: ignore[type-var]
            else:
                found[index] = stand_in.times.get(kind)
        return found

    def state(self) -> dict:
        stand_ins = self.stand_ins.values()
        dead = [(s.index, s.fate.at, s.fate.why) for s in stand_ins if s.fate.dead.is_set()]
        reasons: dict[str, int] = {}
        for stand_in in stand_ins:
            reason = stand_in.stop_reason()
            if reason and not stand_in.fate.dead.is_set():
                reasons[reason] = reasons.get(reason, 0) + 1
        notices = sorted(s.counts.get("notice", 0) for s in stand_ins)
        seen = [s.node.watched_round.seen for s in stand_ins if s.node.watched_round]
        retries = sum(s.torch.retries for s in stand_ins if s.torch is not None)
        return {"dead": dead, "reasons": reasons, "notices": notices, "seen": seen,
                "torch_retries": retries}  # fmt: skip

    # --- events and faults ------------------------------------------------------------------------

    def cascade(self, window: float) -> dict:
        """Every stand-in's rank 0 fails at a random moment within ``window`` seconds."""
        rng = random.Random(self.first)
        start = time.monotonic()
        for stand_in in self.stand_ins.values():
            self.host.loop.call_later(window * rng.random(), stand_in.fail)
        return {"t0": start}

    def fault(self, kind: str, node: int | None) -> dict:
        """Arm a launcher's death (``kind``; ``node``, when in this process, or any node that
        gets there: the judge) at a point of the protocol (bench_jobwide_scale.FAULTS)."""
        armed = threading.Lock()

        def once(test: Any) -> Any:
            def when(op: str, key: str) -> bool:
                return test(op, key) and armed.acquire(blocking=False)

            return when

        tests = {
            "judge": lambda op, key: op in ("check", "get") and key == product.STILL_NODES_KEY,
            "asker": lambda op, key: op == "wait" and key.startswith(
                product.COMPLETE_KEY.format("")),
            "claim": lambda op, key: op == "set" and key.startswith(product.FRAMES_KEY.format("")),
            "poster": lambda op, key: op == "set" and key.startswith(product.EVENT_KEY.format("")),
        }  # fmt: skip
        targets = [self.stand_ins[node]] if node in self.stand_ins else []
        if kind == "judge":
            targets = list(self.stand_ins.values())
        when = once(tests[kind])
        for stand_in in targets:
            stand_in.fate.when = when
        return {"armed": len(targets)}

    def claim_first(self, node: int) -> dict:
        """Node ``node`` publishes its classes' frames now (its store thread, at its next
        wake-up): it claims them first in the round (and, armed, dies before its set)."""
        stand_in = self.stand_ins[node]

        def publish(round_: Any) -> None:
            _, frames = product.node_digest(
                stand_in.raw(), node=round_.me, host=round_.host, pid=round_.pid,
                state="answer", known=product.protocol.state(round_).classes)  # fmt: skip
            product.protocol.publish(stand_in.node.watch, round_, frames, round_.conn)

        start = time.monotonic()
        stand_in.node.watch.queue(publish)
        return {"t0": start}

    def command(self, request: dict) -> object:
        op = request["op"]
        if op == "setup":
            return self.setup()
        if op == "round":
            return self.new_round(request["number"])
        if op == "begin":
            return self.begin(request.get("limit", 120.0))
        if op == "snapshot":
            return self.snapshot(bool(request.get("reset")))
        # An event's start is read before it is set off: read after, a busy machine can
        # deschedule this thread until the event has reached a node (counted as before it).
        if op in ("ask", "fail") and request["node"] in self.stand_ins:
            start = time.monotonic()
            getattr(self.stand_ins[request["node"]], op)()
            return {"t0": start}
        if op == "freeze":
            start = time.monotonic()
            for stand_in in self.stand_ins.values():
                stand_in.freeze()
            return {"t0": start}
        if op == "times":
            return self.times(request["kind"])
        if op == "state":
            return self.state()
        if op == "cascade":
            return self.cascade(request["window"])
        if op == "fault":
            return self.fault(request["kind"], request.get("node"))
        if op == "claim":
            return self.claim_first(request["node"])
        if op == "forget":
            for stand_in in self.stand_ins.values():
                for kind in request["kinds"]:
                    stand_in.times.pop(kind, None)
            return {"ok": True}
        if op == "reply":
            return self.reply(request["node"])
        if op == "quit":
            for stand_in in self.stand_ins.values():
                if not stand_in.fate.dead.is_set():
                    stand_in.close()
            return {"ok": True}
        return {"error": f"unknown op {op!r}"}

    def reply(self, node: int) -> dict:
        """What the last ``numarun stacks`` reply of ``node`` held (its view's size, the nodes
        it names missing)."""
        replies = self.stand_ins[node].replies if node in self.stand_ins else []
        found: dict = {"replies": len(replies)}
        if replies and "view" in replies[-1]:
            text = replies[-1]["view"].encode()
            view, _ = product.read_view(text, limit=1 << 26)
            found.update(view_chars=len(text), answered=len(view.answered),
                         missing=[(why, len(nodes)) for why, nodes in view.missing],
                         classes=len(view.classes))  # fmt: skip
        elif replies:
            found["error"] = replies[-1].get("error")
        return found


def serve(process: StandInProcess) -> None:
    """Commands from stdin (one JSON object a line), answered in order, between the loop's
    callbacks."""
    fd = sys.stdin.fileno()
    os.set_blocking(fd, False)
    pending = b""
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
            request = json.loads(line)
            answer = process.command(request)
            sys.stdout.write(json.dumps(answer) + "\n")
            sys.stdout.flush()
            if request["op"] == "quit":
                os._exit(0)  # threads blocked in torch's C++ calls: no interpreter shutdown

    process.host.loop.add_reader(fd, read_commands)
    while running[0]:
        process.host.poll(0.05)
    os._exit(0)


def main() -> None:
    port, first, last, nodes = (int(value) for value in sys.argv[1:5])
    serve(StandInProcess(port, first, last, nodes, json.loads(sys.argv[5])))


if __name__ == "__main__":
    main()

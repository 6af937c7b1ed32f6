"""What the node stand-ins of ``bench_jobwide_scale.py`` replace, measured on the real thing.

    python benchmarks/jobwide_costs.py [--json] [--handlers 2,4,8,16] [--seconds 21]

A stand-in is a claim about a cost; each claim here is measured, so the stand-ins
(``benchmarks/jobwide_standins.py``) can be given exactly that cost:

* **torch's rendezvous handler while workers run** (:func:`handler_traffic`): ``K`` real
  ``DynamicRendezvousHandler`` objects (torch's c10d backend) form a real round on a real
  ``TCPStore``; then, for ``seconds``, torch's own keep-alive thread runs at torch's default
  (every 5 s) and each node looks at the rendezvous as numarun's store thread does every look
  interval (``num_nodes_waiting()`` then ``is_closed()``); every store request of the
  handlers is counted by operation (requests, bytes both ways). What a node sends and reads
  per second is a few requests, each carrying the whole pickled state.
* **the state's size at N nodes** (:func:`state_text`): torch's ``_RendezvousState`` of a
  complete round of N nodes, built with torch's own classes, pickled as torch's state holder
  pickles it and base64-encoded as its c10d backend stores it: exact at any N (host names of
  :data:`HOST_FORMAT`'s length, 31 characters). :func:`unpickle_cpu` is what each node's
  ``pickle.loads`` of it costs (torch does one per sync; the stand-ins do not spend it).
* **a rank's dump** (:func:`dump_latency`): real rank processes armed by numarun's bootstrap
  (:func:`numarun.stacks.dumphandler.arm`: faulthandler on signal 42) and the launcher's
  :class:`numarun.stacks.dumps.RankDumps` asking them (file emptied, ``/proc`` status read,
  the signal, the file read back until complete): from the ask to the last rank's complete
  dump, the launcher's CPU for it, the dump's size.

The stand-ins' model of torch's traffic (:class:`jobwide_standins.TorchTraffic`) is checked
against the real handlers by ``--check`` (same K, same seconds, side by side).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import pickle
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
HOST_FORMAT = "gpu-node{:05d}.cluster.internal"  # a cluster's host name: 31 characters
RUN_ID = "bench"
KEEP_ALIVE = 5.0  # torch's default keep_alive_interval (seconds)
CACHE = 1.0  # torch's _BackendRendezvousStateHolder cache_duration (seconds)


def state_text(nodes: int, *, heartbeat: datetime | None = None) -> bytes:
    """torch's rendezvous state of a complete round of ``nodes`` nodes, as its c10d backend
    stores it (``b64encode(pickle.dumps(state))``)."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        _NodeDesc,
        _RendezvousState,
    )

    state = _RendezvousState()
    state.round = 1
    state.complete = True
    now = heartbeat or datetime.now(timezone.utc)
    for index in range(nodes):
        node = _NodeDesc(HOST_FORMAT.format(index), 100_000 + index, 0)
        state.participants[node] = index
        state.last_heartbeats[node] = now - timedelta(microseconds=index)
    return base64.b64encode(pickle.dumps(state))


def unpickle_cpu(nodes: int, repeat: int = 5) -> float:
    """Median CPU seconds of one ``pickle.loads`` of the state at ``nodes`` nodes (torch's
    ``sync`` does it, holding the GIL, then walks every heartbeat)."""
    raw = base64.b64decode(state_text(nodes))
    spent = []
    for _ in range(repeat):
        start = time.thread_time()
        pickle.loads(raw)
        spent.append(time.thread_time() - start)
    return statistics.median(spent)


# --- torch's handlers, for real -------------------------------------------------------------------


class OpTally:
    """Requests and bytes by store operation (keys and values, both ways)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ops: dict[str, list[int]] = {}

    def add(self, op: str, size: int) -> None:
        with self.lock:
            entry = self.ops.setdefault(op, [0, 0])
            entry[0] += 1
            entry[1] += size

    def reset(self) -> None:
        with self.lock:
            self.ops = {}

    def snapshot(self) -> dict[str, list[int]]:
        with self.lock:
            return {op: list(v) for op, v in self.ops.items()}


def _size(*values: object) -> int:
    return sum(len(v) if isinstance(v, bytes | str) else 8 for v in values)


def counted(inner: object, tally: OpTally) -> object:
    """A ``torch.distributed.Store`` in front of ``inner`` counting what torch's c10d backend
    calls (get, compare_set, set, add, check, wait, multi_get) by operation."""
    import torch.distributed as dist

    class Counted(dist.Store):
        def __init__(self) -> None:
            super().__init__()

        def get(self, key: str) -> bytes:
            value = inner.get(key)
            tally.add("get", _size(key, value))
            return value

        def set(self, key: str, value: object) -> None:
            tally.add("set", _size(key, value))
            inner.set(key, value)

        def compare_set(self, key: str, expected: object, desired: object) -> bytes:
            value = inner.compare_set(key, expected, desired)
            tally.add("compare_set", _size(key, expected, desired, value))
            return value

        def add(self, key: str, amount: int) -> int:
            tally.add("add", _size(key, amount))
            return inner.add(key, amount)

        def check(self, keys: list[str]) -> bool:
            tally.add("check", _size(*keys))
            return inner.check(keys)

        def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
            tally.add("wait", _size(*keys))
            if timeout is None:
                inner.wait(keys)
            else:
                inner.wait(keys, timeout)

        def multi_get(self, keys: list[str]) -> list[bytes]:
            values = inner.multi_get(keys)
            tally.add("multi_get", _size(*keys, *values))
            return values

        def delete_key(self, key: str) -> bool:
            tally.add("delete_key", _size(key))
            return inner.delete_key(key)

        @property
        def timeout(self) -> timedelta:
            return inner.timeout

    return Counted()


def handler_traffic(nodes: int, seconds: float, look: float = 2.0) -> dict:
    """``nodes`` real torch handlers (c10d backend, torch's defaults) form a round on one real
    TCPStore, then run for ``seconds`` with numarun's look every ``look`` seconds on each;
    their store traffic per node per second, by operation."""
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
        C10dRendezvousBackend,
    )
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # no second store per round
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=60))  # fmt: skip
    tally = OpTally()
    handlers = []
    for index in range(nodes):
        client = dist.TCPStore("127.0.0.1", server.port, is_master=False, wait_for_workers=False,
                               timeout=timedelta(seconds=60))  # fmt: skip
        backend = C10dRendezvousBackend(counted(client, tally), RUN_ID)  # type: ignore[arg-type]
        handlers.append(DynamicRendezvousHandler.from_backend(
            RUN_ID, client, backend, nodes, nodes, local_addr=HOST_FORMAT.format(index)))
    threads = [threading.Thread(target=h.next_rendezvous) for h in handlers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    state = server.get("torch.rendezvous." + RUN_ID)
    tally.reset()
    stop = threading.Event()
    looks = [0]

    def looker(handler: DynamicRendezvousHandler, phase: float) -> None:
        if stop.wait(phase):
            return
        while True:
            handler.num_nodes_waiting()
            handler.is_closed()
            looks[0] += 1
            if stop.wait(look):
                return

    started = time.monotonic()
    lookers = [threading.Thread(target=looker, args=(h, look * i / nodes), daemon=True)
               for i, h in enumerate(handlers)]  # fmt: skip
    for thread in lookers:
        thread.start()
    time.sleep(seconds)
    stop.set()
    spent = tally.snapshot()
    elapsed = time.monotonic() - started
    for handler in handlers:
        handler._stop_heartbeats()
    per = nodes * elapsed
    return {
        "nodes": nodes, "seconds": round(elapsed, 2), "state_bytes": len(state),
        "state_bytes_built": len(state_text(nodes)),
        "requests_per_node_s": sum(v[0] for v in spent.values()) / per,
        "bytes_per_node_s": sum(v[1] for v in spent.values()) / per,
        "by_op": {op: {"requests_per_node_s": v[0] / per, "bytes_per_node_s": v[1] / per}
                  for op, v in sorted(spent.items())},
    }  # fmt: skip


def standin_traffic(nodes: int, seconds: float, look: float = 2.0) -> dict:
    """What ``nodes`` :class:`jobwide_standins.TorchTraffic` send and read in ``seconds``, with
    numarun's look every ``look`` seconds on each: the same figures as :func:`handler_traffic`,
    on a state of the real one's size (:func:`state_text`)."""
    import torch.distributed as dist

    import jobwide_standins as js

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=60))  # fmt: skip
    server.set(js.TORCH_STATE_KEY, state_text(nodes))
    tally = js.Tally()
    traffic = [js.TorchTraffic(js.client(server.port), i, nodes, tally, js.Fate())
               for i in range(nodes)]  # fmt: skip
    stop = threading.Event()

    def looker(handler: js.TorchTraffic, phase: float) -> None:
        if stop.wait(phase):
            return
        while True:
            handler.num_nodes_waiting()
            handler.is_closed()
            if stop.wait(look):
                return

    started = time.monotonic()
    for index, handler in enumerate(traffic):
        handler.start()
        threading.Thread(target=looker, args=(handler, look * index / nodes), daemon=True).start()
    time.sleep(seconds)
    stop.set()
    spent = tally.snapshot()["families"]
    elapsed = time.monotonic() - started
    for handler in traffic:
        handler.stop()
    per = nodes * elapsed
    return {
        "nodes": nodes, "seconds": round(elapsed, 2), "state_bytes": len(state_text(nodes)),
        "requests_per_node_s": sum(v[0] for v in spent.values()) / per,
        "bytes_per_node_s": sum(v[1] for v in spent.values()) / per,
        "by_op": {op: {"requests_per_node_s": v[0] / per, "bytes_per_node_s": v[1] / per}
                  for op, v in sorted(spent.items())},
    }  # fmt: skip


# --- a rank's dump, for real ----------------------------------------------------------------------

_RANK = r"""
import os, sys, threading, time
sys.path[:0] = [{src!r}]
from numarun.worker.dumphandler import arm
arm()
def deep(n):
    if n == 0:
        while True:
            time.sleep(1)
    deep(n - 1)
for _ in range(3):
    threading.Thread(target=deep, args=(36,), daemon=True).start()
print("ready", flush=True)
deep(36)
"""


class _Signaller:
    """What :class:`RankDumps` needs of a supervisor to ask real ranks: their pids, a signal."""

    def __init__(self, procs: list[subprocess.Popen]) -> None:
        self.procs = procs

    def pids(self) -> list[int]:
        return [proc.pid for proc in self.procs]

    def send_signal(self, signum: int, local_ranks: list[int]) -> list[int]:
        for local_rank in local_ranks:
            os.kill(self.procs[local_rank].pid, signum)
        return list(local_ranks)


def dump_latency(ranks: int = 8, samples: int = 40) -> dict:
    """``ranks`` real rank processes (Python, numarun's dump armed, 4 threads about 40 frames
    deep, as the stand-ins' synthetic dumps); each sample asks them all at once
    (:meth:`RankDumps.ask`) and reads until every dump is complete (polled every 0.2 ms,
    :meth:`RankDumps.read`): seconds from the ask to the last rank's complete dump, the
    launcher's CPU per rank for asking and reading, the dump's size."""
    import tempfile

    from numarun.stacks.dumps import RankDumps, _structurally_complete
    from numarun.worker.dumphandler import STACKS_FILE_ENV

    src = str(HERE.parent / "src")
    with tempfile.TemporaryDirectory() as folder:
        directory = os.path.join(folder, "d")
        os.mkdir(directory, 0o700)
        dumps = RankDumps([(r, r) for r in range(ranks)], directory)
        program = os.path.join(folder, "rank.py")
        with open(program, "w") as file:
            file.write(_RANK.format(src=src))
        # As numarun's bootstrap runs a rank: from ``-c`` code (the main thread's bottom frame,
        # written last, is ``<string>`` line 1: how the launcher tells a dump is complete).
        code = f"exec(compile(open({program!r}).read(), {program!r}, 'exec'))"
        procs = []
        for local_rank in range(ranks):
            env = {**os.environ, STACKS_FILE_ENV: dumps.path(local_rank)}
            procs.append(subprocess.Popen([sys.executable, "-c", code], env=env,
                                          stdout=subprocess.PIPE, text=True))  # fmt: skip
        try:
            for proc in procs:
                assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            dumps.attach(_Signaller(procs))  # type: ignore[arg-type]
            latencies, cpu, sizes = [], [], []
            for _ in range(samples):
                time.sleep(0.05)
                start, spent = time.monotonic(), time.thread_time()
                assert not dumps.ask(), "a rank was not asked"
                pending = set(range(ranks))
                while pending and time.monotonic() - start < 5:
                    for local_rank in list(pending):
                        data = dumps.read(local_rank)
                        if _structurally_complete(data):
                            pending.discard(local_rank)
                            sizes.append(len(data))
                    if pending:
                        time.sleep(0.0002)
                latencies.append(time.monotonic() - start)
                cpu.append(time.thread_time() - spent)
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
            dumps.close()
    latencies.sort()
    return {
        "ranks": ranks, "samples": samples,
        "latency_median_s": statistics.median(latencies),
        "latency_p90_s": latencies[int(0.9 * (len(latencies) - 1))],
        "latency_max_s": latencies[-1],
        "latencies_s": [round(x, 5) for x in latencies],
        "launcher_cpu_per_rank_s": statistics.median(cpu) / ranks,
        "dump_bytes": int(statistics.median(sizes)) if sizes else 0,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--handlers", default="2,4,8,16",
                        help="numbers of real torch handlers to measure (comma-separated)")
    parser.add_argument("--seconds", type=float, default=21.0)
    parser.add_argument("--sizes", default="8,64,256,1024,2048,4096,8192")
    parser.add_argument("--check", action="store_true",
                        help="also run the stand-ins' model of torch's traffic at the same "
                        "numbers of nodes, side by side with the real handlers")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    sys.path.insert(0, str(HERE))
    results: dict = {"load_average_start": os.getloadavg()}
    results["state"] = [
        {"nodes": n, "bytes": len(state_text(n)), "unpickle_cpu_s": unpickle_cpu(n)}
        for n in (int(x) for x in args.sizes.split(","))
    ]  # fmt: skip
    results["handlers"] = [handler_traffic(int(k), args.seconds)
                           for k in args.handlers.split(",")]  # fmt: skip
    if args.check:
        results["standins"] = [standin_traffic(int(k), args.seconds)
                               for k in args.handlers.split(",")]  # fmt: skip
    results["dump"] = dump_latency()
    results["load_average_end"] = os.getloadavg()
    if args.json:
        print(json.dumps(results))
        return
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

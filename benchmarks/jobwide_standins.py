"""Node stand-ins that run numarun's real whole-job protocol against a real torch ``TCPStore``.

A stand-in is what a launcher node is to the protocol, with only what is not the protocol
replaced: torch's rendezvous handler (a stub that says no node waits and the rendezvous is open),
the supervisor (:class:`FakeSupervisor`: the stand-ins of one process share one real
:class:`numarun.process.loop.Loop`, whose every callback is timed) and the workers (synthetic
faulthandler dumps: three behaviour classes, about 40 frames per thread, four threads per rank,
one odd rank). Everything else is the code the launcher runs: :class:`ElasticNode`, its
``numarun-store`` thread (:class:`StoreWatch`), :class:`JobStacks` and :class:`HangWatch`, the
digests, the merge, the decoding, on torch's store (wrapped by :class:`CountingStore`, a
``torch.distributed.Store`` that counts each request and its bytes).

The same stand-ins drive the protocol of ``main`` before this change (``--protocol old`` in
``bench_jobwide_scale.py``: numarun imported from a checkout of that commit), through the names
both versions share, with a branch where their interfaces differ.

Used by ``benchmarks/bench_jobwide_scale.py`` and by ``tests/jobwide/test_protocol.py``.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from numarun.cmdline.config import parse_args
from numarun.jobwide.notices import JobNotices
from numarun.process.loop import Loop
from numarun.process.spec import WorkerExit
from numarun.rendezvous.round import Round, WorkerPlace
from numarun.rendezvous.storeresults import Result
from numarun.rendezvous.torchrdzv import ElasticNode
from numarun.stacks.jobstacks import JobStacks
from numarun.stacks.parse import rank_stacks

NEW = hasattr(JobStacks, "take_async")  # this checkout's protocol, or main's before it
PREFIX = "torch.rendezvous.bench.0/"  # torch's per-round prefix, as the c10d handler makes it


class Tally:
    """Requests and bytes through the store (keys and values, both ways), class frames apart."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = 0
        self.bytes = 0
        self.frames = 0

    def add(self, key: str | list[str], *values: Any) -> None:
        keys = [key] if isinstance(key, str) else list(key)
        size = sum(len(k) for k in keys) + sum(
            len(v) if isinstance(v, bytes | str) else 8 for v in values
        )
        with self.lock:
            self.requests += 1
            if any("numarun/frames/" in k for k in keys):
                self.frames += size
            else:
                self.bytes += size

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return {"requests": self.requests, "bytes": self.bytes, "frames": self.frames}


class CountingStore(dist.Store):
    """A ``torch.distributed.Store`` in front of another (a ``PrefixStore``), counting each
    request and its bytes in ``tally``; clones count in the same tally."""

    def __init__(self, inner: Any, tally: Tally) -> None:
        super().__init__()
        self._inner = inner
        self._tally = tally

    def set(self, key: str, value: Any) -> None:
        self._tally.add(key, value)
        self._inner.set(key, value)

    def get(self, key: str) -> bytes:
        value = self._inner.get(key)
        self._tally.add(key, value)
        return value

    def add(self, key: str, amount: int) -> int:
        self._tally.add(key, amount)
        return self._inner.add(key, amount)

    def check(self, keys: list[str]) -> bool:
        self._tally.add(keys)
        return self._inner.check(keys)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._tally.add(keys)
        if timeout is None:
            self._inner.wait(keys)
        else:
            self._inner.wait(keys, timeout)

    def delete_key(self, key: str) -> bool:
        self._tally.add(key)
        return self._inner.delete_key(key)

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        value = self._inner.compare_set(key, expected, desired)
        self._tally.add(key, expected, desired, value)
        return value

    def append(self, key: str, value: Any) -> None:
        self._tally.add(key, value)
        self._inner.append(key, value)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        values = self._inner.multi_get(keys)
        self._tally.add(keys, *values)
        return values

    def has_extended_api(self) -> bool:
        return self._inner.has_extended_api()

    def clone(self) -> CountingStore:
        return CountingStore(self._inner.clone(), self._tally)

    def set_timeout(self, timeout: timedelta) -> None:
        self._inner.set_timeout(timeout)

    @property
    def timeout(self) -> timedelta:
        return self._inner.timeout


def connect(port: int, tally: Tally, timeout: float = 60.0) -> CountingStore:
    """A node's store as torch's c10d handler gives it: a TCPStore client under the round's
    prefix (counted)."""
    client = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                           timeout=timedelta(seconds=timeout))  # fmt: skip
    return CountingStore(dist.PrefixStore(PREFIX, client), tally)


class LoopHost:
    """One real supervisor loop for the stand-ins of a process; each callback is timed: the
    longest CPU time (``time.thread_time``) of the loop's thread spent in one, which is what a
    launcher's loop would be blocked for, less the garbage collections that ran in it (they
    walk the heap of every stand-in of the process, hundreds of launchers' worth:
    ``max_gc``, apart), and the longest wall time (which also counts waits for the GIL that
    the other stand-ins' threads hold: an artefact of hundreds of launchers in one process)."""

    def __init__(self) -> None:
        import gc

        self.loop = Loop(lambda signum: None)
        self.loop.open()
        self.max_wall = 0.0
        self.max_cpu = 0.0
        self.max_gc = 0.0
        self._gc_started = 0.0
        self._gc_spent = 0.0
        self._thread = threading.get_ident()
        gc.callbacks.append(self._collected)

    def _collected(self, phase: str, info: dict) -> None:
        if threading.get_ident() != self._thread:
            return
        if phase == "start":
            self._gc_started = time.thread_time()
        else:
            spent = time.thread_time() - self._gc_started
            self._gc_spent += spent
            self.max_gc = max(self.max_gc, spent)

    def timed(self, callback: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            wall, cpu = time.monotonic(), time.thread_time()
            self._gc_spent = 0.0
            try:
                callback()
            finally:
                spent = time.thread_time() - cpu - self._gc_spent
                self.max_cpu = max(self.max_cpu, spent)
                self.max_wall = max(self.max_wall, time.monotonic() - wall)

        return run

    def poll(self, timeout: float = 0.05) -> None:
        due = self.loop.next_due()
        if due is not None:
            timeout = max(0.0, min(timeout, due - time.monotonic()))
        self.loop.poll(timeout)
        self.loop.run_due(lambda: True)

    def run_until(self, done: Callable[[], bool], limit: float) -> bool:
        deadline = time.monotonic() + limit
        while not done():
            if time.monotonic() > deadline:
                return False
            self.poll()
        return True


class FakeSupervisor:
    """What the protocol needs of a :class:`Supervisor`, on a :class:`LoopHost`'s loop:
    readers, one-shot timers, ``request_stop`` (recorded); ``call_every`` is not run (the
    stand-ins' hang marks are driven by the caller)."""

    def __init__(self, host: LoopHost) -> None:
        self.host = host
        self.stopped: tuple[float, str] | None = None

    def add_reader(self, fd: int, callback: Callable[[], None]) -> None:
        self.host.loop.add_reader(fd, self.host.timed(callback))

    def remove_reader(self, fd: int) -> None:
        self.host.loop.remove_reader(fd)

    def add_writer(self, fd: int, callback: Callable[[], None]) -> None:
        self.host.loop.add_writer(fd, self.host.timed(callback))

    def remove_writer(self, fd: int) -> None:
        self.host.loop.remove_writer(fd)

    def call_every(self, interval: float, callback: Callable[[], None]) -> None:
        pass

    def call_later(self, delay: float, callback: Callable[[], None]) -> object:
        return self.host.loop.call_later(delay, self.host.timed(callback))

    def request_stop(self, reason: str) -> None:
        if self.stopped is None:
            self.stopped = (time.monotonic(), reason)

    def send_signal(self, signum: int, local_ranks: Any = None) -> list[int]:
        return []

    def pids(self) -> list[int]:
        return []


class _Handler:
    """torch's rendezvous handler as the watch uses it: nobody waits, the round is open."""

    def num_nodes_waiting(self) -> int:
        return 0

    def is_closed(self) -> bool:
        return False


# --- synthetic stacks ----------------------------------------------------------------------------

_LIB = "/usr/lib/python3.11/site-packages/torch"
_HELPERS = [
    ("pin_memory_loop", f"{_LIB}/utils/data/_utils/pin_memory.py"),
    ("_worker_loop", f"{_LIB}/utils/data/_utils/worker.py"),
    ("_run_logger", "/usr/lib/python3.11/logging/handlers.py"),
]


def _frames(kind: str, depth: int = 40) -> list[str]:
    """``depth`` frames of one behaviour, innermost first, faulthandler's format."""
    inner = {
        "allreduce": [(f"{_LIB}/distributed/distributed_c10d.py", 2501, "all_reduce"),
                      (f"{_LIB}/distributed/c10d_logger.py", 83, "wrapper"),
                      ("/job/train.py", 34, "wait_for_the_others")],
        "backward": [(f"{_LIB}/autograd/graph.py", 744, "_engine_run_backward"),
                     (f"{_LIB}/autograd/__init__.py", 289, "backward"),
                     ("/job/train.py", 52, "backward_step")],
        "odd": [("/usr/lib/python3.11/threading.py", 320, "wait"),
                ("/job/data.py", 12, "load_batch")],
        "helper": [("/usr/lib/python3.11/threading.py", 324, "wait"),
                   ("/usr/lib/python3.11/queue.py", 180, "get")],
    }[kind]  # fmt: skip
    outer = ['  File "/job/train.py", line 140 in <module>',
             '  File "/job/train.py", line 120 in main']  # fmt: skip
    for level in range(depth - len(inner) - 2):  # the same path from the outside in
        module = f"{_LIB}/nn/modules/module.py" if level % 2 else "/job/model.py"
        outer.append(f'  File "{module}", line {100 + level} in forward_{level}')
    return [f'  File "{f}", line {n} in {fn}' for f, n, fn in inner] + outer[::-1]


def synthetic_dump(kind: str, seed: int) -> str:
    """One rank's faulthandler text: three helper threads, then the main thread of ``kind``;
    thread ids differ from rank to rank, as between processes."""
    rng = random.Random(seed)
    blocks = []
    for name, path in _HELPERS:
        ident = f"0x{rng.getrandbits(47) << 4:016x}"
        frames = [f'  File "{path}", line 55 in {name}', *_frames("helper", 39)[1:]]
        blocks.append("\n".join([f"Thread {ident} (most recent call first):", *frames]))
    ident = f"0x{rng.getrandbits(47) << 4:016x}"
    blocks.append("\n".join([f"Current thread {ident} (most recent call first):",
                             *_frames(kind)]))  # fmt: skip
    return "\n\n".join(blocks) + "\n"


def behaviour(rank: int, local_rank: int, node: int, nodes: int, pattern: str) -> str:
    """Which class a rank is in: the odd rank (the middle of the job, one less) waits for data;
    ``block``: the last eighth of the nodes still in backward; ``strided``: local rank 0 of
    every node in backward; the rest in all_reduce."""
    world = nodes * 8
    if rank == world // 2 - 1:
        return "odd"
    if pattern == "strided" and local_rank == 0:
        return "backward"
    if pattern == "block" and node >= nodes - max(1, nodes // 8):
        return "backward"
    return "allreduce"


# --- one stand-in --------------------------------------------------------------------------------


class StandIn:
    """One node: a real :class:`ElasticNode` watching a real round of ``store``, with real
    :class:`JobStacks` and :class:`HangWatch` whose ranks' dumps are synthetic. ``times``:
    when each kind of result first reached this node's loop (``time.monotonic()``)."""

    def __init__(
        self, host: LoopHost, store: Any, index: int, nodes: int, ranks: int = 8, *,
        interval: float = 2.0, hang_timeout: float = 30.0, pattern: str = "block",
        hostname: str | None = None, keep_alive: int = 60,
    ) -> None:  # fmt: skip
        self.index = index
        config = parse_args([
            "--nnodes", str(nodes), "--nproc-per-node", str(ranks), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", "127.0.0.1:1", "--rdzv-id", "bench", "--monitor-interval",
            str(interval), "--hang-timeout", str(hang_timeout),
            # A neighbour is declared gone after 3 silent keep-alive windows: longer than the
            # stand-ins of a process take to start one after the other.
            "--rdzv-conf", f"keep_alive_interval={keep_alive}", "train.py",
        ])  # fmt: skip
        node = ElasticNode(config)
        node.host = hostname or f"node{index:04d}"
        node._handler = _Handler()
        node._store = store
        world = nodes * ranks
        places = tuple(WorkerPlace(index * ranks + r, index * ranks + r, world, world)
                       for r in range(ranks))  # fmt: skip
        node.round = Round(index, nodes, "127.0.0.1", 1, places)
        node.heartbeats.watch_neighbour(index, nodes, time.monotonic())
        self.node = node
        self.view = JobNotices(node)
        node.diagnostics = self.view
        self.texts = [
            (index * ranks + r, r, 10000 + r,
             synthetic_dump(behaviour(index * ranks + r, r, index, nodes, pattern),
                            index * ranks + r))
            for r in range(ranks)
        ]  # fmt: skip
        self.supervisor = FakeSupervisor(host)
        self.times: dict[str, float] = {}
        self.results: dict[str, Result] = {}
        self.replies: list[dict] = []
        stand_in = self

        class Stacks(JobStacks):
            def take(self) -> list:  # main's protocol, and the failure path
                return stand_in.rank_stacks()

            def take_async(self, done: Callable[[list], None]) -> None:
                done(stand_in.raw())

        self.stacks = Stacks(
            [(r, index * ranks + r) for r in range(ranks)], python=False,
            describe={"run_id": "bench", "host": node.host, "entrypoint": "train.py"},
            hang_timeout=hang_timeout, hang_job=self.view.hang_job(), scope="job",
        )  # fmt: skip
        self.stacks.at_failure = None
        original = node._on_result

        def on_result(result: Result) -> None:
            now = time.monotonic()
            self.times.setdefault(result.kind, now)
            self.results.setdefault(result.kind, result)
            original(result)

        node._on_result = on_result  # type: ignore[method-assign]

    def register(self) -> None:
        """What a node does once the round formed: say it is a numarun node (ALIVE, NODES)."""
        from numarun.rendezvous.storewatch import ALIVE_KEY, NODES_KEY

        store = self.node._store
        if NEW:
            from numarun.rendezvous.storeops import Conn

            conn = Conn(store, clone=False)
            conn.add(ALIVE_KEY.format(self.index), 1)
            conn.add(NODES_KEY, 1)
            conn.close()
        else:
            store.add(ALIVE_KEY.format(self.index), 1)
            store.add(NODES_KEY, 1)

    def watch(self, settle: float = 30.0) -> None:
        """Begin the round's watch; wait (at most ``settle`` seconds) until its thread has its
        connections: torch's client, connecting many at once from one process, waits 5 s per
        16 or so (launchers on many machines do not share that process)."""
        self.node.begin_watch(self.supervisor)  # type: ignore[arg-type]
        self.view.attach(self.stacks)
        self.stacks.attach(self.supervisor)  # type: ignore[arg-type]
        round_ = self.node.watched_round
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline:
            if NEW and round_.conn is not None and (round_.poster or not round_.conn.own):
                return
            if not NEW and getattr(round_, "waiter", None) is not None:
                return
            time.sleep(0.002)

    def raw(self) -> list:
        from numarun.stacks.dumps import Raw

        return [Raw(rank, local, pid, text, None) for rank, local, pid, text in self.texts]

    def rank_stacks(self) -> list:
        return [rank_stacks(rank, local, pid, text, None) for rank, local, pid, text in self.texts]

    # --- the three events ------------------------------------------------------------------------

    def ask(self) -> None:
        """``numarun stacks`` for the whole job on this node (as its socket would ask)."""
        assert self.stacks.job_wide is not None

        def reply(fields: dict) -> None:
            self.times.setdefault("reply", time.monotonic())
            self.replies.append(fields)

        self.stacks.job_wide(reply)

    def go_still(self) -> None:
        """This node's ranks have been still for the timeout (its hang watch says so)."""
        hang = self.stacks.hang
        assert hang is not None
        hang.still = True
        dumps = self.raw() if NEW else self.rank_stacks()
        self.view.hang_job().still(dumps, hang.timeout)

    def fail(self) -> None:
        """Its rank 0 fails: the stacks of the others, then the notice (``on_failure``)."""
        ended = WorkerExit(0, self.index * 8, 4242, 1, None, "failed", time.time())
        self.stacks.at_failure = (ended, self.rank_stacks()[1:])
        self.view.on_worker_failure(ended)

    def verdict_at(self) -> float | None:
        """When the loop stopped the run on the job's hang verdict (None: not, or not so)."""
        stopped = self.supervisor.stopped
        return stopped[0] if stopped and stopped[1].startswith("hang: ") else None

    def stop_reason(self) -> str | None:
        return self.supervisor.stopped[1] if self.supervisor.stopped else None

    def close(self) -> None:
        self.node.unwatch()
        self.node.watch.close(self.node.watched_round or self.node._last_round, limit=0.1)
        self.stacks.close()


"""Node stand-ins that run numarun's real whole-job protocol against a real torch ``TCPStore``.

A stand-in is what a launcher node is to the protocol. Everything of numarun's is the real code:
:class:`ElasticNode`, its ``numarun-store`` thread (:class:`StoreWatch`), :class:`JobStacks`,
:class:`HangWatch` and its ticks, :class:`RankDumps`' taking of dumps (its polling on the loop's
timers), the digests, the merge, the decoding; every store call goes through a
``torch.distributed.Store`` that counts it (:class:`CountingStore`). What is not numarun's is
replaced, and each replacement is a claim about a cost, measured on the real thing by
``benchmarks/jobwide_costs.py``:

* torch's rendezvous handler (:class:`TorchTraffic`): what torch's ``DynamicRendezvousHandler``
  (c10d backend) sends and reads while workers run, by its own mechanism at its defaults: a
  state sync (one ``get`` of the whole rendezvous state, cached 1 s) at each of numarun's looks
  (``num_nodes_waiting``, ``is_closed``), and torch's keep-alive thread every 5 s (a sync, then
  ``compare_set`` of the whole state with this node's heartbeat changed, again while another
  node's write came first). The state is the real one's size at N nodes (torch's own
  ``_RendezvousState`` pickled as torch does); what is left out is its CPU on each node
  (``pickle.loads`` of the state at each sync: :func:`jobwide_costs.unpickle_cpu`), which no
  2-core machine can spend for thousands of nodes: the benchmark reports it apart. Checked
  against real handlers by ``jobwide_costs.py --check``. ``None``: a stub (nobody waits, the
  round is open), for the tests.
* the workers (:class:`SyntheticRanks`, a :class:`RankDumps`): no processes; each rank answers
  a dump request with its synthetic faulthandler text (three behaviour classes, four threads of
  about 40 frames, one odd rank) after a latency drawn from the one measured on real ranks
  (signal 42, faulthandler, the file read back); while the ranks "move", each sample differs
  from the last; frozen, they stop moving and the real hang watch finds them still.
* the supervisor (:class:`FakeSupervisor`): the stand-ins of one process share one real
  :class:`numarun.process.loop.Loop` (:class:`LoopHost`), whose every callback is timed;
  ``call_every`` runs (the hang watch's ticks), at a random phase per node, as nodes start.
* a launcher's death (:class:`Fate`): from a chosen store call on (or at once), every store call
  of the node blocks for good, its loop's callbacks and torch's keep-alive stop: to the store
  and the other nodes it is gone, as a SIGKILLed launcher is (its sockets stay open).

Used by ``benchmarks/bench_jobwide_scale.py``, ``tests/standin_job.py`` (the protocol's tests)
and ``tests/test_bench_jobwide_scale.py`` (the benchmark at tiny N).
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

import jobwide_product as product

RUN_ID = "bench"
PREFIX = f"torch.rendezvous.{RUN_ID}.0/"  # torch's per-round prefix, as the c10d handler makes it
TORCH_STATE_KEY = f"torch.rendezvous.{RUN_ID}"  # where torch's c10d backend keeps its state
_FAMILY = re.compile(r"[0-9a-f]{16}|[0-9]+")


def round_prefix(number: int) -> str:
    return f"torch.rendezvous.{RUN_ID}.{number}/"


class Tally:
    """Requests and bytes through the store (keys and values, both ways), class frames apart,
    and by key family (the key with its numbers as ``N``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = 0
        self.bytes = 0
        self.frames = 0
        self.families: dict[str, list[int]] = {}

    def add(self, key: str | list[str], *values: Any, family: str | None = None) -> None:
        keys = [key] if isinstance(key, str) else list(key)
        size = sum(len(k) for k in keys) + sum(
            len(v) if isinstance(v, bytes | str) else 8 for v in values
        )
        if family is None:
            family = _FAMILY.sub("N", keys[0]) if keys else ""
        with self.lock:
            counts = self.families.setdefault(family, [0, 0])
            counts[0] += 1
            counts[1] += size
            self.requests += 1
            if any("numarun/frames/" in k for k in keys):
                self.frames += size
            else:
                self.bytes += size

    def snapshot(self) -> dict:
        with self.lock:
            return {"requests": self.requests, "bytes": self.bytes, "frames": self.frames,
                    "families": {k: list(v) for k, v in self.families.items()}}  # fmt: skip


class Fate:
    """Whether a node's launcher lives. :meth:`kill` (or ``when(op, key)`` returning True
    before a store call) ends it: that call and every later one of the node block for good."""

    def __init__(self) -> None:
        self.dead = threading.Event()
        self.at: float | None = None
        self.why = ""
        self.when: Callable[[str, str], bool] | None = None
        # What goes with the process (the stores it serves), run once at the death.
        self.on_death: Callable[[], None] | None = None

    def check(self, op: str, key: str) -> None:
        if not self.dead.is_set():
            when = self.when
            if when is None or not when(op, key):
                return
            self.kill(f"before {op} {key}")
        threading.Event().wait()  # the process is gone: nothing more from this thread

    def kill(self, why: str) -> None:
        if not self.dead.is_set():
            self.at = time.monotonic()
            self.why = why
            self.dead.set()
            if self.on_death is not None:
                # Apart: the dying thread may be inside a call of what the callback closes.
                threading.Thread(target=self.on_death, name="bench-death", daemon=True).start()


class CountingStore(dist.Store):
    """A ``torch.distributed.Store`` in front of another (a ``PrefixStore``), counting each
    request and its bytes in ``tally``; clones count in the same tally and share the node's
    :class:`Fate`."""

    def __init__(self, inner: Any, tally: Tally, fate: Fate | None = None) -> None:
        super().__init__()
        self._inner = inner
        self._tally = tally
        self.fate = fate or Fate()

    def set(self, key: str, value: Any) -> None:
        self.fate.check("set", key)
        self._tally.add(key, value)
        self._inner.set(key, value)

    def get(self, key: str) -> bytes:
        self.fate.check("get", key)
        value = self._inner.get(key)
        self._tally.add(key, value)
        return value

    def add(self, key: str, amount: int) -> int:
        self.fate.check("add", key)
        self._tally.add(key, amount)
        return self._inner.add(key, amount)

    def check(self, keys: list[str]) -> bool:
        self.fate.check("check", keys[0] if keys else "")
        self._tally.add(keys)
        return self._inner.check(keys)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self.fate.check("wait", keys[0] if keys else "")
        self._tally.add(keys)
        if timeout is None:
            self._inner.wait(keys)
        else:
            self._inner.wait(keys, timeout)

    def delete_key(self, key: str) -> bool:
        self.fate.check("delete_key", key)
        self._tally.add(key)
        return self._inner.delete_key(key)

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        self.fate.check("compare_set", key)
        value = self._inner.compare_set(key, expected, desired)
        self._tally.add(key, expected, desired, value)
        return value

    def append(self, key: str, value: Any) -> None:
        self.fate.check("append", key)
        self._tally.add(key, value)
        self._inner.append(key, value)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        self.fate.check("multi_get", keys[0] if keys else "")
        values = self._inner.multi_get(keys)
        self._tally.add(keys, *values)
        return values

    def has_extended_api(self) -> bool:
        return self._inner.has_extended_api()

    def clone(self) -> CountingStore:
        self.fate.check("clone", "")
        return CountingStore(self._inner.clone(), self._tally, self.fate)

    def set_timeout(self, timeout: timedelta) -> None:
        self._inner.set_timeout(timeout)

    @property
    def timeout(self) -> timedelta:
        return self._inner.timeout


def client(port: int, timeout: float = 300.0) -> Any:
    """A node's TCPStore client, as torch's c10d handler makes it (one per node)."""
    return dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                         timeout=timedelta(seconds=timeout))  # fmt: skip


def connect(port: int, tally: Tally, timeout: float = 60.0) -> CountingStore:
    """A node's store as torch's c10d handler gives it: a TCPStore client under the round's
    prefix (counted)."""
    return CountingStore(dist.PrefixStore(PREFIX, client(port, timeout)), tally)


def count_diagnostics(tally: Tally) -> None:
    """From now on, in this process, the diagnostics stores' connections
    (``--diagnostics-store own``: :mod:`numarun.rendezvous.diagstore`) are counted in ``tally``
    too and share their node's :class:`Fate` (that of the node's rendezvous store they were
    made for): a dead node's calls block on either store. Idempotent."""
    real = product.diagstore.connect_round
    if getattr(real, "counted", False):
        return

    def connect_round(rendezvous_store: Any, **kwargs: Any) -> Any:
        made = real(rendezvous_store, **kwargs)
        if made.store is not None:
            fate = getattr(rendezvous_store, "fate", None)
            made.store = CountingStore(made.store, tally, fate)
            probe = made.events.probe
            made.events = product.Conn.own_connection(made.store, probe)
            made.posts = product.Conn(made.store, probe=probe)
        return made

    connect_round.counted = True  # type: ignore[attr-defined]
    product.diagstore.connect_round = connect_round


class LoopHost:
    """One real supervisor loop for the stand-ins of a process; each callback is timed: the
    longest CPU time (``time.thread_time``) of the loop's thread spent in one, which is what a
    launcher's loop would be blocked for, less the garbage collections that ran in it (they
    walk the heap of every stand-in of the process, hundreds of launchers' worth:
    ``max_gc``, apart), and the longest wall time (which also counts waits for the GIL that
    the other stand-ins' threads hold: an artefact of hundreds of launchers in one process)."""

    def __init__(self) -> None:
        import gc

        self.loop = product.Loop(lambda signum: None)
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
    readers, timers, ``request_stop`` (recorded). ``ticks``: ``call_every`` runs its callback
    (first at a random phase within one interval, as nodes' runs start at slightly different
    times), else it is dropped (the tests drive the hang marks). :meth:`retire` (the run is
    over, or the launcher died) stops its timers and stop requests."""

    def __init__(self, host: LoopHost, ticks: bool = False) -> None:
        self.host = host
        self.ticks = ticks
        self.retired = False
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
        if not self.ticks:
            return
        timed = self.host.timed(callback)

        def tick() -> None:
            if self.retired:
                return
            timed()
            self.host.loop.call_later(interval, tick)

        self.host.loop.call_later(interval * random.random(), tick)

    def call_later(self, delay: float, callback: Callable[[], None]) -> object:
        timed = self.host.timed(callback)
        return self.host.loop.call_later(delay, lambda: None if self.retired else timed())

    def request_stop(self, reason: str) -> None:
        if self.stopped is None and not self.retired:
            self.stopped = (time.monotonic(), reason)

    def send_signal(self, signum: int, local_ranks: Any = None) -> list[int]:
        return []

    def pids(self) -> list[int]:
        return []

    def retire(self) -> None:
        self.retired = True


class _Handler:
    """torch's rendezvous handler as the watch uses it, for the tests: nobody waits, the round
    is open, no traffic."""

    def num_nodes_waiting(self) -> int:
        return 0

    def is_closed(self) -> bool:
        return False


WAIT_FIELD = 8  # the state's last bytes stand for torch's wait list: b"W" and its length


def waiting_in(state: bytes | None) -> int:
    """How many nodes torch's state ``state`` has in its wait list (its last
    :data:`WAIT_FIELD` bytes, ``W`` and seven digits, once a node joined it; the state as
    torch pickled it ends otherwise)."""
    tail = (state or b"")[-WAIT_FIELD:]
    return int(tail[1:]) if tail[:1] == b"W" and tail[1:].isdigit() else 0


class TorchTraffic:
    """torch's ``DynamicRendezvousHandler`` (c10d backend) of one node, as far as the store
    sees it while workers run (module docstring): :meth:`num_nodes_waiting` and
    :meth:`is_closed` sync the state (a ``get`` of it when the last sync is over ``cache``
    seconds old), torch's keep-alive thread (:meth:`start`) every ``keep_alive`` seconds after
    the last one ended syncs, then writes the state with this node's heartbeat changed
    (``compare_set`` against the state it last read; when another node wrote first, the value
    it gets back is its new token and it writes again, as torch's op executor does, until it
    wins or torch's 5 s heartbeat timeout passes). Its calls go through torch's connection of
    the node (``client``, shared with the round's store, as torch's handler shares it),
    counted in ``tally``; a dead :class:`Fate` ends them."""

    def __init__(
        self, client: Any, index: int, nodes: int, tally: Tally, fate: Fate, *,
        keep_alive: float = 5.0, cache: float = 1.0, timeout: float = 5.0,
    ) -> None:  # fmt: skip
        self.client = client
        self.index = index
        self.nodes = nodes
        self.tally = tally
        self.fate = fate
        self.keep_alive = keep_alive
        self.cache = cache
        self.timeout = timeout
        self.lock = threading.Lock()  # torch's _heartbeat_lock
        self.token: bytes | None = None
        self.synced = -1e9
        self.beats = 0
        self.retries = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _call(self, op: str, *args: Any) -> Any:
        if self.fate.dead.is_set():
            threading.Event().wait()  # the launcher is gone
        value = getattr(self.client, op)(*args)
        self.tally.add(TORCH_STATE_KEY, *args[1:], value, family=op)
        return value

    def _sync(self) -> None:
        if time.monotonic() - self.synced < self.cache and self.token is not None:
            return
        self.token = bytes(self._call("get", TORCH_STATE_KEY))
        self.synced = time.monotonic()

    def num_nodes_waiting(self) -> int:
        """torch's: the state synced, the length of its wait list (:func:`waiting_in`)."""
        with self.lock:
            self._sync()
            return waiting_in(self.token)

    def is_closed(self) -> bool:
        with self.lock:
            self._sync()
        return False

    def beat(self) -> None:
        """One keep-alive of torch's (its ``_keep_alive``): sync, then write until it wins."""
        with self.lock:
            self._write(self._own_slot_changed)

    def join_wait_list(self, current: Callable[[], bool] = lambda: True) -> None:
        """What torch's ``next_rendezvous`` writes when this node re-forms a complete round:
        its exit op (this node out of the participants: its slot changed), then its join op
        (this node in the wait list: :func:`waiting_in` one more), each a sync and a write
        until it wins, as :meth:`beat`. The other nodes' looks then see a node waiting. Given
        up once ``current()`` is false (the next round formed without it: the simulation's
        rounds are formed by the benchmark, not by these writes)."""
        with self.lock:  # torch's op executor tries until the join's timeout (600 s)
            self._write(self._own_slot_changed, limit=600.0, current=current)
            self._write(lambda token: token[:-WAIT_FIELD] + b"W%07d" % (waiting_in(token) + 1),
                        limit=600.0, current=current)  # fmt: skip

    def _own_slot_changed(self, token: bytes) -> bytes:
        self.beats += 1
        slot = (len(token) - 8 - WAIT_FIELD) * self.index // max(1, self.nodes)
        return token[:slot] + b"%08d" % (self.beats % 10**8) + token[slot + 8 :]

    def _write(self, change: Callable[[bytes], bytes], limit: float | None = None,
               current: Callable[[], bool] = lambda: True) -> None:  # fmt: skip
        """torch's op executor: sync, then ``compare_set`` of the changed state until it wins
        (another node's write came first: its state is the new token) or ``limit`` seconds
        (default ``timeout``, the keep-alive's) pass."""
        self._sync()
        deadline = time.monotonic() + (self.timeout if limit is None else limit)
        while time.monotonic() < deadline and current():
            assert self.token is not None
            token = self.token
            desired = change(token)
            got = bytes(self._call("compare_set", TORCH_STATE_KEY, token, desired))
            self.token, self.synced = got, time.monotonic()
            if got == desired:
                return
            self.retries += 1

    def start(self, phase: float | None = None) -> None:
        """torch's keep-alive thread (``_PeriodicTimer``): the first beat after ``phase``
        seconds (default: a random part of one interval), then one interval after each."""

        def run() -> None:
            wait = self.keep_alive * random.random() if phase is None else phase
            while not self._stop.wait(wait):
                self.beat()
                wait = self.keep_alive

        self._thread = threading.Thread(target=run, name="torch-keep-alive", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()


# --- synthetic stacks ----------------------------------------------------------------------------

_LIB = "/usr/lib/python3.11/site-packages/torch"
_HELPERS = [
    ("pin_memory_loop", f"{_LIB}/utils/data/_utils/pin_memory.py"),
    ("_worker_loop", f"{_LIB}/utils/data/_utils/worker.py"),
    ("_run_logger", "/usr/lib/python3.11/logging/handlers.py"),
]
BEHAVIOURS = ("allreduce", "backward", "odd", "dataload")
_BOTTOM = '  File "<string>", line 1 in <module>'  # numarun's bootstrap: a rank's -c code


def _frames(kind: str, depth: int = 40, step: int = 0) -> list[str]:
    """``depth`` frames of one behaviour, innermost first, faulthandler's format; ``step``
    moves the innermost frame's line (a rank that made progress)."""
    inner = {
        "allreduce": [(f"{_LIB}/distributed/distributed_c10d.py", 2501, "all_reduce"),
                      (f"{_LIB}/distributed/c10d_logger.py", 83, "wrapper"),
                      ("/job/train.py", 34, "wait_for_the_others")],
        "backward": [(f"{_LIB}/autograd/graph.py", 744, "_engine_run_backward"),
                     (f"{_LIB}/autograd/__init__.py", 289, "backward"),
                     ("/job/train.py", 52, "backward_step")],
        "odd": [("/usr/lib/python3.11/threading.py", 320, "wait"),
                ("/job/data.py", 12, "load_batch")],
        "dataload": [(f"{_LIB}/utils/data/dataloader.py", 1133, "_get_data"),
                     ("/job/train.py", 61, "next_batch")],
        "helper": [("/usr/lib/python3.11/threading.py", 324, "wait"),
                   ("/usr/lib/python3.11/queue.py", 180, "get")],
    }[kind]  # fmt: skip
    inner = [(inner[0][0], inner[0][1] + step, inner[0][2]), *inner[1:]]
    outer = [_BOTTOM, '  File "/job/train.py", line 140 in <module>',
             '  File "/job/train.py", line 120 in main']  # fmt: skip
    for level in range(depth - len(inner) - 3):  # the same path from the outside in
        module = f"{_LIB}/nn/modules/module.py" if level % 2 else "/job/model.py"
        outer.append(f'  File "{module}", line {100 + level} in forward_{level}')
    return [f'  File "{f}", line {n} in {fn}' for f, n, fn in inner] + outer[::-1]


def synthetic_dump(kind: str, seed: int, step: int = 0) -> str:
    """One rank's faulthandler text: three helper threads, then the main thread of ``kind``
    (listed last, ending with the bootstrap's frame, as a real rank's); thread ids differ from
    rank to rank, as between processes."""
    rng = random.Random(seed)
    blocks = []
    for name, path in _HELPERS:
        ident = f"0x{rng.getrandbits(47) << 4:016x}"
        frames = [f'  File "{path}", line 55 in {name}', *_frames("helper", 39)[1:]]
        blocks.append("\n".join([f"Thread {ident} (most recent call first):", *frames]))
    ident = f"0x{rng.getrandbits(47) << 4:016x}"
    blocks.append("\n".join([f"Current thread {ident} (most recent call first):",
                             *_frames(kind, step=step)]))  # fmt: skip
    return "\n\n".join(blocks) + "\n"


def behaviour(rank: int, local_rank: int, node: int, nodes: int, pattern: str) -> str:
    """Which class a rank is in: the odd rank (the middle of the job, one less) waits for data;
    ``block``: the last eighth of the nodes still in backward; ``strided``: local rank 0 of
    every node in backward; ``random4``: one of four behaviours at random (seeded by the
    rank); the rest in all_reduce."""
    world = nodes * 8
    if pattern == "random4":
        return random.Random(rank).choice(BEHAVIOURS)
    if rank == world // 2 - 1:
        return "odd"
    if pattern == "strided" and local_rank == 0:
        return "backward"
    if pattern == "block" and node >= nodes - max(1, nodes // 8):
        return "backward"
    return "allreduce"


class SyntheticRanks(product.RankDumps):
    """A node's ranks as :class:`RankDumps` sees them, without processes (module docstring):
    :meth:`ask` records when each rank's dump will be there (``latency()`` seconds later);
    :meth:`read` gives it from then on. While :attr:`moving`, each ask's sample differs from
    the last (the innermost frame's line alternates); frozen (``moving`` False), it stays the
    same."""

    def __init__(self, ranks: list[tuple[int, int]], texts: list[tuple[bytes, bytes]],
                 latency: Callable[[], float]) -> None:  # fmt: skip
        super().__init__(ranks, None)
        for local_rank, state in self._ranks.items():
            state.fd = -1  # "a Python rank with a dump file": asked, read, judged
            state.pid = 10_000 + local_rank
        self.texts = texts
        self.latency = latency
        self.moving = True
        self._flip = 0
        self._ready: dict[int, tuple[float, bytes]] = {}

    def ask(self, local_ranks: Any = None) -> dict[int, str]:
        now = time.monotonic()
        if self.moving:
            self._flip ^= 1
        problems: dict[int, str] = {}
        for local_rank in self.local_ranks if local_ranks is None else local_ranks:
            state = self._ranks[local_rank]
            if state.exited:
                problems[local_rank] = "exited"
                continue
            state.asked_at = now
            self._ready[local_rank] = (now + self.latency(), self.texts[local_rank][self._flip])
        return problems

    def ask_for(self, local_ranks: Any, *, stacks: bool, flight: bool) -> tuple:
        """:meth:`ask` as :class:`RankDumps` asks for stacks (no flight recorders: the
        synthetic ranks have no process group)."""
        return (self.ask(local_ranks) if stacks else {}), 0, []

    def nudge(self, local_rank: int) -> bool:
        """No helper thread to wake with a signal: the dump comes after its latency."""
        return False

    def freeze(self) -> None:
        """The ranks stop moving, each at its first sample (the one :meth:`StandIn.raw`
        gives)."""
        self.moving = False
        self._flip = 0

    def read(self, local_rank: int) -> bytes:
        ready = self._ready.get(local_rank)
        if ready is None or time.monotonic() < ready[0]:
            return b""
        return ready[1]

    def answer_problem(self, local_rank: int, data: bytes, *, final: bool) -> str | None:
        return product.PENDING if final and not data else None

    def close(self) -> None:
        for state in self._ranks.values():
            state.fd = None


def latency_sampler(samples: list[float] | None, seed: int) -> Callable[[], float]:
    """Draws from measured dump latencies (seconds); none measured: 2.3 ms (8 real ranks asked
    at once on this machine: ``jobwide_costs.dump_latency``)."""
    rng = random.Random(seed)
    found = samples or [0.0023]
    return lambda: rng.choice(found)


class _RecordingHangJob:
    """The node's ``hang_job`` (the bridge to the store thread), noting when this node's hang
    watch said its ranks are still."""

    def __init__(self, inner: Any, stand_in: StandIn) -> None:
        self.inner = inner
        self.stand_in = stand_in

    def still(self, dumps: list, idle: float) -> None:
        self.stand_in.times.setdefault("still", time.monotonic())
        self.inner.still(dumps, idle)

    def moving(self) -> None:
        self.inner.moving()


# --- one stand-in --------------------------------------------------------------------------------


class StandIn:
    """One node: a real :class:`ElasticNode` watching a real round of ``store``, with real
    :class:`JobStacks` and :class:`HangWatch` over :class:`SyntheticRanks`. ``times``: when each
    kind of result first reached this node's loop in the round (``time.monotonic()``);
    ``counts``: how many of each kind. ``torch``: the node's :class:`TorchTraffic` (None: a
    stub handler); ``ticks``: the hang watch samples the ranks on the loop's timer (else the
    caller marks the node still: :meth:`go_still`)."""

    def __init__(
        self, host: LoopHost, store: Any, index: int, nodes: int, ranks: int = 8, *,
        interval: float = 2.0, hang_timeout: float = 30.0, pattern: str = "block",
        hostname: str | None = None, keep_alive: int = 60, torch: TorchTraffic | None = None,
        ticks: bool = False, latency: Callable[[], float] | None = None,
        diagnostics_store: str = "rendezvous",
    ) -> None:  # fmt: skip
        self.host = host
        self.index = index
        self.nodes = nodes
        self.ranks = ranks
        self.hang_timeout = hang_timeout
        self.torch = torch
        self.ticks = ticks
        self.latency = latency or latency_sampler(None, index)
        config = product.parse_args([
            "--nnodes", str(nodes), "--nproc-per-node", str(ranks), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", "127.0.0.1:1", "--rdzv-id", RUN_ID, "--monitor-interval",
            str(interval), "--hang-timeout", str(hang_timeout),
            "--rdzv-conf", f"keep_alive_interval={keep_alive}",
            "--diagnostics-store", diagnostics_store, "train.py",
        ])  # fmt: skip
        node = product.ElasticNode(config)
        node.host = hostname or f"node{index:04d}"
        node._handler = torch if torch is not None else _Handler()
        self.node = node
        self.view = product.JobNotices(node)
        node.diagnostics = self.view
        first = index * ranks
        kinds = [behaviour(first + r, r, index, nodes, pattern) for r in range(ranks)]
        self.texts = [
            tuple(synthetic_dump(kinds[r], first + r, step).encode() for step in (0, 1))
            for r in range(ranks)
        ]  # fmt: skip
        original = node._on_result

        def on_result(result: product.Result) -> None:
            now = time.monotonic()
            self.times.setdefault(result.kind, now)
            self.results.setdefault(result.kind, result)
            self.counts[result.kind] = self.counts.get(result.kind, 0) + 1
            running = self.supervisor.stopped is None and not self.supervisor.retired
            original(result)
            if running and getattr(result, "kind", None) == product.REJOIN:
                self._rejoin(getattr(result, "message", ""))

        node._on_result = on_result  # type: ignore[method-assign]
        self.start_round(store, 0)

    def _rejoin(self, why: str) -> None:
        """This node re-forms the group: the launcher stops its workers and calls torch's
        ``next_rendezvous``, which puts it in torch's wait list (:meth:`TorchTraffic.
        join_wait_list`, in a thread: the launcher's main thread, not the loop). Only a node
        that decided on its own joins here (its silent neighbour): one that re-forms because
        it saw a node waiting, another node's word or notice joins after what the benchmark
        measures (a thousand joins at once are torch's herd of compare-and-sets of the whole
        state, minutes on this machine, after every node stopped: left out, and named so)."""
        torch, number = self.torch, self.number
        own = re.match(r"node \d+ stopped answering \(", why) is not None and " saw" not in why
        if torch is None or self.joined or self.fate.dead.is_set() or not own:
            return
        self.joined = True
        threading.Thread(target=torch.join_wait_list, args=(lambda: self.number == number,),
                         name="torch-join", daemon=True).start()  # fmt: skip

    def _gone(self) -> None:
        """The launcher died (:class:`Fate`): what it served goes with it, the diagnostics
        store it hosts above all (its clients see the connection closed)."""
        for server in (self.node._diag_server, getattr(self, "old_server", None)):
            if server is not None:
                server.close()

    def start_round(self, store: Any, number: int) -> None:
        """A new round of ``store`` (torch's per-round prefix store of round ``number``): what
        the launcher has after ``next_round`` and before the workers start (a new
        :class:`JobStacks`, a new supervisor). Call :meth:`register` and :meth:`watch` next."""
        node, index, ranks, nodes = self.node, self.index, self.ranks, self.nodes
        self.store = store
        self.fate: Fate = getattr(store, "fate", None) or Fate()
        self.fate.on_death = self._gone
        self.joined = False
        if self.torch is not None:  # its join synced the new round's state (no wait list)
            self.torch.token, self.torch.synced = None, -1e9
        node._store = store
        world = nodes * ranks
        places = tuple(product.WorkerPlace(index * ranks + r, index * ranks + r, world, world)
                       for r in range(ranks))  # fmt: skip
        node.round = product.NodeRound(index, nodes, "127.0.0.1", 1, places)
        node.change = None
        node._announced = False
        node._in_barrier = False
        node.heartbeats.watch_neighbour(index, nodes, time.monotonic())
        self.number = number
        self.times: dict[str, float] = {}
        self.results: dict[str, product.Result] = {}
        self.counts: dict[str, int] = {}
        self.replies: list[dict] = []
        self.supervisor = FakeSupervisor(self.host, self.ticks)
        pairs = [(r, index * ranks + r) for r in range(ranks)]
        self.stacks = product.JobStacks(
            pairs, python=False, describe={"run_id": RUN_ID, "host": node.host,
                                           "entrypoint": "train.py"},
            hang_timeout=self.hang_timeout, scope="job",
        )  # fmt: skip
        self.dumps = SyntheticRanks(pairs, self.texts, self.latency)  # type: ignore[arg-type]
        self.dumps.moving = self.ticks  # without ticks, the same sample every time
        self.stacks.dumps = self.dumps
        self.stacks.hang = product.HangWatch(
            self.dumps, self.hang_timeout, output_watched=False,
            job=_RecordingHangJob(self.view.hang_job(), self),
        )  # fmt: skip

    def register(self) -> None:
        """What a node does once the round formed: say it is a numarun node (ALIVE, NODES)."""
        conn = product.Conn(self.node._store, clone=False)
        conn.add(product.ALIVE_KEY.format(self.index), 1)
        conn.add(product.NODES_KEY, 1)
        conn.close()
        # Node 0 hosts the round's diagnostics store (--diagnostics-store own), by the
        # launcher's own code. The previous round's is closed at begin(), once every process
        # let its round go (a real round forms only once every node left the last one).
        from types import SimpleNamespace

        self.old_server, self.node._diag_server = self.node._diag_server, None
        self.node._host_diagnostics(SimpleNamespace(rank=self.index, store=self.node._store))

    def begin(self) -> None:
        """Hand the round to the store thread (it connects twice: the connect storm when every
        node of a process does so at once) and start the hang watch's timer."""
        old, self.old_server = getattr(self, "old_server", None), None
        if old is not None:
            old.close()
        self.node.begin_watch(self.supervisor)  # type: ignore[arg-type]
        self.view.attach(self.stacks)
        self.stacks.attach(self.supervisor)  # type: ignore[arg-type]
        self.dumps.attach(self.supervisor)  # type: ignore[arg-type]

    def connected(self) -> bool:
        """Whether the round's store thread has its connections."""
        round_ = self.node.watched_round
        if round_ is not None and round_.own_diag and round_.conn is None:
            # Its connect thread gave up: as connected as it will be this round.
            return round_.diag_why not in (None, product.diagstore.PENDING)
        return round_ is not None and round_.conn is not None and (
            round_.poster is not None or not round_.conn.own
        )

    def watch(self, settle: float = 30.0) -> None:
        """:meth:`begin`, then wait (at most ``settle`` seconds) for the connections."""
        self.begin()
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline and not self.connected():
            time.sleep(0.002)

    def end_round(self) -> None:
        """The run is over: results stop, the round's watch ends (its thread lets it go)."""
        self.supervisor.retire()
        self.node.unwatch()
        self.node._end_watch()

    def raw(self) -> list:
        first = self.index * self.ranks
        return [product.Raw(first + local, local, 10_000 + local, texts[0].decode(), None)
                for local, texts in enumerate(self.texts)]  # fmt: skip

    # --- the events ------------------------------------------------------------------------------

    def ask(self) -> None:
        """``numarun stacks`` for the whole job on this node (as its socket would ask)."""
        assert self.stacks.job_wide is not None

        def reply(fields: dict) -> None:
            self.times.setdefault("reply", time.monotonic())
            self.replies.append(fields)

        self.stacks.job_wide(reply)

    def go_still(self) -> None:
        """This node's ranks have been still for the timeout (as its hang watch says it)."""
        hang = self.stacks.hang
        assert hang is not None
        hang.still = True
        self.view.hang_job().still(self.raw(), hang.timeout)

    def freeze(self) -> None:
        """This node's ranks stop moving: its hang watch's ticks find them still after the
        timeout."""
        self.dumps.freeze()

    def fail(self) -> None:
        """Its rank 0 fails: the supervisor's ``on_failure`` (the other ranks' stacks, taken
        as the launcher takes them: blocking, at most 1 s), then the notice."""
        ended = product.WorkerExit(0, self.index * self.ranks, 10_000, 1, None, "failed",
                                   time.time())  # fmt: skip
        self.times.setdefault("failed", time.monotonic())
        self.stacks.on_failure(ended)
        self.view.on_worker_failure(ended)

    def die(self, why: str = "killed") -> None:
        """The launcher is SIGKILLed now (:class:`Fate`)."""
        self.fate.kill(why)
        self.supervisor.retire()
        if self.torch is not None:
            self.torch.stop()

    def verdict_at(self) -> float | None:
        """When the loop stopped the run on the job's hang verdict (None: not, or not so)."""
        stopped = self.supervisor.stopped
        return stopped[0] if stopped and stopped[1].startswith("hang: ") else None

    def stop_reason(self) -> str | None:
        return self.supervisor.stopped[1] if self.supervisor.stopped else None

    def close(self) -> None:
        if self.torch is not None:
            self.torch.stop()
        self.supervisor.retire()
        self.node.unwatch()
        self.node.watch.close(self.node.watched_round or self.node._last_round, limit=0.1)
        self.stacks.close()
        server, self.node._diag_server = self.node._diag_server, None
        if server is not None:
            server.close()

"""The one thread that talks to the rendezvous store while workers run, and its way back into the
supervisor's loop.

torch's store calls block in C++ for as long as the store does (a ``TCPStore.get`` on a store
whose host is stopped blocks for its whole timeout, and no Python signal handler runs in that
thread meanwhile), so none is made on the supervisor's loop, the thread that handles signals.
Instead one daemon thread per launcher, ``numarun-store``, makes every store call of numarun's
while workers run, and reports through a pipe the loop watches (:meth:`Supervisor.add_reader`):
the loop never waits for the store, a signal is acted on within the usual bound whatever the
store does, and a frozen store costs at most this thread.

The thread sleeps blocked in the store, in ``wait`` for the next event key of the round on a
second connection of its own (``Store.clone()``: torch's keep-alive thread and the rendezvous
share the first, and a long wait there would hold them up), so another node's notice wakes it
the moment it is posted (no polling); the wait times out every look interval
(``--monitor-interval``, default 2 s), when it looks at the rendezvous as torchrun's agent
does: nodes waiting to join, a closed rendezvous, its own heartbeat and its neighbour's.

Events are numbered: a poster adds 1 to ``numarun/events`` and sets ``numarun/event/<k>``; each
thread waits for the key after the last one it read. An event is one of: another node's failure
notice (with that node's stacks, :mod:`numarun.stacks.remote`), a request for the whole job's
stacks (each numarun node answers ``numarun/reply/<k>/<group rank>`` with its post; the asking
node collects them for about 2 s and names any node that did not answer), the job-wide hang
verdict, and a wake-up (a node leaving a round, so that its thread moves on at once). With
``--hang-timeout`` each node whose ranks are all still posts ``numarun/still/<group rank>`` and
adds 1 to ``numarun/stills`` (and takes both back when a rank moves); the node that brings the
count to the number of numarun nodes (``numarun/nodes``) posts the verdict, and every node reads
every node's stacks and stops with the same summary.

Every key is under torch's per-round prefix and is never read by torch; stacks posted are
deleted by the node that collected them, and at the end of the round by the node that posted
them. Local news that cannot wait for the thread's next wake-up (this node's failure notice, a
``numarun stacks`` request for the whole job) is posted by a short-lived thread of its own that
nobody waits for (fire-and-forget: two quick store calls; with a frozen store it is abandoned).

Degraded mode: a torch without ``Store.clone`` (or a store that cannot be cloned): the thread
sleeps on a local condition instead and reads events at each look (every look interval).
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
import time
from datetime import timedelta

from numarun.process import children

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from numarun.process.supervisor import Supervisor

EVENTS_KEY = "numarun/events"
EVENT_KEY = "numarun/event/{}"
ALIVE_KEY = "numarun/alive/{}"
NODES_KEY = "numarun/nodes"
REPLY_KEY = "numarun/reply/{}/{}"
STILL_KEY = "numarun/still/{}"
STILLS_KEY = "numarun/stills"
COLLECT_LIMIT = 2.0  # seconds the asking node waits for the other nodes' stacks
ANSWER_LIMIT = 1.5  # seconds this node's loop has to hand over its own stacks
_HOLE_LOOKS = 5  # with a waiter, the event count is read every this many looks


def _is_timeout(error: BaseException) -> bool:
    return "timeout" in str(error).lower() and "DistNetworkError" not in type(error).__name__


class Round:
    """What the thread needs of one round: the store (torch's per-round ``PrefixStore``),
    torch's handler, this node's group rank, the group's size, and the loop's handlers."""

    def __init__(
        self, store: Any, handler: Any, me: int, size: int, on_result: Callable[[tuple], None]
    ) -> None:
        self.store = store
        self.handler = handler
        self.me = me
        self.size = size
        self.on_result = on_result
        self.active = True
        self.seen = 0  # the last event read
        self.hole_since = 0.0  # an event counted but not set (its poster died in between)
        self.posted: list[str] = []  # keys of stacks this node posted, deleted at the end
        self.still = False
        self.waiter: Any = None


class StoreWatch:
    """The ``numarun-store`` thread of one launcher (module docstring) and the pipe back.

    Loop side: :meth:`begin` (a round's watch, with the supervisor whose loop reads the
    results), :meth:`end`, :meth:`post` (fire-and-forget), :meth:`queue` (work for the thread's
    next wake-up), :meth:`answer` (this node's stacks for a request the thread reported).
    ``look(round)`` is called in the thread every ``interval`` seconds and returns results for
    the loop; ``on_result(result)`` is called in the loop for each result, in order.
    """

    def __init__(self, interval: float, look: Callable[[Round], list[tuple]]) -> None:
        self.interval = interval
        self._look = look
        self._cond = threading.Condition()
        self._round: Round | None = None
        self._results: collections.deque[tuple[Round, tuple]] = collections.deque()
        self._work: collections.deque[Callable[[Round], None]] = collections.deque()
        self._answers: dict[int, bytes] = {}
        self._thread: threading.Thread | None = None
        self._supervisor: Supervisor | None = None
        self._read_fd, self._write_fd = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        children.track(self._read_fd)
        children.track(self._write_fd)

    # --- the loop's side -------------------------------------------------------------------------

    def begin(self, supervisor: Supervisor, round_: Round) -> None:
        """Watch ``round_`` from now on; its results reach ``round_.on_result`` in
        ``supervisor``'s loop."""
        self._supervisor = supervisor
        supervisor.add_reader(self._read_fd, self._drain)
        with self._cond:
            self._round = round_
            self._answers.clear()
            self._cond.notify_all()
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="numarun-store", daemon=True)
            self._thread.start()

    def end(self) -> Round | None:
        """The round's watch is over (its attempt ended): results are no longer delivered; the
        thread deletes what this node posted and waits for the next round. Returns the round
        that was watched."""
        with self._cond:
            round_, self._round = self._round, None
            if round_ is not None:
                round_.active = False
            self._cond.notify_all()
        if self._supervisor is not None:
            self._supervisor.remove_reader(self._read_fd)
            self._supervisor = None
        return round_

    def queue(self, work: Callable[[Round], None]) -> None:
        """``work(round)`` in the thread at its next wake-up (within one look interval)."""
        with self._cond:
            self._work.append(work)
            self._cond.notify_all()

    def answer(self, request: int, post: bytes) -> None:
        """This node's stacks for request ``request`` (the thread waits for them)."""
        with self._cond:
            self._answers[request] = post
            self._cond.notify_all()

    @staticmethod
    def post(calls: Callable[[], None]) -> None:
        """``calls()`` (store calls) in a short-lived daemon thread nobody waits for."""
        threading.Thread(target=_quietly(calls), name="numarun-post", daemon=True).start()

    def _drain(self) -> None:
        with contextlib.suppress(OSError):
            os.read(self._read_fd, 4096)  # non-blocking; the results are in the deque
        while self._results:
            round_, result = self._results.popleft()
            if round_.active and round_ is self._round:
                round_.on_result(result)

    def _report(self, round_: Round, result: tuple) -> None:
        with self._cond:  # never a byte to a closed pipe's number, which may be reused
            if self._write_fd < 0:
                return
            self._results.append((round_, result))
            with contextlib.suppress(OSError):  # full: a wake-up byte is waiting already
                os.write(self._write_fd, b"!")

    def close(self, last: Round | None = None, limit: float = 0.5) -> None:
        """Stop delivering and end the thread: woken through ``last`` (the round it may sleep
        in), waited for at most ``limit`` seconds (with a frozen store it is abandoned: a
        daemon). Closes the pipe."""
        self.end()
        thread = self._thread
        with self._cond:
            self._thread = None
            self._cond.notify_all()
        if thread is not None and thread.is_alive():
            if last is not None:
                self.post(lambda: wake(last))
            thread.join(limit)
        with self._cond:
            for fd in (self._read_fd, self._write_fd):
                children.close(fd)
            self._read_fd = self._write_fd = -1

    # --- the thread ------------------------------------------------------------------------------

    def _serve(self) -> None:
        me = threading.current_thread()
        while True:
            with self._cond:
                while self._round is None and self._thread is me:
                    self._cond.wait()
                if self._thread is not me:
                    return
                round_ = self._round
            assert round_ is not None
            try:
                self._watch(round_)
            except Exception as error:  # the store is gone or broken: the loop decides
                if round_.active:
                    self._report(round_, ("lost", error))
                    with self._cond:  # nothing more to do in this round
                        while round_.active and self._thread is me:
                            self._cond.wait()

    def _watch(self, round_: Round) -> None:
        store = round_.store
        with contextlib.suppress(Exception):
            round_.waiter = store.clone() if hasattr(store, "clone") else None
        next_look = time.monotonic()
        looks = 0
        while round_.active:
            self._run_work(round_)
            now = time.monotonic()
            if now >= next_look:
                looks += 1
                # With a waiter, events wake it; the count is read now and then only, for an
                # event whose poster died between its two calls (a hole to skip). Events come
                # before the look: a node that posts its failure and then closes the
                # rendezvous (its last restart failed) is read as its notice, not as a bare
                # "closed" (torch 2.4's handler sees the closing at once).
                if round_.waiter is None or looks % _HOLE_LOOKS == 0:
                    self._take_events(round_, looking=True)
                for result in self._look(round_):
                    self._report(round_, result)
                next_look = time.monotonic() + self.interval
                continue
            if round_.waiter is None:
                with self._cond:
                    if round_.active and not self._work:
                        self._cond.wait(next_look - now)
                continue
            key = EVENT_KEY.format(round_.seen + 1)
            try:
                round_.waiter.wait([key], timedelta(seconds=max(0.001, next_look - now)))
            except Exception as error:
                if not _is_timeout(error):
                    raise
                continue
            self._take_events(round_)
        _delete_quietly(store, round_.posted)
        if round_.still:
            with contextlib.suppress(Exception):
                store.add(STILLS_KEY, -1)

    def _run_work(self, round_: Round) -> None:
        while True:
            with self._cond:
                if not self._work:
                    return
                work = self._work.popleft()
            work(round_)

    def _take_events(self, round_: Round, *, looking: bool = False) -> None:
        store = round_.store
        count = store.add(EVENTS_KEY, 0)
        while round_.seen < count and round_.active:
            key = EVENT_KEY.format(round_.seen + 1)
            if not store.check([key]):
                # Counted but not set: its poster is between its two calls, or died there.
                now = time.monotonic()
                if not looking:
                    return
                if not round_.hole_since:
                    round_.hole_since = now
                    return
                if now - round_.hole_since < self.interval:
                    return
                round_.seen += 1  # skipped for good
                round_.hole_since = 0.0
                continue
            round_.hole_since = 0.0
            round_.seen += 1
            self._event(round_, round_.seen, store.get(key))

    def _event(self, round_: Round, number: int, value: bytes) -> None:
        head, _, rest = value.partition(b"\n")
        fields = head.decode("ascii", "replace").split()
        if len(fields) < 2 or not fields[1].isdigit():
            return  # not numarun's: ignored
        kind, sender = fields[0], int(fields[1])
        if kind == "stop" and sender != round_.me:
            notice, _, post = rest.partition(b"\n")
            self._report(round_, ("notice", notice.decode("utf-8", "replace"), post))
        elif kind == "stacks":
            self._answer_request(round_, number, sender, fields[2] if len(fields) > 2 else "")
        elif kind == "hang":
            self._report(round_, ("hang", self._still_posts(round_)))

    # --- whole-job stacks ------------------------------------------------------------------------

    def _answer_request(self, round_: Round, number: int, asker: int, token: str) -> None:
        with self._cond:
            self._answers.pop(number, None)
        self._report(round_, ("ask", number))
        deadline = time.monotonic() + ANSWER_LIMIT
        with self._cond:
            while number not in self._answers and round_.active:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            post = self._answers.pop(number, None)
        store = round_.store
        if post is not None:
            key = REPLY_KEY.format(number, round_.me)
            store.set(key, post)
            if asker != round_.me:
                round_.posted.append(key)
        if asker == round_.me:
            self._report(round_, ("answer", token, self._collect(round_, number)))

    def _collect(self, round_: Round, number: int) -> list[tuple[int, bytes | None, str]]:
        """Every node's post for request ``number`` within :data:`COLLECT_LIMIT` seconds:
        (group rank, post or None, why not). Deletes what it read."""
        store = round_.store
        keys = [REPLY_KEY.format(number, rank) for rank in range(round_.size)]
        if round_.waiter is not None:
            with contextlib.suppress(Exception):
                round_.waiter.wait(keys, timedelta(seconds=COLLECT_LIMIT))
        else:
            deadline = time.monotonic() + COLLECT_LIMIT
            while not all(store.check([key]) for key in keys) and time.monotonic() < deadline:
                time.sleep(0.05)
        replies: list[tuple[int, bytes | None, str]] = []
        for rank, key in enumerate(keys):
            if store.check([key]):
                replies.append((rank, store.get(key), ""))
                store.delete_key(key)
            elif store.add(ALIVE_KEY.format(rank), 0) == 0:
                replies.append((rank, None, "not a numarun node (torchrun?): its ranks not shown"))
            else:
                replies.append((rank, None, f"did not answer within {COLLECT_LIMIT:g} s"))
        with contextlib.suppress(Exception):
            store.delete_key(EVENT_KEY.format(number))
        return replies

    # --- the job-wide hang verdict ---------------------------------------------------------------

    def mark_still(self, post: bytes) -> None:
        """This node's ranks are all still (``post``: their stacks); declares the hang when
        every numarun node is."""

        def still(round_: Round) -> None:
            store = round_.store
            key = STILL_KEY.format(round_.me)
            store.set(key, post)
            if key not in round_.posted:
                round_.posted.append(key)
            if round_.still:
                return
            round_.still = True
            count = store.add(STILLS_KEY, 1)
            if count >= max(1, store.add(NODES_KEY, 0)):
                number = store.add(EVENTS_KEY, 1)
                store.set(EVENT_KEY.format(number), f"hang {round_.me}".encode())

        self.queue(still)

    def mark_moving(self) -> None:
        def moving(round_: Round) -> None:
            if round_.still:
                round_.still = False
                round_.store.add(STILLS_KEY, -1)

        self.queue(moving)

    def _still_posts(self, round_: Round) -> list[bytes]:
        store = round_.store
        posts = []
        for rank in range(round_.size):
            key = STILL_KEY.format(rank)
            if store.check([key]):
                posts.append(store.get(key))
        return posts


def wake(round_: Round) -> None:
    """Post a wake-up event in ``round_`` (its thread, blocked in the store, moves on at
    once); for a thread other than the loop, as the next round's join."""
    store = round_.store
    number = store.add(EVENTS_KEY, 1)
    store.set(EVENT_KEY.format(number), f"wake {round_.me}".encode())


def _quietly(calls: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        with contextlib.suppress(Exception):
            calls()

    return run


def _delete_quietly(store: Any, keys: list[str]) -> None:
    while keys:
        key = keys.pop()
        with contextlib.suppress(Exception):
            store.delete_key(key)

"""The one thread that talks to the rendezvous store while workers run, and its way back into the
supervisor's loop.

torch's store calls block in C++ for as long as the store does (a ``TCPStore.get`` on a store
whose host is stopped blocks for its whole timeout, and no Python signal handler runs in that
thread meanwhile), so none is made on the supervisor's loop, the thread that handles signals.
Instead one daemon thread per launcher, ``numarun-store``, makes every store call of numarun's
while workers run, on a connection of its own per round (:class:`numarun.launch.storeops.Conn`,
closed when the round's watch ends), and reports through a pipe the loop watches
(:meth:`Supervisor.add_reader`): the loop never waits for the store, a signal is acted on within
the usual bound whatever the store does, and a frozen store costs at most this thread.

The thread sleeps blocked in the store, in ``wait`` for the next event key of the round, so
another node's event wakes it the moment it is posted (no polling); the wait times out every look
interval (``--monitor-interval``, default 2 s), when it looks at the rendezvous as torchrun's agent
does (:mod:`numarun.launch.torchrdzv`) and runs the work the loop queued (this node's hang marks).

Events are numbered: a poster adds 1 to ``numarun/events`` and sets ``numarun/event/<k>``; each
thread waits for the key after the last one it read. The counter is checked like any value read
from the store: one that is not a number is named and set back to the last event there, one that
jumped is named and the events after the jump are read, one that went back is named and followed
(:meth:`StoreWatch._check_count`). An event key is never deleted while another node may not have
read it: its poster deletes it once the next round formed (:mod:`numarun.launch.torchrdzv`).

The whole job in O(1) store requests per node per event (:mod:`numarun.stacks.remote`,
:mod:`numarun.stacks.merge`): each node posts a *digest* of its ranks' stacks (a few hundred
bytes: class ids with rank sets) and, the first time in the round a class is seen by anyone (an
``add`` on its claim key returns 1), that class's frames; one node merges every digest into the
job's classes and posts the one merged result as an event; every node reads that one event and
the frames of the classes it has not seen yet.

* ``numarun stacks`` for the whole job: the asking node posts ``stacks``; every node appends its
  digest to ``numarun/replies/<k>`` (one request) and counts itself in ``numarun/replied/<k>``;
  the last numarun node sets ``numarun/complete/<k>``, which the asking node waits for (at most
  :data:`COLLECT_LIMIT` seconds), reads every digest in one request, merges and posts ``merged``.
* ``--hang-timeout``: a node whose ranks are all still posts its digest at ``numarun/still/<n>``,
  lists itself once in ``numarun/still-nodes`` and adds 1 to ``numarun/stills`` (and sets its key
  to ``moving`` and takes the 1 back when a rank moves); a node whose ranks all ended counts as
  still for good (it waits in the exit barrier, still watching). The node that brings the count
  to the number of numarun nodes (``numarun/nodes``) reads the listed nodes' keys in one request,
  checks that each is still (a count moved by another client is named and repaired, ``recount``),
  merges and posts ``hang``; every node stops with the same summary. A node that was never still
  names a verdict it receives as coming from the store, and ignores it.
* a failure notice (``stop``) carries the failing node's digest; each node reads it in one
  request.

Local news that cannot wait for the thread's next wake-up (this node's failure notice, a
``numarun stacks`` request) is posted by a short-lived thread that nobody waits for
(fire-and-forget; with a frozen store it is abandoned), on the round's second connection of
numarun's own (made by the store thread when the round's watch begins, one post at a time):
connecting to the store is slow when many connections are made at once (torch's client waits 5 s
before it tries again), so numarun connects twice per node and round, never per post.

Degraded mode: a torch that cannot clone a store: calls go through torch's connection (every
counter read before it is added to) and the thread sleeps on a local condition, reading events at
each look. A store without torch's extended API (etcd's): digests are keys of their own.
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
import threading
import time

from numarun.launch.storeops import Conn, Forged, as_count
from numarun.launch.storeresults import Ask, Lost
from numarun.process import forkexec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from numarun.launch.storeresults import Result
    from numarun.process.supervisor import Supervisor
    from numarun.stacks.remote import Raw

EVENTS_KEY = "numarun/events"
EVENT_KEY = "numarun/event/{}"
ALIVE_KEY = "numarun/alive/{}"
NODES_KEY = "numarun/nodes"
FRAMES_KEY = "numarun/frames/{}"
CLAIM_KEY = "numarun/claim/{}"
REPLIES_KEY = "numarun/replies/{}"
REPLIED_KEY = "numarun/replied/{}"
COMPLETE_KEY = "numarun/complete/{}"
STILL_KEY = "numarun/still/{}"
STILLS_KEY = "numarun/stills"
STILL_NODES_KEY = "numarun/still-nodes"
MOVING = b"moving"
COLLECT_LIMIT = 2.0  # seconds the asking node waits for the other nodes' digests
ANSWER_LIMIT = 1.5  # seconds this node's loop has to hand over its own stacks
FRAMES_WAIT = 0.5  # seconds to wait for frames a digest names (their poster is still writing)
_HOLE_LOOKS = 5  # on its own connection, the event count is read every this many looks
_SCAN = 64  # event numbers looked at around a hole or a jump


class Round:
    """What the thread needs of one round: the store (torch's per-round ``PrefixStore``), torch's
    handler, this node's group rank, the group's size, the loop's handler; ``world``: the job's
    rank count (a bound on ranks read back), ``host`` and ``pid`` for this node's digests."""

    def __init__(
        self, store: Any, handler: Any, me: int, size: int, on_result: Callable[[Result], None],
        *, world: int = 1 << 22, host: str = "", pid: int = 0,
    ) -> None:  # fmt: skip
        from numarun.stacks.remote import Classes

        self.store = store
        self.handler = handler
        self.me = me
        self.size = size
        self.on_result = on_result
        self.world = world
        self.host = host
        self.pid = pid or os.getpid()
        self.active = True
        self.conn: Conn | None = None  # opened by the thread, closed when the watch ends
        self.poster: Conn | None = None  # the posting threads' connection, one at a time
        self.post_lock = threading.Lock()
        self.seen = 0  # the last event read
        self.read: dict[int, int] = {}  # the last events read: number -> hash of the value
        self.hole_since = 0.0  # an event counted but not set (its poster died in between)
        self.local: list[str] = []  # keys only this node reads: deleted when the watch ends
        self.shared: list[str] = []  # keys others read: deleted once the next round formed
        self.still = False
        self.still_once = False  # this node's ranks were still (or ended) in this round
        self.done: list[Raw] | None = None  # this node's ranks all ended: they, for answers
        self.listed = False
        self.nodes: int | None = None  # numarun nodes in the round, once read
        self.frame_posts: dict[str, bytes] = {}  # class id -> its frames post, this round
        self.claimed: set[str] = set()
        self.classes = Classes()
        self.noted: set[str] = set()


class StoreWatch:
    """The ``numarun-store`` thread of one launcher (module docstring) and the pipe back.

    Loop side: :meth:`begin` (a round's watch, with the supervisor whose loop reads the
    results), :meth:`detach` (results wait in :attr:`delivered` instead, for a thread that waits
    for them: the exit barrier), :meth:`end`, :meth:`post` (fire-and-forget), :meth:`queue`
    (work for the thread's next wake-up), :meth:`answer` (this node's dumps for a request the
    thread reported). ``look(round)``
    is called in the thread every ``interval`` seconds and returns results for the loop;
    ``on_result(result)`` is called in the loop for each result, in order;
    ``on_event(watch, round, number, value)`` in the thread for each event read (the protocol:
    :mod:`numarun.launch.jobwide`).
    """

    def __init__(
        self,
        interval: float,
        look: Callable[[Round], list[Result]],
        on_event: Callable[[StoreWatch, Round, int, bytes], None] | None = None,
    ) -> None:
        self.interval = interval
        self._look = look
        self._on_event = on_event
        self._cond = threading.Condition()
        self._round: Round | None = None
        self._results: collections.deque[tuple[Round, Result]] = collections.deque()
        self._work: collections.deque[Callable[[Round], None]] = collections.deque()
        self._answers: dict[int, list[Raw]] = {}
        self._thread: threading.Thread | None = None
        self._supervisor: Supervisor | None = None
        self.delivered = threading.Event()  # set when a result waits and no loop reads them
        self._read_fd, self._write_fd = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        forkexec.track(self._read_fd)
        forkexec.track(self._write_fd)

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

    def detach(self) -> None:
        """The loop stops reading results (its run ended); the round stays watched and later
        results wait for :meth:`take_delivered`, with :attr:`delivered` set."""
        if self._supervisor is not None:
            self._supervisor.remove_reader(self._read_fd)
            self._supervisor = None

    def take_delivered(self) -> list[Result]:
        """The results that arrived while detached, in order (of the round still watched)."""
        taken = []
        with self._cond:
            self.delivered.clear()
            while self._results:
                round_, result = self._results.popleft()
                if round_.active and round_ is self._round:
                    taken.append(result)
        return taken

    def end(self) -> Round | None:
        """The round's watch is over: results are no longer delivered; the thread deletes the
        keys only this node reads, closes the round's connection and waits for the next round.
        Returns the round that was watched."""
        with self._cond:
            round_, self._round = self._round, None
            if round_ is not None:
                round_.active = False
            self._results.clear()
            self._cond.notify_all()
        self.detach()
        return round_

    def queue(self, work: Callable[[Round], None]) -> None:
        """``work(round)`` in the thread at its next wake-up (within one look interval)."""
        with self._cond:
            self._work.append(work)
            self._cond.notify_all()

    def answer(self, request: int, dumps: list[Raw]) -> None:
        """This node's dumps for request ``request`` (the thread waits for them)."""
        with self._cond:
            self._answers[request] = dumps
            self._cond.notify_all()

    @staticmethod
    def post(round_: Round, calls: Callable[[Conn], None]) -> None:
        """``calls(conn)`` (store calls on the round's posting connection, or one of their
        own, closed after, before the watch made it) in a short-lived daemon thread nobody
        waits for."""

        def run() -> None:
            with round_.post_lock:
                conn = round_.poster
                fresh = conn is None
                try:
                    if conn is None:
                        conn = Conn(round_.store, clone=False)
                    calls(conn)
                except Exception:  # fire-and-forget: the store may be gone
                    pass
                finally:
                    if fresh and conn is not None:
                        conn.close()

        threading.Thread(target=run, name="numarun-post", daemon=True).start()

    def _drain(self) -> None:
        with contextlib.suppress(OSError):
            os.read(self._read_fd, 4096)  # non-blocking; the results are in the deque
        while True:
            with self._cond:
                if not self._results:
                    return
                round_, result = self._results.popleft()
            if round_.active and round_ is self._round:
                round_.on_result(result)

    def _report(self, round_: Round, result: Result) -> None:
        with self._cond:  # never a byte to a closed pipe's number, which may be reused
            if self._write_fd < 0 or not round_.active:
                return
            self._results.append((round_, result))
            if self._supervisor is None:
                self.delivered.set()
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
                self.post(last, lambda conn: wake(conn, last.me))
            thread.join(limit)
        with self._cond:
            for fd in (self._read_fd, self._write_fd):
                forkexec.close(fd)
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
                    self._report(round_, Lost(error))
                    with self._cond:  # nothing more to do in this round
                        while round_.active and self._thread is me:
                            self._cond.wait()
            finally:
                self._let_go(round_)

    def _let_go(self, round_: Round) -> None:
        round_.poster = None  # closed with the last posting thread's reference
        conn, round_.conn = round_.conn, None
        if conn is not None:
            while round_.local:
                conn.delete(round_.local.pop())
            conn.close()

    def _watch(self, round_: Round) -> None:
        round_.conn = conn = Conn(round_.store)
        if conn.own:
            round_.poster = Conn(round_.store)
        next_look = time.monotonic()
        looks = 0
        while round_.active:
            self._run_work(round_)
            now = time.monotonic()
            if now >= next_look:
                looks += 1
                # On its own connection events wake the watch; the count is read now and then
                # only, for an event whose poster died between its two calls, or a counter
                # moved. Events are also read before a look's results are reported: a node that
                # posts its failure and then closes the rendezvous (its last restart failed) is
                # read as its notice, not as a bare "closed" (torch 2.4's handler sees it first).
                results = list(self._look(round_))
                if results or not conn.own or looks % _HOLE_LOOKS == 0:
                    self._take_events(round_)
                    self._check_count(round_)
                for result in results:
                    self._report(round_, result)
                next_look = time.monotonic() + self.interval
                continue
            if not conn.own:
                with self._cond:
                    if round_.active and not self._work:
                        self._cond.wait(next_look - now)
                continue
            key = EVENT_KEY.format(round_.seen + 1)
            if conn.wait([key], next_look - now):
                value = conn.get_after_wait(key)
                if value is not None:
                    self._took(round_, value)

    def _run_work(self, round_: Round) -> None:
        while True:
            with self._cond:
                if not self._work:
                    return
                work = self._work.popleft()
            try:
                work(round_)
            except Forged as forged:
                self.note(round_, forged.key, str(forged))

    def note(self, round_: Round, topic: str, line: str) -> None:
        """Say once per round and topic, on stderr, what in the store is not numarun's."""
        if topic in round_.noted or len(round_.noted) > 64:
            return
        round_.noted.add(topic)
        from numarun.stacks.remote import printable

        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(f"numarun: warning: the rendezvous store: {printable(line)}\n")
            sys.stderr.flush()

    # --- events ----------------------------------------------------------------------------------

    def _take_events(self, round_: Round) -> None:
        """Read the events there are after the last one read (a wait that returned for
        nothing reads none)."""
        conn = round_.conn
        assert conn is not None
        while round_.active:
            value = conn.get_now(EVENT_KEY.format(round_.seen + 1))
            if value is None:
                return
            self._took(round_, value)

    def _took(self, round_: Round, value: bytes) -> None:
        """The next event read: counted, remembered (to tell a moved counter), handled."""
        round_.seen += 1
        round_.hole_since = 0.0
        round_.read[round_.seen] = hash(value)
        if len(round_.read) > 2 * _SCAN:
            round_.read.pop(next(iter(round_.read)))
        self._event(round_, round_.seen, value)

    def _check_count(self, round_: Round) -> None:
        """The event counter against what this node read: a hole (an event counted, never
        set: its poster died between its two calls) skipped after an interval; a counter
        that is not a number, or that another client moved (by more than a few events, or
        back), named, and the events posted since read (module docstring)."""
        conn = round_.conn
        assert conn is not None
        try:
            count = conn.count(EVENTS_KEY)
        except Forged as forged:
            self.note(round_, EVENTS_KEY, f"{forged}; it is set back when this node posts")
            return
        seen = round_.seen
        if count == seen:
            round_.hole_since = 0.0
            return
        # Events posted after holes are holes, however many: at a thousand nodes a failure
        # cascade posts hundreds of notices while a few posters are between their two calls.
        if seen < count <= seen + _SCAN or (count > seen and _posted_soon_after(conn, seen)):
            now = time.monotonic()
            if not round_.hole_since:
                round_.hole_since = now
            elif now - round_.hole_since >= self.interval:
                round_.hole_since = 0.0
                for number in range(seen + 2, count + 1):
                    if conn.get_now(EVENT_KEY.format(number)) is not None:
                        round_.seen = number - 1
                        return
                round_.seen = count
            return
        low = count
        while count - low < _SCAN:
            value = conn.get_now(EVENT_KEY.format(low))
            if value is None or round_.read.get(low) == hash(value):
                break  # before the events posted since the counter moved
            low -= 1
        self.note(round_, f"{EVENTS_KEY} {count}", f"{EVENTS_KEY} moved from {seen} to {count} "
                  f"(another client of the store?); reading on from event {low + 1}")  # fmt: skip
        round_.seen = low
        round_.hole_since = 0.0

    def _event(self, round_: Round, number: int, value: bytes) -> None:
        if self._on_event is not None:
            try:
                self._on_event(self, round_, number, value)
            except Forged as forged:
                self.note(round_, forged.key, str(forged))

    def wait_answer(self, round_: Round, number: int) -> list[Raw] | None:
        """This node's dumps for request ``number`` from the loop (at most
        :data:`ANSWER_LIMIT` seconds); without a loop (the exit barrier), its ended ranks."""
        if round_.done is not None and self._supervisor is None:
            return round_.done
        with self._cond:
            self._answers.pop(number, None)
        self._report(round_, Ask(number))
        deadline = time.monotonic() + ANSWER_LIMIT
        with self._cond:
            while number not in self._answers and round_.active:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return self._answers.pop(number, None)

    def report(self, round_: Round, result: Result) -> None:
        self._report(round_, result)

def _posted_soon_after(conn: Conn, seen: int) -> bool:
    """Whether an event is there within :data:`_SCAN` numbers after the hole at ``seen + 1``
    (posters between their two calls), as there never is after a counter another client moved
    far ahead."""
    return any(
        conn.get_now(EVENT_KEY.format(number)) is not None
        for number in range(seen + 2, seen + _SCAN + 1)
    )


def post_event(conn: Conn, header: str, body: bytes = b"", *, after: int = 0,
               note: Callable[[str], None] | None = None) -> str | None:  # fmt: skip
    """Post one event (``header`` line, then ``body``) as the round's next; returns its key.
    A counter that is not a number, or that went back below events already there, is set to
    the last event found from ``after`` on (and named through ``note``) first."""
    value = header.encode() + (b"\n" + body if body else b"")
    for _ in range(3):
        try:
            number = conn.add(EVENTS_KEY, 1)
        except Forged as forged:
            top = _last_event(conn, after)
            if note is not None:
                note(f"{forged}; set back to {top}")
            conn.repair(EVENTS_KEY, forged.value, top)
            continue
        key = EVENT_KEY.format(number)
        if conn.get_now(key) is None:
            conn.set(key, value)
            return key
        top = _last_event(conn, number)
        if note is not None:
            note(f"{EVENTS_KEY} went back to {number - 1}, below events already posted "
                 f"(another client of the store?); set to {top}")  # fmt: skip
        conn.repair(EVENTS_KEY, str(number).encode(), top)
    return None


def _last_event(conn: Conn, after: int) -> int:
    number = max(0, after)
    for _ in range(_SCAN * 4):
        if conn.get_now(EVENT_KEY.format(number + 1)) is None:
            break
        number += 1
    return number


def wake(conn: Conn, me: int) -> None:
    """Post a wake-up event (the round's thread, blocked in the store, moves on at once)."""
    post_event(conn, f"wake {me}")


def read_count(conn: Conn, key: str, low: int, high: int) -> int | None:
    """A counter within ``[low, high]``, or None (absent, not a number, out of range)."""
    value = as_count(conn.get_now(key))
    return value if value is not None and low <= value <= high else None


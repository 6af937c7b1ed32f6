"""The one thread that talks to the rendezvous store while workers run, and its way back into the
supervisor's loop.

torch's store calls block in C++ for as long as the store does (a ``TCPStore.get`` on a store
whose host is stopped blocks for its whole timeout, and no Python signal handler runs in that
thread meanwhile), so none is made on the supervisor's loop, the thread that handles signals.
Instead one daemon thread per launcher, ``numarun-store``, makes every store call of numarun's
while workers run, on a connection of its own per round (:class:`numarun.rendezvous.storeops.Conn`,
closed when the round's watch ends), and reports through a pipe the loop watches
(:meth:`Supervisor.add_reader`): the loop never waits for the store, a signal is acted on within
the usual bound whatever the store does, and a frozen store costs at most this thread.

The thread sleeps blocked in the store, in ``wait`` for the next event key of the round, so
another node's event wakes it the moment it is posted (no polling); the wait times out every look
interval (``--monitor-interval``, default 2 s), when it looks at the rendezvous as torchrun's
agent does (:mod:`numarun.rendezvous.torchrdzv`), or sooner for timed work
(:meth:`StoreWatch.later`: a hang verdict's window, a still node's waves). Work queued from
other threads (:meth:`StoreWatch.queue`) runs at its next wake-up. This node's heartbeat (every
second, :mod:`numarun.rendezvous.liveness`) is a thread of its own per round, ``numarun-beat``,
on the round's posting connection (in this thread, at wake-ups of its own, where a torch cannot
clone).

Events are numbered (:mod:`numarun.rendezvous.events`: posting one, and the counter checked
at each look like any value read from the store, so a hole costs at most a look interval and
:data:`~numarun.rendezvous.events.HOLE_GRACE`); each thread waits for the key after the last
one it read. Once the round is over for this node (the first ``stop`` notice read, or its own
posted: :attr:`WatchedRound.stopping`) no event is read any more. An event key is never deleted
while another node may not have read it: its poster deletes it once the next round formed
(:mod:`numarun.rendezvous.torchrdzv`).

What happens at each event is not this module's: the round's events are handed to the
``on_event`` callable its :class:`StoreWatch` was made with (the rendezvous's own, which passes
the whole-job view's on to :mod:`numarun.jobwide`); docs/protocol.md lists every key and event.
A diagnostic that fails there, or in queued work, is one line (:meth:`StoreWatch.note`), never a
lost rendezvous; so is a store call on numarun's own keys that fails or times out (the event wait
and reads, the counter, a post: :meth:`StoreWatch.unavailable`; the events then rest until the
next look). Only the look (the rendezvous's own health: what torch's handler raises) ends a
round's watch with :class:`numarun.rendezvous.storeresults.Lost`.

Local news that cannot wait for the thread's next wake-up (this node's failure notice, a
``numarun stacks`` request) is posted by a short-lived thread that nobody waits for
(fire-and-forget; with a frozen store it is abandoned), on the round's second connection of
numarun's own (made by the store thread when the round's watch begins, one post at a time):
connecting to the store is slow when many connections are made at once (torch's client waits 5 s
before it tries again), so numarun connects twice per node and round, never per post.

With a diagnostics store of its own (``--diagnostics-store own``,
:mod:`numarun.rendezvous.diagstore`) the round's connections are made by a ``numarun-connect``
thread (the view is off until then; posts wait for it), the events are on that store, and the
look runs in a thread of its own, ``numarun-look``: torch's handler waits for its own lock,
which its keep-alive's retries on a saturated rendezvous store hold for seconds. The heartbeats
stay on the rendezvous store (:data:`HEALTH`), on a connection of their own.

Degraded mode: a torch that cannot clone a store: calls go through torch's connection (every
counter read before it is added to) and the thread sleeps on a local condition, reading events at
each look. A store without torch's extended API (etcd's): digests are keys of their own.
"""

from __future__ import annotations

import collections
import contextlib
import heapq
import os
import sys
import threading
import time

from numarun.process import forkexec
from numarun.rendezvous import diagstore
from numarun.rendezvous.events import EVENT_KEY, SCAN, check_count, wake
from numarun.rendezvous.storeops import Conn, Forged, first_line
from numarun.rendezvous.storeresults import Lost

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeVar

    T = TypeVar("T")

    from numarun.process.supervisor import Supervisor
    from numarun.rendezvous.storeresults import Result

ALIVE_KEY = "numarun/alive/{}"
NODES_KEY = "numarun/nodes"
# What the health calls are named by (StoreWatch.tolerant's ``what``): on the rendezvous
# store, always (numarun.rendezvous.torchrdzv's health threads). One name each, so that a
# call named otherwise cannot be taken for the diagnostics store's.
OWN_BEAT = "this node's heartbeat"
NEXT_BEAT = "the next node's heartbeat"
GONE_WORD = "the word that a node is gone"
HEALTH = frozenset({OWN_BEAT, NEXT_BEAT, GONE_WORD})
_RDZV, _DIAG = "the rendezvous store", "the diagnostics store"
EVENTS_FIRST = 1.0  # seconds a look's results wait for the store thread to read the events first
EVENTS = "the round's events (other nodes' notices, stacks requests, hang verdicts)"


class WatchedRound:
    """What the thread needs of one round: the store (torch's per-round ``PrefixStore``), torch's
    handler, this node's group rank, the group's size, the loop's handler; ``world``: the job's
    rank count (a bound on ranks read back), ``host`` and ``pid`` for this node's posts.
    ``job`` is the whole-job view's own state for the round (:mod:`numarun.jobwide.protocol`
    makes it at its first use; nothing here reads it)."""

    def __init__(
        self, store: Any, handler: Any, me: int, size: int, on_result: Callable[[Result], None],
        *, world: int = 1 << 22, host: str = "", pid: int = 0, own_diag: bool = False,
    ) -> None:  # fmt: skip
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
        self.local: list[str] = []  # keys only this node reads: deleted when the watch ends
        self.shared: list[str] = []  # keys others read: deleted once the next round formed
        self.noted: set[str] = set()
        # This node left the round (another node's notice, or its own): no more event is read.
        self.stopping = False
        self.events_down = False  # the last event call failed: none until the next look
        self.trouble: tuple[str, BaseException] | None = None  # said once a look succeeded
        self.timers: list[tuple[float, int, Callable[[WatchedRound], None]]] = []
        self.job: Any = None
        # --diagnostics-store own (numarun.rendezvous.diagstore): the whole-job view's keys
        # (events, notices, requests, hang marks, frames) on a store of their own, connected by
        # the numarun-connect thread; ``conn`` and ``poster`` are its connections then, and the
        # rendezvous's health (heartbeats, the exit barrier) goes through ``health``.
        self.own_diag = own_diag
        self.diag_store: Any = None if own_diag else store  # where the view's keys are
        self.diag_why: str | None = diagstore.PENDING if own_diag else None
        self.health: Conn | None = None  # own: the heartbeat's own connection to the rendezvous
        # own: a second one, where numarun-word waits for the word that a node is gone
        # (liveness.GONE_KEY), made once the view's store refused a probe (torchrdzv).
        self.word: Conn | None = None
        # own: the view's store refused a probe, so its host (group rank 0) may be gone: this
        # node then watches that node's beat too (liveness.Heartbeats); it decides nothing.
        self.diag_host_unreachable = False
        self._torch_conn: Conn | None = None
        self.deferred: list[tuple[Callable[[Conn], object], str]] = []  # posts while connecting

    def view_off(self) -> str | None:
        """Why the whole-job view is off on this node now (its store not connected, or never
        this round), or None when it is on."""
        return self.diag_why if self.own_diag and self.conn is None else None

    def health_conn(self) -> Conn | None:
        """The connection for the rendezvous's own health keys (the neighbour's beat, the exit
        barrier's): the round's connection where the view shares the rendezvous store; with a
        diagnostics store of its own, the heartbeat's own connection to the rendezvous store
        once made, torch's connection until then."""
        if not self.own_diag:
            return self.conn
        if self.health is not None:
            return self.health
        if self._torch_conn is None:
            self._torch_conn = Conn(self.store, clone=False)
        return self._torch_conn


class StoreWatch:
    """The ``numarun-store`` thread of one launcher (module docstring) and the pipe back.

    Loop side: :meth:`begin` (a round's watch, with the supervisor whose loop reads the
    results), :meth:`detach` (results wait instead, for a thread that waits
    for them: the exit barrier), :meth:`end`, :meth:`post` (fire-and-forget), :meth:`queue`
    (work for the thread's next wake-up), :meth:`on_delivery` and :meth:`take_delivered`
    (results while detached), :meth:`answer` (the loop's answer to a request the
    thread made with :meth:`ask_loop`). ``look(round)`` is called in the thread every
    ``interval`` seconds and returns results for the loop;
    ``on_result(result)`` is called in the loop for each result, in order;
    ``on_event(round, number, value)`` in the thread for each event read (what it means is the
    caller's: :class:`numarun.rendezvous.torchrdzv.ElasticNode` and the whole-job view).
    """

    def __init__(
        self,
        interval: float,
        look: Callable[[WatchedRound], list[Result]],
        on_event: Callable[[WatchedRound, int, bytes], None] | None = None,
        beat: tuple[float, Callable[[WatchedRound, Conn], None]] | None = None,
    ) -> None:
        self.interval = interval
        self._look = look
        self._on_event = on_event
        self._beat = beat  # (seconds, call): this node's heartbeat, on its own cadence
        self._cond = threading.Condition()
        self.lock = self._cond  # under it a connecting round's posts are deferred (diagstore)
        self._round: WatchedRound | None = None
        self._results: collections.deque[tuple[WatchedRound, Result]] = collections.deque()
        self._work: collections.deque[Callable[[WatchedRound], None]] = collections.deque()
        self._answers: dict[int, object] = {}
        self._thread: threading.Thread | None = None
        self._supervisor: Supervisor | None = None
        self._delivered = threading.Event()  # set when a result waits and no loop reads them
        self._read_fd, self._write_fd = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        forkexec.track(self._read_fd)
        forkexec.track(self._write_fd)

    # --- the loop's side -------------------------------------------------------------------------

    def begin(self, supervisor: Supervisor, round_: WatchedRound) -> None:
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

    @property
    def watching(self) -> bool:
        """Whether a round is watched (from :meth:`begin` to :meth:`end`)."""
        return self._round is not None

    def on_delivery(self, event: threading.Event) -> None:
        """Set ``event`` when a result arrives while detached (at once if one waits): the
        exit barrier's wait wakes on it."""
        with self._cond:
            self._delivered = event
            if self._results:
                event.set()

    def take_delivered(self) -> list[Result]:
        """The results that arrived while detached, in order (of the round still watched)."""
        taken = []
        with self._cond:
            self._delivered.clear()
            while self._results:
                round_, result = self._results.popleft()
                if round_.active and round_ is self._round:
                    taken.append(result)
        return taken

    def end(self) -> WatchedRound | None:
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

    def queue(self, work: Callable[[WatchedRound], None]) -> None:
        """``work(round)`` in the thread at its next wake-up (within one look interval)."""
        with self._cond:
            self._work.append(work)
            self._cond.notify_all()

    def later(self, round_: WatchedRound, delay: float,
              work: Callable[[WatchedRound], None]) -> None:  # fmt: skip
        """``work(round_)`` in the thread ``delay`` seconds from now, if ``round_`` is still
        watched then (in the thread itself: on time; from another thread: at the thread's
        next wake-up after that, within a look interval). Guarded as queued work is."""
        with self._cond:
            heapq.heappush(round_.timers, (time.monotonic() + delay, id(work), work))
            self._cond.notify_all()

    @property
    def attached(self) -> bool:
        """Whether a supervisor's loop reads the results (not detached: see :meth:`detach`)."""
        return self._supervisor is not None

    def answer(self, request: int, value: object) -> None:
        """The loop's answer to request ``request`` (:meth:`ask_loop` waits for it)."""
        with self._cond:
            self._answers[request] = value
            self._cond.notify_all()

    def post(self, round_: WatchedRound, calls: Callable[[Conn], object], what: str) -> None:
        """``calls(conn)`` (store calls on the round's posting connection, or one of their
        own, closed after, before the watch made it) in a short-lived daemon thread nobody
        waits for, one such thread at a time per round (this node's beats take their turns
        too). What ``calls`` returns, when callable, is called after, in the same thread but
        out of turn: work that may take long (a hang verdict's judging, on a connection of its
        own) never holds up a beat. What they raise is one line naming ``what`` could not be
        posted (:meth:`unavailable`; nothing when ``what`` is empty): a store that is gone, or
        that refuses numarun's keys, is the rendezvous's to judge (its look), never a post's."""

        with self._cond:  # the view's store not connected: never the rendezvous's instead
            # While it connects (a second or two at a round's start) the post waits for it
            # (diagstore.connecting posts it then); once it gave up: one line.
            off = round_.own_diag and round_.poster is None
            if off and round_.diag_why == diagstore.PENDING and len(round_.deferred) < 64:
                round_.deferred.append((calls, what))
                return
        if off:
            if what:
                diagstore.say_unavailable(round_)
            return

        def run() -> None:
            after = None
            with round_.post_lock:
                conn = round_.poster
                fresh = conn is None
                if fresh and round_.own_diag:  # its store let go meanwhile: nothing posted
                    return
                try:
                    if conn is None:
                        conn = Conn(round_.store, clone=False)
                    after = calls(conn)
                except Forged as forged:
                    self.note(round_, forged.key, str(forged))
                except Exception as error:  # fire-and-forget: the store may be gone
                    if what:
                        self.unavailable(round_, what, error)
                finally:
                    if fresh and conn is not None:
                        conn.close()
            if callable(after):
                self.tolerant(round_, what or "a post", after)

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

    def _report(self, round_: WatchedRound, result: Result) -> None:
        with self._cond:  # never a byte to a closed pipe's number, which may be reused
            if self._write_fd < 0 or not round_.active:
                return
            self._results.append((round_, result))
            if self._supervisor is None:
                self._delivered.set()
            with contextlib.suppress(OSError):  # full: a wake-up byte is waiting already
                os.write(self._write_fd, b"!")

    def close(self, last: WatchedRound | None = None, limit: float = 0.5) -> None:
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
                self.post(last, lambda conn: wake(conn, last.me), "")
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
            except Exception as error:  # the look: the store is gone for the rendezvous
                if round_.active:
                    self._report(round_, Lost(error))
                    with self._cond:  # nothing more to do in this round
                        while round_.active and self._thread is me:
                            self._cond.wait()
            finally:
                self._let_go(round_)

    def _let_go(self, round_: WatchedRound) -> None:
        round_.poster = None  # closed with the last posting thread's reference
        conn, round_.conn = round_.conn, None
        if conn is not None:
            while round_.local:
                conn.delete(round_.local.pop())
            conn.close()
        if round_.own_diag:
            round_.diag_why = "the round's watch ended"
            round_.health = round_.word = None

    def _watch(self, round_: WatchedRound) -> None:
        """The round's watch. Only what the look raises leaves it (the rendezvous's own
        health: :meth:`_serve` reports it as :class:`Lost`); a store call of numarun's own
        that fails (the event wait, an event read, the counter) is one line, said once a look
        succeeded (the rendezvous is fine: only numarun's keys are unavailable), and the
        events wait until the next look."""
        if round_.own_diag:  # connected by a thread of its own; the view off until then
            threading.Thread(target=diagstore.connecting, args=(self, round_),
                             name="numarun-connect", daemon=True).start()  # fmt: skip
        else:
            round_.conn = conn = Conn(round_.store)
            if conn.own:
                round_.poster = Conn(round_.store)  # a clone's failure: torch's connection
        next_look = next_beat = time.monotonic()
        beat = self._beat
        if round_.own_diag:  # the look (torch's handler: its lock, its store) apart
            threading.Thread(target=_look_apart, args=(self, round_), name="numarun-look",
                             daemon=True).start()  # fmt: skip
        if beat is not None and (round_.poster is not None or round_.own_diag):
            # A thread of its own beats on the posting connection: no wake-up of this one
            # (a timed-out store wait costs this thread ten times a beat).
            threading.Thread(target=self._beating, args=(round_, *beat), name="numarun-beat",
                             daemon=True).start()  # fmt: skip
            beat = None
        while round_.active:
            self._run_work(round_)
            now = time.monotonic()
            if beat is not None and now >= next_beat:
                self.tolerant(round_, OWN_BEAT, beat[1], round_, round_.conn)
                next_beat = time.monotonic() + beat[0]
            wake = min(next_look, next_beat) if beat is not None else next_look
            if now >= next_look and round_.own_diag:  # the look is numarun-look's
                if not round_.stopping and round_.conn is not None:
                    self._numarun_calls(round_, self._events_at_look, round_, False)
                next_look = time.monotonic() + self.interval
                continue
            if now >= next_look:
                results = list(self._look(round_))
                round_.events_down = False
                if not round_.stopping and round_.conn is not None:
                    # Events are also read before a look's results are reported: a node that
                    # posts its failure and then closes the rendezvous (its last restart
                    # failed) is read as its notice, not as a bare "closed" (torch 2.4's
                    # handler sees it first).
                    self._numarun_calls(round_, self._events_at_look, round_, bool(results))
                for result in results:
                    self._report(round_, result)
                self._say_trouble(round_)
                next_look = time.monotonic() + self.interval
                continue
            until = min(wake, self._next_due(round_))
            conn = round_.conn
            if conn is None or round_.stopping or round_.events_down or not conn.own:
                self._sleep(round_, until)
                continue
            self._numarun_calls(round_, self._wait_event, round_, until - now)

    def _wait_event(self, round_: WatchedRound, seconds: float) -> None:
        conn = round_.conn
        assert conn is not None
        key = EVENT_KEY.format(round_.seen + 1)
        if conn.wait([key], seconds):
            value = conn.get_after_wait(key)
            if value is not None:
                self._took(round_, value)

    def _events_at_look(self, round_: WatchedRound, results: bool) -> None:
        conn = round_.conn
        assert conn is not None
        if results or not conn.own:
            self._take_events(round_)
        # Every look: an event whose poster died between its two calls (a hole) costs at most
        # a look interval and HOLE_GRACE; a counter moved by another client is named.
        check_count(round_, self.note)

    def _numarun_calls(self, round_: WatchedRound, call: Callable[..., None],
                       *args: object) -> None:  # fmt: skip
        """``call(*args)``: store calls on numarun's own keys. :class:`Forged` is named; any
        other error is :attr:`WatchedRound.trouble`, said after the next look (which judges
        the store for the rendezvous), and the events rest until then."""
        try:
            call(*args)
        except Forged as forged:
            self.note(round_, forged.key, str(forged))
        except Exception as error:
            round_.trouble = (EVENTS, error)
            round_.events_down = True

    def _say_trouble(self, round_: WatchedRound) -> None:
        """The round's events' trouble, in one line, while the round is watched: once its
        watch ended (the job's end, the next round), a read of its events that failed is of
        no use, and at a job's end the store goes away with the node that hosts it (the line
        would be a false warning)."""
        if round_.trouble is not None:
            what, error = round_.trouble
            round_.trouble = None
            if round_.active:
                self.unavailable(round_, what, error)

    def _sleep(self, round_: WatchedRound, until: float) -> None:
        with self._cond:
            if round_.active and not self._work:
                self._cond.wait(max(0.0, until - time.monotonic()))

    def _next_due(self, round_: WatchedRound) -> float:
        with self._cond:
            return round_.timers[0][0] if round_.timers else float("inf")

    def _beating(
        self, round_: WatchedRound, interval: float, beat: Callable[[WatchedRound, Conn], None]
    ) -> None:
        """This node's heartbeat while ``round_`` is watched, every ``interval`` seconds on
        the round's posting connection (one call at a time with the posts; whatever a post
        does that may take long, a hang verdict's judging, runs outside that turn). A beat
        that fails is one line (:meth:`unavailable`) and the next comes on time: a store that
        is gone is the look's to judge."""
        while True:
            with self._cond:
                if not round_.active:
                    return
            if round_.own_diag:  # the rendezvous store, never the diagnostics store's turns
                conn = round_.health_conn()
                if conn is not None:
                    self.tolerant(round_, OWN_BEAT, beat, round_, conn)
            else:
                with round_.post_lock:
                    conn = round_.poster
                    if conn is None or not round_.active:
                        return
                    self.tolerant(round_, OWN_BEAT, beat, round_, conn)
            deadline = time.monotonic() + interval
            with self._cond:  # woken early by anything that notifies: waits on to the beat
                while round_.active and (left := deadline - time.monotonic()) > 0:
                    self._cond.wait(left)

    def _run_work(self, round_: WatchedRound) -> None:
        while True:
            with self._cond:
                if self._work:
                    work = self._work.popleft()
                elif round_.timers and round_.timers[0][0] <= time.monotonic():
                    work = heapq.heappop(round_.timers)[2]
                else:
                    return
            self.guarded(round_, "queued work", work, round_)

    def note(self, round_: WatchedRound, topic: str, line: str,
             about: str | None = None) -> None:  # fmt: skip
        """Say once per round and topic, on stderr, what in the store is not numarun's, or
        what of numarun's failed (``about``: the store the line is about; default the view's)."""
        if topic in round_.noted or len(round_.noted) > 64:
            return
        about = about or (_DIAG if round_.own_diag else _RDZV)
        round_.noted.add(topic)
        from numarun.stacks.digest import printable

        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(f"numarun: warning: {about}: {printable(line)}\n")
            sys.stderr.flush()

    def unavailable(self, round_: WatchedRound, what: str, error: BaseException) -> None:
        """One line: ``what`` is unavailable on this node because a store call on numarun's
        keys failed with ``error``; the training goes on. Once per round and kind of error (a
        store that refuses numarun's keys refuses them all: the first thing it cost is
        named; with a store of its own, :func:`diagstore.error_topic`)."""
        from numarun.rendezvous.storeops import root_cause

        cause, own = root_cause(error), round_.own_diag and what not in HEALTH
        self.note(round_, diagstore.error_topic(own, f"unavailable: {type(cause).__name__}",
                  cause), f"{what}: unavailable on this node ({type(cause).__name__}: "
                  f"{first_line(cause)}); the training goes on", None if own else _RDZV)

    def tolerant(self, round_: WatchedRound, what: str, call: Callable[..., T],
                 *args: object) -> T | None:  # fmt: skip
        """``call(*args)``, store calls on numarun's keys: its value, or None after one line
        (:meth:`unavailable`; :class:`Forged` named) when it raised."""
        try:
            return call(*args)
        except Forged as forged:
            self.note(round_, forged.key, str(forged))
        except Exception as error:
            self.unavailable(round_, what, error)
        return None

    # --- events ----------------------------------------------------------------------------------

    def _take_events(self, round_: WatchedRound) -> None:
        """Read the events there are after the last one read (a wait that returned for
        nothing reads none)."""
        conn = round_.conn
        assert conn is not None
        while round_.active and not round_.stopping:
            value = conn.get_now(EVENT_KEY.format(round_.seen + 1))
            if value is None:
                return
            self._took(round_, value)

    def _took(self, round_: WatchedRound, value: bytes) -> None:
        """The next event read: counted, remembered (to tell a moved counter), handled."""
        round_.seen += 1
        round_.read[round_.seen] = hash(value)
        if len(round_.read) > 2 * SCAN:
            round_.read.pop(next(iter(round_.read)))
        self._event(round_, round_.seen, value)

    def _event(self, round_: WatchedRound, number: int, value: bytes) -> None:
        if self._on_event is not None:
            self.guarded(round_, f"event {number}", self._on_event, round_, number, value)

    def guarded(self, round_: WatchedRound, what: str, call: Callable[..., object],
                *args: object) -> None:  # fmt: skip
        """``call(*args)`` in the thread, for a diagnostic: whatever it raises is one line
        (:meth:`note`), never a lost rendezvous (DESIGN.md, "Diagnostics never end training")."""
        try:
            call(*args)
        except Forged as forged:
            self.note(round_, forged.key, str(forged))
        except Exception as error:
            topic = diagstore.error_topic(round_.own_diag, f"failed: {type(error).__name__}",
                                          error)  # fmt: skip
            self.note(round_, topic, f"{what} failed ({type(error).__name__}: "
                      f"{first_line(error)}); it is skipped, the training goes on")  # fmt: skip

    def ask_loop(self, round_: WatchedRound, number: int, ask: Result,
                 limit: float) -> object | None:  # fmt: skip
        """Report ``ask`` to the loop and wait at most ``limit`` seconds for its
        :meth:`answer` to request ``number``; None when none came (or no loop reads)."""
        if self._supervisor is None:
            return None
        with self._cond:
            self._answers.pop(number, None)
        self._report(round_, ask)
        deadline = time.monotonic() + limit
        with self._cond:
            while number not in self._answers and round_.active:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return self._answers.pop(number, None)

    def report(self, round_: WatchedRound, result: Result) -> None:
        """``result`` for the loop (or, detached, for :meth:`take_delivered`)."""
        self._report(round_, result)


def _look_apart(watch: StoreWatch, round_: WatchedRound) -> None:
    """With the view's store apart, the look in a thread of its own (``numarun-look``):
    torch's handler holds its lock for seconds under load, and the events go on meanwhile.
    What the look raises is :class:`Lost`, as in the watch."""
    deadline = time.monotonic()
    while True:
        with watch._cond:
            while round_.active and (left := deadline - time.monotonic()) > 0:
                watch._cond.wait(left)
            if not round_.active:
                return
        try:
            results = list(watch._look(round_))
        except Exception as error:  # the store is gone for the rendezvous
            watch._report(round_, Lost(error))
            return
        if results and round_.conn is not None and not round_.stopping:
            _report_after_events(watch, round_, results)
        else:
            for result in results:
                watch._report(round_, result)
        watch._say_trouble(round_)
        deadline = time.monotonic() + watch.interval


def _report_after_events(watch: StoreWatch, round_: WatchedRound, results: list[Result]) -> None:
    """A look's results reported after the store thread read the events posted so far
    (woken at once by a wake-up post): a node that posts its failure and then closes the
    rendezvous is read as its notice, not as a bare "closed", as in the watch's own look.
    Bounded: when the store thread has not taken them within :data:`EVENTS_FIRST` seconds
    (the view's store frozen), this thread reports them itself."""
    taken = threading.Lock()  # whoever holds it reports the results, once
    reported = threading.Event()

    def in_store_thread(watched: WatchedRound) -> None:
        if not taken.acquire(blocking=False):
            return
        try:
            watch._numarun_calls(watched, watch._events_at_look, watched, True)
        finally:
            for result in results:
                watch._report(watched, result)
            reported.set()

    watch.queue(in_store_thread)
    watch.post(round_, lambda conn: wake(conn, round_.me), "")
    if not reported.wait(EVENTS_FIRST) and taken.acquire(blocking=False):
        for result in results:
            watch._report(round_, result)

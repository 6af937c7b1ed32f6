"""This node's heartbeat in a torch rendezvous, its watch of the next node's, and a lost node given
up while this node waits in torch's join.

Each numarun node adds 1 to ``numarun/alive/<group rank>`` every :data:`BEAT_INTERVAL` seconds
while its round is watched (workers running, their teardown, the exit barrier; a thread of its
own, :meth:`numarun.rendezvous.storewatch.StoreWatch`'s ``numarun-beat``) and, every look,
reads its successor's; a counter that stays still for torch's keep-alive window
(``keep_alive_interval * keep_alive_max_attempt``; at least three looks) means that node's
launcher is gone (:class:`Heartbeats`, in the ``numarun-store`` thread). DESIGN.md
("Rendezvous and restarts") and :mod:`numarun.rendezvous.torchrdzv` state the whole watch.

A node waiting in torch's join (a spare, or a node re-joining after its workers stopped) reads
the counters of the standing round's participants between torch's polls of the rendezvous
state (:class:`LostNodes`): one whose counter beat from its store thread and then stood still
for :data:`LOST_AFTER` seconds is given up in torch's own state (its keep-alive time set to
the epoch, which torch's next sync removes as it removes a node whose keep-alive expired), so
that the next round forms seconds after a node is lost, not after torch's 15 s window.
"""

from __future__ import annotations

import contextlib
import sys
import time
from datetime import datetime, timezone

from numarun.rendezvous import torchcompat
from numarun.rendezvous.storeops import Conn, Forged, as_count, first_line, read_count, root_cause
from numarun.rendezvous.storewatch import ALIVE_KEY, NODES_KEY

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from numarun.cmdline.config import LaunchConfig
    from numarun.rendezvous.storewatch import WatchedRound

_MIN_LOOKS = 3  # a silent neighbour is declared gone after at least this many looks
BEAT_INTERVAL = 1.0
"""Seconds between a watched node's beats: a store ``add`` each, on numarun's own
connection (a thousand nodes: a thousand small writes a second to the store)."""
LOST_AFTER = 4.0
"""Seconds a participant's counter may stand still, once it beat from its store thread (the
count past the mark of its join), before a node waiting in torch's join gives it up: four
beats missed. A launcher that is alive beats from its own thread, whatever its workers do;
that thread's longest wait inside one event of the whole-job view (an answer from its loop,
then the other nodes' digests: 3.5 s at most) stays below it."""
_LOOKS_PER_SECOND = 400.0  # counters read per second while waiting in the join, at most
GONE_KEY = "numarun/gone"
"""With the whole-job view on a store of its own: ``<silent node> <by node>``, set on the
rendezvous store (the round's prefix) by the node that saw its neighbour silent, read by every
other node's ``numarun-health`` thread every second (one ``check``) and, once a call on the
view's store failed, waited for by its ``numarun-word`` on a connection of its own (woken when
it is set). The notice on the view's store cannot be the only word: that store is group rank
0's, and dies with it."""


def next_read(previous: float, now: float, period: float) -> float:
    """When the next of reads made every ``period`` seconds is due, the one before due at
    ``previous``, at ``now``: a period after the previous one was due, so that reads that take
    long (a store saturated by torch's state syncs: a good part of a second each) do not
    stretch the period by their own time; never before ``now``, and never a burst to catch up
    after a late one (at most one read per period, however slow the store)."""
    return max(previous + period, now)


def register(store: Any, rank: int) -> None:
    """Say this node (group rank ``rank``) is a numarun node of the round: its first beat and
    1 added to the round's count, on torch's connection (read before added to: a forged value
    must not make the store close it; a connection of numarun's own would cost one per
    round). What fails (numarun's keys only: the rendezvous is fine) is one line."""
    conn = Conn(store, clone=False)
    try:
        for key in (ALIVE_KEY.format(rank), NODES_KEY):
            with contextlib.suppress(Forged):  # named by the watch when it matters
                conn.add(key, 1)
    except Exception as error:
        cause = root_cause(error)
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(
                "numarun: warning: the rendezvous store: this node could not say it is a "
                f"numarun node ({type(cause).__name__}: {first_line(cause)}): the others take "
                "it for a torchrun node; the training goes on\n"
            )
    finally:
        conn.close()


class BeatSeen:
    """One node's beat counter as this node reads it: the value last read, and since when it
    has stood still. A value that is not a number counts as a move: it is not that node's
    beat, and no sign that the node is gone."""

    def __init__(self, now: float, value: int = 0) -> None:
        self.value, self.since = value, now

    def still_for(self, conn: Conn, rank: int, now: float) -> float:
        """Read node ``rank``'s counter through ``conn``; the seconds it has stood still (0
        when it moved since the last read)."""
        beat = read_count(conn, ALIVE_KEY.format(rank), 0, 1 << 62)
        if beat is None or beat != self.value:
            self.value = self.value + 1 if beat is None else beat
            self.since = now
            return 0.0
        return now - self.since


class Heartbeats:
    """This node's beats and its watch of one neighbour, for one node of the rendezvous.

    ``note(round, topic, line)`` says once what in the store is not numarun's (the store
    watch's :meth:`~numarun.rendezvous.storewatch.StoreWatch.note`)."""

    def __init__(
        self,
        config: LaunchConfig,
        poll_interval: float,
        note: Callable[[WatchedRound, str, str], None],
    ) -> None:
        conf = dict(config.rdzv_conf)
        window = int(conf.get("keep_alive_interval", 5)) * int(
            conf.get("keep_alive_max_attempt", 3)
        )
        self.silence_limit = max(float(window), _MIN_LOOKS * poll_interval)
        self.beat_interval = BEAT_INTERVAL
        self._note = note
        self._next_look = 0.0
        self._watched: int | None = None
        self._neighbour = BeatSeen(0.0)
        self._gone_refused = False  # GONE_KEY held something else: not read again this round
        # The round whose GONE_KEY's wait returned: not waited for again in it (a round, not
        # a flag: that round's numarun-word may outlive it by a wait, into the next round).
        self._word_read: WatchedRound | None = None
        self._host = BeatSeen(0.0, -1)  # group rank 0's (-1: not read yet)

    def watch_neighbour(self, rank: int, size: int, now: float) -> None:
        """A new round: watch the next node by group rank (none when alone)."""
        self._watched = (rank + 1) % size if size > 1 else None
        self._gone_refused = False
        self._neighbour = BeatSeen(now)
        self._next_look = 0.0
        self._host = BeatSeen(now, -1)

    def due(self) -> bool:
        """Whether the next look at the neighbour's beat is due: true once per
        :attr:`beat_interval`."""
        now = time.monotonic()
        if now < self._next_look:
            return False
        self._next_look = now + self.beat_interval
        return True

    def look(self, round_: WatchedRound, handler: Any = None) -> int | None:
        """When due (:meth:`due`), a look at the neighbour's beat: the neighbour's group rank
        once it is silent (:meth:`silent_neighbour`, torch's keep-alive in ``handler``'s
        state cross-checked), else None. This node's own beats come from the store watch's
        ``numarun-beat`` thread (:meth:`beat`)."""
        if not self.due():
            return None
        return self.silent_neighbour(round_, handler)

    def say_gone(self, round_: WatchedRound, silent: int) -> None:
        """Tell every node on the rendezvous store that node ``silent`` stopped beating."""
        conn = round_.health_conn()
        assert conn is not None
        conn.set(GONE_KEY, f"{silent} {round_.me}".encode())

    def gone_elsewhere(self, round_: WatchedRound) -> tuple[int, int] | None:
        """Another node's word that a node stopped beating (:data:`GONE_KEY`): ``(silent,
        by)``, or None. Untrusted: a value of another form is named once and not read again
        this round (it costs one read of what the store holds); a forged word in the right
        form re-forms the group once, as a forged notice does."""
        if self._gone_refused:
            return None
        conn = round_.health_conn()
        assert conn is not None
        return self._word(round_, conn.get_now(GONE_KEY))

    def waits_for_word(self, round_: WatchedRound) -> bool:
        """Whether :meth:`wait_word` waits on the store (else :meth:`gone_elsewhere` reads)."""
        return round_.word is not None and not self._gone_refused and self._word_read is not round_

    def wait_word(self, round_: WatchedRound, until: float) -> tuple[int, int] | None:
        """Wait until ``until`` (``time.monotonic()``) for another node's word that a node
        stopped beating (:data:`GONE_KEY`), on the round's connection for it
        (``round_.word``): ``(silent, by)`` the moment it is set, or None (not said by then;
        this node's own word, or one refused). Once the word is there, every later wait would
        return at once: it is read once, and not waited for again this round (the caller
        reads it every beat interval instead: :meth:`gone_elsewhere`). Without that
        connection, returns None at once."""
        conn = round_.word
        if conn is None or not self.waits_for_word(round_):
            return None
        if not conn.wait([GONE_KEY], until - time.monotonic()):
            return None
        self._word_read = round_
        return self._word(round_, conn.get_after_wait(GONE_KEY))

    def _word(self, round_: WatchedRound, value: bytes | None) -> tuple[int, int] | None:
        if value is None:
            return None
        fields = value.split() if len(value) <= 24 else []
        if len(fields) == 2 and all(field.isdigit() for field in fields):
            silent, by = int(fields[0]), int(fields[1])
            if silent < round_.size and by < round_.size:
                return None if by == round_.me else (silent, by)  # its own word: said already
        self._gone_refused = True
        shown = value[:40].decode("ascii", "backslashreplace")
        self._note(round_, GONE_KEY, f"{GONE_KEY} holds {shown!r}, not a node's word numarun "
                   "writes (another client of the store?): ignored this round")  # fmt: skip
        return None

    def beat(self, round_: WatchedRound, conn: Conn) -> None:
        """Add 1 to this node's counter through ``conn`` (one that is not a number is named
        and set back)."""
        key = ALIVE_KEY.format(round_.me)
        try:
            conn.add(key, 1)
        except Forged as forged:
            self._note(round_, key, f"{forged}; set back to 1")
            conn.repair(key, forged.value, 1)

    def silent_neighbour(self, round_: WatchedRound, handler: Any = None) -> int | None:
        """The watched node's group rank once its beat stood still for the silence limit,
        unless torch's own keep-alive of that node is fresh in ``handler``'s state (then a
        value frozen by another client of the store: named once, the node not taken for gone;
        a handler without that state leaves it to numarun's beat). A node that never beat (a
        torchrun node) is passed over for the next one."""
        if self._watched is None:
            return None
        now = time.monotonic()
        conn = round_.health_conn()  # the rendezvous store's, whichever store the view uses
        assert conn is not None
        if self._silent_host(round_, conn, now, handler):
            return 0
        if self._neighbour.still_for(conn, self._watched, now) < self.silence_limit:
            return None
        if self._neighbour.value == 0:
            following = (self._watched + 1) % round_.size
            self._watched = None if following == round_.me else following
            self._neighbour.since = now
            return None
        if torchcompat.keep_alive_fresh(handler, self._watched, self.silence_limit) is True:
            key = ALIVE_KEY.format(self._watched)
            self._note(round_, f"{key} frozen", f"{key} stood still for {self.silence_limit:g} "
                       f"s while torch's own keep-alive of node {self._watched} is fresh: not "
                       "numarun's heartbeat (another client of the store?); node "
                       f"{self._watched} is not taken for gone")  # fmt: skip
            return None
        return self._watched

    def _silent_host(self, round_: WatchedRound, conn: Conn, now: float, handler: Any) -> bool:
        """Whether group rank 0, the host of the view's own store, is silent as this node sees
        it: read only once that store refused a probe (``round_.diag_host_unreachable``), by a
        node whose neighbour it is not. Every node then sees the host's silence as its
        neighbour does, after the same silence limit, instead of a second or two later
        through the neighbour's word (:data:`GONE_KEY`) on a store that torch's traffic
        saturates. What decides is the host's beat on the rendezvous store, as for the
        neighbour (a torch keep-alive that is fresh: not silent); the view's store failing
        alone decides nothing (a host that still beats is never taken for gone)."""
        if not round_.diag_host_unreachable or round_.me == 0 or self._watched == 0:
            return False
        if self._host.still_for(conn, 0, now) < self.silence_limit or self._host.value == 0:
            return False
        return torchcompat.keep_alive_fresh(handler, 0, self.silence_limit) is not True


class LostNodes:
    """While this node waits in torch's join: the participants of the standing round whose
    launcher is gone, given up in torch's rendezvous state (module docstring).

    :meth:`look` is called in the joining thread between torch's polls of the state (the
    state holder is that thread's alone then: torch stops its keep-alive thread during a
    join); it reads each participant's counter at most every ``participants / 400`` seconds
    (at least every 0.25 s) and gives up a node that stood still for ``after`` seconds, saying
    so in one line. What it needs of torch's handler (``_state_holder`` with ``state`` and
    ``mark_dirty``, ``_this_node``, ``_get_store``) is looked up at each look: without it,
    nothing is given up and torch's keep-alive window decides, as in torchrun. ``where``
    names the rendezvous in that line."""

    def __init__(self, handler: Any, where: str, after: float = LOST_AFTER) -> None:
        self.handler = handler
        self.where = where
        self.after = after
        self.given_up: list[str] = []  # the lines said, one per node given up
        self._round: int | None = None
        self._seen: dict[Any, tuple[int, float]] = {}  # node -> (its count, since when)
        self._next = 0.0

    def look(self) -> None:
        """Read the counters if it is time; give up the nodes that stood still too long."""
        now = time.monotonic()
        if now < self._next:
            return
        holder = getattr(self.handler, "_state_holder", None)
        state = getattr(holder, "state", None)
        participants = getattr(state, "participants", None)
        if not isinstance(participants, dict) or not getattr(state, "complete", False):
            self._next = now + 0.25
            return  # no standing round: nobody to give up
        self._next = now + max(0.25, len(participants) / _LOOKS_PER_SECOND)
        if state.round != self._round:
            self._round, self._seen = state.round, {}
        me = getattr(self.handler, "_this_node", None)
        store = self.handler._get_store()  # the round's PrefixStore, where the counters are
        lost = []
        for node, rank in list(participants.items()):
            if node == me or not isinstance(rank, int):
                continue
            count = _count(store, ALIVE_KEY.format(rank))
            seen = self._seen.get(node)
            if count is None or seen is None or seen[0] != count:
                self._seen[node] = (-1 if count is None else count, now)
                continue
            if count >= 2 and now - seen[1] >= self.after:
                lost.append((node, rank))
        if lost:
            self._give_up(holder, state, lost)

    def _give_up(self, holder: Any, state: Any, lost: list[tuple[Any, int]]) -> None:
        heartbeats = getattr(state, "last_heartbeats", None)
        if not isinstance(heartbeats, dict) or not callable(getattr(holder, "mark_dirty", None)):
            return
        for node, rank in lost:
            heartbeats[node] = datetime.fromtimestamp(0, timezone.utc)
            self._seen.pop(node, None)
            host = _shown(str(getattr(node, "addr", "?"))[:200])  # from the store: untrusted
            line = (
                f"numarun: node {rank} ({host}) of the {self.where} stopped beating (no "
                f"heartbeat for {self.after:g} s: its launcher is gone); given up, the next "
                "round forms without it"
            )
            if line not in self.given_up:
                self.given_up.append(line)
                sys.stderr.write(line + "\n")
                sys.stderr.flush()
        holder.mark_dirty()  # torch's next sync writes it, and every node's sync drops them


def _shown(text: str) -> str:
    return "".join(char if char.isprintable() else ascii(char)[1:-1] for char in text)


def _count(store: Any, key: str) -> int | None:
    """A counter read without waiting for it (None: absent, or not numarun's)."""
    if not store.check([key]):
        return None
    value = as_count(bytes(store.get(key)))
    return value if value is not None and value < 1 << 62 else None

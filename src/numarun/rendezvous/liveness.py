"""This node's heartbeat in a torch rendezvous, and its watch of the next node's.

Each numarun node adds 1 to ``numarun/alive/<group rank>`` three times per keep-alive window
(torch's ``keep_alive_interval * keep_alive_max_attempt``; at least three looks) and reads its
successor's; a counter that stays still for that window means its launcher is gone. DESIGN.md
("Rendezvous and restarts") and :mod:`numarun.rendezvous.torchrdzv` state the whole watch. All of
it runs in the ``numarun-store`` thread.
"""

from __future__ import annotations

import contextlib
import sys
import time

from numarun.rendezvous import torchcompat
from numarun.rendezvous.storeops import Conn, Forged, first_line, root_cause
from numarun.rendezvous.storewatch import ALIVE_KEY, NODES_KEY, read_count

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from numarun.cmdline.config import LaunchConfig
    from numarun.rendezvous.storewatch import WatchedRound

_MIN_LOOKS = 3  # a silent neighbour is declared gone after at least this many looks


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
        # Beats matter on the scale of the keep-alive window, not of a look: three per window.
        self.beat_interval = self.silence_limit / _MIN_LOOKS
        self._note = note
        self._next_beat = 0.0
        self._watched: int | None = None
        self._watched_beat = 0
        self._watched_since = 0.0

    def watch_neighbour(self, rank: int, size: int, now: float) -> None:
        """A new round: watch the next node by group rank (none when alone)."""
        self._watched = (rank + 1) % size if size > 1 else None
        self._watched_beat = 0
        self._watched_since = now
        self._next_beat = 0.0

    def due(self) -> bool:
        """Whether this node's next beat is due (and, with it, a look at the neighbour's);
        true once per :attr:`beat_interval`."""
        now = time.monotonic()
        if now < self._next_beat:
            return False
        self._next_beat = now + self.beat_interval
        return True

    def beat(self, round_: WatchedRound) -> None:
        """Add 1 to this node's counter (one that is not a number is named and set back)."""
        conn = round_.conn
        assert conn is not None
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
        assert round_.conn is not None
        beat = read_count(round_.conn, ALIVE_KEY.format(self._watched), 0, 1 << 62)
        if beat is None:  # not a number: not the neighbour's, and no sign it is gone
            beat = self._watched_beat + 1
        if beat != self._watched_beat:
            self._watched_beat = beat
            self._watched_since = now
            return None
        if now - self._watched_since < self.silence_limit:
            return None
        if beat == 0:
            following = (self._watched + 1) % round_.size
            self._watched = None if following == round_.me else following
            self._watched_since = now
            return None
        if torchcompat.keep_alive_fresh(handler, self._watched, self.silence_limit) is True:
            key = ALIVE_KEY.format(self._watched)
            self._note(round_, f"{key} frozen", f"{key} stood still for {self.silence_limit:g} "
                       f"s while torch's own keep-alive of node {self._watched} is fresh: not "
                       "numarun's heartbeat (another client of the store?); node "
                       f"{self._watched} is not taken for gone")  # fmt: skip
            return None
        return self._watched

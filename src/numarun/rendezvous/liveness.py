"""This node's heartbeat in a torch rendezvous, and its watch of the next node's.

Each numarun node adds 1 to ``numarun/alive/<group rank>`` three times per keep-alive window
(torch's ``keep_alive_interval * keep_alive_max_attempt``; at least three looks) and reads its
successor's; a counter that stays still for that window means its launcher is gone. DESIGN.md
("Rendezvous and restarts") and :mod:`numarun.rendezvous.torchrdzv` state the whole watch. All of
it runs in the ``numarun-store`` thread.
"""

from __future__ import annotations

import time

from numarun.rendezvous.storeops import Forged
from numarun.rendezvous.storewatch import ALIVE_KEY, read_count

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from numarun.cmdline.config import LaunchConfig
    from numarun.rendezvous.storewatch import WatchedRound

_MIN_LOOKS = 3  # a silent neighbour is declared gone after at least this many looks


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

    def look(self, round_: WatchedRound) -> int | None:
        """When due (:meth:`due`), this node's beat and a look at the neighbour's: the
        neighbour's group rank once it is silent (:meth:`silent_neighbour`), else None."""
        if not self.due():
            return None
        self.beat(round_)
        return self.silent_neighbour(round_)

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

    def silent_neighbour(self, round_: WatchedRound) -> int | None:
        """The watched node's group rank once its beat stood still for the silence limit.
        A node that never beat (a torchrun node) is passed over for the next one."""
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
        return self._watched

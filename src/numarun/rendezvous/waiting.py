"""What this node says while it waits in a torch rendezvous: the waiting lines and the status a
``numarun stacks`` on a waiting job reads.

A node waits twice before its first workers run: while :meth:`ElasticNode.connect
<numarun.rendezvous.torchrdzv.ElasticNode.connect>` imports torch's rendezvous and creates torch's
handler (which connects to the store, or hosts it), and while :meth:`ElasticNode.next_round
<numarun.rendezvous.torchrdzv.ElasticNode.next_round>` joins a round. Under load the import alone
takes tens of seconds, so the lines say which of these the node is doing: before torch's handler
exists nothing is known of the other nodes, and a line that said "waiting for 2 node(s)" then was
wrong whenever both were there (issue 32, item 6). While joining, the line names who is there
(torch's participants, as torch's handler last read them: no store call) and how many more are
awaited.

:class:`Waiting` is ticked from the launcher's main thread (:func:`numarun.rendezvous.storeops
.run_blocking`'s ``tick``, every :data:`TICK` seconds): it writes a line every
:data:`WAIT_LINE_EVERY` seconds and hands the status to ``on_change`` whenever it changed (the
launcher keeps it where ``numarun stacks`` finds it: :mod:`numarun.stacks.waiting`). Its phase is
set by the thread that makes torch's calls. Nothing here blocks or raises: a status that cannot be
read is left out.
"""

from __future__ import annotations

import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from numarun.cmdline.config import LaunchConfig

WAIT_LINE_EVERY = 10.0  # seconds between the lines that say what a rendezvous waits for
TICK = 1.0  # seconds between looks at the state for the status (never a store call)
IMPORTING = "importing torch's rendezvous"
CONNECTING = "creating torch's rendezvous handler (connecting to its store)"
JOINING = "joining"
_HOSTS_SHOWN = 4  # nodes named in a line; the others counted


class Waiting:
    """One node's waits in the rendezvous ``where`` (``config``: the node counts wanted).

    :meth:`begin` at the start of a wait, :attr:`doing` set as it goes (:data:`IMPORTING`,
    :data:`CONNECTING`, :data:`JOINING`), :attr:`handler` once torch's handler exists,
    :meth:`tick` while it waits, :meth:`end` when the round formed (or the wait failed).
    ``on_change(status)``: the status dict of :meth:`status` (with ``text``, its
    :meth:`describe`) whenever it changed, None at the end; what it raises drops it (a
    diagnostic)."""

    def __init__(self, config: LaunchConfig, where: str) -> None:
        self.min_nodes = config.min_nodes
        self.max_nodes = config.max_nodes
        self.where = where
        self.doing = ""
        self.handler: Any = None
        self.on_change: Callable[[dict | None], None] | None = None
        self._since = 0.0  # monotonic
        self._since_wall = 0.0
        self._last_line = 0.0
        self._said: dict | None = None
        self._said_spare = False

    def begin(self, doing: str) -> None:
        """A wait starts (its clock, its first status)."""
        self.doing = doing
        self._since = self._last_line = time.monotonic()
        self._since_wall = time.time()
        self._publish()

    def tick(self) -> None:
        """From the waiting thread, every :data:`TICK` seconds: the line when due, the status
        when it changed."""
        now = time.monotonic()
        if now - self._last_line >= WAIT_LINE_EVERY - TICK / 2:
            self._last_line = now
            spare = bool(self.status().get("spare"))
            if not (spare and self._said_spare):  # said once: a spare may wait for days
                self._said_spare = spare
                self.say()
        self._publish()

    def end(self) -> None:
        """The wait is over."""
        self.doing = ""
        self._said = None
        self._hand(None)

    def say(self) -> None:
        """One line on stderr: how long this node waits, for what, and who is there."""
        waited = time.monotonic() - self._since
        line = f"numarun: waiting {waited:.0f} s for the {self.where}: {self.describe()}\n"
        try:
            sys.stderr.write(line)
            sys.stderr.flush()
        except (OSError, ValueError):
            pass

    def describe(self, status: dict | None = None) -> str:
        """What the node is doing and, while it joins, who is there and how many more are
        awaited: ``1 of 2 node(s) there (node0 pid 4242), 1 more awaited`` (of ``status``, by
        default :meth:`status`)."""
        status = self.status() if status is None else status
        there = status.get("there")
        if status["doing"] != JOINING or not there:  # torch's handler has not read it yet
            return f"this node is {status['doing'] or 'starting'}"
        hosts = ", ".join(there[:_HOSTS_SHOWN])
        if len(there) > _HOSTS_SHOWN:
            hosts += f" and {len(there) - _HOSTS_SHOWN} more"
        named = f" ({hosts})" if hosts else ""
        if status.get("complete"):
            if status.get("spare"):
                return (
                    f"the round is complete with {len(there)} node(s){named}; this node waits "
                    "as a spare"
                )
            return f"the round is complete with {len(there)} node(s){named}; taking its place"
        return (
            f"{len(there)} of {status['wanted']} node(s) there{named}, "
            f"{status['awaited']} more awaited"
        )

    def status(self) -> dict:
        """The wait as plain data: ``where``, ``since`` (wall-clock seconds), ``doing``,
        ``wanted`` (``"2"`` or ``"1 to 4"``) and, once torch's handler read the rendezvous's
        state, ``there`` (each node as ``host pid N``), ``awaited``, ``complete``, ``spare``."""
        wanted = f"{self.min_nodes}" + (
            f" to {self.max_nodes}" if self.max_nodes != self.min_nodes else ""
        )
        status: dict = {"where": self.where, "since": self._since_wall, "doing": self.doing,
                        "wanted": wanted}  # fmt: skip
        state = getattr(getattr(self.handler, "_state_holder", None), "state", None)
        participants = getattr(state, "participants", None)
        if self.doing != JOINING or not isinstance(participants, dict):
            return status
        try:
            nodes = [_node_name(node) for node in list(participants)]
        except Exception:  # torch's state changed shape: the count alone
            nodes = [""] * len(participants)
        me = getattr(self.handler, "_this_node", None)
        complete = bool(getattr(state, "complete", False))
        status.update(
            there=sorted(nodes),
            awaited=max(0, self.min_nodes - len(nodes)),
            complete=complete,
            spare=complete and me is not None and me not in participants,
        )
        return status

    def _publish(self) -> None:
        status = self.status()
        if status != self._said:
            self._said = status
            self._hand({**status, "text": self.describe(status)})

    def _hand(self, status: dict | None) -> None:
        if self.on_change is not None:
            try:
                self.on_change(status)
            except Exception:  # a diagnostic never ends the wait
                self.on_change = None


def _node_name(node: object) -> str:
    """torch's node descriptor (``addr``, ``pid``) as ``addr pid N``, printable and short."""
    from numarun.stacks.digest import printable

    addr = printable(str(getattr(node, "addr", "?")))[:80]
    pid = getattr(node, "pid", None)
    return f"{addr} pid {pid}" if isinstance(pid, int) else addr

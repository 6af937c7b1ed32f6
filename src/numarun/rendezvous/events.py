"""The round's numbered events on the store: posting one, and checking the counter every node
reads them by (:class:`numarun.rendezvous.storewatch.StoreWatch` waits for them, reads them and
hands each to its owner).

A poster adds 1 to ``numarun/events`` (:data:`EVENTS_KEY`) and sets ``numarun/event/<k>``
(:data:`EVENT_KEY`) to a header line and a body. Both are read as untrusted: an event counted
but not set within :data:`HOLE_GRACE` (its poster died between its two calls) is skipped; a
counter that is not a number is named and set back to the last event there when this node
posts; one that jumped is named and the events after the jump are read; one that went back is
named and followed (:func:`check_count`). docs/protocol.md lists the events and their bodies.
"""

from __future__ import annotations

from numarun.rendezvous.storeops import Conn, Forged

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Protocol, TypeVar

    class EventReader(Protocol):
        """A round's watch as its events are read and posted
        (:class:`numarun.rendezvous.storewatch.WatchedRound`, which imports this module)."""

        me: int  # this node's group rank
        conn: Conn | None  # the round's connection to the store the events are on
        seen: int  # the last event read
        read: dict[int, int]  # the last events read: number -> hash of the value
        shared: list[str]  # keys others read, deleted once the next round formed

    R = TypeVar("R", bound=EventReader)


EVENTS_KEY = "numarun/events"
EVENT_KEY = "numarun/event/{}"
SCAN = 64  # event numbers looked at around a jump
_PROBES = 8  # event numbers looked at after a hole (one request each: the look waits for them)
HOLE_GRACE = 0.5  # seconds a counted event may take to be set before it is taken for a hole


def check_count(round_: R, note: Callable[[R, str, str], None]) -> None:
    """The event counter against what this node read: a hole (an event counted, never
    set: its poster died between its two calls) skipped once :data:`HOLE_GRACE` passed; a
    counter that is not a number, or that another client moved (by more than a few
    events, or back), named through ``note`` (:meth:`StoreWatch.note`), and the events
    posted since read (module docstring)."""
    conn = round_.conn
    assert conn is not None
    try:
        count = conn.count(EVENTS_KEY)
    except Forged as forged:
        note(round_, EVENTS_KEY, f"{forged}; it is set back when this node posts")
        return
    seen = round_.seen
    if count == seen:
        return
    # Events posted after holes are holes, however many: at a thousand nodes a failure
    # cascade posts hundreds of notices while a few posters are between their two calls.
    if seen < count <= seen + SCAN or (count > seen and _posted_soon_after(conn, seen)):
        if conn.wait([EVENT_KEY.format(seen + 1)], HOLE_GRACE):
            return  # its poster was between its two calls: read by the next wait
        last = min(count, seen + _PROBES)
        for number in range(seen + 2, last + 1):
            if conn.has(EVENT_KEY.format(number)):
                round_.seen = number - 1
                return
        round_.seen = last  # holes, all of them: the next look goes on from there
        return
    low = count
    while count - low < SCAN:
        value = conn.get_now(EVENT_KEY.format(low))
        if value is None or round_.read.get(low) == hash(value):
            break  # before the events posted since the counter moved
        low -= 1
    note(round_, f"{EVENTS_KEY} {count}", f"{EVENTS_KEY} moved from {seen} to {count} "
         f"(another client of the store?); reading on from event {low + 1}")  # fmt: skip
    round_.seen = low


def _posted_soon_after(conn: Conn, seen: int) -> bool:
    """Whether an event is there within :data:`_PROBES` numbers after the hole at ``seen + 1``
    (posters between their two calls), as there never is after a counter another client moved
    far ahead."""
    return any(conn.has(EVENT_KEY.format(number)) for number in range(seen + 2, seen + _PROBES + 1))


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
    for _ in range(SCAN * 4):
        if conn.get_now(EVENT_KEY.format(number + 1)) is None:
            break
        number += 1
    return number


def post_notice(round_: EventReader, body: bytes) -> None:
    """Post this node's ``stop`` notice (``body``: its line) on the round's connection, for the
    other nodes to read; deleted once the next round formed."""
    if round_.conn is None:  # the view's store is not connected: no notice (the view is off)
        return
    key = post_event(round_.conn, f"stop {round_.me}", body, after=round_.seen)
    if key is not None:
        round_.shared.append(key)


def wake(conn: Conn, me: int) -> None:
    """Post a wake-up event (the round's thread, blocked in the store, moves on at once)."""
    post_event(conn, f"wake {me}")


def notice_body(text: str) -> bytes:
    """A ``stop`` notice's first line (newlines would end it)."""
    return text.replace("\n", " ").encode("utf-8", "replace") + b"\n"

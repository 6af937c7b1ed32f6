"""numarun.rendezvous.storewatch: the one thread that talks to the rendezvous store while workers
run.

Node stand-ins (``tests/standin_job.py``) run the launcher's own classes against one real torch
TCPStore: the event counter checked like any value read from the store (not a number, moved by
another client), and each round's connections closed with the round. What the events carry (the
whole job's stacks, the hang verdict) is ``tests/jobwide/test_protocol.py``'s.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from datetime import timedelta

import pytest

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
# torch's client looks up the name of the address it connects to at each connection (a reverse
# lookup of 127.0.0.1 in DNS): a resolver that drops some of them costs 5 s each.
os.environ.setdefault("RES_OPTIONS", "timeout:1 attempts:1")
dist = pytest.importorskip("torch.distributed")

from numarun.jobwide import hangverdict  # noqa: E402
from numarun.rendezvous import events, storeops, storewatch  # noqa: E402
from numarun.rendezvous.storeops import Conn  # noqa: E402
from standin_job import INTERVAL, LIMIT, Job, ask_and_read, lost  # noqa: E402


def test_a_counter_that_is_not_a_number_is_named_and_repaired_never_lost(
    make_job: Callable[..., Job], capfd: pytest.CaptureFixture[str]
) -> None:
    job = make_job(3)
    for key in (events.EVENTS_KEY, hangverdict.STILLS_KEY, storewatch.NODES_KEY,
                storewatch.ALIVE_KEY.format(1)):  # fmt: skip
        job.raw.set(key, b"not a number \x1b[2J")
    view = ask_and_read(job)  # the request's poster finds the counter and sets it back
    assert view.rank_count == 24
    for node in job.nodes:
        node.go_still()
    job.until(lambda: all(node.verdict_at() for node in job.nodes))
    job.run_for(3.5 * INTERVAL * 5)  # beats and counts read
    assert lost(job) == []
    err = capfd.readouterr().err
    assert "numarun/events holds 'not a number \\x1b[2J', not a number" in err
    assert "numarun/stills held b'not a number" in err
    assert "\x1b" not in err
    assert "Traceback" not in err


def test_a_counter_moved_by_a_trillion_loses_no_later_event(
    make_job: Callable[..., Job], capfd: pytest.CaptureFixture[str]
) -> None:
    job = make_job(3)
    ask_and_read(job)
    job.raw.add(events.EVENTS_KEY, 10**12)
    view = ask_and_read(job, asker=1)
    assert view.rank_count == 24
    job.raw.add(events.EVENTS_KEY, -2 * 10**12)
    view = ask_and_read(job, asker=2)
    assert view.rank_count == 24
    assert lost(job) == []
    err = capfd.readouterr().err
    assert "numarun/events moved from 1 to 1000000000002 (another client of the store?); " \
           "reading on from event 1000000000002" in err  # fmt: skip
    assert "numarun/events moved from 100000000000" in err and " to -99999999999" in err
    assert "Traceback" not in err


def test_many_events_behind_a_hole_are_a_hole_not_a_moved_counter(
    make_job: Callable[..., Job], capfd: pytest.CaptureFixture[str]
) -> None:
    # Six posters counted their events and have not set them yet; 100 more were posted after
    # them (a failure cascade at a thousand nodes): the node skips the holes after an interval
    # and reads all 100, and names nothing (before: "moved ... another client of the store?",
    # and every event but the last 64 skipped).
    job = make_job(2)
    ask_and_read(job)
    poster = Conn(job.raw)
    hole = int(poster.add(events.EVENTS_KEY, 6)) - 5
    keys = [events.post_event(poster, f"wake {n % 2}") for n in range(100)]
    assert keys[-1] == events.EVENT_KEY.format(hole + 105)
    round_ = job.nodes[1].node.watched_round
    job.until(lambda: round_.seen >= hole + 105)
    view = ask_and_read(job, asker=1)  # and the job goes on
    assert view.rank_count == 16
    assert lost(job) == []
    err = capfd.readouterr().err
    assert "moved from" not in err and "another client" not in err
    assert "Traceback" not in err


def sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return count


def test_numarun_connections_are_closed_with_their_round(make_job: Callable[..., Job]) -> None:
    job = make_job(2)
    node = job.nodes[1].node
    job.run_for(INTERVAL)
    before = sockets()
    node.unwatch()
    round_ = node.watched_round
    node._end_watch()
    deadline = time.monotonic() + LIMIT
    while (round_.conn is not None or round_.poster is not None) and time.monotonic() < deadline:
        time.sleep(0.01)
    import gc

    gc.collect()
    assert sockets() <= before - 2  # the round's two connections (its waits and its posts)


@pytest.mark.parametrize("watched", [True, False])
def test_events_that_failed_are_said_only_while_their_round_is_watched(
    watched: bool, capfd: pytest.CaptureFixture[str]
) -> None:
    """A read of the round's events that failed is said after the next look; once the
    round's watch ended (a job's end, where the store goes away with the node that hosts
    it), nothing: the line would be a false warning, printed as the launcher exits."""
    watch = storewatch.StoreWatch(INTERVAL, lambda round_: [])
    round_ = storewatch.WatchedRound(None, None, 1, 2, lambda result: None)
    round_.trouble = (storewatch.EVENTS, RuntimeError("Failed to recv, got 0 bytes"))
    round_.active = watched
    watch._say_trouble(round_)
    err = capfd.readouterr().err
    assert (storewatch.EVENTS in err) == watched, err
    assert round_.trouble is None  # said or dropped, once


# --- posting an event, reading a counter ---------------------------------------------------------


@pytest.fixture
def conn() -> Conn:
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=10))  # fmt: skip
    connection = Conn(dist.PrefixStore("round", server))
    connection.server = server  # type: ignore[attr-defined]  # kept alive with the connection
    return connection


def test_events_are_numbered_one_after_another_header_then_body(conn: Conn) -> None:
    assert events.post_event(conn, "stacks 0") == events.EVENT_KEY.format(1)
    assert events.post_event(conn, "stop 1", b"rank 3 failed") == events.EVENT_KEY.format(2)
    assert conn.get_now(events.EVENT_KEY.format(1)) == b"stacks 0"
    assert conn.get_now(events.EVENT_KEY.format(2)) == b"stop 1\nrank 3 failed"
    assert conn.get_now(events.EVENTS_KEY) == b"2"


def test_a_counter_that_is_not_a_number_is_set_back_to_the_last_event_and_named(conn: Conn) -> None:
    events.post_event(conn, "first")
    events.post_event(conn, "second")
    conn.set(events.EVENTS_KEY, b"garbage")
    notes: list[str] = []
    key = events.post_event(conn, "third", note=notes.append)
    assert key == events.EVENT_KEY.format(3)
    assert conn.get_now(key) == b"third"
    assert conn.get_now(events.EVENT_KEY.format(2)) == b"second"  # nothing overwritten
    assert len(notes) == 1 and notes[0].endswith("; set back to 2"), notes


def test_a_counter_that_went_back_never_overwrites_a_posted_event(conn: Conn) -> None:
    for header in ("first", "second", "third"):
        events.post_event(conn, header)
    conn.set(events.EVENTS_KEY, b"1")  # another client of the store
    notes: list[str] = []
    key = events.post_event(conn, "fourth", note=notes.append)
    assert key == events.EVENT_KEY.format(4)
    assert [conn.get_now(events.EVENT_KEY.format(n)) for n in (1, 2, 3, 4)] == [
        b"first", b"second", b"third", b"fourth"
    ]  # fmt: skip
    assert notes == [
        f"{events.EVENTS_KEY} went back to 1, below events already posted (another client "
        "of the store?); set to 3"
    ]


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, 0), (b"0", 0), (b"7", 7), (b"8", None), (b"-1", None), (b"seven", None)],
)
def test_a_counter_is_read_only_within_its_bounds(
    conn: Conn, value: bytes | None, expected: int | None
) -> None:
    if value is not None:
        conn.set("count", value)
    assert storeops.read_count(conn, "count", 0, 7) == expected


# --- only the rendezvous's own health ends a round's watch ---------------------------------------


@pytest.mark.parametrize("mode", ["refuse", "timeout"])
def test_a_store_that_fails_numaruns_keys_only_is_one_line_never_lost(
    make_job: Callable[..., Job], capfd: pytest.CaptureFixture[str], mode: str
) -> None:
    faults: dict = {}
    job = make_job(3, faults=faults)
    job.run_for(INTERVAL * 2)
    faults["mode"] = mode  # every call on numarun's keys fails from now on; torch's are served
    asker = job.nodes[0]
    asker.ask()
    job.until(lambda: bool(asker.replies))
    assert "the whole job's stacks are unavailable" in asker.replies[0]["error"]
    for node in job.nodes:
        node.go_still()
    job.run_for(INTERVAL * 10)  # looks, beats, event waits: all failing
    assert lost(job) == []
    assert not any(node.supervisor.stopped for node in job.nodes)
    err = capfd.readouterr().err
    assert "unavailable on this node" in err and "the training goes on" in err
    assert "Traceback" not in err and "lost" not in err
    # Served again: the next request is answered, the events read on.
    faults["mode"] = None
    view = ask_and_read(job, asker=1)
    assert view.rank_count == 24


def test_what_the_look_raises_is_the_rendezvous_lost(make_job: Callable[..., Job]) -> None:
    job = make_job(2)

    def gone() -> int:
        raise RuntimeError("the store went away")

    job.nodes[1].node._handler.num_nodes_waiting = gone
    job.until(lambda: bool(lost(job)))
    assert lost(job) == ["rendezvous: lost the c10d rendezvous 'bench' at 127.0.0.1:1: the store "
                         "went away"]  # fmt: skip
    assert job.nodes[0].supervisor.stopped is None


def test_a_hole_in_the_event_counter_costs_at_most_a_look(make_job: Callable[..., Job]) -> None:
    # A poster died between its two calls (the counter added to, its event never set); the next
    # event is another node's notice. Before, the hole was looked for every fifth look and
    # skipped one interval later: six looks or more. Now the first look skips it.
    job = make_job(2)
    watch = job.nodes[1].node.watch
    looks: list[float] = []
    look = watch._look

    def counted(round_: storewatch.WatchedRound) -> list:
        looks.append(time.monotonic())
        return look(round_)

    watch._look = counted  # type: ignore[method-assign]
    job.run_for(INTERVAL * 2)
    poster = Conn(job.raw)
    poster.add(events.EVENTS_KEY, 1)  # the dead poster's number
    events.post_event(poster, "stop 0", b"node 0 (host): rank 0 failed\n", after=0)
    posted = time.monotonic()
    job.until(lambda: job.nodes[1].node.change is not None)
    assert "rank 0 failed" in job.nodes[1].node.change.message  # type: ignore[union-attr]
    assert len([t for t in looks if t > posted]) <= 2, looks

"""The diagnostics store of its own (``numarun.rendezvous.diagstore``), on real TCPStores on
loopback: the address published and read, checked as untrusted, a refused connection final, a
bounded wait for an address that never comes, the server closed at the next round, a connect
storm, and the whole-job view off (never on the rendezvous store) until it is connected."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from types import SimpleNamespace

import pytest

dist = pytest.importorskip("torch.distributed")

from numarun.rendezvous import diagstore  # noqa: E402
from numarun.rendezvous.storeops import Conn  # noqa: E402
from numarun.rendezvous.storewatch import StoreWatch, WatchedRound  # noqa: E402

LIMIT = 60.0  # seconds anything here may take on a loaded machine (it takes milliseconds)
PREFIX = "torch.rendezvous.test.0/"


@pytest.fixture
def rendezvous() -> object:
    """A rendezvous store as torch's handler gives it: a TCPStore under the round's prefix."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=LIMIT))  # fmt: skip
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False, wait_for_workers=False,
                           timeout=timedelta(seconds=LIMIT))  # fmt: skip
    yield dist.PrefixStore(PREFIX, client)
    del server  # served until the test is over


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then closed: refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def refused_within(hostname: str, port: int, limit: float) -> bool:
    """Whether ``hostname:port`` refuses a connection within ``limit`` seconds (a server
    closed by dropping its last reference stops listening soon, not at once)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            socket.create_connection((hostname, port), timeout=1.0).close()
        except ConnectionRefusedError:
            return True
        time.sleep(0.05)
    return False


def host(rendezvous: object) -> diagstore.DiagServer:
    server = diagstore.host_round(None, SimpleNamespace(rank=0, store=rendezvous), True,
                                  "127.0.0.1:29400")  # fmt: skip
    assert server is not None
    return server


def test_the_address_is_published_read_and_served(rendezvous: object) -> None:
    server = host(rendezvous)
    published = bytes(rendezvous.get(diagstore.ADDRESS_KEY))  # type: ignore[attr-defined]
    assert published == server.address.encode()
    assert published.startswith(b"127.0.0.1:")  # the interface that reaches the endpoint
    made = diagstore.connect_round(rendezvous, spread=0.0)
    assert made.why is None
    assert made.health is not None and made.health.own  # the heartbeat's own connection
    assert made.events is not None and made.posts is not None
    made.posts.set("numarun/x", b"1")
    assert made.events.get_now("numarun/x") == b"1"
    # Not on the rendezvous store: the view's keys stay off it.
    assert not rendezvous.check(["numarun/x"])  # type: ignore[attr-defined]
    server.close()


def test_a_refused_connection_is_final_and_one_line(
    rendezvous: object, capsys: pytest.CaptureFixture[str]
) -> None:
    port = closed_port()
    rendezvous.set(diagstore.ADDRESS_KEY, f"127.0.0.1:{port}")  # type: ignore[attr-defined]
    start = time.monotonic()
    made = diagstore.connect_round(rendezvous, spread=0.0, window=LIMIT)
    assert time.monotonic() - start < LIMIT / 2  # final: not retried for the window
    assert made.events is None and made.why is not None
    assert "refused" in made.why
    round_ = WatchedRound(rendezvous, None, 1, 2, lambda result: None, own_diag=True)
    round_.diag_why = made.why
    diagstore.say_unavailable(round_)
    diagstore.say_unavailable(round_)
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"numarun: whole-job diagnostics unavailable this round: {made.why}; "
                     "training goes on"]  # fmt: skip


def test_an_address_that_never_comes_is_waited_for_a_bounded_time(rendezvous: object) -> None:
    start = time.monotonic()
    made = diagstore.connect_round(rendezvous, spread=0.0, address_wait=0.5)
    took = time.monotonic() - start
    assert made.events is None
    assert made.why == f"its address ({diagstore.ADDRESS_KEY}) was not published within 0.5 s"
    assert 0.5 <= took < LIMIT / 2
    assert made.health is not None  # the heartbeat's connection is made all the same


def test_the_server_is_served_until_the_next_round_formed(rendezvous: object) -> None:
    server = host(rendezvous)
    made = diagstore.connect_round(rendezvous, spread=0.0)
    assert made.events is not None
    made.posts.set("numarun/late", b"read")  # type: ignore[union-attr]
    hostname, port = diagstore.parse_address(server.address.encode())
    # The next round formed elsewhere (this node is not its group rank 0): the old one closes.
    assert diagstore.host_round(server, SimpleNamespace(rank=1, store=rendezvous), True,
                                "127.0.0.1:29400") is None  # fmt: skip
    assert refused_within(hostname, port, LIMIT), "the old round's server still accepts connections"
    with pytest.raises(diagstore.Unavailable, match="refused"):
        diagstore.connect(hostname, port, spread=0.0, window=LIMIT)


def test_a_store_whose_host_went_away_is_named_not_reconnected_to(rendezvous: object) -> None:
    """Group rank 0's launcher dies with the store it serves: a connection renewed after a
    failed call (:meth:`Conn.add` renews one the server closed) is probed first, so it fails
    at once with what happened, instead of torch's client retrying a refused connection for
    its whole timeout (10 s) in the thread that needed it (a silent neighbour's notice, the
    events: 11 s late in the simulation before)."""
    server = host(rendezvous)
    refused: list[bool] = []
    made = diagstore.connect_round(rendezvous, spread=0.0, unreachable=lambda: refused.append(True))
    assert made.posts is not None and made.events is not None
    assert made.posts.add("numarun/events", 1) == 1
    assert refused == []
    server.close()  # the launcher that hosted it is gone
    hostname, port = diagstore.parse_address(server.address.encode())
    assert refused_within(hostname, port, LIMIT)
    for conn in (made.posts, made.events):
        with pytest.raises(diagstore.Unavailable, match=r"went away .*ConnectionRefusedError"):
            conn.add("numarun/events", 1)
    assert refused == [True, True]  # the round's watch of its host's beat begins (liveness)


def test_posts_made_while_connecting_are_posted_once_connected(rendezvous: object) -> None:
    server = host(rendezvous)
    watch = StoreWatch(0.2, lambda round_: [])
    round_ = WatchedRound(rendezvous, None, 1, 2, lambda result: None, own_diag=True)
    posted = threading.Event()
    watch.post(round_, lambda conn: (conn.set("numarun/early", b"1"), posted.set()), "a post")
    assert not posted.is_set()
    diagstore.connecting(watch, round_)  # its connections handed over through the queue
    with watch.lock:
        work = list(watch._work)
        watch._work.clear()
    for queued in work:
        queued(round_)
    assert posted.wait(LIMIT)
    assert round_.conn is not None and round_.conn.get_now("numarun/early") == b"1"
    assert not rendezvous.check(["numarun/early"])  # type: ignore[attr-defined]
    watch.close()
    server.close()


def test_a_connect_storm_all_connect(rendezvous: object) -> None:
    server = host(rendezvous)
    count = 48
    results: list[diagstore.Connected] = []
    lock = threading.Lock()

    def node() -> None:
        made = diagstore.connect_round(rendezvous, spread=1.0)
        with lock:
            results.append(made)

    threads = [threading.Thread(target=node) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(LIMIT * 2)
    assert len(results) == count
    assert [made.why for made in results if made.why] == []
    for made in results:
        made.posts.add("numarun/count", 1)  # type: ignore[union-attr]
    assert results[0].events.count("numarun/count") == count  # type: ignore[union-attr]
    server.close()


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (b"999.1.1.1:80", "not HOST:PORT"),
        (b"node7:0", "port 0, not from 1 to 65535"),
        (b"node7:99999", "port 99999"),
        ("n\u00f6de7:80".encode(), "non-ASCII"),
        (b"x" * 100_000 + b":80", "100003 bytes"),
        (b"node7", "not HOST:PORT"),
        (b"[zz::g]:80", "not HOST:PORT"),
        (b"a..b:80", "not HOST:PORT"),
        (b"-node:80", "not HOST:PORT"),
        (b"node 7:80", "not HOST:PORT"),
        (b"node7:\x00", "not HOST:PORT"),
    ],
)
def test_a_forged_address_is_one_line_and_no_connection_attempt(
    rendezvous: object, monkeypatch: pytest.MonkeyPatch, value: bytes, why: str
) -> None:
    tried: list[object] = []
    monkeypatch.setattr(diagstore, "connect", lambda *args, **kwargs: tried.append(args))
    rendezvous.set(diagstore.ADDRESS_KEY, value)  # type: ignore[attr-defined]
    made = diagstore.connect_round(rendezvous, spread=0.0)
    assert tried == []
    assert made.events is None and made.why is not None
    assert why in made.why
    assert len(made.why) < 200 and made.why.isprintable()  # one bounded line


def test_good_addresses_are_read() -> None:
    assert diagstore.parse_address(b"10.0.0.7:29500") == ("10.0.0.7", 29500)
    assert diagstore.parse_address(b"[::1]:1") == ("::1", 1)
    assert diagstore.parse_address(b"gpu-node00007.cluster.internal:65535") == (
        "gpu-node00007.cluster.internal", 65535)  # fmt: skip
    assert diagstore.format_address("::1", 5) == "[::1]:5"
    assert diagstore.endpoint_host("[::1]:29400") == "::1"
    assert diagstore.endpoint_host("head:29400") == "head"
    assert diagstore.endpoint_host("") == "localhost"


def test_the_view_is_off_until_connected_and_never_on_the_rendezvous_store(
    rendezvous: object, capsys: pytest.CaptureFixture[str]
) -> None:
    watch = StoreWatch(0.2, lambda round_: [])
    round_ = WatchedRound(rendezvous, None, 1, 2, lambda result: None, own_diag=True)
    called: list[Conn] = []
    watch.post(round_, called.append, "this node's stacks request")
    assert called == []
    assert round_.view_off() == diagstore.PENDING
    assert capsys.readouterr().err == ""  # still connecting: the post waits for it
    assert len(round_.deferred) == 1
    round_.diag_why = "its store at 127.0.0.1:9 refused the connection"  # the connect gave up
    round_.deferred.clear()
    watch.post(round_, called.append, "this node's stacks request")
    watch.post(round_, called.append, "this node's hang mark (still)")
    assert called == [] and round_.deferred == []
    err = capsys.readouterr().err.splitlines()
    assert err == ["numarun: whole-job diagnostics unavailable this round: its store at "
                   "127.0.0.1:9 refused the connection; training goes on"]  # fmt: skip
    # The rendezvous's health goes on: torch's connection until the heartbeat's own is made.
    health = round_.health_conn()
    assert health is not None and not health.own
    watch.close()


def test_a_store_that_went_away_is_one_line_per_round_not_one_per_call(
    rendezvous: object, capsys: pytest.CaptureFixture[str]
) -> None:
    """Group rank 0 gone: the events, the queued work, each request fail on its store, each
    with its own error; the node says so once (1,024 nodes said 4,093 lines in the simulation
    before). A heartbeat's failure, on the rendezvous store, is still its own line."""
    watch = StoreWatch(0.2, lambda round_: [])
    round_ = WatchedRound(rendezvous, None, 1, 2, lambda result: None, own_diag=True)

    def fails(error: BaseException) -> None:
        raise error

    watch.unavailable(round_, "the round's events", dist.DistNetworkError("Broken pipe"))
    watch.guarded(round_, "queued work", fails, ConnectionResetError("reset"))
    watch.guarded(round_, "event 3", fails, diagstore.Unavailable("its store went away"))
    watch.unavailable(round_, "this node's heartbeat", dist.DistNetworkError("Broken pipe"))
    watch.guarded(round_, "event 4", fails, ValueError("a bug, not the store"))
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "numarun: warning: the diagnostics store: the round's events: unavailable on this node "
        "(DistNetworkError: Broken pipe); the training goes on",
        "numarun: warning: the rendezvous store: this node's heartbeat: unavailable on this node "
        "(DistNetworkError: Broken pipe); the training goes on",
        "numarun: warning: the diagnostics store: event 4 failed (ValueError: a bug, not the "
        "store); it is skipped, the training goes on",
    ]
    watch.close()


def test_a_silent_node_is_told_on_the_rendezvous_store_and_forged_words_are_one_line(
    rendezvous: object, capsys: pytest.CaptureFixture[str]
) -> None:
    """The node that saw its neighbour silent says so on the rendezvous store (the view's
    store may have died with that node); every other node reads it in one request per look.
    A value of another form is named once and not read again this round."""
    from numarun.cmdline.config import parse_args
    from numarun.rendezvous.liveness import GONE_KEY, Heartbeats

    config = parse_args(["--nnodes", "3", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                         "127.0.0.1:1", "train.py"])  # fmt: skip
    watch = StoreWatch(0.2, lambda round_: [])

    def node(me: int) -> tuple[Heartbeats, WatchedRound]:
        beats = Heartbeats(config, 0.2, watch.note)
        round_ = WatchedRound(rendezvous, None, me, 3, lambda result: None, own_diag=True)
        beats.watch_neighbour(me, 3, time.monotonic())
        return beats, round_

    (saw, saw_round), (other, other_round) = node(2), node(1)
    assert other.gone_elsewhere(other_round) is None  # nobody said anything
    saw.say_gone(saw_round, 0)
    assert other.gone_elsewhere(other_round) == (0, 2)
    assert saw.gone_elsewhere(saw_round) is None  # its own word
    assert capsys.readouterr().err == ""
    for forged in (b"0 2 " + b"9" * 4096, b"7 2", b"zero two"):
        beats, round_ = node(1)
        rendezvous.set(GONE_KEY, forged)  # type: ignore[attr-defined]
        assert beats.gone_elsewhere(round_) is None
        rendezvous.set(GONE_KEY, b"0 2")  # type: ignore[attr-defined]
        assert beats.gone_elsewhere(round_) is None  # not read again this round
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and "ignored this round" in err[0] and len(err[0]) < 300, err
    watch.close()


@pytest.mark.parametrize("stopping", [False, True])
def test_numarun_health_reads_nothing_once_this_nodes_round_is_stopping(
    rendezvous: object, stopping: bool
) -> None:
    """A node whose attempt is over (its failure notice posted, or another's read) ends soon,
    and so may the node hosting the rendezvous store: a read of the neighbour's beat then
    failed and said so in a false warning on a job that ended as it should (seen once in the
    suite at load, on the failed node). The thread reads while the round runs, not after."""
    from numarun.rendezvous import torchrdzv

    looked = threading.Event()

    def look(*args: object) -> None:
        looked.set()
        raise RuntimeError("the store went away")

    watch = StoreWatch(0.05, lambda round_: [])
    round_ = WatchedRound(rendezvous, None, 1, 2, lambda result: None, own_diag=True)
    round_.stopping = stopping
    beats = SimpleNamespace(beat_interval=0.05, silent_neighbour=look, gone_elsewhere=look,
                            waits_for_word=lambda round_: False)  # fmt: skip
    node = SimpleNamespace(poll_interval=0.05, heartbeats=beats, _barrier=None, change=None,
                           watch=watch, _handler=None)  # fmt: skip
    thread = threading.Thread(target=torchrdzv._watch_health, args=(node, round_), daemon=True)
    thread.start()
    # Twenty looks' worth of time: enough for a running round's first look at any load.
    assert looked.wait(LIMIT if not stopping else 1.0) is not stopping
    round_.active = False
    thread.join(LIMIT)
    watch.close()


class CountedWaits:
    """A store in front of another, counting its ``wait`` calls (the rest passed through)."""

    def __init__(self, inner: object) -> None:
        self.inner, self.waits = inner, 0
        self.on_wait: Callable[[], None] = lambda: None  # may raise (a store that went away)

    def wait(self, *args: object) -> object:
        self.waits += 1
        self.on_wait()
        return self.inner.wait(*args)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


class Cloning:
    """The round's store: its clones (the word's connection) count their waits."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.clones: list[CountedWaits] = []
        self.on_wait: Callable[[], None] = lambda: None

    def clone(self) -> CountedWaits:
        made = CountedWaits(self.inner.clone())  # type: ignore[attr-defined]
        made.on_wait = self.on_wait
        self.clones.append(made)
        return made

    def waits(self) -> int:
        return sum(clone.waits for clone in self.clones)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def first_wait(store: Cloning) -> None:
    """Until ``numarun-word`` began its first wait on one of ``store``'s clones, or ``LIMIT``
    seconds (the thread starts late on a busy machine: a fixed sleep counted none)."""
    deadline = time.monotonic() + LIMIT
    while store.waits() == 0 and time.monotonic() < deadline:
        time.sleep(0.05)


def health_thread(rendezvous: object, period: float, *, unreachable: bool = True,
                  on_wait: Callable[[WatchedRound], None] | None = None) -> tuple:  # fmt: skip
    """``numarun-health`` of node 1 of 3, started with its reads due every ``period`` seconds
    (neither its neighbour nor group rank 0 ever beat: none is silent), the view's store
    refused its probe or not (``unreachable``): (thread, round, reports, the round's store,
    whose clones count their waits)."""
    import queue

    from numarun.cmdline.config import parse_args
    from numarun.rendezvous.liveness import Heartbeats
    from numarun.rendezvous.torchrdzv import _watch_health

    config = parse_args(["--nnodes", "3", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                         "127.0.0.1:1", "train.py"])  # fmt: skip
    watch = StoreWatch(0.2, lambda round_: [])
    reports: queue.Queue = queue.Queue()
    watch.report = lambda round_, result: reports.put(result)  # type: ignore[method-assign]
    beats = Heartbeats(config, period, watch.note)
    beats.beat_interval = period
    store = Cloning(rendezvous)
    round_ = WatchedRound(store, None, 1, 3, lambda result: None, own_diag=True)
    if on_wait is not None:
        store.on_wait = lambda: on_wait(round_)
    beats.watch_neighbour(1, 3, time.monotonic())
    round_.health = Conn(rendezvous)
    round_.diag_host_unreachable = unreachable
    node = SimpleNamespace(poll_interval=period, heartbeats=beats, _barrier=None, change=None,
                           watch=watch, _handler=None)  # fmt: skip
    thread = threading.Thread(target=_watch_health, args=(node, round_), daemon=True)
    thread.start()
    return thread, round_, reports, store


def test_the_word_that_a_node_is_gone_wakes_every_node_when_it_is_set(
    rendezvous: object,
) -> None:
    """Read once a second on a rendezvous store that torch's traffic saturates, the word
    reached the last of 1,024 nodes about 3 s after the first heard it (the asking node's
    death: up to 19.3 s against its 19 s bound). Once the view's store refused a probe (its
    host may be the node that is gone), ``numarun-word`` waits for it on a connection of its
    own: here a read would be due every 120 s, and the word set by another node is taken
    long before the first of them."""
    from numarun.rendezvous.liveness import GONE_KEY
    from numarun.rendezvous.storeresults import REJOIN

    _, round_, reports, store = health_thread(rendezvous, 120.0)
    time.sleep(0.2)  # most likely asleep in its wait by now; either way the word is taken
    rendezvous.set(GONE_KEY, b"0 2")  # type: ignore[attr-defined]
    change = reports.get(timeout=LIMIT)
    assert change.kind == REJOIN and change.message.startswith("node 0 stopped answering")
    assert change.message.endswith("as node 2 saw")
    assert len(store.clones) == 1 and store.waits() >= 1
    round_.active = False  # numarun-health ends after its first read's sleep (a daemon)


def test_a_healthy_round_makes_no_connection_for_the_word(rendezvous: object) -> None:
    """A connection per node and round for the word, made at the round's start, doubled the
    connect storm on the rendezvous store (at 4,096 simulated nodes no node had the view's
    store within 120 s). It is made once the view's store refused a probe, the one death
    whose notice that store cannot carry; until then the word is read on the period."""
    from numarun.rendezvous.liveness import GONE_KEY

    thread, round_, reports, store = health_thread(rendezvous, 0.05, unreachable=False)
    time.sleep(1.0)  # twenty periods
    assert store.clones == [] and reports.empty()
    round_.diag_host_unreachable = True
    first_wait(store)
    assert len(store.clones) == 1 and store.waits() >= 1
    rendezvous.set(GONE_KEY, b"0 2")  # type: ignore[attr-defined]
    assert reports.get(timeout=LIMIT).message.endswith("as node 2 saw")
    round_.active = False
    thread.join(LIMIT)


@pytest.mark.parametrize("word", [b"1 1", b"zero two"])
def test_a_word_numarun_word_does_not_take_is_not_waited_for_again(
    rendezvous: object, word: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    """A word that is this node's own (it said it already) or not in numarun's form (named
    once) stays in the store: waiting for it again would return at once, every time, and
    spin the thread. It is waited for once; then read on the period (a word named once is
    not read again)."""
    from numarun.rendezvous.liveness import GONE_KEY

    rendezvous.set(GONE_KEY, word)  # type: ignore[attr-defined]
    thread, round_, reports, store = health_thread(rendezvous, 0.1)
    first_wait(store)
    time.sleep(1.0)  # ten periods more, in which it is not waited for again
    round_.active = False
    thread.join(LIMIT)
    assert not thread.is_alive() and reports.empty()
    assert store.waits() == 1
    err = capsys.readouterr().err
    assert err.count("ignored this round") == (word == b"zero two"), err


@pytest.mark.parametrize("over", [False, True])
def test_a_failed_wait_for_the_word_is_one_line_unless_the_round_was_over_by_then(
    rendezvous: object, over: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """A wait for the word lasts 2 s; the rendezvous store may go away meanwhile with the node
    that hosts it, at the job's end (seen on the failed node of a finished-and-failed job: a
    false warning). A failed wait is one line on a round that runs, none on one that was
    over by the time it failed; either way the word is not waited for again (the thread
    does not spin on the failing store): numarun-health reads it on the period."""

    def store_goes(round_: WatchedRound) -> None:
        if over:
            round_.stopping = True  # this node's notice posted while it waited
        raise RuntimeError("Connection reset by peer")

    thread, round_, _, store = health_thread(rendezvous, 0.1, on_wait=store_goes)
    first_wait(store)
    time.sleep(1.0)  # ten periods more, in which it is not waited for again
    round_.active = False
    thread.join(LIMIT)
    assert not thread.is_alive()
    assert store.waits() == 1 and round_.word is None
    err = capsys.readouterr().err.splitlines()
    if over:
        assert err == []
    else:
        assert err == ["numarun: warning: the rendezvous store: the word that a node is gone: "
                       "unavailable on this node (RuntimeError: Connection reset by peer); the "
                       "training goes on"]  # fmt: skip


def test_numarun_health_reads_are_due_a_period_after_the_last_began_not_after_it_ended() -> None:
    """On a rendezvous store that torch's state syncs saturate, one read takes a good part of
    a second; with the next read due a period after the last one ended, the word that a node
    is gone was heard up to 2 s after it was set (the asking node's death at 1,024 nodes:
    19.2-19.8 s against its 19 s bound). A read slower than the period is followed at once,
    and late reads are never made up for by a burst."""
    from numarun.rendezvous.liveness import next_read

    due, now, starts = 0.0, 0.0, []
    for _ in range(4):
        due = next_read(due, now, 1.0)
        now = max(now, due)  # asleep until it is due
        starts.append(now)
        now += 0.6  # the read itself
    assert starts == [1.0, 2.0, 3.0, 4.0]  # not 1.0, 2.6, 4.2, 5.8
    assert next_read(1.0, 5.0, 1.0) == 5.0  # 3 s late: the next read now, one only
    assert next_read(5.0, 5.2, 1.0) == 6.0  # and then on the period again


def test_every_node_watches_the_view_stores_host_once_that_store_refused_it(
    rendezvous: object,
) -> None:
    """Group rank 0 hosts the view's store and dies with it. Its neighbour sees it silent
    after the silence limit; the other nodes heard it through the neighbour's word
    (``numarun/gone``), read once a second on a store torch's traffic saturates: up to 2 s
    more, past the 19 s bound at 1,024 nodes. Once the view's store refused a probe, a node
    reads the host's beat itself and sees the silence as the neighbour does, after the same
    limit; the store's failure alone decides nothing (a host that beats is never gone)."""
    from numarun.cmdline.config import parse_args
    from numarun.rendezvous.liveness import Heartbeats
    from numarun.rendezvous.storewatch import ALIVE_KEY

    config = parse_args(["--nnodes", "8", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                         "127.0.0.1:1", "--rdzv-conf", "keep_alive_interval=1,"
                         "keep_alive_max_attempt=1", "train.py"])  # fmt: skip
    watch = StoreWatch(0.1, lambda round_: [])
    beats = Heartbeats(config, 0.1, watch.note)
    assert beats.silence_limit == 1.0
    round_ = WatchedRound(rendezvous, None, 5, 8, lambda result: None, own_diag=True)
    beats.watch_neighbour(5, 8, time.monotonic())
    conn = round_.health_conn()
    assert conn is not None

    def look_for(seconds: float, *, host_beats: bool) -> tuple[int | None, float]:
        """Looks every 0.1 s for ``seconds`` while the neighbour (6) beats, until one says
        a node is silent: (that node, when), or (None, the time looked)."""
        start = time.monotonic()
        while (took := time.monotonic() - start) < seconds:
            conn.add(ALIVE_KEY.format(6), 1)
            if host_beats:
                conn.add(ALIVE_KEY.format(0), 1)
            silent = beats.silent_neighbour(round_)
            if silent is not None:  # when it was said, not when this look began
                return silent, time.monotonic() - start
            time.sleep(0.1)
        return None, took

    conn.add(ALIVE_KEY.format(0), 1)  # the host beat once, then its launcher died
    assert look_for(2.0, host_beats=False) == (None, pytest.approx(2.0, abs=LIMIT))
    round_.diag_host_unreachable = True  # a probe of the view's store found nobody there
    silent, took = look_for(LIMIT, host_beats=False)
    assert silent == 0 and took >= beats.silence_limit  # never sooner than the neighbour
    # A host that beats on is never taken for gone, its store refusing or not.
    beats.watch_neighbour(5, 8, time.monotonic())
    assert look_for(2.5, host_beats=True)[0] is None
    watch.close()

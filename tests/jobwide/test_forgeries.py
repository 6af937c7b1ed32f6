"""What another client of the rendezvous store can do to the whole-job view (anyone who reaches
its port: torch's store is unauthenticated), the reviewer's cases written against the keys, on
node stand-ins running the launcher's own classes (``tests/standin_job.py``): a post can at most
deny or delay a verdict, named in one line; it never produces a verdict against a node whose
ranks move, never makes a healthy job re-form more than once per forged notice, and never grows a
launcher's memory beyond a bound (measured here: this process holds the stand-ins and the
store, so the bound is generous)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
os.environ.setdefault("RES_OPTIONS", "timeout:1 attempts:1")
dist = pytest.importorskip("torch.distributed")

from numarun.jobwide import hangverdict  # noqa: E402
from numarun.rendezvous import events, storewatch  # noqa: E402
from numarun.rendezvous.storeops import Conn  # noqa: E402
from numarun.stacks import digest as codec  # noqa: E402
from standin_job import INTERVAL, LIMIT, Job, ask_and_read, rss_mib  # noqa: E402

GROWTH_MIB = 64  # what the forgeries below may add to this process's memory, at most


def forge_event(job: Job, header: str, body: bytes = b"") -> None:
    events.post_event(Conn(job.raw), header, body, after=0)


@pytest.fixture
def forger() -> Iterator[Callable[..., None]]:
    """``forger(calls)``: another client of the store calling ``calls()`` in a loop until the
    test ends (or ``seconds``)."""
    stop = threading.Event()
    threads = []

    def start(calls: Callable[[], None], seconds: float = LIMIT) -> None:
        deadline = time.monotonic() + seconds

        def run() -> None:
            while not stop.is_set() and time.monotonic() < deadline:
                calls()
                time.sleep(0.01)

        threads.append(threading.Thread(target=run, daemon=True))
        threads[-1].start()

    yield start
    stop.set()
    for thread in threads:
        thread.join(5)


def ranks_named(count: int) -> list:
    """A rank set of ``count`` ranks, as numarun encodes them (one triple)."""
    return [[0, count, 1]]


def test_a_merged_or_hang_post_naming_millions_of_ranks_costs_no_memory(
    make_job: Callable[..., Job], capfd: pytest.CaptureFixture[str]
) -> None:
    # The reviewer's ~500-byte merged event whose rank sets name 4 million ranks: both
    # launchers grew from 228 to 1,666 MiB (read_view expanded them). Sixty-four of them, and
    # as many forged verdicts, reaching nodes whose ranks are still (they read verdicts).
    job = make_job(2)
    job.nodes[0].go_still()  # it reads the verdicts; node 1, whose ranks move, denies them
    job.until(lambda: Conn(job.raw).count(hangverdict.STILLS_KEY) >= 1)
    before = rss_mib()
    huge = ranks_named(4_000_000)
    cls = (b'{"ranks": %s, "nodes": %s, "hosts": "h", "id": "%s"}'
           % (str(huge).encode(), str(huge).encode(), b"ab" * 8))  # fmt: skip
    view = (b'{"v": 2, "kind": "hang", "by": "x", "size": 2, "answered": [[0, 2, 1]], '
            b'"missing": [], "notes": [], "idle": 1, "classes": [' + b",".join([cls] * 8)
            + b"]}")  # fmt: skip
    assert len(view) < 1500
    for _ in range(64):
        forge_event(job, "merged 1 1 tok", view)
        forge_event(job, "hang 1", view)
    job.run_for(INTERVAL * 10)
    assert rss_mib() - before < GROWTH_MIB
    assert not any(node.supervisor.stopped for node in job.nodes)
    err = capfd.readouterr().err
    assert "numarun: warning: the rendezvous store: the hang verdict of node 1: ranks is not a " \
           "whole number from 1 to 16: ignored" in err  # fmt: skip
    assert "Traceback" not in err


def test_a_still_post_forged_for_a_node_whose_ranks_move_never_stops_a_node(
    make_job: Callable[..., Job], capfd: pytest.CaptureFixture[str]
) -> None:
    # The reviewer's case: node 0's ranks had finished (it waits in the exit barrier); a still
    # post forged for node 1, whose training is healthy (its digest, its number in the still
    # nodes, the count raised by one), made node 0 declare HUNG and exit 124, taking the store
    # and node 1's training with it. Now the verdict is posted, node 1 denies it, and no node
    # acts on it.
    job = make_job(2)
    done, healthy = job.nodes
    done.node.unwatch()  # its run ended: results wait for the exit barrier's thread
    conn = Conn(job.raw)
    digest, _ = codec.node_digest(healthy.raw(), node=1, host="node0001", pid=4242,
                                  state="still", known=codec.Classes())  # fmt: skip
    conn.set(hangverdict.STILL_KEY.format(1), digest.encode())
    conn.append(hangverdict.STILL_NODES_KEY, "1", b"1")
    conn.add(hangverdict.STILLS_KEY, 1)
    ended = [codec.Raw(r, r, None, "", "ended with exit code 0") for r in range(8)]
    hangverdict.mark(done.node.watch, done.node.watched_round, "done", ended)
    round_ = done.node.watched_round
    job.until(lambda: round_.seen >= 2)  # the verdict and the deny read
    job.run_for(hangverdict.DENY_WINDOW * 3)
    assert [r for r in done.node.watch.take_delivered() if r.kind == "hang"] == []
    assert healthy.supervisor.stopped is None
    err = capfd.readouterr().err
    assert "a hang verdict posted by node 0 reached this node, whose ranks are moving: not " \
           "acted on, and denied" in err  # fmt: skip
    assert "node 1 denied the hang verdict of node 0 (its ranks move): not acted on" in err
    # The forged post was taken back by the node it named.
    assert conn.get_now(hangverdict.STILL_KEY.format(1)) == hangverdict.MOVING


class KeepAlive:
    """torch's handler as the look uses it, whose state says every node's own keep-alive is
    fresh (torch's ``_state_holder.state``: ``participants``, ``last_heartbeats``)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def num_nodes_waiting(self) -> int:
        return 0

    def is_closed(self) -> bool:
        return False

    @property
    def _state_holder(self) -> SimpleNamespace:
        now = datetime.now(timezone.utc)
        nodes = [f"host:{n}" for n in range(self.size)]
        return SimpleNamespace(state=SimpleNamespace(
            participants={node: rank for rank, node in enumerate(nodes)},
            last_heartbeats=dict.fromkeys(nodes, now),
        ))  # fmt: skip


@pytest.mark.parametrize("torch_keeps_alive", [True, False])
def test_a_frozen_heartbeat_is_checked_against_torchs_own_keep_alive(
    make_job: Callable[..., Job],
    capfd: pytest.CaptureFixture[str],
    forger: Callable[..., None],
    torch_keeps_alive: bool,
) -> None:
    # The reviewer's case: alive/<n> written with a frozen value made the job re-form every
    # 15 s. torch's own keep-alive of that node is fresh: it is not taken for gone. Without
    # torch's word (a handler that keeps no such state), numarun's beat decides, as before.
    job = make_job(2, keep_alive=1)  # a silence of 3 s
    watcher = job.nodes[0].node
    if torch_keeps_alive:
        watcher._handler = KeepAlive(2)
    key = storewatch.ALIVE_KEY.format(1)
    client = Conn(job.raw)
    forger(lambda: client.store.set(key, b"7"))
    silence = watcher.heartbeats.silence_limit
    if not torch_keeps_alive:
        job.until(lambda: watcher.change is not None)
        assert "node 1 stopped answering" in watcher.change.message  # type: ignore[union-attr]
        return
    round_ = watcher.watched_round
    job.until(lambda: f"{key} frozen" in round_.noted)  # type: ignore[union-attr]
    job.run_for(silence + INTERVAL * 4)  # and more silent windows: still no re-forming
    assert watcher.change is None
    err = capfd.readouterr().err
    assert f"{key} stood still for {silence:g} s while torch's own keep-alive of node 1 is " \
           "fresh" in err  # fmt: skip


def test_forged_moving_posts_and_counts_delay_a_real_verdict_only_while_they_last(
    make_job: Callable[..., Job],
    capfd: pytest.CaptureFixture[str],
    forger: Callable[..., None],
) -> None:
    # The reviewer's case: a stream of still/<n>=moving posts or a negative still count denied
    # a real hang's verdict for 120 s, and the store host's launcher grew to 863 MiB. Every
    # node here is really still: the forgeries delay the verdict while they last (named), the
    # nodes' memory stays bounded, and the verdict comes once they stop.
    job = make_job(3)
    before = rss_mib()
    client = Conn(job.raw)

    def forge() -> None:
        client.store.set(hangverdict.STILL_KEY.format(1), hangverdict.MOVING)
        client.store.set(hangverdict.STILLS_KEY, b"-5")

    forger(forge, seconds=4.0)
    for node in job.nodes:
        node.go_still()
    job.until(lambda: all(node.verdict_at() for node in job.nodes))  # at the latest once the
    # forgeries stopped: node 1 sets its post again, a wave's judge checks every post
    assert rss_mib() - before < GROWTH_MIB
    err = capfd.readouterr().err
    assert "numarun/stills held b'-" in err or "numarun/stills said -" in err, err
    assert "numarun/still/1 was overwritten by another client of the store: set again" in err
    view = ask_and_read(job)
    assert view.rank_count == 24

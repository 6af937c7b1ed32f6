"""The whole-job protocol through a real torch TCPStore, with node stand-ins running the launcher's
own classes (``benchmarks/jobwide_standins.py``: ElasticNode, its store thread, JobStacks,
HangWatch; synthetic dumps): one merged result per event read by every node, the hang verdict
with a node whose ranks all ended, every forgery of the store's content named and survived. The
store thread's own rules (the event counter, a round's connections) are
``tests/rendezvous/test_storewatch.py``'s; torch's timeout by its type is
``tests/rendezvous/test_torchcompat.py``'s."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from datetime import timedelta

import pytest

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
# torch's client looks up the name of the address it connects to at each connection (a reverse
# lookup of 127.0.0.1 in DNS): a resolver that drops some of them costs 5 s each.
os.environ.setdefault("RES_OPTIONS", "timeout:1 attempts:1")
dist = pytest.importorskip("torch.distributed")

from numarun.jobwide import hangverdict, protocol  # noqa: E402
from numarun.rendezvous import events, storewatch  # noqa: E402
from numarun.rendezvous.storeops import Conn  # noqa: E402
from numarun.stacks import digest as codec  # noqa: E402
from numarun.stacks import merge  # noqa: E402
from numarun.stacks.dumps import Raw  # noqa: E402
from standin_job import INTERVAL, LIMIT, Job, ask_and_read  # noqa: E402

# --- one merged result per event, read by every node ---------------------------------------------


def test_whole_job_stacks_are_merged_by_the_asking_node_alone(
    make_job: Callable[..., Job],
) -> None:
    job = make_job(12)
    job.run_for(INTERVAL * 2)
    before = job.tally.snapshot()
    view = ask_and_read(job)
    job.run_for(INTERVAL * 2)
    spent = job.tally.snapshot()
    assert view.rank_count == 96 and view.answered == list(range(12)) and not view.missing
    assert sorted(len(item.ranks) for item in view.classes) == [1, 8, 87]
    assert all(item.threads for item in view.classes)  # every representative's frames
    # Only the asking node reads the merged view; nobody else hears of it.
    assert [node.index for node in job.nodes if "merged" in node.times] == [0]
    # O(1) requests per node: each node's digest once, frames once.
    requests = (spent["requests"] - before["requests"]) / 12
    assert requests < 30, requests
    assert (spent["bytes"] - before["bytes"]) / 12 < 4096
    # The request event stays for the nodes that have not read it yet (until the next round).
    assert job.raw.check([events.EVENT_KEY.format(1)])
    # A second request: the classes' frames are not posted or read again.
    frames_before = job.tally.snapshot()["frames"]
    ask_and_read(job, asker=5)
    assert job.tally.snapshot()["frames"] - frames_before < 40_000  # node 5's reply only


def test_a_node_that_does_not_answer_is_named_and_the_others_answer(
    make_job: Callable[..., Job],
) -> None:
    job = make_job(3)
    job.nodes[2].node.watch.end()  # its store thread stops watching: it never answers
    conn = Conn(job.raw)
    conn.add(storewatch.ALIVE_KEY.format(2), -conn.count(storewatch.ALIVE_KEY.format(2)))
    view = ask_and_read(job)
    assert view.rank_count == 16
    assert view.missing == [("not a numarun node (torchrun?): its ranks not shown", [2])]


# --- the hang verdict ----------------------------------------------------------------------------


def test_the_verdict_counts_a_node_whose_ranks_ended_and_reaches_it_in_the_exit_barrier(
    make_job: Callable[..., Job],
) -> None:
    job = make_job(4)
    done = job.nodes[3]
    done.node.unwatch()  # its run ended: results wait for the exit barrier's thread
    wake = threading.Event()
    done.node.watch.on_delivery(wake)
    ended = [Raw(24 + r, r, None, "", "ended with exit code 0") for r in range(8)]
    hangverdict.mark(done.node.watch, done.node.watched_round, "done", ended)
    for node in job.nodes[1:3]:
        node.go_still()
    job.run_for(INTERVAL * 3)
    assert not any(node.verdict_at() for node in job.nodes[:3])  # node 0 still moves
    job.nodes[0].go_still()
    job.until(lambda: all(node.verdict_at() for node in job.nodes[:3]))
    assert wake.wait(LIMIT)
    delivered = [r for r in done.node.watch.take_delivered() if r.kind == "hang"]
    assert delivered, "the verdict did not reach the node in the exit barrier"
    view = delivered[0].view
    assert view.rank_count == 32 and len(view.answered) == 4
    shown, _ = merge.ordered(view)
    assert [item.problem for item in shown if item.problem] == ["ended with exit code 0"]
    report = job.nodes[1].stacks.hang.report  # type: ignore[union-attr]
    assert report is not None and report.by == "node 0, through the rendezvous store"
    assert job.nodes[0].stacks.hang.report.by == "this node"  # type: ignore[union-attr]


def test_a_node_that_moves_again_takes_its_count_back(make_job: Callable[..., Job]) -> None:
    job = make_job(2)
    job.nodes[1].go_still()
    job.until(lambda: Conn(job.raw).count(hangverdict.STILLS_KEY) == 1)
    hangverdict.mark(job.nodes[1].node.watch, job.nodes[1].node.watched_round, "moving", [])
    job.until(lambda: Conn(job.raw).count(hangverdict.STILLS_KEY) == 0)
    assert job.raw.get(hangverdict.STILL_KEY.format(1)) == hangverdict.MOVING
    job.nodes[0].go_still()
    job.run_for(INTERVAL * 4)
    assert not any(node.verdict_at() for node in job.nodes)


# --- the store's content is untrusted ------------------------------------------------------------


def post_event(job: Job, header: str, body: bytes = b"") -> None:
    conn = Conn(job.raw)
    events.post_event(conn, header, body, after=0)


def test_a_notice_with_a_deeply_nested_post_and_escapes_stops_the_nodes_named(
    make_job: Callable[..., Job], capfd: pytest.CaptureFixture[str]
) -> None:
    job = make_job(2)
    body = b"node 1 (host): rank 9 failed \x1b]0;owned\x07\n" + b"[" * 50_000 + b"]" * 50_000
    post_event(job, "stop 1", body)
    job.until(lambda: job.nodes[0].node.change is not None)
    message = job.nodes[0].node.change.message  # type: ignore[union-attr]
    assert message == "node 1 (host): rank 9 failed \\x1b]0;owned\\x07"
    err = capfd.readouterr().err
    assert "the notice of node 1: a digest: " in err and "its ranks not shown" in err
    assert "Traceback" not in err and "\x1b" not in err


def test_a_forged_verdict_is_named_as_coming_from_the_store_and_ignored(
    make_job: Callable[..., Job], capfd: pytest.CaptureFixture[str]
) -> None:
    job = make_job(2)
    digests = [codec.Digest(0, "h", 1, "still", [], [("exited", list(range(16)))])]
    forged = merge.encode_view(merge.merge(digests, kind="hang", by="node 1 (h)", size=2))
    post_event(job, "hang 1", forged)
    post_event(job, "hang 0", b"{" * 20_000)
    post_event(job, "hang 99999", forged)
    post_event(job, "gibberish")
    job.run_for(INTERVAL * 5)
    assert not any(node.supervisor.stopped for node in job.nodes)
    err = capfd.readouterr().err
    assert "a hang verdict posted by node 1 reached this node, whose ranks are moving: not " \
           "acted on, and denied" in err  # fmt: skip
    assert "names node 99999, not one of the 2 nodes: ignored" in err
    assert "is not numarun's: ignored" in err
    # A verdict reaching nodes that were still is theirs: it shows who declared it.
    for node in job.nodes:
        node.go_still()
    job.until(lambda: all(node.verdict_at() for node in job.nodes))
    assert job.nodes[1].stacks.hang.report.by in (  # type: ignore[union-attr]
        "node 0, through the rendezvous store", "this node")


# --- stores torch gives, and its timeout ---------------------------------------------------------


class EtcdLike(dist.Store):
    """A store as torch's EtcdStore is: set/get/add/check/wait/delete_key only, no clone, no
    extended API, ``LookupError`` when a wait times out."""

    def __init__(self, data: dict, cond: threading.Condition) -> None:
        super().__init__()
        self._data = data
        self._cond = cond

    def set(self, key: str, value: object) -> None:
        with self._cond:
            self._data[key] = value.encode() if isinstance(value, str) else bytes(value)  # type: ignore[arg-type]
            self._cond.notify_all()

    def get(self, key: str) -> bytes:
        with self._cond:
            if not self._cond.wait_for(lambda: key in self._data, 5):
                raise LookupError(f"no {key}")
            return self._data[key]

    def add(self, key: str, amount: int) -> int:
        with self._cond:
            value = int(self._data.get(key, b"0")) + amount
            self._data[key] = str(value).encode()
            self._cond.notify_all()
            return value

    def check(self, keys: list[str]) -> bool:
        with self._cond:
            return all(key in self._data for key in keys)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        with self._cond:
            seconds = 5 if timeout is None else timeout.total_seconds()
            if not self._cond.wait_for(lambda: all(k in self._data for k in keys), seconds):
                raise LookupError("Timeout while waiting for keys in EtcdStore")


def test_a_store_without_clone_or_extended_api_serves_the_whole_job(
    make_job: Callable[..., Job],
) -> None:
    data: dict = {}
    cond = threading.Condition()
    job = make_job(3, store_factory=lambda: EtcdLike(data, cond))
    assert not job.nodes[0].node.watched_round.conn.own  # type: ignore[union-attr]
    view = ask_and_read(job)
    assert view.rank_count == 24 and not view.missing
    for node in job.nodes:
        node.go_still()
    job.until(lambda: all(node.verdict_at() for node in job.nodes))


# --- faults, each with a bound -------------------------------------------------------------------


def test_a_mark_reaches_the_store_at_once_not_at_the_threads_next_look(
    make_job: Callable[..., Job],
) -> None:
    # Looks every 30 s: the store thread sleeps in its wait meanwhile. A node's still mark and
    # its moving mark reach the store at once, in order (before: queued until the thread woke,
    # so a node that moved was counted still for up to a look interval).
    job = make_job(2, interval=30.0)
    job.run_for(0.5)
    conn = Conn(job.raw)
    job.nodes[1].go_still()
    job.until(lambda: conn.count(hangverdict.STILLS_KEY) == 1, limit=20.0)
    hangverdict.mark(job.nodes[1].node.watch, job.nodes[1].node.watched_round, "moving", [])
    job.until(lambda: conn.count(hangverdict.STILLS_KEY) == 0, limit=20.0)
    assert conn.get_now(hangverdict.STILL_KEY.format(1)) == hangverdict.MOVING


def test_frames_that_never_come_are_waited_for_once_per_round(make_job: Callable[..., Job]) -> None:
    # A class claimed by a node that died before it set its frames: every read of the class's
    # frames used to wait FRAMES_WAIT; now the first one does, and no later one asks the store.
    job = make_job(1)
    round_ = job.nodes[0].node.watched_round
    conn = round_.conn
    claimed = "0123456789abcdef"
    Conn(job.raw).add(protocol.CLAIM_KEY.format(claimed), 1)  # claimed, never set
    assert protocol.frames_of(round_, [claimed], conn) == {}
    before = job.tally.snapshot()["requests"]
    for _ in range(5):
        assert protocol.frames_of(round_, [claimed], conn) == {}
    assert job.tally.snapshot()["requests"] == before


def test_an_asking_node_that_dies_leaves_the_others_free(make_job: Callable[..., Job]) -> None:
    job = make_job(3)
    asker = job.nodes[0]
    asker.ask()
    asker.node.watch.end()  # its launcher is gone once its request was posted
    others = job.nodes[1:]
    job.until(lambda: Conn(job.raw).count(protocol.REPLIED_KEY.format(1)) >= 2)
    view = ask_and_read(job, asker=1)  # the others answer the next request as usual
    assert view.rank_count == 16 and [n.index for n in others if n.supervisor.stopped] == []
    assert view.missing == [("did not answer within 2 s", [0])]


def test_a_second_digest_of_a_node_is_dropped_without_crowding_out_another_nodes() -> None:
    # A forged post appended before the nodes answer a request names node 1 again: the first of
    # node 1's is kept; the honest second is dropped, one note, and counts nothing against the
    # job's ranks, so node 0's, read after both, still fits (it did not: "names more ranks than
    # the job has", and node 0 "did not answer").
    def post(node: int, ranks: list[int]) -> bytes:
        return codec.Digest(node, "h", 1, "answer", [("a" * 16, ranks, {})], []).encode()

    round_ = type("Round", (), {"size": 2, "world": 4})()
    posts = [post(1, [2, 3]), post(1, [2, 3]), post(0, [0, 1])]
    digests, notes = protocol.read_digests(None, round_, posts, "an answer to 2", 4)
    assert [digest.node for digest in digests] == [1, 0]
    assert notes == ["an answer to 2: a second digest of node 1: ignored"]
    # The bound on the ranks read stands: a digest of another node past it is refused.
    digests, notes = protocol.read_digests(None, round_, [post(1, [0, 1, 2, 3]), post(0, [0])],
                                           "an answer to 3", 4)  # fmt: skip
    assert [digest.node for digest in digests] == [1] and len(notes) == 1

"""Taking over a judge that died after the still count completed (``hangverdict._wave``), with
three nodes on a real torch TCPStore: each wave's first node is whichever still node gets there
first, so the count's completeness at the last wave must be known to any of them, not only to
a node that came first twice running (at a thousand nodes, almost never: the hang was then
declared only at wave 4, after the heartbeat had re-formed the group)."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
os.environ.setdefault("RES_OPTIONS", "timeout:1 attempts:1")
dist = pytest.importorskip("torch.distributed")

from numarun.jobwide import hangverdict, protocol  # noqa: E402
from numarun.rendezvous.storeops import Conn  # noqa: E402
from numarun.rendezvous.storewatch import NODES_KEY, WatchedRound  # noqa: E402

NODES = 3


class HandTickedWatch:
    """The store thread's two services ``_wave`` uses: a wave's next turn kept (this test
    ticks the waves by hand, each node in an order of its choosing), and a note."""

    interval = 2.0

    def __init__(self) -> None:
        self.turns: list[object] = []
        self.notes: list[str] = []

    def later(self, round_: WatchedRound, delay: float, work: object) -> None:
        self.turns.append(work)

    def note(self, round_: WatchedRound, topic: str, line: str, about: str = "") -> None:
        self.notes.append(line)


def test_a_judge_that_died_is_taken_over_a_wave_after_the_count_completed_whoever_comes_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=30))  # fmt: skip
    judged: list[tuple[int, int, int]] = []  # (wave, node, count)
    monkeypatch.setattr(hangverdict, "judge", lambda watch, round_, conn, count: judged.append(
        (protocol.state(round_).waves, round_.me, count)))  # fmt: skip
    conn = Conn(server, clone=False)
    conn.set(NODES_KEY, str(NODES).encode())
    conn.set(hangverdict.STILLS_KEY, str(NODES - 1).encode())  # the judge not yet still
    watch = HandTickedWatch()
    rounds = []
    for me in range(NODES):
        round_ = WatchedRound(server, None, me, NODES, lambda result: None)
        round_.conn = Conn(server, clone=False)
        job = protocol.state(round_)
        job.still, job.chain = True, 1
        rounds.append(round_)
    try:
        # Wave 1 is node 1's, wave 2 node 2's, wave 3 node 0's: never the same node twice. The
        # judge completes the count after wave 1 and dies before it judges.
        for wave in range(1, 4):
            for me in ((wave + k) % NODES for k in range(NODES)):
                hangverdict._wave(watch, rounds[me], 1)  # type: ignore[arg-type]
            if wave == 1:
                assert judged == []  # the count was not complete
                conn.set(hangverdict.STILLS_KEY, str(NODES).encode())
            if judged:
                break
        # Complete at wave 2 (given to a judge still at work), unjudged at wave 3: judged then,
        # by that wave's first node (before, by nobody until wave 4's check of every post).
        assert judged == [(3, 0, NODES)], judged
        assert watch.notes == []
    finally:
        for round_ in rounds:
            assert round_.conn is not None
            round_.conn.close()
        conn.close()

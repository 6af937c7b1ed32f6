"""numarun.rendezvous.waiting: what a node waiting in the rendezvous says, read from a stand-in
of torch's handler state (its participants, as torch's handler last read them)."""

from __future__ import annotations

import io
import sys
from types import SimpleNamespace

import pytest

from numarun.cmdline.config import parse_args
from numarun.rendezvous.waiting import CONNECTING, IMPORTING, JOINING, Waiting

WHERE = "c10d rendezvous 'job42' at node0:29400"


class Node:
    """torch's ``_NodeDesc``: hashable, an address and a pid."""

    def __init__(self, addr: str, pid: int) -> None:
        self.addr, self.pid = addr, pid


def _waiting(nnodes: str = "2") -> Waiting:
    config = parse_args(["--nnodes", nnodes, "--rdzv-backend", "c10d", "--rdzv-endpoint",
                         "node0:29400", "--rdzv-id", "job42", "train.py"])  # fmt: skip
    return Waiting(config, WHERE)


def _handler(me: Node, participants: list[Node], complete: bool = False) -> SimpleNamespace:
    state = SimpleNamespace(participants=dict.fromkeys(participants, 0), complete=complete)
    return SimpleNamespace(_state_holder=SimpleNamespace(state=state), _this_node=me)


def test_before_torchs_handler_reads_the_state_the_line_says_what_this_node_does() -> None:
    waiting = _waiting()
    waiting.begin(IMPORTING)
    assert waiting.describe() == "this node is importing torch's rendezvous"
    waiting.doing = CONNECTING
    assert waiting.describe() == f"this node is {CONNECTING}"
    me = Node("node1", 7)
    waiting.handler = _handler(me, [])  # joining, torch's handler not synced yet
    waiting.doing = JOINING
    assert waiting.describe() == "this node is joining"


def test_joining_names_who_is_there_and_how_many_more_are_awaited() -> None:
    waiting = _waiting("3")
    me = Node("node1", 7)
    waiting.handler = _handler(me, [me, Node("node0", 9)])
    waiting.begin(JOINING)
    assert waiting.describe() == (
        "2 of 3 node(s) there (node0 pid 9, node1 pid 7), 1 more awaited"
    )
    status = waiting.status()
    assert status["there"] == ["node0 pid 9", "node1 pid 7"] and status["awaited"] == 1
    many = [Node(f"n{i}", i) for i in range(6)]
    waiting.handler = _handler(me, many)
    assert waiting.describe() == (
        "6 of 3 node(s) there (n0 pid 0, n1 pid 1, n2 pid 2, n3 pid 3 and 2 more), 0 more awaited"
    )


def test_a_complete_round_is_taken_or_waited_for_as_a_spare() -> None:
    waiting = _waiting("1:2")
    me, other = Node("node1", 7), Node("node0", 9)
    waiting.handler = _handler(me, [me, other], complete=True)
    waiting.begin(JOINING)
    assert waiting.describe().endswith("; taking its place")
    waiting.handler = _handler(me, [other, Node("node2", 3)], complete=True)
    assert waiting.describe() == (
        "the round is complete with 2 node(s) (node0 pid 9, node2 pid 3); this node waits "
        "as a spare"
    )


def test_a_hostile_address_is_escaped_and_cut() -> None:
    waiting = _waiting()
    me = Node("evil\x1b[2J" + "x" * 500, 1)
    waiting.handler = _handler(me, [me])
    waiting.begin(JOINING)
    line = waiting.describe()
    assert "\x1b" not in line and len(line) < 200


def test_lines_every_ten_seconds_and_the_status_on_each_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [100.0]
    monkeypatch.setattr("numarun.rendezvous.waiting.time.monotonic", lambda: clock[0])
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    seen: list[dict | None] = []
    waiting = _waiting()
    waiting.on_change = seen.append
    waiting.begin(IMPORTING)
    for _ in range(25):  # 25 ticks of a second
        clock[0] += 1.0
        waiting.tick()
    lines = err.getvalue().splitlines()
    assert lines == [
        f"numarun: waiting {s} s for the {WHERE}: this node is importing torch's rendezvous"
        for s in (10, 20)
    ]
    assert len(seen) == 1 and seen[0] is not None and seen[0]["doing"] == IMPORTING
    me = Node("node1", 7)
    waiting.handler = _handler(me, [me])
    waiting.doing = JOINING
    waiting.tick()
    assert seen[-1] is not None and seen[-1]["there"] == ["node1 pid 7"]
    waiting.tick()
    assert len(seen) == 2  # unchanged: not handed again
    waiting.end()
    assert seen[-1] is None


def test_a_failing_status_hook_is_dropped_not_raised() -> None:
    waiting = _waiting()

    def broken(status: dict | None) -> None:
        raise OSError("disk full")

    waiting.on_change = broken
    waiting.begin(IMPORTING)
    waiting.tick()
    assert waiting.on_change is None

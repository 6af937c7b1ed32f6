"""numarun.rendezvous.torchcompat: what numarun needs of torch's private names, read as each torch
release has them; a torch that lacks an optional one keeps working, a missing required one is
one line.

Run in the test process, against the torch pytest runs with. The launches without torch's names,
by a real launcher under any torch (``NUMARUN_TEST_TORCH_PYTHON``), are in
``tests/e2e/test_jobwide_jobs.py``.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import pytest

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
dist = pytest.importorskip("torch.distributed")

from numarun.rendezvous import torchcompat  # noqa: E402
from numarun.rendezvous.storeops import Conn  # noqa: E402


@pytest.mark.parametrize(
    ("version", "release"),
    [("2.4.1+cu121", (2, 4)), ("2.15.0", (2, 15)), ("2.16.0a0+git1234", (2, 16)),
     ("10.0", (10, 0)), ("unknown", None), ("2", None)],
)  # fmt: skip
def test_torch_releases_are_read_from_any_version_string(
    version: str, release: tuple[int, int] | None
) -> None:
    from numarun.rendezvous import torchcompat

    assert torchcompat.torch_release(version) == release


class _Info:
    def __init__(self, rank: int, store: object, addr: str = "node0", port: int = 1234) -> None:
        from types import SimpleNamespace

        self.rank = rank
        self.store = store
        self.bootstrap_store_info = SimpleNamespace(master_addr=addr, master_port=port)


class _Handler:
    def __init__(self, shared: bool) -> None:
        self.use_agent_store = shared


def test_the_workers_store_follows_torchs_handler_in_each_case(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Not shared (torch 2.4, etcd): exactly what torch's handler built for the round. Shared
    # (2.5 on): the store torch's handler gives rank 0, published again under torch's own keys
    # every round and read back by every node, so a node that joins later (or a torchrun node)
    # gets the same one.
    from datetime import timedelta

    from torch.distributed import TCPStore

    from numarun.rendezvous import torchcompat

    def store_of(shared: bool, rank: int, first: bool = True, **info: Any) -> tuple:
        return torchcompat.workers_store(
            _Handler(shared), _Info(rank, store, **info), first_round=first, local_addr="10.1.2.3"
        )

    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10))
    assert store_of(False, 1) == ("node0", 1234, False)
    assert not store.check(["MASTER_ADDR"])
    assert store_of(True, 0) == ("node0", 1234, True)
    assert store.get("MASTER_PORT") == b"1234"
    # Another node whose own (first-round) idea differs reads rank 0's.
    assert store_of(True, 1, addr="stale", port=1) == ("node0", 1234, True)
    # A later round where torch cannot empty its store: a fresh one, hosted here.
    with monkeypatch.context() as patch:
        patch.setattr(torchcompat, "can_clear_worker_store", lambda: False)
        addr, port, shared = store_of(True, 0, first=False)
    assert (addr, shared) == ("10.1.2.3", True) and port != 1234
    client = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
    client.set("k", "v")  # a store really listens there
    assert store_of(True, 1, first=False) == (addr, port, True)


def test_a_rejoin_without_torchs_delay_or_state_cache_is_torchs_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    from numarun.rendezvous import torchcompat

    class Handler:  # no _state_holder: nothing to speed up
        def next_rendezvous(self) -> str:
            return "joined"

    monkeypatch.delattr(dynamic_rendezvous, "_delay")
    assert torchcompat.rejoin(Handler()) == "joined"
    assert not hasattr(dynamic_rendezvous, "_delay")  # nothing put in its place


def test_torchs_timeout_is_recognised_by_its_type(monkeypatch: pytest.MonkeyPatch) -> None:
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=5))  # fmt: skip
    conn = Conn(dist.PrefixStore("p", server))
    assert conn.wait(["never"], 0.05) is False  # DistStoreError: a timeout
    with pytest.raises(Exception) as caught:
        server.wait(["never"], timedelta(seconds=0.05))
    assert torchcompat.is_store_timeout(caught.value)
    assert not torchcompat.is_store_timeout(dist.DistNetworkError("Connection reset: timeout"))
    assert not torchcompat.is_store_timeout(RuntimeError("Wait timeout"))  # not the type
    # A torch without the type: its message, on RuntimeError only.
    monkeypatch.delattr(dist, "DistStoreError")
    assert torchcompat.store_timeout_type() is None
    assert torchcompat.is_store_timeout(RuntimeError("Wait timeout after 50ms"))
    assert torchcompat.is_store_timeout(RuntimeError("Socket Timeout"))
    assert not torchcompat.is_store_timeout(RuntimeError("Connection reset by peer"))
    assert not torchcompat.is_store_timeout(ValueError("timeout"))


# --- the first round, noticed sooner -------------------------------------------------------------


@pytest.mark.parametrize(
    ("nodes", "pause"), [(1, 0.05), (2, 0.05), (30, 0.3), (100, None), (5000, None)]
)
def test_a_first_join_polls_faster_the_fewer_nodes_may_wait(
    monkeypatch: pytest.MonkeyPatch, nodes: int, pause: float | None
) -> None:
    # torch waits a second between reads of the rendezvous state (and caches it for a second):
    # a node that waited for a late one goes on up to a second after the round is complete.
    # numarun reads every nodes/100 s (at least 0.05 s): at most ~100 reads a second in all.
    # torch's random spread of the first joins stays, but for a job of one node (nobody to
    # spread from).
    pytest.importorskip("torch")
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    from numarun.rendezvous import torchcompat

    slept: list[object] = []
    monkeypatch.setattr(dynamic_rendezvous, "_delay", slept.append)

    class Holder:
        _cache_duration = 1

    class Handler:
        _state_holder = Holder()

        def next_rendezvous(self) -> str:
            dynamic_rendezvous._delay((0, 0.3))  # torch's spread of the first joins
            seen.append(self._state_holder._cache_duration)
            dynamic_rendezvous._delay(1)  # between two reads of the state
            return "joined"

    seen: list[object] = []
    assert torchcompat.first_join(Handler(), nodes) == "joined"
    spread = [] if nodes == 1 else [(0, 0.3)]
    assert slept == [*spread, 1 if pause is None else pause]
    assert seen == [1 if pause is None else pause]
    assert dynamic_rendezvous._delay == slept.append  # torch's own back
    assert Handler._state_holder._cache_duration == 1

"""numarun.rendezvous.storeops: numarun's connection to a round's store. A value in the store
that is not what numarun wrote is named (``Forged``) and never closes torch's own connection."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
dist = pytest.importorskip("torch.distributed")

from numarun.rendezvous.storeops import Conn, Forged  # noqa: E402


def test_a_forged_value_does_not_close_torchs_connection() -> None:
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=5))  # fmt: skip
    client = dist.PrefixStore("p", dist.TCPStore("127.0.0.1", server.port, is_master=False,
                                                 wait_for_workers=False))  # fmt: skip
    client.set("numarun/nodes", "abc")
    conn = Conn(client)
    with pytest.raises(Forged):
        conn.add("numarun/nodes", 1)
    assert client.add("other", 1) == 1  # torch's own connection still works
    assert conn.add("other", 1) == 2  # and numarun's was made again


def test_keys_that_never_come_cost_a_few_requests_not_one_per_key() -> None:
    # The sim's finding: a read of many keys of which some never come (a poster that died, ids
    # made up by another client) read each key alone, two requests per key: at 208 ms a round
    # trip (torch's traffic at 1,024 nodes) 64 keys kept the store thread from its heartbeat
    # past the silence limit, and every node took the busy one for gone.
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from jobwide_standins import CountingStore, Tally

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=5))  # fmt: skip
    tally = Tally()
    store = CountingStore(dist.PrefixStore("p", dist.TCPStore(
        "127.0.0.1", server.port, is_master=False, wait_for_workers=False)), tally)  # fmt: skip
    conn = Conn(store)
    keys = [f"k/{n}" for n in range(64)]
    absent = {"k/5", "k/40"}
    for key in keys:
        if key not in absent:
            conn.set(key, key.encode())
    before = tally.snapshot()["requests"]
    values = conn.get_many(keys, 0.05)
    assert tally.snapshot()["requests"] - before <= 34  # a wait, 32 checks at most, one read
    assert [key for key, value in zip(keys, values, strict=True) if value is None] == sorted(
        absent, key=keys.index
    )
    assert all(value == key.encode() for key, value in zip(keys, values, strict=True) if value)

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

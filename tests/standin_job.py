"""N node stand-ins running the launcher's own classes on one real torch TCPStore
(``benchmarks/jobwide_standins.py``), for the tests of the whole-job protocol
(``tests/jobwide/test_protocol.py``) and of the store thread
(``tests/rendezvous/test_storewatch.py``). Needs torch: import it after ``pytest.importorskip``."""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import jobwide_standins as js
from numarun.stacks import merge

LIMIT = 60.0  # seconds any event may take on a loaded machine (it takes milliseconds)
INTERVAL = 0.2  # the stand-ins' look interval


class Job:
    """``count`` stand-ins on one real store; :meth:`until` runs their loop until ``done``."""

    def __init__(self, count: int, store_factory: Callable[[], object] | None = None) -> None:
        self.server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                    timeout=timedelta(seconds=60))  # fmt: skip
        self.tally = js.Tally()
        self.host = js.LoopHost()
        make = store_factory or (lambda: js.connect(self.server.port, self.tally))
        self.nodes = [js.StandIn(self.host, make(), i, count, interval=INTERVAL)
                      for i in range(count)]  # fmt: skip
        for node in self.nodes:
            node.register()
        for node in self.nodes:
            node.watch()
        self.raw = dist.PrefixStore(js.PREFIX, dist.TCPStore(
            "127.0.0.1", self.server.port, is_master=False, wait_for_workers=False))  # fmt: skip

    def until(self, done: Callable[[], bool], limit: float = LIMIT) -> None:
        assert self.host.run_until(done, limit), "not within the limit"

    def run_for(self, seconds: float) -> None:
        self.host.run_until(lambda: False, seconds)

    def close(self) -> None:
        for node in self.nodes:
            node.close()


def ask_and_read(job: Job, asker: int = 0) -> merge.JobView:
    before = len(job.nodes[asker].replies)
    job.nodes[asker].ask()
    job.until(lambda: len(job.nodes[asker].replies) > before)
    reply = job.nodes[asker].replies[-1]
    assert "view" in reply, reply
    view, inline = merge.read_view(reply["view"].encode(), limit=1 << 26)
    view.add_posts(inline)
    view.resolve()
    return view


def lost(job: Job) -> list[str]:
    return [n.stop_reason() or "" for n in job.nodes if "rendezvous" in (n.stop_reason() or "")]

"""N node stand-ins running the launcher's own classes on one real torch TCPStore
(``benchmarks/jobwide_standins.py``), for the tests of the whole-job protocol
(``tests/jobwide/test_protocol.py``) and of the store thread
(``tests/rendezvous/test_storewatch.py``). Needs torch: import it after ``pytest.importorskip``."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import jobwide_standins as js
from numarun.stacks import merge

LIMIT = 60.0  # seconds any event may take on a loaded machine (it takes milliseconds)
INTERVAL = 0.2  # the stand-ins' look interval


class FaultyStore(dist.Store):
    """A store in front of another whose calls on numarun's keys fail while ``faults["mode"]``
    says so: ``"refuse"`` (a ``RuntimeError`` at once) or ``"timeout"`` (torch's timeout, after
    the wait asked for, at most a second); torch's own keys are served. Clones share
    ``faults``."""

    def __init__(self, inner: object, faults: dict) -> None:
        super().__init__()
        self._inner = inner
        self._faults = faults

    def _check(self, keys: str | list[str], seconds: float = 0.0) -> None:
        mode = self._faults.get("mode")
        names = [keys] if isinstance(keys, str) else keys
        if mode is None or not any(name.startswith("numarun/") for name in names):
            return
        if mode == "timeout":
            time.sleep(min(seconds, 1.0))
            raise dist.DistStoreError("injected: the store timed out")
        raise RuntimeError("injected: the store refuses numarun's keys")

    def set(self, key: str, value: object) -> None:
        self._check(key)
        self._inner.set(key, value)  # type: ignore[attr-defined]

    def get(self, key: str) -> bytes:
        self._check(key)
        return self._inner.get(key)  # type: ignore[attr-defined]

    def add(self, key: str, amount: int) -> int:
        self._check(key)
        return self._inner.add(key, amount)  # type: ignore[attr-defined]

    def check(self, keys: list[str]) -> bool:
        self._check(keys)
        return self._inner.check(keys)  # type: ignore[attr-defined]

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._check(keys, timeout.total_seconds() if timeout else 1.0)
        self._inner.wait(keys, timeout) if timeout else self._inner.wait(keys)  # type: ignore[attr-defined]

    def delete_key(self, key: str) -> bool:
        return self._inner.delete_key(key)  # type: ignore[attr-defined]

    def compare_set(self, key: str, expected: object, desired: object) -> bytes:
        self._check(key)
        return self._inner.compare_set(key, expected, desired)  # type: ignore[attr-defined]

    def append(self, key: str, value: object) -> None:
        self._check(key)
        self._inner.append(key, value)  # type: ignore[attr-defined]

    def multi_get(self, keys: list[str]) -> list[bytes]:
        self._check(keys)
        return self._inner.multi_get(keys)  # type: ignore[attr-defined]

    def has_extended_api(self) -> bool:
        return self._inner.has_extended_api()  # type: ignore[attr-defined]

    def clone(self) -> FaultyStore:
        return FaultyStore(self._inner.clone(), self._faults)  # type: ignore[attr-defined]

    def set_timeout(self, timeout: timedelta) -> None:
        self._inner.set_timeout(timeout)  # type: ignore[attr-defined]


class Job:
    """``count`` stand-ins on one real store; :meth:`until` runs their loop until ``done``.
    ``faults``: the stand-ins' stores are :class:`FaultyStore` s sharing that dictionary;
    ``standin``: keyword arguments of each :class:`jobwide_standins.StandIn`."""

    def __init__(self, count: int, store_factory: Callable[[], object] | None = None,
                 faults: dict | None = None, **standin: object) -> None:  # fmt: skip
        self.server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                    timeout=timedelta(seconds=60))  # fmt: skip
        self.tally = js.Tally()
        self.host = js.LoopHost()
        make = store_factory or (lambda: js.connect(self.server.port, self.tally))
        if faults is not None:
            plain = make
            make = lambda: FaultyStore(plain(), faults)  # noqa: E731
        standin.setdefault("interval", INTERVAL)
        self.nodes = [js.StandIn(self.host, make(), i, count, **standin)  # type: ignore[arg-type]
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


def rss_mib() -> float:
    """This process's resident memory, MiB (the stand-ins, their threads and the store)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0

"""Test-only fault injection into a numarun launcher: on ``PYTHONPATH`` for the tests of
``tests/e2e/test_jobwide_faults.py`` only, armed by ``NUMARUN_TEST_FAULTS`` (a comma list; each
launcher of a test's job gets its own). Nothing of numarun reads that variable: the faults are
patched into numarun's modules as they load (an import hook), so a worker, which never imports
them, is untouched.

* ``raise``: every call the node makes into the whole-job view (``JobNotices``'s methods, the hang
  marks, the ``numarun stacks`` hook) and the codecs it uses (digests, merge, views) raise
  ``RuntimeError("injected fault in <name>")``.
* ``refuse``: every store call numarun makes on its own keys (through
  ``numarun.rendezvous.storeops.Conn``) raises, as a store that refuses them; ``timeout``: each
  takes a moment and raises torch's store timeout (``DistStoreError``).
* ``count=PATH``: each store request numarun makes counted by call and its first key's family
  (``numarun/event/7`` is ``numarun/event``), rewritten to PATH as JSON after each call.
* ``kill-judge``: the launcher SIGKILLs itself the moment its still count says every node is
  still, before it judges (the merging node dies after its count completed).
* ``late-register=SECONDS``: the node says it is a numarun node SECONDS after the round formed.
* ``diag-refused``: the node that hosts the round's diagnostics store publishes the address of a
  port nobody listens on (``--diagnostics-store own``): every node's connection is refused.
"""

from __future__ import annotations

import importlib.abc
import json
import os
import sys
import threading
import time

_FAULTS = dict(
    (item.partition("=")[0], item.partition("=")[2])
    for item in os.environ.get("NUMARUN_TEST_FAULTS", "").split(",")
    if item
)
_LOCK = threading.Lock()
_COUNTS: dict[str, int] = {}


def _injected(name: str) -> object:
    def raiser(*args: object, **kwargs: object) -> object:
        raise RuntimeError(f"injected fault in {name}")

    return raiser


class _StoreFaults:
    """A store numarun's ``Conn`` talks to: torch's, with the faults armed in front."""

    _PASS = ("has_extended_api", "clone", "set_timeout", "timeout")

    def __init__(self, inner: object) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        attr = getattr(self._inner, name)
        if name in self._PASS or not callable(attr):
            return attr

        def call(*args: object, **kwargs: object) -> object:
            key = args[0] if args else ""
            keys = key if isinstance(key, list) else [key]
            _count(name, [str(k) for k in keys])
            if "refuse" in _FAULTS:
                raise RuntimeError(f"injected: the store refuses numarun's {name}")
            if "timeout" in _FAULTS:
                import torch.distributed as dist

                seconds = 0.2
                if name == "wait" and len(args) > 1:
                    seconds = min(2.0, args[1].total_seconds())  # type: ignore[attr-defined]
                time.sleep(seconds)
                raise dist.DistStoreError(f"injected: numarun's {name} timed out")
            return attr(*args, **kwargs)

        return call


def _count(call: str, keys: list[str]) -> None:
    path = _FAULTS.get("count")
    if not path:
        return
    with _LOCK:  # one request, named by its first key's family
        family = "/".join(part for part in (keys or [""])[0].split("/")[:2] if not part.isdigit())
        name = f"{call} {family}"
        _COUNTS[name] = _COUNTS.get(name, 0) + 1
        with open(path + ".tmp", "w") as out:
            json.dump(_COUNTS, out)
        os.replace(path + ".tmp", path)


def _patch_storeops(module: object) -> None:
    if not {"refuse", "timeout", "count"} & set(_FAULTS):
        return
    conn = module.Conn  # type: ignore[attr-defined]
    original = conn._connect

    def _connect(self: object, clone: bool = True) -> None:
        original(self, clone)
        self.store = _StoreFaults(self.store)  # type: ignore[attr-defined]

    conn._connect = _connect


def _patch_notices(module: object) -> None:
    if "raise" not in _FAULTS:
        return
    notices = module.JobNotices  # type: ignore[attr-defined]
    for name in ("on_event", "read_notice", "notice_post", "before_stop", "on_result",
                 "while_waiting", "unwatched", "_failure_dumps", "_ask_job_stacks"):
        setattr(notices, name, _injected(f"JobNotices.{name}"))
    hang_job = module._HangJob  # type: ignore[attr-defined]
    hang_job.still = _injected("the hang mark (still)")
    hang_job.moving = _injected("the hang mark (moving)")


def _patch_codecs(module: object) -> None:
    if "raise" in _FAULTS:
        for name in ("node_digest", "merge", "encode_view", "read_view", "read_digest"):
            if hasattr(module, name):
                setattr(module, name, _injected(name))
    if "kill-judge" in _FAULTS and hasattr(module, "judge"):
        import signal

        def judge(*args: object, **kwargs: object) -> None:
            os.kill(os.getpid(), signal.SIGKILL)

        module.judge = judge  # type: ignore[attr-defined]


def _patch_torchrdzv(module: object) -> None:
    delay = _FAULTS.get("late-register")
    if not delay:
        return
    storeops = sys.modules["numarun.rendezvous.storeops"]
    original = storeops.Conn.add

    def add(self: object, key: str, amount: int) -> int:
        if key.startswith("numarun/nodes") and threading.current_thread().name == (
            "numarun-rendezvous"
        ):
            time.sleep(float(delay))
        return original(self, key, amount)

    storeops.Conn.add = add


def _patch_diagstore(module: object) -> None:
    if "diag-refused" not in _FAULTS:
        return
    import socket

    def publish(self: object, store: object) -> None:
        with socket.socket() as sock:  # bound, then closed: refused
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        store.set(module.ADDRESS_KEY, f"127.0.0.1:{port}".encode())  # type: ignore[attr-defined]

    module.DiagServer.publish = publish  # type: ignore[attr-defined]


_PATCHES = {
    "numarun.rendezvous.diagstore": _patch_diagstore,
    "numarun.rendezvous.storeops": _patch_storeops,
    "numarun.rendezvous.torchrdzv": _patch_torchrdzv,
    "numarun.jobwide.notices": _patch_notices,
    "numarun.jobwide.protocol": _patch_codecs,
    "numarun.jobwide.hangverdict": _patch_codecs,
}


class _Patcher(importlib.abc.MetaPathFinder):
    """Patches each module of :data:`_PATCHES` once it has loaded."""

    def find_spec(self, name: str, path: object, target: object = None) -> object:
        if name not in _PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module: object) -> None:
            run(module)
            _PATCHES[name](module)

        loader.exec_module = exec_module
        return spec


if _FAULTS:
    sys.meta_path.insert(0, _Patcher())

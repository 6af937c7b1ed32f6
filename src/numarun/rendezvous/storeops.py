"""numarun's own calls on the rendezvous store: one connection per round, calls that never wait
on a key another node may delete, counters that a forged value cannot turn into a lost rendezvous.

torch's TCPStore closes a client's connection when that client adds to a key whose value is not a
number (its server's ``stoll`` throws), and every later call on that connection fails. So numarun
never makes its calls on torch's connection (the rendezvous and torch's keep-alive share it): each
round's calls go through a connection of numarun's own (:class:`Conn`, ``Store.clone()``), closed
at the end of the round; a call on it that fails that way is followed by a new connection and a
look at the value: a value that is not a number is named (:class:`Forged`), never taken for a
lost store. Where torch cannot clone a store, numarun uses torch's connection and reads every
counter before it adds to it.

Reads that must not wait: ``get`` of a missing key blocks for the store's whole timeout (a
minute by default). :meth:`Conn.get_now` checks that a key is there before it reads it: numarun
never deletes a key that another node may still read before the round is over (the keys only one
node reads are deleted by that node), so the check cannot be outrun. ``compare_set`` is used for
repairs only: torch's libuv server wakes every client waiting for a key at each ``compare_set``
on it, even one that sets nothing, so a read through it would wake the other nodes' waits for
nothing. A key a ``wait`` returned for is read at once (:meth:`Conn.get_after_wait`): numarun's
own connection has a timeout of :data:`OWN_TIMEOUT` seconds, so even a wait woken for nothing
(a ``compare_set`` of another client's) costs that much at most. torch's timeout is recognised by
its exception type (:func:`numarun.rendezvous.torchcompat.is_store_timeout`).
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable
from datetime import timedelta

from numarun.rendezvous import torchcompat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TypeVar

    T = TypeVar("T")

_COUNT = re.compile(rb"-?[0-9]{1,18}")
OWN_TIMEOUT = 10.0  # seconds a call on numarun's own connection may wait for a key


class Forged(Exception):
    """A key numarun counts with holds something else; ``value`` is what it holds."""

    def __init__(self, key: str, value: bytes) -> None:
        super().__init__(key, value)
        self.key = key
        self.value = value

    def __str__(self) -> str:
        shown = self.value[:40].decode("ascii", "backslashreplace")
        return f"{self.key} holds {shown!r}, not a number (written by another client of the store?)"


def as_count(value: bytes | None) -> int | None:
    """A counter's value (absent: 0), or None when it is not a number numarun could have
    written."""
    if value is None:
        return 0
    if _COUNT.fullmatch(value) is None:
        return None
    return int(value)


def read_count(conn: Conn, key: str, low: int, high: int) -> int | None:
    """A counter within ``[low, high]``, or None (absent, not a number, out of range)."""
    value = as_count(conn.get_now(key))
    return value if value is not None and low <= value <= high else None


class Conn:
    """numarun's connection to one round's store (module docstring). ``base`` is torch's store of
    the round (a ``PrefixStore``); calls go through a clone of it when torch can clone, unless
    ``clone`` is False (one or two calls: every counter is read before it is added to)."""

    def __init__(self, base: Any, *, clone: bool = True,
                 probe: Callable[[], None] | None = None) -> None:  # fmt: skip
        self.base = base
        self.store: Any = None
        self.own = False
        self.extended = False
        # Called before :meth:`reconnect` clones: raises at once when the server is gone
        # (torch's client would retry a refused connection for its whole timeout).
        self.probe = probe
        self._connect(clone)

    @classmethod
    def own_connection(cls, store: Any, probe: Callable[[], None] | None = None) -> Conn:
        """A :class:`Conn` on ``store``, a connection numarun made itself (the diagnostics
        store's client): used as is, as a clone would be; :meth:`reconnect` clones it."""
        conn = cls(store, clone=False, probe=probe)
        conn.own = True
        return conn

    def _connect(self, clone: bool = True) -> None:
        store = None
        if clone and hasattr(self.base, "clone"):
            try:
                store = self.base.clone()
            except Exception:
                store = None
        self.own = store is not None
        if store is not None:
            from datetime import timedelta

            with contextlib.suppress(Exception):  # a store without it keeps torch's timeout
                store.set_timeout(timedelta(seconds=OWN_TIMEOUT))
        self.store = store if store is not None else self.base
        try:
            self.extended = bool(self.store.has_extended_api())
        except Exception:
            self.extended = False

    def close(self) -> None:
        """Drop numarun's connection (torch closes a store's socket with its last reference)."""
        self.store = None

    def reconnect(self) -> None:
        """A new connection of numarun's own; raises what :attr:`probe` or cloning raises
        (the store is gone)."""
        if not self.own:
            raise RuntimeError("no connection of numarun's own to renew")
        if self.probe is not None:
            self.probe()
        self._connect()

    # --- reads ---------------------------------------------------------------------------------

    def get_now(self, key: str) -> bytes | None:
        """``key``'s value, or None when it is absent; never waits for it (module docstring:
        for keys nobody deletes while another node may read them)."""
        if not self.store.check([key]):
            return None
        return bytes(self.store.get(key))

    def has(self, key: str) -> bool:
        """Whether ``key`` is there (one request)."""
        return bool(self.store.check([key]))

    def get_after_wait(self, key: str) -> bytes | None:
        """``key``'s value once a :meth:`wait` for it returned (None: it woke for nothing)."""
        if not self.own:
            return self.get_now(key)  # torch's connection keeps torch's (long) timeout
        try:
            return bytes(self.store.get(key))
        except Exception as error:
            if torchcompat.is_store_timeout(error):
                return None
            raise

    def get_many(self, keys: list[str], seconds: float, probes: int = 32) -> list[bytes | None]:
        """The values of ``keys`` (None: absent): in one request when every key is there within
        ``seconds``; else the keys that are there found by halving (``check`` of each half, at
        most ``probes`` of them; keys still unknown then count as absent) and read together.
        So a few keys that never come (a poster that died, ids another client made up) cost a
        few requests, never one or two per key."""
        if not keys:
            return []
        if not (self.extended and self.own):  # etcd's store, torch's connection: one by one
            return [self.get_now(key) for key in keys]
        if self.wait(keys, seconds):
            found = self._multi_get(keys)
            if found is not None:
                return found
        present: list[str] = []
        pending = [keys]
        while pending and probes > 0:
            group = pending.pop()
            probes -= 1
            if self.store.check(group):
                present += group
            elif len(group) > 1:
                pending += [group[: len(group) // 2], group[len(group) // 2 :]]
        values = dict(zip(present, self._multi_get(present) or [], strict=False))
        return [values.get(key) for key in keys]

    def _multi_get(self, keys: list[str]) -> list[bytes | None] | None:
        if not keys:
            return []
        try:
            return [bytes(value) for value in self.store.multi_get(keys)]
        except Exception as error:  # a key gone meanwhile (woken for nothing): none read
            if not torchcompat.is_store_timeout(error):
                raise
            return None

    def wait(self, keys: list[str], seconds: float) -> bool:
        """True once every key of ``keys`` is there, False after ``seconds``."""
        try:
            self.store.wait(keys, timedelta(seconds=max(0.001, seconds)))
        except Exception as error:
            if torchcompat.is_store_timeout(error):
                return False
            raise
        return True

    def count(self, key: str) -> int:
        """A counter's value (absent: 0); :class:`Forged` when it is not a number."""
        value = self.get_now(key)
        found = as_count(value)
        if found is None:
            assert value is not None
            raise Forged(key, value)
        return found

    # --- writes --------------------------------------------------------------------------------

    def set(self, key: str, value: bytes) -> None:
        self.store.set(key, value)

    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to a counter; its new value. :class:`Forged` when the key holds
        something that is not a number (the connection renewed when the store closed it)."""
        if not self.own:
            self.count(key)  # torch's own connection: never let the server close it
            return int(self.store.add(key, amount))
        try:
            return int(self.store.add(key, amount))
        except Exception as error:
            if torchcompat.is_store_timeout(error):
                raise
            self.reconnect()
            value = self.get_now(key)
            if as_count(value) is None:
                assert value is not None
                raise Forged(key, value) from None
            return int(self.store.add(key, amount))

    def repair(self, key: str, found: bytes, value: int) -> None:
        """Put ``value`` back in a counter that holds ``found`` (unless it changed since; a
        store without ``compare_set``, etcd's: set)."""
        try:
            self.store.compare_set(key, found, str(value).encode())
        except Exception as error:  # a Python store without it: torch says "Not implemented"
            if "not implemented" not in str(error).lower():
                raise
            self.store.set(key, str(value).encode())

    def append(self, key: str, part: str, line: bytes) -> None:
        """Add ``line`` (no newline in it) to the lines under ``key``: in one request with
        torch's ``append``, else as a key of its own, ``key/part``."""
        if self.extended:
            self.store.append(key, line + b"\n")
        else:
            self.store.set(f"{key}/{part}", line)

    def lines(self, key: str, parts: range) -> list[bytes]:
        """The lines :meth:`append` added under ``key`` (``parts``: every part that may have
        one, for a store without ``append``)."""
        if self.extended:
            return [line for line in (self.get_now(key) or b"").split(b"\n") if line]
        found = (self.get_now(f"{key}/{part}") for part in parts)
        return [value for value in found if value]

    def delete(self, key: str) -> None:
        # A store without delete_key, or one going away: nothing to undo.
        with contextlib.suppress(Exception):
            self.store.delete_key(key)


class Woken(Exception):
    """:func:`run_blocking`'s ``wake`` was set before the call ended (it goes on, abandoned)."""


def run_blocking(
    call: Callable[[], T],
    *,
    limit: float | None = None,
    every: float | None = None,
    tick: Callable[[], None] | None = None,
    wake: threading.Event | None = None,
) -> T:
    """``call()`` in a daemon thread; wait here, where signal handlers run (see the module
    docstring). Returns its value or raises its exception; :class:`TimeoutError` after
    ``limit`` seconds (the call goes on in its thread). An exception raised by a signal
    handler while waiting propagates; the call is then abandoned. ``tick()`` is called here
    every ``every`` seconds while the call runs (it must not block). ``wake``: an event that
    another thread may set too (the call's end sets it): :class:`Woken` when it was set and
    the call has not ended."""
    done = wake if wake is not None else threading.Event()
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed to the waiting thread
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=target, name="numarun-rendezvous", daemon=True).start()
    deadline = None if limit is None else time.monotonic() + limit
    while True:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        step = left if every is None else (every if left is None else min(every, left))
        if done.wait(step):
            if wake is not None and not outcome:
                raise Woken()
            break
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"no answer within {limit:g} s")
        if tick is not None:
            tick()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def first_line(error: BaseException) -> str:
    """An error's first line (its type's name when it has no text): what numarun's one-line
    messages quote."""
    text = str(error).strip() or type(error).__name__
    return text.split("\n", 1)[0]


def root_cause(error: BaseException) -> BaseException:
    """The innermost cause: torch wraps store errors in "see inner exception" messages."""
    while error.__cause__ is not None:
        error = error.__cause__
    return error


def store_gone(error: BaseException) -> bool:
    """Whether a store call failed because the store's host is gone (its connection closed or
    refused), not for a timeout or a refusal of torch's."""
    cause = root_cause(error)
    if isinstance(cause, ConnectionError):  # BrokenPipeError, ConnectionResetError, ...
        return True
    # torch's DistNetworkError ("Broken pipe", "Failed to recv, got 0 bytes. Connection was
    # likely closed"); its timeouts are DistStoreError.
    return "Network" in type(cause).__name__ or "closed" in str(cause).lower()


def store_error(error: BaseException) -> str:
    """A store call's failure in words: the store's host gone is said so, never with the
    socket's own text ("Broken pipe", "Failed to recv, got 0 bytes")."""
    if store_gone(error):
        return "its store stopped answering: the node that hosted it ended"
    return first_line(root_cause(error))

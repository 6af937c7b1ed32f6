"""numarun's diagnostics store: a TCPStore of its own per round, away from the rendezvous's.

At a thousand nodes torch's own rendezvous traffic (its keep-alive ``compare_set`` of the whole
pickled state, retried at once) saturates the one TCPStore server the rendezvous endpoint hosts,
and every whole-job diagnostic sharing it (stacks requests, hang marks and verdicts, failure
notices, merges, frames) waited 5-11 s per event (docs/measurements.md, issue 29). So, with
``--diagnostics-store own`` (the default where the rendezvous has a TCPStore: c10d):

- group rank 0 of each round hosts a TCPStore server for that round (:class:`DiagServer`:
  ``is_master=True``, port 0, every interface, ``wait_for_workers=False``) and publishes
  ``ADDR:PORT`` as :data:`ADDRESS_KEY` in the round's rendezvous store (its prefix, as every
  numarun key). ADDR is the address of the interface that reaches the rendezvous endpoint's
  host (:func:`reaching_address`: a UDP socket ``connect()``-ed there, no packet sent), the
  host name only when that fails. The server is closed once the next round formed, or at the
  node's end: a late reader of the old round never meets a refused connection mid-round.
- every node (rank 0 too, as a client) connects in a background thread, ``numarun-connect``
  (:func:`connect_round`): first its own connection to the rendezvous store (the heartbeat's,
  :mod:`numarun.rendezvous.liveness`; until it is made beats go on torch's connection), then
  the address read with a bounded wait (:data:`ADDRESS_WAIT`), checked as untrusted
  (:func:`parse_address`), and two connections to the diagnostics store made within
  :data:`STORM_WINDOW` seconds: first attempts spread over up to :data:`SPREAD` seconds at
  random, retries with jitter (a thousand nodes at once must not overrun the server's accept
  backlog). A refused connection is final for the round.

Until the diagnostics store is connected, and for the whole round if it never is, the whole-job
view is off on this node: one line says why ("whole-job diagnostics unavailable this round"),
and nothing of the view falls back to the rendezvous store (that would bring the saturation
back). Training never depends on it: nothing here raises into the rendezvous.

What stays on the rendezvous store (the rendezvous's own health, sharing its fate):
``numarun/alive/<n>``, ``numarun/nodes``, the exit barrier, and this module's address key.
The store is unauthenticated, as torch's is: anyone who reaches its port can read and write
it; a forged address can at most deny the diagnostics (docs/security.md).
"""

from __future__ import annotations

import contextlib
import ipaddress
import random
import re
import socket
import sys
import time
from datetime import timedelta

from numarun.cmdline.nodes import split_endpoint
from numarun.rendezvous.storeops import OWN_TIMEOUT, Conn, first_line, root_cause

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    StoreWatch = WatchedRound = Any  # storewatch's, which imports this module

ADDRESS_KEY = "numarun/diagstore"
ADDRESS_LIMIT = 300
"""Bytes an address value may have (a host name is at most 253, a port 5, the colon and the
brackets of an IPv6 literal); a longer value is not read further."""
ADDRESS_WAIT = 30.0
"""Seconds a node waits for group rank 0 to publish the address (it does so in its join,
before its own workers start)."""
STORM_WINDOW = 30.0
"""Seconds a node keeps trying to connect to the diagnostics store (a connect storm: every node
of the round at once) before the view is off for the round."""
SPREAD = 1.0
"""Seconds over which the first connection attempts are spread at random, at most."""
PROBE_TIMEOUT = 5.0  # seconds one TCP connection attempt may take (a full backlog drops SYNs)
PENDING = "its store is not connected yet"  # why the view is off while a node connects
UNAVAILABLE = "numarun: whole-job diagnostics unavailable this round: {}; training goes on"

_HOST_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,251}[A-Za-z0-9])?")
_PORT = re.compile(r"[0-9]{1,5}")


class Unavailable(Exception):
    """The diagnostics store cannot be had this round; the message says why (one line)."""


def endpoint_host(endpoint: str) -> str:
    """The host of a rendezvous endpoint (:func:`numarun.cmdline.nodes.split_endpoint`:
    ``HOST``, ``HOST:PORT``, ``[V6]:PORT``); ``localhost`` for an empty one (c10d's default)."""
    return split_endpoint(endpoint)[0] or "localhost"


def reaching_address(host: str, port: int = 9) -> str:
    """The address of this machine's interface that reaches ``host``: a UDP socket
    ``connect()``-ed to it (no packet is sent), then ``getsockname()``; this machine's host
    name when that fails (no route, a name that does not resolve)."""
    try:
        infos = socket.getaddrinfo(host, port, 0, socket.SOCK_DGRAM)
        family, _, _, _, where = infos[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(where)
            address = probe.getsockname()[0]
        if address and not ipaddress.ip_address(address).is_unspecified:
            return str(address)
    except (OSError, ValueError, IndexError):
        pass
    return socket.gethostname()


def format_address(host: str, port: int) -> str:
    """``HOST:PORT`` (``[V6]:PORT`` for an IPv6 literal)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_address(value: bytes | None) -> tuple[str, int]:
    """``(host, port)`` from an address value read from the store (untrusted): ASCII, at most
    :data:`ADDRESS_LIMIT` bytes, ``HOST:PORT`` with a host name or an IP literal (IPv6 in
    brackets) and a port from 1 to 65535. :class:`Unavailable` naming what is wrong, before any
    connection is tried, otherwise."""
    if value is None:
        raise Unavailable(f"{ADDRESS_KEY} is not there")
    if len(value) > ADDRESS_LIMIT:
        raise Unavailable(f"{ADDRESS_KEY} holds {len(value)} bytes, not an address "
                          "(another client of the store?)")  # fmt: skip
    try:
        text = value.decode("ascii")
    except UnicodeDecodeError:
        raise Unavailable(f"{ADDRESS_KEY} holds non-ASCII bytes, not an address "
                          "(another client of the store?)") from None  # fmt: skip
    shown = text[:60].encode("unicode_escape").decode("ascii")
    host, sep, port_text = text.rpartition(":")
    bad = Unavailable(f"{ADDRESS_KEY} holds {shown!r}, not HOST:PORT (another client of the "
                      "store?)")  # fmt: skip
    if not sep or _PORT.fullmatch(port_text) is None:
        raise bad
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise Unavailable(f"{ADDRESS_KEY} names port {port}, not from 1 to 65535 (another "
                          "client of the store?)")  # fmt: skip
    if host.startswith("[") and host.endswith("]"):
        try:
            return str(ipaddress.IPv6Address(host[1:-1])), port
        except ValueError:
            raise bad from None
    if re.fullmatch(r"[0-9.]+", host):
        try:
            return str(ipaddress.IPv4Address(host)), port
        except ValueError:
            raise bad from None
    if _HOST_NAME.fullmatch(host) is None or ".." in host:
        raise bad
    return host, port


class DiagServer:
    """The diagnostics store's server for one round, hosted by its group rank 0 (module
    docstring). ``address`` is what the clients connect to."""

    def __init__(self, endpoint: str, *, address: str | None = None) -> None:
        from torch.distributed import TCPStore

        host = address or reaching_address(endpoint_host(endpoint))
        self._store: Any = TCPStore(
            host, 0, is_master=True, wait_for_workers=False,
            timeout=timedelta(seconds=OWN_TIMEOUT),
        )  # fmt: skip
        self.address = format_address(host, int(self._store.port))

    def publish(self, store: Any) -> None:
        """Set the address in the round's rendezvous ``store`` (its round's prefix)."""
        store.set(ADDRESS_KEY, self.address.encode("ascii"))

    def close(self) -> None:
        """Stop serving (torch closes the server's socket with the last reference)."""
        self._store = None


def connect(host: str, port: int, *, window: float = STORM_WINDOW, spread: float = SPREAD,
            rng: random.Random | None = None, sleep: Callable[[float], None] = time.sleep,
            ) -> Any:  # fmt: skip
    """A client of the diagnostics store at ``host:port``: the first attempt after a random
    delay of up to ``spread`` seconds, then retries with jitter until ``window`` seconds
    passed. A refused connection is final (:class:`Unavailable` at once: nobody listens
    there); so is the window's end. Each attempt is a plain TCP connection first (torch's own
    client retries a refused connection for its whole timeout), then torch's client with a
    bounded timeout."""
    from torch.distributed import TCPStore

    rng = rng or random.Random()
    deadline = time.monotonic() + window
    sleep(rng.uniform(0.0, max(0.0, spread)))
    pause = 0.1
    last = "no attempt"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Unavailable(f"could not connect to its store at {format_address(host, port)} "
                              f"within {window:g} s ({last})")  # fmt: skip
        try:
            with socket.create_connection((host, port), timeout=min(PROBE_TIMEOUT, left)):
                pass
            timeout = timedelta(seconds=max(1.0, min(OWN_TIMEOUT, left)))
            return TCPStore(host, port, is_master=False, wait_for_workers=False, timeout=timeout)
        except ConnectionRefusedError:
            raise Unavailable(f"its store at {format_address(host, port)} refused the "
                              "connection") from None  # fmt: skip
        except socket.gaierror as error:
            raise Unavailable(f"its store's host {host!r} is unknown ({error.strerror})") from None
        except Exception as error:  # a timeout, a reset: a storm, retried
            last = f"{type(root_cause(error)).__name__}: {first_line(root_cause(error))}"
        sleep(min(rng.uniform(0.5, 1.5) * pause, max(0.0, deadline - time.monotonic())))
        pause = min(2.0, pause * 2)


def still_served(host: str, port: int, timeout: float = PROBE_TIMEOUT) -> None:
    """Raise :class:`Unavailable` unless something accepts a TCP connection at
    ``host:port`` within ``timeout`` seconds: the diagnostics store's host (group rank 0's
    launcher) may be gone, and a reconnect's clone would retry for torch's whole timeout
    (10 s) in the thread that needs it, once per call."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return
    except OSError as error:
        raise Unavailable(f"its store at {format_address(host, port)} went away "
                          f"({type(error).__name__}: {error.strerror or error})") from None


def error_topic(own: bool, topic: str, error: BaseException) -> str:
    """The topic a line about ``error`` is said under (once per round and topic): with a store
    of its own (``own``), every connection error on it is one topic, since once its host is
    gone every later call fails alike, and a thousand lines per node would say nothing more."""
    cause = root_cause(error)
    gone = isinstance(cause, (OSError, Unavailable)) or type(cause).__name__ == "DistNetworkError"
    return "the diagnostics store's connection" if own and gone else topic


def read_address(conn: Conn, wait: float = ADDRESS_WAIT) -> tuple[str, int]:
    """The diagnostics store's address from the round's rendezvous store through ``conn``,
    waited for at most ``wait`` seconds, checked (:func:`parse_address`)."""
    if not conn.wait([ADDRESS_KEY], wait):
        raise Unavailable(f"its address ({ADDRESS_KEY}) was not published within {wait:g} s")
    # A forged value of any size is read once and refused by its length (the store holds it
    # whole already; nothing here grows with it after that).
    return parse_address(conn.get_now(ADDRESS_KEY))


class Connected:
    """What :func:`connect_round` made: ``health`` (the heartbeat's connection to the rendezvous
    store, None when it could not be made), ``events`` and ``posts`` (two connections to the
    diagnostics store, None when unavailable), ``why`` (the one line's reason then)."""

    def __init__(self) -> None:
        self.health: Conn | None = None
        self.events: Conn | None = None
        self.posts: Conn | None = None
        self.store: Any = None
        self.why: str | None = None


def connect_round(rendezvous_store: Any, *, spread: float = SPREAD,
                  window: float = STORM_WINDOW, address_wait: float = ADDRESS_WAIT,
                  active: Callable[[], bool] = lambda: True,
                  unreachable: Callable[[], None] = lambda: None) -> Connected:  # fmt: skip
    """In the ``numarun-connect`` thread: the connections of one round (module docstring).
    Never raises: what fails is in :attr:`Connected.why`. ``active()`` False: the round is
    over, nothing more is tried. ``unreachable()`` is called each time a probe before a
    reconnect finds nothing listening at the store's address (its host may be gone)."""
    made = Connected()
    rng = random.Random()
    time.sleep(rng.uniform(0.0, max(0.0, spread)))
    try:
        made.health = Conn(rendezvous_store)
        if not made.health.own:  # torch cannot clone: the address read on torch's connection
            made.health = None
        reader = made.health or Conn(rendezvous_store, clone=False)
        if not active():
            made.why = "the round ended first"
            return made
        host, port = read_address(reader, address_wait)
        if reader is not made.health:
            reader.close()
        client = connect(host, port, window=window, spread=0.0, rng=rng)
        made.store = client

        def probe() -> None:  # before a reconnect: a host that went away fails at once
            try:
                still_served(host, port)
            except Unavailable:
                unreachable()
                raise

        made.events = Conn.own_connection(client, probe)
        made.posts = Conn(client, probe=probe)  # a clone: a second connection, the posts' turn
    except Unavailable as why:
        made.why = str(why)
    except Exception as error:
        cause = root_cause(error)
        made.why = f"{type(cause).__name__}: {first_line(cause)}"
    if made.why is not None:
        made.events = made.posts = made.store = None
    return made


def connecting(watch: StoreWatch, round_: WatchedRound) -> None:
    """The ``numarun-connect`` thread of a round whose view has a store of its own
    (:func:`connect_round`); the connections are handed to the round's store thread through
    :meth:`StoreWatch.queue`, the one line said when there are none."""
    def unreachable() -> None:
        round_.diag_host_unreachable = True

    made = connect_round(round_.store, active=lambda: round_.active, unreachable=unreachable)

    def take(current: WatchedRound) -> None:
        if current is not round_ or not round_.active:
            return  # the round is over: its connections go with this closure
        round_.health = made.health
        with watch.lock:  # StoreWatch.post defers a post under it while this node connects
            deferred, round_.deferred = round_.deferred, []
            if made.events is None:
                round_.diag_why = made.why
            else:
                round_.diag_store, round_.poster = made.store, made.posts
                round_.diag_why = None
                round_.conn = made.events
        if made.events is None:
            say_unavailable(round_)
            return
        for calls, what in deferred:  # the posts made while it connected, in order
            watch.post(round_, calls, what)

    watch.queue(take)


def say_unavailable(round_: WatchedRound) -> None:
    """One line, once per round: the whole-job view is off on this node, and why."""
    if "diagstore" in round_.noted:
        return
    round_.noted.add("diagstore")
    from numarun.stacks.digest import printable

    _say(printable(round_.view_off() or round_.diag_why or "its store is not connected"))


def _say(why: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(UNAVAILABLE.format(why) + "\n")
        sys.stderr.flush()


def host_round(previous: DiagServer | None, info: Any, own: bool,
               endpoint: str) -> DiagServer | None:  # fmt: skip
    """In the joining thread, once a round formed (``info``: torch's result, its ``rank`` and
    ``store``): ``previous`` (the last round's server) closed, every node having left that
    round; on group rank 0 with ``own``, this round's hosted and its address published (the
    server returned). What fails is one line: the others then find no address and say so;
    training goes on."""
    if previous is not None:
        previous.close()
    if not own or info.rank != 0:
        return None
    try:
        server = DiagServer(endpoint)
        server.publish(info.store)
    except Exception as error:
        cause = root_cause(error)
        _say(f"its store could not be hosted here ({type(cause).__name__}: {first_line(cause)})")
        return None
    return server

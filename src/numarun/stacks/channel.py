"""The running jobs of one user on this host, and the private channel ``numarun stacks`` uses.

Each launcher (and each :func:`numarun.spawn` parent) that takes stacks listens on a Unix
socket ``<runtime dir>/<pid>-<random>.sock``. The runtime directory is per user:
``$XDG_RUNTIME_DIR/numarun`` when ``XDG_RUNTIME_DIR`` is set, else ``/tmp/numarun-<uid>``;
the client looks in both, so a job is found from a session with or without that variable.
``$NUMARUN_RUNTIME_DIR`` names one directory to use instead, for jobs and client alike.
The directory is made with mode 0700 and checked before every use without following symbolic
links: it must be a real directory owned by the effective user with no permission bits for
group or others, else it is refused with one line (another user who made
``/tmp/numarun-<uid>`` first can deny the service, never read or trigger anything). The
socket is 0600 too, and the server reads the peer's credentials (``SO_PEERCRED``) before it
reads a byte: a peer whose uid is not the launcher's effective uid (root included) is
disconnected without an answer. No other user can list jobs, read stacks or make numarun
signal anything.

Protocol: one request line of JSON, ``{"op": "info"}`` or ``{"op": "stacks"}`` (with ``"scope":
"job"``: every node of a job on a torch rendezvous, see :mod:`numarun.stacks.jobstacks`); one
reply line of JSON; the connection is closed. The server runs inside the supervisor's loop
(:meth:`Supervisor.add_reader`), every connection non-blocking with a deadline, a bound on its
request and on how many are served at once (:class:`JobServer`): a client never blocks the loop,
and neither do the dumps (taken from the loop's timers, :meth:`RankDumps.take_async`). A socket
whose launcher died (nothing listens: ``ECONNREFUSED``) is stale; the client removes it and its
dump directory. Names carry a random part, so a stale name is never reused by a new job.
"""

from __future__ import annotations

import _socket
import os
import stat
import sys
import time

from numarun.errors import NumarunError, UsageError, suppress
from numarun.stacks.dumps import RUNTIME_DIR_ENV, runtime_dir, runtime_dirs  # noqa: F401
from numarun.stacks.dumps import check_private as _check_private

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from numarun.process.supervisor import Supervisor

REQUEST_LIMIT = 4096  # bytes of one request line
MAX_CONNECTIONS = 8  # clients served at once; more are closed at once
REQUEST_DEADLINE = 1.0  # seconds from connecting to the end of the request, in all
ANSWER_DEADLINE = 5.0  # seconds for the job to answer (a whole-job request takes up to ~2.5)
REPLY_DEADLINE = 1.0  # seconds for the client to take a small reply once it is ready
REPLY_RATE = 4 * 1024 * 1024  # bytes per second a client is given on top, for a large reply
CLIENT_TIMEOUT = 5.0


class JobsError(NumarunError):
    """``numarun stacks`` found no job, or the job did not answer: exit status 1."""

    exit_code = 1


# --- the launcher's side -------------------------------------------------------------------------


def peer_uid(conn: _socket.socket) -> int:
    """The effective uid of the process at the other end of a connected Unix socket."""
    import struct

    creds = conn.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


class _Connection:
    """One client of a :class:`JobServer`: its socket, what it sent, what waits to be sent, and
    when it is cut off."""

    __slots__ = ("deadline", "outbox", "request", "sent", "sock")

    def __init__(self, sock: _socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.request = b""
        self.outbox: memoryview | None = None
        self.sent = 0


class JobServer:
    """The listening socket of one job, served from the supervisor's loop without ever blocking it.

    ``answer(op, request, reply)`` is called from the loop with the request's ``"op"``
    (``"info"`` or ``"stacks"``) and the whole request object; it calls ``reply(dict)`` once,
    then or later (a whole-job request answers once the other nodes did). Each connection is
    non-blocking and served as its bytes come: at most :data:`MAX_CONNECTIONS` at once (more are
    closed at once), a request of at most :data:`REQUEST_LIMIT` bytes that must arrive within
    :data:`REQUEST_DEADLINE` seconds of the connection in all (not per byte), a reply that must
    be taken within :data:`REPLY_DEADLINE` seconds of being ready plus one second per
    :data:`REPLY_RATE` bytes (a 40 MB reply: 11 s), and :data:`ANSWER_DEADLINE` for the answer
    itself. A reply is sent from a :class:`memoryview` of it, so each send costs what the
    socket takes, never a copy of the rest. A connection past its deadline is closed the next
    time the loop looks at it or at a new connection; one that does not read its reply never
    blocks the loop. So a client that dribbles, idles or never reads costs the job nothing but
    one of the slots.
    """

    def __init__(
        self, directory: str, name: str, answer: Callable[[str, dict, Callable[[dict], None]], None]
    ) -> None:
        from numarun.process import forkexec

        _check_private(directory)
        self.path = os.path.join(directory, f"{name}.sock")
        self._answer = answer
        self._supervisor: Supervisor | None = None
        self._connections: dict[int, _Connection] = {}
        # _socket, not socket: socket.py builds its enums when imported, milliseconds that
        # would be spent while the workers start.
        self._sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            self._sock.bind(self.path)
            os.chmod(self.path, 0o600)
            self._sock.listen(16)
            self._sock.setblocking(False)
        except BaseException:
            self._sock.close()
            with suppress(OSError):
                os.unlink(self.path)
            raise
        forkexec.track(self._sock.fileno())  # forked workers close it

    def fileno(self) -> int:
        return self._sock.fileno()

    def attach(self, supervisor: Supervisor) -> None:
        self._supervisor = supervisor
        supervisor.add_reader(self._sock.fileno(), self._accept)

    def _accept(self) -> None:
        from numarun.process import forkexec

        while True:
            try:
                fd, _ = self._sock._accept()  # close-on-exec, as socket.accept()
            except OSError:  # BlockingIOError: nobody more waits
                return
            try:
                conn = _socket.socket(fileno=fd)
            except OSError:
                os.close(fd)
                continue
            now = time.monotonic()
            self._expire(now)
            try:
                if peer_uid(conn) != os.geteuid() or len(self._connections) >= MAX_CONNECTIONS:
                    conn.close()  # not the owner (not a byte read), or too many at once
                    continue
                conn.setblocking(False)
                forkexec.track(conn.fileno())
                connection = _Connection(conn, now + REQUEST_DEADLINE)
                self._connections[conn.fileno()] = connection
                assert self._supervisor is not None
                self._supervisor.add_reader(conn.fileno(), lambda c=connection: self._read(c))
            except Exception:  # a client's mistake must never end the job
                self._drop(conn)

    def _expire(self, now: float) -> None:
        for connection in list(self._connections.values()):
            if now > connection.deadline:
                self._drop(connection.sock)

    def _drop(self, conn: _socket.socket) -> None:
        from numarun.process import forkexec

        fd = conn.fileno()
        if fd >= 0:
            if self._supervisor is not None:
                self._supervisor.remove_reader(fd)
                self._supervisor.remove_writer(fd)
            self._connections.pop(fd, None)
            forkexec.close_untracked(fd)
        conn.close()

    def _read(self, connection: _Connection) -> None:
        import json

        if time.monotonic() > connection.deadline:
            self._drop(connection.sock)
            return
        try:
            chunk = connection.sock.recv(REQUEST_LIMIT)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(connection.sock)
            return
        connection.request += chunk
        if b"\n" not in connection.request:
            if len(connection.request) >= REQUEST_LIMIT:
                self._drop(connection.sock)
            return
        assert self._supervisor is not None
        self._supervisor.remove_reader(connection.sock.fileno())
        connection.deadline = time.monotonic() + ANSWER_DEADLINE
        try:
            request = json.loads(connection.request.split(b"\n", 1)[0].decode("utf-8"))
            op = request.get("op")
        except (ValueError, AttributeError):
            request, op = {}, None
        if op not in ("info", "stacks"):
            self._reply(connection, {"error": "unknown request; send {\"op\": \"stacks\"}"})
            return
        try:
            self._answer(op, request, lambda reply: self._reply(connection, reply))
        except Exception as error:  # told to the client; the job goes on
            self._reply(connection, {"error": f"{type(error).__name__}: {error}"})

    def _reply(self, connection: _Connection, reply: dict) -> None:
        """Send ``reply`` as far as the socket takes it now; the rest when it can take more."""
        import json

        fd = connection.sock.fileno()
        if fd < 0 or self._connections.get(fd) is not connection or connection.outbox is not None:
            return  # cut off meanwhile, or answered already
        data = json.dumps(reply).encode() + b"\n"
        connection.outbox = memoryview(data)
        connection.deadline = time.monotonic() + REPLY_DEADLINE + len(data) / REPLY_RATE
        self._write(connection)
        if connection.sock.fileno() >= 0 and self._supervisor is not None:
            with suppress(Exception):
                self._supervisor.add_writer(fd, lambda: self._write(connection))

    def _write(self, connection: _Connection) -> None:
        if time.monotonic() > connection.deadline:
            self._drop(connection.sock)
            return
        outbox = connection.outbox
        assert outbox is not None
        try:
            while connection.sent < len(outbox):
                connection.sent += connection.sock.send(outbox[connection.sent :])
        except BlockingIOError:
            return
        except OSError:
            self._drop(connection.sock)
            return
        self._drop(connection.sock)

    def close(self, supervisor: Supervisor | None = None) -> None:
        from numarun.process import forkexec

        for connection in list(self._connections.values()):
            self._drop(connection.sock)
        if self._sock.fileno() >= 0:
            if supervisor is not None:
                supervisor.remove_reader(self._sock.fileno())
            forkexec.close_untracked(self._sock.fileno())
            self._sock.close()
        with suppress(OSError):
            os.unlink(self.path)


# --- the client's side ---------------------------------------------------------------------------


class FoundJob:
    """A job found in a runtime directory: its socket and what it said about itself (empty
    ``info`` and an ``error`` when it did not answer)."""

    def __init__(self, path: str, info: dict, error: str | None = None) -> None:
        self.path = path
        self.info = info
        self.error = error

    @property
    def name(self) -> str:
        return os.path.basename(self.path)[: -len(".sock")]


def ask(path: str, op: str, timeout: float = CLIENT_TIMEOUT, **fields: str) -> dict:
    """Send one request (``op`` and ``fields``) to the job listening on ``path``; its reply.
    Raises OSError (``ConnectionRefusedError`` when nothing listens) or TimeoutError."""
    import json
    import socket

    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(path)
        conn.sendall(json.dumps({"op": op, **fields}).encode() + b"\n")
        chunks = []
        while True:
            conn.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = conn.recv(1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    data = b"".join(chunks)
    if not data.endswith(b"\n"):
        raise TimeoutError("the job closed the connection without an answer")
    reply = json.loads(data)
    if not isinstance(reply, dict):
        raise ValueError("the job's answer is not an object")
    return reply


def _remove_stale(directory: str, name: str) -> None:
    """Remove a dead launcher's socket and its dump directory (files only, no symlinks)."""
    with suppress(OSError):
        os.unlink(os.path.join(directory, f"{name}.sock"))
    dumps = os.path.join(directory, f"{name}.d")
    try:
        if not stat.S_ISDIR(os.lstat(dumps).st_mode):
            return
        for entry in os.listdir(dumps):
            with suppress(OSError):
                os.unlink(os.path.join(dumps, entry))
        os.rmdir(dumps)
    except OSError:
        pass


def _remove_orphan(directory: str, name: str) -> None:
    """A dump directory without a socket (``--preload`` standbys make theirs before any
    socket) whose launcher (``<pid>-...``) is gone: removed as a stale socket's is."""
    pid = name.partition("-")[0]
    if not pid.isdigit():
        return
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        _remove_stale(directory, name)
    except OSError:
        pass  # alive, another user's pid now: left alone


def find_jobs(timeout: float = CLIENT_TIMEOUT) -> list[FoundJob]:
    """The calling user's running jobs on this host, oldest first; stale sockets removed. A job
    that waits in its rendezvous (no ranks yet, so no socket) is found by its status record
    (:mod:`numarun.stacks.pending`): its ``info`` has ``waiting``.

    Directories that fail the checks of :func:`runtime_dir` are skipped."""
    from numarun.stacks import pending

    jobs: list[FoundJob] = []
    for directory in dict.fromkeys(runtime_dirs()):
        try:
            _check_private(directory)
            names = sorted(os.listdir(directory))
        except (OSError, UsageError):
            continue
        for entry in names:
            path = os.path.join(directory, entry)
            if entry.endswith(pending.SUFFIX):
                record = pending.read_record(path)
                if record is not None:
                    jobs.append(FoundJob(path, record))
                continue
            if entry.endswith(".d") and f"{entry[:-2]}.sock" not in names:
                _remove_orphan(directory, entry[:-2])
            if not entry.endswith(".sock"):
                continue
            try:
                jobs.append(FoundJob(path, ask(path, "info", timeout)))
            except (ConnectionRefusedError, FileNotFoundError):
                _remove_stale(directory, entry[: -len(".sock")])
            except (OSError, ValueError) as error:
                jobs.append(FoundJob(path, {}, f"did not answer ({error or type(error).__name__})"))
    # A launcher whose workers just started may still have its record: its socket answers.
    serving = {job.info.get("pid") for job in jobs if "waiting" not in job.info}
    jobs = [job for job in jobs if "waiting" not in job.info or job.info["pid"] not in serving]
    return sorted(jobs, key=lambda job: (job.info.get("started") or 0, job.path))


def _parent(pid: int) -> int:
    """The parent of ``pid`` (0 when it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            data = file.read()
        return int(data[data.rindex(b")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _lineage(pid: int) -> list[int]:
    """``pid`` and its ancestors, nearest first (at most 64)."""
    chain = []
    while pid > 1 and len(chain) < 64:
        chain.append(pid)
        pid = _parent(pid)
    return chain


def _matches(job: FoundJob, wanted: str) -> bool:
    """``wanted`` names the job: its run id, its socket's name, or a pid -- the launcher's, any
    process of the job (a worker, a worker's child), or an ancestor of the launcher (the pid
    ``$!`` gives after ``timeout 600 numarun ... &``)."""
    info = job.info
    if wanted in (job.name, str(info.get("run_id")), str(info.get("pid"))):
        return True
    if not wanted.isdigit() or not isinstance(info.get("pid"), int):
        return False
    pid, launcher = int(wanted), info["pid"]
    workers = {item.get("pid") for item in info.get("ranks") or () if isinstance(item, dict)}
    return launcher in _lineage(pid) or pid in _lineage(launcher) or bool(
        workers & set(_lineage(pid))
    )


def _session_and_terminal(pid: int) -> tuple[int, int] | None:
    """(session id, controlling terminal's device number, 0 for none) of ``pid``, from
    ``/proc/<pid>/stat``; None when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            data = file.read()
        fields = data[data.rindex(b")") + 2 :].split()
        return int(fields[3]), int(fields[4])
    except (OSError, ValueError, IndexError):
        return None


def started_here(job: FoundJob) -> bool:
    """Whether ``job``'s launcher (or ``numarun.spawn``'s caller) runs in the caller's session
    or on the caller's controlling terminal: the job this shell or terminal started, among a
    shared account's others."""
    pid = job.info.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False
    theirs, mine = _session_and_terminal(pid), _session_and_terminal(os.getpid())
    if theirs is None or mine is None:
        return False
    return theirs[0] == mine[0] or (mine[1] != 0 and theirs[1] == mine[1])


def format_job_list(jobs: Sequence[FoundJob]) -> str:
    """One line per job: run id, launcher pid, ranks on this host, start time, command; ``*``
    before the jobs :func:`started_here`, and, after the list, what the mark means and each run
    id that several of the jobs share (they are named by pid)."""
    lines = [f"  {'RUN_ID':<14} {'PID':>8} {'RANKS':>5}  {'STARTED':<8}  COMMAND"]
    marked = False
    for job in jobs:
        info = job.info
        if job.error is not None:
            lines.append(f"  {job.name:<14} {'?':>8} {'?':>5}  {'?':<8}  ({job.error})")
            continue
        mark = "* " if started_here(job) else "  "
        marked = marked or mark == "* "
        started = time.strftime("%H:%M:%S", time.localtime(info.get("started") or 0))
        lines.append(
            f"{mark}{info.get('run_id')!s:<14} {info.get('pid', '?'):>8} "
            f"{len(info.get('ranks') or ()):>5}  {started:<8}  {info.get('entrypoint', '')}"
        )
    if marked:
        lines.append("  (*: started from this session or terminal)")
    for run_id, pids in _shared_run_ids(jobs).items():
        lines.append(
            f"  run id {run_id} is shared by {len(pids)} running jobs (pids "
            f"{', '.join(map(str, pids))}): name one by its pid, numarun stacks {pids[0]}"
        )
    return "\n".join(lines)


def _shared_run_ids(jobs: Sequence[FoundJob]) -> dict[str, list[object]]:
    """Each run id that more than one of ``jobs`` has -> their launchers' pids."""
    by_id: dict[str, list[object]] = {}
    for job in jobs:
        if job.error is None:
            by_id.setdefault(str(job.info.get("run_id")), []).append(job.info.get("pid", "?"))
    return {run_id: pids for run_id, pids in by_id.items() if len(pids) > 1}


def choose_job(jobs: Sequence[FoundJob], wanted: str | None) -> FoundJob:
    """The job ``wanted`` names (run id, launcher pid or socket name), or the only one.

    Raises JobsError (exit 1) when there is none, UsageError (exit 2) listing them
    (:func:`format_job_list`) when the choice is ambiguous: several jobs and no ``wanted``, or
    several jobs sharing the run id ``wanted`` (then to be named by pid)."""
    user = os.geteuid()
    host = os.uname().nodename
    if wanted is not None:
        found = [job for job in jobs if _matches(job, wanted)]
        # A launcher's own pid (or socket name) names that job, even when it runs inside
        # another's: how a run id that several jobs share is told apart.
        exact = [job for job in found if wanted in (job.name, str(job.info.get("pid")))]
        found = exact or found
        if not found:
            raise JobsError(f"no running numarun job {wanted!r} of uid {user} on {host}")
    else:
        found = list(jobs)
        if not found:
            raise JobsError(f"no running numarun job of uid {user} on {host}")
    if len(found) > 1:
        if wanted is None:
            head = f"{len(found)} jobs running; name one: numarun stacks RUN_ID"
        elif all(str(job.info.get("run_id")) == wanted for job in found):
            head = (
                f"{len(found)} running jobs share the run id {wanted!r}; name one by its pid: "
                "numarun stacks PID"
            )
        else:
            head = f"{len(found)} jobs match {wanted!r}; name one: numarun stacks RUN_ID or PID"
        raise UsageError(head + "\n" + format_job_list(found))
    return found[0]


def stacks_command(wanted: str | None, *, as_json: bool, timeout: float) -> int:
    """``numarun stacks [RUN_ID] [--json]``: print the chosen job's stacks -- every node's
    under a torch rendezvous, this node's otherwise (a static job over several nodes says
    so); exit status."""
    from numarun.stacks import parse

    job = choose_job(find_jobs(timeout), wanted)
    if job.error is not None:
        raise JobsError(f"job {job.name} {job.error}")
    if "waiting" in job.info:  # in its rendezvous: no ranks, no stacks yet
        return _print_waiting(job.info, as_json)
    scope = job.info.get("scope")
    try:
        if scope == "job":
            reply = ask(job.path, "stacks", timeout, scope="job")
        else:
            reply = ask(job.path, "stacks", timeout)
    except (OSError, ValueError) as error:
        raise JobsError(f"job {job.name} did not answer: {error or type(error).__name__}") from None
    if "error" in reply:
        raise JobsError(f"job {job.name}: {reply['error']}")
    fields = {key: reply.get(key) for key in ("run_id", "name", "pid", "host", "entrypoint")}
    if reply.get("job_wide"):
        return _print_job_wide(reply, fields, as_json)
    ranks = [
        parse.rank_stacks(
            item.get("rank", -1),
            item.get("local_rank", -1),
            item.get("pid"),
            item.get("text") or "",
            item.get("problem"),
        )
        for item in reply.get("dumps", [])
    ]
    flight = reply.get("flight") if isinstance(reply.get("flight"), dict) else None
    if as_json:
        import json

        document = parse.stacks_to_json(ranks, **fields)
        if flight is not None:
            document["flight"] = flight
        print(json.dumps(document, indent=1))
        return 0
    count = len(ranks)
    lines = [
        f"numarun stacks: job {fields['run_id']} (launcher pid {fields['pid']}, {count} "
        f"rank{'s' if count != 1 else ''} on {fields['host']}): {fields['entrypoint']}",
    ]
    if scope == "node":
        lines.append(
            f"numarun stacks: this node's ranks only, of a job on {reply.get('nnodes')} nodes: "
            "with the static rendezvous the launchers share no store; run `numarun stacks` on "
            "each node, or launch with --rdzv-backend c10d to see every node's ranks from any"
        )
    lines.extend(parse.format_groups(parse.group_ranks(ranks)))
    lines.extend(_flight_lines(flight))
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def _print_waiting(record: dict, as_json: bool) -> int:
    """A job waiting in its rendezvous: where, since when, for whom; exit status 0 (the job
    was found and said where it is)."""
    from numarun.stacks import pending

    if as_json:
        import json

        fields = ("run_id", "pid", "host", "entrypoint", "waiting")
        print(json.dumps({**{key: record.get(key) for key in fields}, "ranks": []}, indent=1))
        return 0
    print(pending.waiting_line(record))
    return 0


def _flight_lines(flight: dict | None) -> list[str]:
    """The job's flight-recorder verdict as the launcher sent it (escaped again here)."""
    if flight is None:
        return []
    from numarun.stacks.flightverdict import printable

    shown = [line for line in flight.get("lines") or () if isinstance(line, str)][:40]
    saved = flight.get("saved")
    if isinstance(saved, str):
        from numarun.stacks.flightreport import ANALYZER

        command = f"{ANALYZER} --allow-incomplete-ranks" if flight.get("incomplete") else ANALYZER
        shown.append(f"dumps: {saved} (read with: {command} {saved})")
    return ["Flight recorder (each rank's collectives, as torch recorded them):",
            *(f"  {printable(line)}" for line in shown)]  # fmt: skip


def _print_job_wide(reply: dict, fields: dict, as_json: bool) -> int:
    """The whole job's stacks: the merged classes the launcher sent (every node's ranks, each
    class naming its ranks and nodes), the nodes that did not answer, and why. What came
    through the rendezvous store is read back checked and shown escaped."""
    import json

    from numarun.stacks import digest as codec
    from numarun.stacks import merge

    view_doc = reply.get("view")
    if not isinstance(view_doc, str):
        raise JobsError(f"job {fields['run_id']}: the job's stacks did not come back")
    try:
        view, inline = merge.read_view(view_doc.encode(), limit=64 << 20)
    except codec.PostError as error:
        raise JobsError(
            f"job {fields['run_id']}: the job's stacks are unreadable: {error}"
        ) from None
    view.add_posts(inline)
    if as_json:
        print(json.dumps(merge.view_to_json(view, **fields), indent=1))
        return 0
    count = view.rank_count
    lines = [
        codec.printable(
            f"numarun stacks: job {fields['run_id']} ({count:,} rank{'s' if count != 1 else ''} "
            f"on {len(view.answered):,} of {view.size:,} nodes): {fields['entrypoint']}"
        ),
        *(f"  {line}" for line in merge.summary_lines(view)),
        *merge.format_view(view),
    ]
    if view.flight is not None:  # every node's ranks' collectives, merged by the asked node
        lines.append("Flight recorder (each rank's collectives, as torch recorded them on "
                     "every node; each node keeps its ranks' dumps in its log directory):")
        lines.extend(f"  {line}" for line in view.flight.shown_lines())
    sys.stdout.write("\n".join(lines) + "\n")
    return 0

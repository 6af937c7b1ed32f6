"""Inside a worker: arm numarun's stack dumps before the user's code runs, with a small helper
thread that takes them and answers the launcher's flight-recorder requests.

:func:`arm` is called first thing by both bootstraps (:mod:`numarun.worker.bootstrap` for scripts
and modules, :mod:`numarun.spawning.childmain` for :func:`numarun.spawn` under every start method).
When the launcher gave this rank a dump file (``NUMARUN_STACKS_FILE``, a path in a private 0700
directory of the launcher's, see :mod:`numarun.stacks.dumps`), it starts the helper thread
(:func:`_numarun_stacks_helper`), then registers :func:`faulthandler.register` on
:data:`STACKS_SIGNAL` (``all_threads=True``, ``chain=False``). Nothing goes to the rank's stdout
or stderr.

Why a helper, and why it dumps holding the GIL. A signal sent to a process goes to a thread of
the kernel's choosing, the main thread first: its blocking system call then fails with
``EINTR``, and code that does not restart it sees that (torch's TCPStore client printed
"Interrupted system call" and waited out a retry delay; ``poll``/``connect`` with a timeout are
never restarted, ``SA_RESTART`` or not). A signal sent to another thread alone (``tgkill``)
interrupts nothing of the program, but faulthandler's handler then reads the other threads'
frames while one of them may be running Python and changing them: measured here, a rank deep in
recursion died of SIGSEGV at the first such dump. So the launcher asks the helper through a
FIFO (``<dump file>.req``, request lines ``<number> <what>``, ``s`` for stacks, ``f`` for the
flight recorder), and the helper, woken by its own ``read``, takes the stacks with
:func:`faulthandler.dump_traceback` while it holds the GIL: no thread runs Python meanwhile
(one blocked in a collective, in C, has no GIL and unchanging frames), and no thread of the
program is interrupted. It writes ``numarun-stacks <number>`` then the dump to the dump file.
Getting the GIL takes a busy program its switch interval (5 ms). A rank whose GIL is held
and not let go (C code that keeps it: a hang of its own) leaves the request unanswered; the
launcher then sends :data:`STACKS_SIGNAL` to the rank's main thread, the likely holder (see
:mod:`numarun.stacks.rankhelper`), and the handler, running on the thread it interrupted,
writes the dump to ``<dump file>.sig``, as numarun did before the helper existed. A rank
without a helper (it could not start) registers the handler on the dump file itself and is
signalled as a process.

The helper's native thread id is the first line of its answer file (``<dump file>.fr``),
written before the handler is registered, so the launcher knows the rank has a helper as soon
as it sees the handler installed. :func:`arm` writes that line itself, the id read from
``/proc/self/task`` (the one thread there that was not before the helper's start), and does
not wait for the helper to run: a wait for a new thread's first turn cost each rank a
scheduler round while all ranks start at once on few cores (issue 32 item 13). Only where
``/proc`` cannot tell (no such directory, another thread started meanwhile) does it wait for
the helper's own word, at most :data:`_READY_WAIT` seconds. A request the launcher sends before
the helper first runs waits in the FIFO. A flight-recorder request is answered there, replacing
what was there: one header line ``numarun-fr <request> <tid> <status> <length>`` and
``length`` bytes: ``ok`` and torch's flight recorder dump (its pickle, as ``_dump_fr_trace``
returns it, without stack traces: their first symbolisation costs a rank seconds); ``none``
and why the rank has no collectives to record (``torch.distributed`` not imported, no process
group); ``absent`` when its torch has no recorder for its backend; ``error`` and the
exception's line. torch is looked up in :data:`sys.modules` only: a rank that never imported
``torch.distributed`` loads nothing. A gloo recorder of torch 2.13 leaves ``pg_config`` (the
groups' members) empty; the helper fills it from ``torch.distributed``'s own table of groups,
so that torch's analyzer (``python -m torch.distributed.flight_recorder.fr_trace``) can read
the dumps.

The variable is removed from ``os.environ``, so the user's program and its children never see
it (a child started with the same bootstrap is not armed twice on the rank's file). The files
are opened close-on-exec and moved to high fd numbers, so that a program closing and reopening
low fds does not get them under a number of its own. Children forked by the rank (DataLoader
workers) inherit the registration but not the helper thread; the launcher only ever signals
the rank processes.

If the user's code later registers the same signal (``signal.signal`` or
``faulthandler.register``), its handler replaces numarun's: the user's wins, and the launcher
reports that rank's stacks as unavailable.

The helper blocks every signal but the faults a thread raises on itself (:data:`_FAULTS`); it
is started with them blocked, so there is no moment it could take one. A signal sent to the
process goes to any thread that does not block it, and Python runs a handler only in the main
thread, at its next turn with the GIL; the C handler that ran in another thread wakes nothing.
One taken by the helper waited for the main thread to take the GIL again: a rank asleep in
``time.sleep(60)`` slept through a teardown's SIGTERM whose handler would have ended it, until
SIGKILL came with the end of the grace period (seen with ``ftrace``: a spawn's SIGTERM
delivered to the helper's thread of a rank whose main thread slept through it). With the helper
blocking them, such a signal goes to a thread of the program's.

This module is on every worker's start-up path: it imports only what a bare interpreter has
already loaded (``os``, ``sys``, ``_thread``, ``_signal``) and the built-in ``faulthandler``;
:mod:`signal` is not imported (its ``enum`` import costs milliseconds), the signal number is a
constant.
"""

import _signal
import _thread
import faulthandler
import os
import sys

STACKS_FILE_ENV = "NUMARUN_STACKS_FILE"
# Real-time signal 42 (SIGRTMIN+8 under glibc, whose SIGRTMIN is 34; within SIGRTMIN..SIGRTMAX
# under musl too). Not SIGUSR1/SIGUSR2: Slurm's --signal and Lightning use them. Its default
# action kills, so the launcher sends it only to a rank whose handler is installed.
STACKS_SIGNAL = 42
ANSWER_SUFFIX = ".fr"  # <dump file>.fr: the helper's answers (launcher-made, regular file)
REQUEST_SUFFIX = ".req"  # <dump file>.req: the launcher's requests (launcher-made FIFO)
SIGNAL_SUFFIX = ".sig"  # <dump file>.sig: what the signal handler writes, with a helper
ANSWER_MAGIC = b"numarun-fr"
STACKS_MAGIC = b"numarun-stacks"  # the helper's stack dumps start with it and the request
HELPER_FUNCTION = "_numarun_stacks_helper"  # how the helper's frames are recognised in a dump
FLIGHT_LIMIT = 16 * 1024 * 1024  # bytes of one dump the helper sends; more: said, not sent
_HIGH_FD = 1000  # where the files' fds move to, when free and allowed
_READY_WAIT = 5.0  # seconds arm() waits for the helper's id where /proc cannot tell it
_STOP_WAIT = 1.0  # seconds the interpreter's exit waits for the helper to end
_running: "list[tuple[int, _thread.LockType, int]]" = []  # the helper started, if any
# What the helper leaves unblocked: the faults a thread raises on itself. One of those blocked is
# forced through at the default action, a crash without faulthandler's dump; SIGKILL and SIGSTOP
# cannot be blocked.
_FAULTS = frozenset(
    getattr(_signal, name)
    for name in ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGTRAP", "SIGSYS", "SIGKILL", "SIGSTOP")
    if hasattr(_signal, name)
)


def arm(path: "str | None" = None) -> "tuple[str, int] | None":
    """Start the helper and register the stack dump for this rank, if the launcher asked for
    one (``path``, or the environment's); never raises. Returns (the file's path, the fd the
    dumps go to) once armed, else None.

    Without ``NUMARUN_STACKS_FILE`` (not started by a numarun that takes stacks) nothing
    happens. A file that cannot be opened or a registration that fails leaves the rank
    running unarmed: the launcher then reports its stacks as unavailable. A helper that cannot
    start (no answer file, no thread) leaves the stacks armed: the launcher then signals the
    process as a whole, as numarun did before the helper existed. Armed again on another file
    (a ``--preload`` standby handed an attempt whose file is not the one it was born with: see
    :mod:`numarun.worker.bootstrap`), the first helper is stopped first.
    """
    path = os.environ.pop(STACKS_FILE_ENV, None) or path
    if not path:
        return None
    try:
        # No O_CREAT: the launcher made the file; a rank never creates files of its own here.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    fd = _move_high(fd)
    if _running:  # armed before on another file: that helper ends first
        _stop_helper(*_running.pop())
    signalled = _start_helper(path, fd)
    try:
        faulthandler.register(STACKS_SIGNAL, file=fd if signalled is None else signalled,
                              all_threads=True, chain=False)  # fmt: skip
    except (OSError, RuntimeError, ValueError):
        os.close(fd)
        return None
    return path, fd


def _start_helper(path: str, stacks: int) -> "int | None":
    """Open the helper's files, start it and write its thread id to its answer file (module
    docstring: without waiting for it to run, where ``/proc`` tells the id); returns the fd the
    signal handler is to write to (``<dump file>.sig``), or None when the helper cannot start
    or its id cannot be written (the handler then writes to the dump file)."""
    opened = []
    # The FIFO read-write: opening it so never waits for a writer, and read never sees EOF.
    files = ((ANSWER_SUFFIX, os.O_WRONLY), (SIGNAL_SUFFIX, os.O_WRONLY | os.O_APPEND),
             (REQUEST_SUFFIX, os.O_RDWR))  # fmt: skip
    try:
        for suffix, flags in files:
            opened.append(_move_high(os.open(path + suffix, flags | os.O_NOFOLLOW | os.O_CLOEXEC)))
    except OSError:
        for fd in opened:
            os.close(fd)
        return None
    answers, signalled, requests = opened
    stopped = _thread.allocate_lock()  # held until the helper ends (what _stop_helper waits for)
    stopped.acquire()
    said = _thread.allocate_lock()  # released once the helper put its id in `ids`
    said.acquire()
    ids: list[int] = []
    before = _threads()
    mask = _block_signals()  # what the helper inherits (module docstring)
    try:
        try:
            _thread.start_new_thread(
                _numarun_stacks_helper, (requests, answers, stacks, stopped, said, ids)
            )
        except RuntimeError:  # no thread can start (a process or memory limit)
            for fd in opened:
                os.close(fd)
            return None
        import atexit  # built in: nothing to load

        helper = (requests, stopped, os.getpid())
        _running.append(helper)
        atexit.register(_stop_running, helper)
    finally:
        # This thread's mask back: a signal that came meanwhile is handled here (its handler
        # may raise, as it would have at the next line), the helper being known by then.
        _restore_signals(mask)
    new = _threads() - before if before is not None else set()
    if len(new) == 1:
        tid = new.pop()
    else:  # /proc cannot tell: the helper's own word
        said.acquire(True, _READY_WAIT)
        tid = ids[0] if ids else 0
    try:
        if tid <= 0:
            raise OSError("the helper's thread id is unknown")
        _answer(answers, b"0", tid, b"ready", b"")
    except OSError:  # the launcher's file went: signalled as a whole process, as before
        _stop_running(helper)
        os.close(signalled)
        return None
    return signalled


def _block_signals() -> "set[int] | None":
    """Block in this thread every signal but :data:`_FAULTS`; the mask before, or None when it
    could not be changed (the helper then takes signals, as before)."""
    try:
        return _signal.pthread_sigmask(_signal.SIG_BLOCK, _signal.valid_signals() - _FAULTS)
    except (AttributeError, OSError, ValueError):
        return None


def _restore_signals(mask: "set[int] | None") -> None:
    """Put back the mask :func:`_block_signals` returned (nothing for None). Python then runs
    the handlers of signals that came meanwhile, here: what they raise is raised."""
    if mask is not None:
        _signal.pthread_sigmask(_signal.SIG_SETMASK, mask)


def _threads() -> "set[int] | None":
    """The native ids of this process's threads now (``/proc/self/task``); None when unread."""
    try:
        return {int(name) for name in os.listdir("/proc/self/task")}
    except (OSError, ValueError):
        return None


def _stop_running(helper: "tuple[int, _thread.LockType, int]") -> None:
    if helper in _running:
        _running.remove(helper)
        _stop_helper(*helper)


def _stop_helper(requests: int, stopped: "_thread.LockType", pid: int) -> None:
    """At the interpreter's exit (atexit, before its finalization): tell the helper to end
    and wait for it (at most :data:`_STOP_WAIT` seconds), so that no thread of numarun's is
    left when the program's modules are torn down (with one left, about one DDP job in ten
    died at its exit of "terminate called without an active exception"). Not in a forked
    child, which shares the FIFO with its parent but not the helper."""
    if os.getpid() != pid:
        return
    try:
        os.write(requests, b"0 q\n")
    except OSError:
        return
    stopped.acquire(True, _STOP_WAIT)


def _numarun_stacks_helper(
    requests: int,
    answers: int,
    stacks: int,
    stopped: "_thread.LockType",
    said: "_thread.LockType",
    ids: "list[int]",
) -> None:
    """The helper thread: puts its thread id in ``ids`` (for :func:`arm`, where ``/proc`` could
    not tell it), then serves each request line (the last one read, when several came at once)
    until told to stop or its FIFO fails, and releases ``stopped``. Its function's name marks
    its frames in a dump (:data:`HELPER_FUNCTION`)."""
    try:
        tid = _thread.get_native_id()
        ids.append(tid)
        said.release()
        _serve(requests, answers, stacks, tid)
    finally:
        stopped.release()  # what _stop_helper waits for


def _serve(requests: int, answers: int, stacks: int, tid: int) -> None:
    """Answer each request line until told to stop (``q``) or the FIFO fails."""
    pending = b""
    while True:
        try:
            chunk = os.read(requests, 4096)
        except OSError:
            return
        if not chunk:
            return
        pending = (pending + chunk)[-4096:]
        if b"\n" not in pending:
            continue
        lines, pending = pending.rsplit(b"\n", 1)
        latest = {}  # what is asked -> the last request asking for it
        for line in lines.split(b"\n"):
            request, _, wanted = line.strip().partition(b" ")
            if request.isdigit():
                for what in (b"s", b"f", b"q"):
                    if what in wanted:
                        latest[what] = request
        if b"q" in latest:
            return
        try:
            if b"s" in latest:  # taken holding the GIL: no thread runs Python meanwhile
                os.write(stacks, b"%s %s\n" % (STACKS_MAGIC, latest[b"s"]))
                faulthandler.dump_traceback(file=stacks, all_threads=True)
            if b"f" in latest:
                status, body = _flight_record()
                _answer(answers, latest[b"f"], tid, status, body)
        except (OSError, ValueError):
            return


def _answer(fd: int, request: bytes, tid: int, status: bytes, body: bytes) -> None:
    """Replace the answer file's content with one answer (header line, then ``body``)."""
    data = b"%s %s %d %s %d\n%s" % (ANSWER_MAGIC, request, tid, status, len(body), body)
    os.ftruncate(fd, 0)
    view = memoryview(data)
    offset = 0
    while offset < len(data):
        offset += os.pwrite(fd, view[offset:], offset)


def _flight_record() -> "tuple[bytes, bytes]":
    """(status, body) of this rank's flight recorder, from what the program loaded."""
    modules = sys.modules
    dist = modules.get("torch.distributed")
    c10d = modules.get("torch._C._distributed_c10d")
    if dist is None or c10d is None:
        return b"none", b"torch.distributed not imported"
    try:
        if not dist.is_initialized():
            return b"none", b"no process group (init_process_group not called)"
        backend = str(dist.get_backend())
        dump = getattr(c10d, "_dump_nccl_trace", None) if "nccl" in backend else None
        if dump is None:
            dump = getattr(c10d, "_dump_fr_trace", None)
        if dump is None:
            version = getattr(modules.get("torch"), "__version__", "?")
            return b"absent", f"torch {version} has no flight recorder for {backend}".encode()
        data = dump(True, False, False)  # collectives, no stack traces, every entry
        if len(data) > FLIGHT_LIMIT:
            return b"error", f"its dump is {len(data)} bytes, over {FLIGHT_LIMIT}".encode()
        return b"ok", _with_groups(data, modules)
    except Exception as error:  # a diagnostic: one line, never the program's problem
        return b"error", f"{type(error).__name__}: {error}"[:300].encode("utf-8", "replace")


def _with_groups(data: bytes, modules: "dict[str, object]") -> bytes:
    """``data`` with ``pg_config`` filled from ``torch.distributed``'s groups when torch left it
    empty (gloo); as it was otherwise, or when the table cannot be read."""
    pickle = modules.get("pickle")
    c10d = modules.get("torch.distributed.distributed_c10d")
    if pickle is None or c10d is None:
        return data
    loaded = pickle.loads(data)  # type: ignore[attr-defined]  # torch's own bytes, this process
    config = loaded.get("pg_config")
    if isinstance(config, dict) and any(config):
        return data
    descs = {}
    for entry in loaded.get("entries") or ():
        name = entry.get("process_group")
        if isinstance(name, (tuple, list)) and len(name) == 2:
            descs[name[0]] = name[1]
    world = c10d._world  # type: ignore[attr-defined]
    groups = {}
    for group, name in list(world.pg_names.items()):
        members = world.pg_group_ranks.get(group)
        if not members:
            continue
        ranks = sorted(members, key=members.__getitem__)  # in the group's own rank order
        desc = descs.get(name) or getattr(group, "group_desc", None) or "undefined"
        listed = ", ".join(str(rank) for rank in ranks)
        groups[str(name)] = {"name": str(name), "desc": str(desc), "ranks": f"[{listed}]"}
    if not groups:
        return data
    loaded["pg_config"] = groups
    return pickle.dumps(loaded, protocol=2)  # type: ignore[attr-defined]


def _move_high(fd: int) -> int:
    """``fd`` duplicated onto a free fd >= 1000 (close-on-exec), or ``fd`` itself when that is
    not possible (a low RLIMIT_NOFILE)."""
    for target in range(_HIGH_FD, _HIGH_FD + 8):
        try:
            os.fstat(target)
            continue  # in use (inherited): never clobber it
        except OSError:
            pass
        try:
            os.dup2(fd, target, inheritable=False)
        except OSError:
            return fd
        os.close(fd)
        return target
    return fd

"""What runs inside every worker of :func:`numarun.spawn`: multiprocessing's own child bootstrap.

Each worker is a :class:`WorkerProcess`, a :class:`multiprocessing.process.BaseProcess` made in
the caller (name ``SpawnProcess-N`` / ``ForkProcess-N`` / ``ForkServerProcess-N``, the caller's
authkey, the caller as parent). In the child, after the binding is in force, it runs
``BaseProcess._bootstrap`` exactly as a :mod:`multiprocessing` child does: ``current_process()``,
``parent_process()``, the forced start method, after-fork hooks, ``fn`` (through
:meth:`WorkerProcess.run`), then multiprocessing's exit handlers (queue feeder threads are
flushed), the join of non-daemon threads and the flush of stdio. Entry points, one per start
method:

* ``spawn``: the supervisor execs ``python -c "...; from numarun.spawning.childmain import main;
  main()"`` (numarun's own directory is put on ``sys.path`` for that one import, so a numarun that
  the caller found through its own ``sys.path`` is the one that runs); :func:`main` reads the
  payload from the fd named by ``NUMARUN_PAYLOAD_FD``: a plain pickle of the header (``{"fds":
  [...], "tracker_fd": ...}``), then multiprocessing's preparation data (``sys.argv``, ``sys.path``,
  the working directory, the main module, imported as ``__mp_main__`` as
  :func:`multiprocessing.spawn.prepare` does), then the :class:`WorkerProcess` with ``fn`` and its
  arguments.
* ``forkserver``: multiprocessing's fork server forks the child and runs
  :func:`numarun.process.forkexec.forkserver_child`, which binds and then calls
  :func:`run_forkserver`:
  the payload is only the :class:`WorkerProcess` (the fork server prepared the interpreter).
* ``fork``: the supervisor forks, binds, and calls :func:`run_fork` with the
  :class:`WorkerProcess` itself (nothing is pickled on the way in, as with multiprocessing).

Fds: payloads and results are pickled with :class:`multiprocessing.reduction.ForkingPickler`
while :class:`FdCollector` stands in for multiprocessing's ``Popen``
(``multiprocessing.context.set_spawning_popen``), so queues, pipes, locks, events, Manager
proxies, sockets and torch's shared-memory tensors pickle as they do for a process
multiprocessing starts. Each fd an object asks to pass (``reduction.DupFd``) is recorded and
becomes a :class:`PassedFd`: an index into the fds the receiver was given. The worker gets its
fds from the supervisor (``WorkerSpec.pass_fds``: the result socket first, then the payload's);
the caller gets a result's fds with the result, through ``SCM_RIGHTS``.

The result: the worker's end of a Unix stream socket; the caller's end stays open for the whole
run, so a dup of the worker's end is multiprocessing's parent sentinel. One frame:
``RESULT_HEADER`` (pickle length, fd count) sent with the first ``MAX_FDS_PER_MESSAGE`` fds, one
``b"\\0"`` byte with each further batch, then a ForkingPickler pickle of ``("ok", value)`` or
``("raised", traceback text)``. Exit status: 0 after ``("ok", ...)``, 1 after ``("raised",
...)``, ``n`` for ``SystemExit(n)`` (then no frame is sent; ``BaseProcess._bootstrap`` maps the
code as Python does).

Each entry point first arms numarun's stack dumps (:func:`numarun.worker.dumphandler.arm`), before
anything of the caller's is unpickled, so ``numarun stacks`` sees ``fn`` under every start
method.

Start-up cost matters (this module runs first in every spawned worker, and N workers' start-up
is benchmarked against N bare interpreters): only what the bootstrap needs is imported;
:mod:`traceback` only when ``fn`` raised.
"""

from __future__ import annotations

import io
import os
import pickle
import socket
import struct
import sys
import threading
from multiprocessing import context, process, reduction

from numarun.worker.dumphandler import arm as arm_stacks

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

PAYLOAD_FD_ENV = "NUMARUN_PAYLOAD_FD"
RESULT_HEADER = struct.Struct("!QI")  # pickle length, number of fds passed with the frame
MAX_FDS_PER_MESSAGE = 253  # SCM_MAX_FD: the kernel's limit for one SCM_RIGHTS message

_PROCESS_NAMES = {"spawn": "SpawnProcess", "fork": "ForkProcess", "forkserver": "ForkServerProcess"}

# True while this worker imports the parent's main module: numarun.spawn called from module
# level of a script without an ``if __name__ == "__main__":`` guard must fail, not fork-bomb.
importing_main = False

# The fds a PassedFd indexes into, while load_with_fds() runs in this thread.
_loading = threading.local()


class WorkerProcess(process.BaseProcess):
    """One worker as multiprocessing sees it: ``fn(local_rank, *args)`` is its target.

    Made in the caller; its copy in the child (forked, or unpickled after the binding) is what
    ``_bootstrap`` runs. ``result_fd`` is set in the child only.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        local_rank: int,
        args: Sequence[Any],
        start_method: str,
        daemon: bool,
    ) -> None:
        super().__init__(target=fn, args=(local_rank, *args), daemon=daemon)
        # As multiprocessing's SpawnProcess etc.: _bootstrap makes it the child's default.
        self._start_method = start_method
        self._name = f"{_PROCESS_NAMES[start_method]}-" + ":".join(map(str, self._identity))
        self.result_fd = -1

    def run(self) -> None:
        """Call ``fn`` and send its outcome to the caller (see the module docstring)."""
        try:
            value = self._target(*self._args, **self._kwargs)  # type: ignore[attr-defined]
        except SystemExit:
            raise
        except BaseException as exc:
            # The traceback starts at fn: this frame says nothing to the user.
            exc.__traceback__ = exc.__traceback__.tb_next if exc.__traceback__ else None
            report_exception(self.result_fd, None)
            raise SystemExit(1) from None
        try:
            data, fds = dumps(("ok", value))
        except BaseException:
            report_exception(self.result_fd, "while pickling the return value of fn")
            raise SystemExit(1) from None
        # value stays referenced until sent: its objects own the fds that go with it.
        send_result(self.result_fd, data, fds)


# --- entry points --------------------------------------------------------------------------------


def main() -> None:
    """Entry point of a worker started with ``start_method="spawn"``; never returns.

    Without ``NUMARUN_PAYLOAD_FD`` (not started by numarun) it prints one line to stderr and
    exits 2.
    """
    try:
        payload_fd = int(os.environ.pop(PAYLOAD_FD_ENV))
    except (KeyError, ValueError):
        sys.stderr.write(
            f"numarun.spawning.childmain: {PAYLOAD_FD_ENV} is not set; "
            "this module runs inside workers started by numarun.spawn\n"
        )
        sys.exit(2)
    arm_stacks()
    stream = io.BytesIO(read_all(payload_fd))
    os.close(payload_fd)
    header = pickle.load(stream)
    if header["tracker_fd"] is not None:
        # As multiprocessing.spawn.spawn_main: share the caller's resource tracker.
        from multiprocessing import resource_tracker

        resource_tracker._resource_tracker._fd = header["tracker_fd"]
    fds = header["fds"]
    os.set_inheritable(fds[0], False)  # programs that fn execs must not hold the result socket
    sys.exit(load_and_bootstrap(stream, fds, prepare=True))


def run_forkserver(payload_fd: int, result_fd: int) -> int:
    """Fork target for ``start_method="forkserver"``: unpickle the worker now, after the
    binding, and run it. Returns the exit status."""
    from numarun.process import forkexec

    arm_stacks()
    stream = io.BytesIO(read_all(payload_fd))
    os.close(payload_fd)
    return load_and_bootstrap(stream, forkexec.passed_fds, prepare=False)


def run_fork(worker: WorkerProcess, payload_fd: int, result_fd: int) -> int:
    """Fork target for ``start_method="fork"`` (bound with ``functools.partial``): the forked
    child already holds the worker; returns the exit status."""
    from numarun.process import forkexec

    arm_stacks()
    worker.result_fd = forkexec.passed_fds[0]
    return worker._bootstrap(parent_sentinel=os.dup(worker.result_fd))  # type: ignore[attr-defined]


def load_and_bootstrap(stream: io.BytesIO, passed: Sequence[int], *, prepare: bool) -> int:
    """Prepare the interpreter (``prepare``: from the preparation data in ``stream``), load the
    worker with ``passed[1:]`` as its fds, and run multiprocessing's bootstrap on it.

    ``passed[0]`` is the result socket. Returns the exit status.
    """
    result_fd = passed[0]
    current = process.current_process()
    current._inheriting = True  # type: ignore[attr-defined]  # as multiprocessing.spawn._main
    try:
        if prepare:
            prepare_main(pickle.load(stream))
        worker = load_with_fds(stream, passed[1:])
    except BaseException:
        return report_exception(result_fd, "while loading fn and args in the worker")
    finally:
        del current._inheriting  # type: ignore[attr-defined]
    del stream
    worker.result_fd = result_fd
    return worker._bootstrap(parent_sentinel=os.dup(result_fd))  # type: ignore[no-any-return]


def prepare_main(prep: dict[str, Any]) -> None:
    """:func:`multiprocessing.spawn.prepare`: ``sys.argv``, ``sys.path``, working directory,
    authkey, and the parent's ``__main__`` imported as ``__mp_main__``."""
    global importing_main
    import multiprocessing.spawn

    importing_main = True
    try:
        multiprocessing.spawn.prepare(prep)
    finally:
        importing_main = False


# --- fds through pickles -------------------------------------------------------------------------


class PassedFd:
    """What ``multiprocessing.reduction.DupFd(fd)`` pickles to under :class:`FdCollector`: the
    index of the fd among those handed to the receiver (as multiprocessing's fork server
    ``_DupFd``). :meth:`detach` works only while :func:`load_with_fds` runs."""

    def __init__(self, index: int) -> None:
        self.index = index

    def detach(self) -> int:
        table = getattr(_loading, "table", None)
        if table is None:
            raise RuntimeError("a numarun PassedFd is detached only while numarun unpickles")
        table.taken.add(self.index)
        return table.fds[self.index]  # type: ignore[no-any-return]


class FdCollector:
    """Stands in for multiprocessing's ``Popen`` while numarun pickles for another process:
    ``duplicate_for_child(fd)`` records the fd and returns its index; ``DupFd`` wraps it."""

    DupFd = PassedFd

    def __init__(self) -> None:
        self.fds: list[int] = []

    def duplicate_for_child(self, fd: int) -> int:
        self.fds.append(fd)
        return len(self.fds) - 1


def dumps(*objects: object) -> tuple[memoryview, list[int]]:
    """``objects`` pickled back to back by ForkingPickler in multiprocessing's spawning context;
    returns the bytes and the fds they refer to (to hand over with them, in order)."""
    collector = FdCollector()
    stream = io.BytesIO()
    previous = context.get_spawning_popen()
    context.set_spawning_popen(collector)
    try:
        for obj in objects:
            reduction.ForkingPickler(stream, pickle.HIGHEST_PROTOCOL).dump(obj)
    finally:
        context.set_spawning_popen(previous)
    return stream.getbuffer(), collector.fds


class _FdTable:
    def __init__(self, fds: Sequence[int]) -> None:
        self.fds = fds
        self.taken: set[int] = set()


def load_with_fds(source: Any, fds: Sequence[int], *, close_untaken: bool = False) -> Any:
    """One pickle from ``source`` (a binary stream, or bytes-like: read in place) with ``fds``
    as the fds its :class:`PassedFd` objects name; ``close_untaken``: close the fds no object
    took (the caller's side of a result)."""
    table = _FdTable(fds)
    previous = getattr(_loading, "table", None)
    _loading.table = table
    try:
        return pickle.load(source) if hasattr(source, "read") else pickle.loads(source)
    finally:
        _loading.table = previous
        if close_untaken:
            for index, fd in enumerate(fds):
                if index not in table.taken:
                    os.close(fd)


# --- the result ----------------------------------------------------------------------------------


def send_result(fd: int, data: bytes | memoryview, fds: Sequence[int]) -> None:
    """Send one result frame (module docstring) on the socket ``fd``, then close it.

    A caller that is gone (``BrokenPipeError``, ``ConnectionResetError``) is ignored: it kills
    us anyway.
    """
    sock = socket.socket(fileno=fd)
    batches = [fds[i : i + MAX_FDS_PER_MESSAGE] for i in range(0, len(fds), MAX_FDS_PER_MESSAGE)]
    header = RESULT_HEADER.pack(len(data), len(fds))
    try:
        if batches:
            socket.send_fds(sock, [header], batches[0])
        else:
            sock.sendall(header)
        for batch in batches[1:]:
            socket.send_fds(sock, [b"\0"], batch)
        sock.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        sock.close()


def report_exception(result_fd: int, where: str | None) -> int:
    """Send ``("raised", traceback)`` for the exception being handled; return 1."""
    import traceback

    exc = sys.exc_info()[1]
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    if where is not None:
        text = f"{text}(raised {where})\n"
    send_result(result_fd, pickle.dumps(("raised", text), protocol=pickle.HIGHEST_PROTOCOL), ())
    return 1


def read_all(fd: int) -> bytes:
    """Read ``fd`` until EOF."""
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)

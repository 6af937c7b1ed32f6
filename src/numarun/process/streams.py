"""The workers' pipes in the supervisor's loop: output to sinks, results, payloads, consoles.

:class:`Streams` serves, from the loop (:mod:`numarun.process.loop`), the supervisor's ends of
the pipes the start made for each worker (:mod:`numarun.process.starting`), all non-blocking:

* Output (lane :data:`~numarun.process.loop.OUTPUT`): each time a stdout/stderr pipe is
  readable, one read of up to 256 KiB goes to the stream's sink
  (:meth:`~numarun.process.spec.OutputSink.feed`). At end of file, or on a read error, the pipe
  is closed and the sink's ``close()`` called, exactly once. A dead worker's output pipes stay
  open until end of file (a grandchild may hold them); the supervisor closes those of a worker
  given up on when it drains, and every one still open when the run ends.
* Results (lane :data:`~numarun.process.loop.TRANSFERS`): one read per readable event, added to
  ``Worker.result``; when the worker's end is seen, the pipe is read until it is empty (what the
  worker wrote before it died) and closed. End of file closes it earlier.
* Payloads (lane :data:`~numarun.process.loop.TRANSFERS`): each time the pipe is writable, up to
  :data:`numarun.process.forkexec.PIPE_SIZE` bytes of the rest are written; once all is written
  the pipe is closed, so the child sees end of file. A reader that is gone (``EPIPE``) drops the
  rest. A dead worker's payload and result pipes are closed at once
  (:meth:`Streams.close_pipes_of_dead`).
* Consoles (lane :data:`~numarun.process.loop.CONSOLES`): a tee'd sink's ``console``
  (:class:`numarun.process.console.Console`) queues what it cannot write at once; it is watched for
  writing only while output waits in it (:meth:`Streams.watch_consoles`, before each wait of the
  loop), and flushed when writable, so a stalled terminal or pipe never blocks the loop. A flush
  that wrote something calls ``on_console_progress()`` (the supervisor then gives a draining run
  more time). :meth:`Streams.finish` flushes each console once more and abandons what a reader
  that stalled still did not take.
"""

from __future__ import annotations

import os
from _functools import partial  # functools.partial, without functools.py (DESIGN.md)

from numarun.process import forkexec
from numarun.process.loop import CONSOLES, OUTPUT, READ, TRANSFERS, WRITE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from numarun.process.loop import Loop
    from numarun.process.record import Worker

_READ_SIZE = 256 * 1024


class Streams:
    """The pipes of ``workers`` (the supervisor's list) and the consoles their sinks show on,
    in ``loop`` (module docstring)."""

    def __init__(
        self, loop: Loop, workers: list[Worker], on_console_progress: Callable[[], None]
    ) -> None:
        self._loop = loop
        self._workers = workers
        self._on_console_progress = on_console_progress
        self._consoles: list[Any] = []  # what tee'd sinks show on (see watch_consoles)
        self._watched_consoles: set[int] = set()

    def watch(self, worker: Worker) -> None:
        """Serve ``worker``'s output, result and payload pipes from now on."""
        for fd, sink in worker.outputs.items():
            self._loop.watch(fd, READ, partial(self.read_output, worker, fd), OUTPUT)
            console = getattr(sink, "console", None)
            if console is not None and all(console is not c for c in self._consoles):
                self._consoles.append(console)
        if worker.result_fd is not None:
            self._loop.watch(worker.result_fd, READ, partial(self.read_result, worker), TRANSFERS)
        if worker.payload_fd is not None:
            self._loop.watch(
                worker.payload_fd, WRITE, partial(self._write_payload, worker), TRANSFERS
            )

    def flowing(self) -> bool:
        """Whether output may still come (an output pipe is open) or waits for a console."""
        return any(worker.outputs for worker in self._workers) or any(
            console.pending() for console in self._consoles
        )

    # --- output --------------------------------------------------------------------------------

    def read_output(self, worker: Worker, fd: int) -> None:
        try:
            data = os.read(fd, _READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            worker.outputs[fd].feed(data)
        else:
            self.close_output(worker, fd)

    def close_output(self, worker: Worker, fd: int) -> None:
        sink = worker.outputs.pop(fd)
        self._loop.discard(fd)
        forkexec.close(fd)
        sink.close()

    def close_outputs(self, worker: Worker) -> None:
        """Close every output pipe of ``worker`` still open (its sinks are closed)."""
        for fd in list(worker.outputs):
            self.close_output(worker, fd)

    # --- results and payloads ------------------------------------------------------------------

    def read_result(self, worker: Worker, *, until_empty: bool = False) -> None:
        assert worker.result_fd is not None
        while True:
            try:
                data = os.read(worker.result_fd, _READ_SIZE)
            except BlockingIOError:
                return
            if not data:
                self._loop.unwatch(worker.result_fd)
                forkexec.close(worker.result_fd)
                worker.result_fd = None
                return
            worker.result += data
            if not until_empty:
                return

    def _write_payload(self, worker: Worker) -> None:
        assert worker.payload_fd is not None and worker.payload_view is not None
        try:
            written = os.write(worker.payload_fd, worker.payload_view[: forkexec.PIPE_SIZE])
        except BlockingIOError:
            return
        except OSError:
            written = len(worker.payload_view)  # the reader is gone; drop the rest
        worker.payload_view = worker.payload_view[written:]
        if not worker.payload_view:
            self._loop.unwatch(worker.payload_fd)
            forkexec.close(worker.payload_fd)
            worker.payload_fd = None
            worker.payload_view = None

    def close_pipes_of_dead(self, worker: Worker) -> None:
        """A dead worker reads no payload and writes no result; its output may go on (a
        grandchild holding the pipe), so output pipes stay until end of file."""
        # discard, not unwatch: the pipes of a worker that never started were never watched.
        if worker.payload_fd is not None:
            self._loop.discard(worker.payload_fd)
            forkexec.close(worker.payload_fd)
            worker.payload_fd = None
            worker.payload_view = None
        if worker.result_fd is not None:
            self._loop.discard(worker.result_fd)
            forkexec.close(worker.result_fd)
            worker.result_fd = None

    # --- consoles ------------------------------------------------------------------------------

    def watch_consoles(self, *, watch: bool = True) -> None:
        """Wait for a console (:class:`numarun.process.console.Console`) to be writable only while
        output waits for it: tee'd lines are queued there, never written blocking, so a
        stalled terminal or pipe cannot stop the loop from handling signals and deaths.
        ``watch=False``: watch none (the loop is about to stop serving consoles)."""
        for console in self._consoles:
            fd = console.fileno()
            if watch and console.pending():
                if fd not in self._watched_consoles:
                    self._loop.watch(fd, WRITE, partial(self._flush_console, console), CONSOLES)
                    self._watched_consoles.add(fd)
            elif fd in self._watched_consoles:
                self._loop.unwatch(fd)
                self._watched_consoles.discard(fd)

    def _flush_console(self, console: Any) -> None:
        if console.flush():
            self._on_console_progress()

    def finish(self) -> None:
        """The run is over: close every output pipe still open, flush every console once more
        and abandon what its reader still did not take."""
        for worker in self._workers:
            self.close_outputs(worker)
        for console in self._consoles:
            console.flush()
            if console.pending():
                console.abandon()  # the reader stalled for kill_wait: the run must end

"""The supervisor's record of one started worker, which its parts share.

One :class:`Worker` per :class:`~numarun.process.spec.WorkerSpec`, made when the start prepares
the worker's pipes (:mod:`numarun.process.starting`) and kept until the run ends. The start
fills in the pid and the pipes, the loop's parts update it as events come (the streams its fds,
the supervisor its exit, the teardown what it signalled and who survived), all in the thread
that runs the loop: nothing here locks.

A worker has *exited* once its exit code is known: reported by the watchdog (``"exec"`` and
``"fork"`` workers, which it keeps as zombies until the run ends) or read from the
:class:`multiprocessing.Process` (``"forkserver"``). An exited worker is never signalled again.
"""

from __future__ import annotations

from numarun.process.spec import UNKILLABLE, WorkerExit, signal_name

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from numarun.process.spec import OutputSink, WorkerSpec


class Worker:
    """Mutable bookkeeping for one started worker (the loop's view of it)."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.pid = 0
        self.reported: int | None = None  # the exit code the watchdog reported
        self.process: Any = None  # multiprocessing.Process for start="forkserver"
        self.exit_fd: int | None = None  # the forkserver sentinel in the selector
        self.pidfd: int | None = None  # start="forkserver": pins the worker (see teardown)
        # start="forkserver": ended before it could be pinned, its pid maybe another's now
        self.lost = False
        self.child_fds: list[int] = []  # the child's ends of its pipes, until it is forked
        self.streams: dict[str, int] = {}  # "stdout"/"stderr" -> the child's end
        self.env: dict[str, str] = {}
        self.payload_child = -1
        self.result_child = -1
        self.exit_code: int | None = None
        self.exited = False
        self.ended_at: float | None = None
        self.signalled = False
        self.payload_fd: int | None = None
        self.payload_view: memoryview | None = None
        self.result_fd: int | None = None
        self.result = bytearray()
        self.outputs: dict[int, OutputSink] = {}
        self.state: str | None = None
        self.proc_state: str | None = None

    def poll(self) -> int | None:
        """The exit code if the worker has ended, else None; never blocks, never reaps."""
        if self.exited:
            return self.exit_code
        if self.process is not None:
            return self.process.exitcode
        return self.reported

    def as_exit(self, state: str | None = None) -> WorkerExit:
        """What the caller is told about this worker, in ``state`` (default: its own, else
        ``"unkillable"``); an unkillable worker has no exit code, signal or end time."""
        state = state or self.state or UNKILLABLE
        ended = WorkerExit(
            local_rank=self.spec.local_rank,
            rank=self.spec.rank,
            pid=self.pid,
            exit_code=self.exit_code if state != UNKILLABLE else None,
            signal_name=signal_name(self.exit_code) if state != UNKILLABLE else None,
            state=state,
            ended_at=self.ended_at if state != UNKILLABLE else None,
            result=bytes(self.result),
            proc_state=self.proc_state if state == UNKILLABLE else None,
        )
        return ended

"""What a caller of the supervisor describes, and what it gets back.

These values are the process wing's vocabulary: :mod:`numarun.process.forkexec` (inside a
worker), :mod:`numarun.process.supervisor` (the run) and every caller (the launcher, the spawn
API, the stack dumps) share them, so they live below all of them.
"""

from __future__ import annotations

import _signal

from numarun.machine.model import Value, fill_fields

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Protocol

    from numarun.placement.binding import MemPolicy
else:
    Protocol = object  # OutputSink is a protocol for type checkers, a plain class at run time

RUN_ID_ENV = "NUMARUN_RUN_ID"  # in every worker's environment: the run it belongs to
PAYLOAD_FD_ENV = "NUMARUN_PAYLOAD_FD"
RESULT_FD_ENV = "NUMARUN_RESULT_FD"
START_METHODS = ("exec", "fork", "forkserver")

SUCCEEDED = "succeeded"
FAILED = "failed"
TERMINATED = "terminated"
UNKILLABLE = "unkillable"
NOT_STARTED = "not started"  # a teardown signal stopped the start before this worker's turn


class OutputSink(Protocol):
    """Where one stream (stdout or stderr) of one worker goes; see :mod:`numarun.process.sinks`."""

    def feed(self, data: bytes) -> None:
        """Raw chunks of the stream, in order, called from the supervisor loop."""

    def close(self) -> None:
        """End of file on the stream; called exactly once."""


class WorkerSpec(Value):
    """One worker to start. See the module docstring for ``start``, ``payload``, ``want_result``.

    ``env`` is the worker's complete environment (the supervisor adds ``NUMARUN_RUN_ID`` and the
    pipe fd variables); ``cpus`` None inherits the supervisor's affinity; ``mem`` None leaves the
    memory policy inherited; ``stdout``/``stderr`` None let the worker inherit fd 1/2 untouched.
    ``make_dir`` (``"exec"`` workers): a directory the child makes (``mkdir``, mode 0o755; one
    already there is fine) before its program runs, so that a worker never started costs no
    directory (the launcher's per-rank log directories, where its error file goes); its
    parent must be one no other user can change (:mod:`numarun.files.safedir`).
    """

    _fields = (
        "local_rank", "rank", "env", "argv", "start", "fork_target", "payload", "want_result",
        "cpus", "mem", "stdout", "stderr", "cwd", "pass_fds", "make_dir",
    )  # fmt: skip
    __slots__ = _fields
    local_rank: int
    rank: int
    env: Mapping[str, str]
    argv: Sequence[str] | None
    start: str
    fork_target: Callable[[int, int], int] | None
    payload: bytes | None
    want_result: bool
    cpus: Sequence[int] | None
    mem: MemPolicy | None
    stdout: OutputSink | None
    stderr: OutputSink | None
    cwd: str | None
    pass_fds: Sequence[int]
    make_dir: str | None

    def __init__(
        self,
        local_rank: int,
        rank: int,
        env: Mapping[str, str],
        argv: Sequence[str] | None = None,
        start: str = "exec",
        fork_target: Callable[[int, int], int] | None = None,
        payload: bytes | None = None,
        want_result: bool = False,
        cpus: Sequence[int] | None = None,
        mem: MemPolicy | None = None,
        stdout: OutputSink | None = None,
        stderr: OutputSink | None = None,
        cwd: str | None = None,
        pass_fds: Sequence[int] = (),
        make_dir: str | None = None,
    ) -> None:
        fill_fields(self, locals())


class WorkerExit(Value):
    """How one worker ended.

    ``exit_code`` follows :class:`subprocess.Popen`: >= 0 exit status, -N killed by signal N,
    None when it could not be killed. ``state``: ``"succeeded"`` (exit 0 before any teardown),
    ``"failed"`` (ended on its own with a non-zero status, or ``is_failure`` said so; also a
    worker that, after our SIGTERM, exited with a status in 1..127), ``"terminated"`` (ended
    by our teardown: killed by a signal, status 0 or >= 128 after we signalled it),
    ``"unkillable"`` (alive ``kill_wait`` seconds after SIGKILL; ``proc_state`` is its
    ``/proc/<pid>/stat`` state letter, e.g. ``"D"``), ``"not started"`` (a teardown signal
    stopped the start before its turn: pid 0, no exit code). ``ended_at`` is ``time.time()``
    when the death was observed (None for unkillable and never started workers).
    """

    _fields = (
        "local_rank", "rank", "pid", "exit_code", "signal_name", "state", "ended_at", "result",
        "proc_state",
    )  # fmt: skip
    __slots__ = _fields
    local_rank: int
    rank: int
    pid: int
    exit_code: int | None
    signal_name: str | None
    state: str
    ended_at: float | None
    result: bytes
    proc_state: str | None

    def __init__(
        self,
        local_rank: int,
        rank: int,
        pid: int,
        exit_code: int | None,
        signal_name: str | None,
        state: str,
        ended_at: float | None,
        result: bytes = b"",
        proc_state: str | None = None,
    ) -> None:
        fill_fields(self, locals())


class RunResult(Value):
    """The end of a run: ``workers`` by local rank; ``first_failure`` the first ``"failed"``
    worker in time (teardown kills never count); ``received_signal`` the signal that made the
    supervisor tear down, or the first that came during a teardown a failure or
    :meth:`Supervisor.request_stop` began, if any; ``unkillable`` the workers that survived SIGKILL;
    ``stop_reason`` the reason given to :meth:`Supervisor.request_stop` when that call began the
    teardown (a failure or signal that came first wins), else None."""

    _fields = ("workers", "first_failure", "received_signal", "unkillable", "stop_reason")
    __slots__ = _fields
    workers: list[WorkerExit]
    first_failure: WorkerExit | None
    received_signal: int | None
    unkillable: list[WorkerExit]
    stop_reason: str | None

    def __init__(
        self,
        workers: list[WorkerExit],
        first_failure: WorkerExit | None,
        received_signal: int | None,
        unkillable: list[WorkerExit],
        stop_reason: str | None = None,
    ) -> None:
        fill_fields(self, locals())


def signal_numbers() -> dict[str, int]:
    """The members of :class:`signal.Signals`, aliases included (``SIGIOT``, ``SIGPOLL``), as
    ``{name: number}``: read from ``_signal`` with signal.py's own rule, without building its
    enum (milliseconds on every launch's start-up path)."""
    return {
        name: value
        for name, value in vars(_signal).items()
        if name.isupper() and name.startswith("SIG") and not name.startswith("SIG_")
    }


def signal_name(code: int | None) -> str | None:
    """``"SIGSEGV"`` for exit code -11 (Popen convention), the name
    ``signal.Signals(11).name`` gives (of aliases, the first in alphabetical order:
    ``SIGABRT``, not ``SIGIOT``); ``"SIG<n>"`` for a signal without a name; None for a code
    that is not a signal death (None or >= 0)."""
    if code is None or code >= 0:
        return None
    names = [name for name, number in signal_numbers().items() if number == -code]
    return min(names) if names else f"SIG{-code}"

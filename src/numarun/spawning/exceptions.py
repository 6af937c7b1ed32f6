"""What a caller of :func:`numarun.spawn` is told when a worker fails: torch's exception classes
(joined with torch's own when ``torch.multiprocessing`` is loaded, so either ``except`` catches
them) and warnings that point at the caller's line, not numarun's."""

from __future__ import annotations

import sys
import warnings
from typing import Any


class ProcessException(Exception):
    """A worker failed. ``error_index`` is its local rank, ``error_pid`` (alias ``pid``) its pid.

    The exception raised is the first failure in time; ``failures`` holds the exceptions of the
    other workers that failed on their own (not those numarun terminated), in order of death.
    When ``torch.multiprocessing`` is loaded, the instances numarun raises also belong to
    torch's class of the same name (``except torch.multiprocessing.ProcessRaisedException``
    catches them); ``except numarun.ProcessRaisedException`` always does. Instances pickle with
    all attributes.
    """

    def __init__(self, msg: str, error_index: int, error_pid: int) -> None:
        # Not super(): with torch's class among the bases, the next __init__ is torch's.
        Exception.__init__(self, msg)
        self.msg = msg
        self.error_index = error_index
        self.error_pid = error_pid
        self.failures: list[ProcessException] = []

    @property
    def pid(self) -> int:
        return self.error_pid

    def _init_args(self) -> tuple[Any, ...]:
        return (self.msg, self.error_index, self.error_pid)

    def __reduce__(self) -> tuple[Any, ...]:
        name = _numarun_class(type(self)).__name__
        return _rebuild_exception, (name, self._init_args()), self.__dict__


class ProcessRaisedException(ProcessException):
    """``fn`` raised in a worker; the message ends with the worker's formatted traceback."""


class ProcessExitedException(ProcessException):
    """A worker exited with a non-zero status or was killed by a signal.

    ``exit_code`` follows :class:`subprocess.Popen`: ``n`` for ``exit(n)``, ``-N`` when killed
    by signal ``N``; ``signal_name`` is then e.g. ``"SIGSEGV"``, else ``None``.
    """

    def __init__(
        self,
        msg: str,
        error_index: int,
        error_pid: int,
        exit_code: int,
        signal_name: str | None = None,
    ) -> None:
        ProcessException.__init__(self, msg, error_index, error_pid)
        self.exit_code = exit_code
        self.signal_name = signal_name

    def _init_args(self) -> tuple[Any, ...]:
        return (self.msg, self.error_index, self.error_pid, self.exit_code, self.signal_name)


_EXCEPTIONS = {cls.__name__: cls for cls in (ProcessRaisedException, ProcessExitedException)}


_JOINED: dict[type, type] = {}


def raised_as(cls: type[ProcessException]) -> type[ProcessException]:
    """``cls``, joined with torch's class of the same name when ``torch.multiprocessing`` is
    loaded (never imported here): real subclassing, which is what ``except`` checks."""
    peer = getattr(sys.modules.get("torch.multiprocessing.spawn"), cls.__name__, None)
    if not (isinstance(peer, type) and issubclass(peer, Exception)):
        return cls
    joined = _JOINED.get(cls)
    if joined is None:
        namespace = {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
        joined = _JOINED[cls] = type(cls.__name__, (cls, peer), namespace)
    return joined


def _numarun_class(cls: type) -> type:
    return next(base for base in cls.__mro__ if base.__module__ == __name__)


def _rebuild_exception(name: str, args: tuple[Any, ...]) -> ProcessException:
    return raised_as(_EXCEPTIONS[name])(*args)


def warn(message: str) -> None:
    """``warnings.warn`` pointing at the first caller outside numarun."""
    frame, level = sys._getframe(0), 1
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith("numarun."):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, RuntimeWarning, stacklevel=level)

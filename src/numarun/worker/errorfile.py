"""Worker error files: torchrun's ``error.json``, read and written.

As ``@record`` from ``torch.distributed.elastic.multiprocessing.errors`` writes it to
``$TORCHELASTIC_ERROR_FILE`` on an uncaught exception (``timestamp``: a *string* of integer
epoch seconds)::

    {"message": {"message": "RuntimeError: boom",
                 "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "1712345678"}}}

torchrun also reads a newer form where ``message`` is a string and ``extraInfo`` /
``timestamp`` sit at the top level; :func:`read_error_file` accepts both. A failing worker's
bootstrap imports this module to write its file, so it imports nothing of numarun's, and
nothing beyond what writing needs (no :mod:`dataclasses`, :mod:`pathlib` or :mod:`typing`:
creating a dataclass reads ``typing`` from ``sys.modules`` without the import lock, which
fails while another thread of the worker is importing it).
"""

from __future__ import annotations

import math
import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Bounds on what the summary quotes, so one bad rank cannot flood the screen.
_MAX_ERROR_FILE_BYTES = 16 * 1024 * 1024


class WorkerError:
    """What a worker's error file says: the one-line message, its traceback, when (epoch s).

    ``traceback`` and ``timestamp`` are None when the file does not carry them. ``raised_at``:
    the exact time (epoch s, a float) the exception reached the top of the worker, which only
    numarun's own error files carry (``extraInfo.numarun_raised_at``; torch's ``@record`` writes
    whole seconds only), else None. Immutable; equal when its four fields are (a frozen
    dataclass's semantics, written out).
    """

    __slots__ = ("message", "raised_at", "timestamp", "traceback")
    message: str
    traceback: str | None
    timestamp: int | None
    raised_at: float | None

    def __init__(
        self,
        message: str,
        traceback: str | None,
        timestamp: int | None,
        raised_at: float | None = None,
    ) -> None:
        object.__setattr__(self, "message", message)
        object.__setattr__(self, "traceback", traceback)
        object.__setattr__(self, "timestamp", timestamp)
        object.__setattr__(self, "raised_at", raised_at)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"WorkerError is immutable: cannot assign {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"WorkerError is immutable: cannot delete {name!r}")

    def _values(self) -> tuple[str, str | None, int | None, float | None]:
        return (self.message, self.traceback, self.timestamp, self.raised_at)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is WorkerError:
            return self._values() == other._values()  # type: ignore[attr-defined]
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        return (
            "WorkerError(message={!r}, traceback={!r}, timestamp={!r}, raised_at={!r})"
        ).format(*self._values())

    def __reduce__(self) -> tuple:
        return (WorkerError, self._values())


def read_error_file(path: str | os.PathLike[str] | None) -> WorkerError | None:
    """Read a torchrun-style error file; None when there is nothing usable in it.

    Accepts the ``@record`` form (``message`` an object with ``message`` and ``extraInfo``) and
    the newer one (``message`` a string, ``extraInfo``/``timestamp`` at the top level). None
    (never an exception) for: ``path`` None or empty, a missing, unreadable, empty, larger
    than 16 MiB, non-JSON or half-written file, or JSON without a ``message``. A timestamp that
    is not an integer (as a number or a string) gives ``timestamp=None``; a missing
    ``py_callstack`` gives ``traceback=None``. Bytes that are not UTF-8 are replaced.
    """
    if not path:
        return None
    try:
        with open(path, "rb") as file:
            raw = file.read(_MAX_ERROR_FILE_BYTES + 1)
    except (OSError, ValueError):
        return None
    if not raw.strip() or len(raw) > _MAX_ERROR_FILE_BYTES:
        return None
    import json  # here, not at the top: the launcher imports this module while workers start

    try:
        data = json.loads(raw.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    return _error_from_json(data)


def _error_from_json(data: dict[str, Any]) -> WorkerError | None:
    message = data.get("message")
    if isinstance(message, dict):
        extra = message.get("extraInfo")
        text = message.get("message")
        timestamp = _dict_get(extra, "timestamp")
    elif isinstance(message, str):
        extra = data.get("extraInfo")
        text = message
        timestamp = data.get("timestamp", _dict_get(extra, "timestamp"))
    else:
        return None
    callstack = _dict_get(extra, "py_callstack")
    return WorkerError(
        message=text if isinstance(text, str) else ("" if text is None else str(text)),
        traceback=callstack if isinstance(callstack, str) and callstack else None,
        timestamp=_whole_seconds(timestamp),
        raised_at=_exact_time(_dict_get(extra, "numarun_raised_at")),
    )


def _dict_get(value: object, key: str) -> object:
    return value.get(key) if isinstance(value, dict) else None


def _whole_seconds(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None


def _exact_time(value: object) -> float | None:
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, float) and math.isfinite(value) and value > 0:
        return value
    return None


def write_error_file(
    path: str | os.PathLike[str], exc: BaseException, *, now: float | None = None
) -> None:
    """Write ``exc`` to ``path`` exactly as torchrun's ``@record`` does.

    ``{"message": {"message": "<Type>: <str(exc)>", "extraInfo": {"py_callstack":
    "<formatted traceback>", "timestamp": "<int seconds>", "numarun_raised_at": "<seconds,
    6 decimals>"}}}`` (torchrun's readers ignore the last key; numarun's root cause uses it,
    :func:`numarun.launch.summary.root_cause`); the traceback is
    ``exc``'s own (chained exceptions included), so this may be called outside the ``except``
    block. ``now`` (default ``time.time()``) sets the timestamp. The file is written to a new
    temporary file in the same directory, created with a random name, ``O_EXCL`` and
    ``O_NOFOLLOW`` (a name planted in advance, a symbolic link included, is never opened), then
    renamed over ``path`` (a symbolic link there is replaced, never followed), so a reader never
    sees half of it. ``OSError`` (missing directory, permissions) propagates; the caller
    decides whether that matters.
    """
    import json
    import traceback

    callstack = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    when = time.time() if now is None else now
    data = {
        "message": {
            "message": f"{type(exc).__name__}: {exc}",
            "extraInfo": {
                "py_callstack": callstack,
                "timestamp": str(int(when)),
                "numarun_raised_at": f"{when:.6f}",
            },
        }
    }
    target = os.fspath(path)
    folder, name = os.path.split(target)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(100):
        temporary = os.path.join(folder, f".{name}.{os.urandom(6).hex()}.tmp")
        try:
            fd = os.open(temporary, flags, 0o644)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free temporary name next to {target}")
    try:
        with open(fd, "w", encoding="utf-8") as file:
            json.dump(data, file)
        os.replace(temporary, target)
    except BaseException:
        import contextlib

        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise

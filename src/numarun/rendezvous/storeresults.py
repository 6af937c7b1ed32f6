"""What the ``numarun-store`` thread reports to the supervisor's loop about the rendezvous itself,
as typed records: :class:`Change`, :class:`Lost`, :class:`Notice`.

:mod:`numarun.rendezvous.storewatch` and :class:`numarun.rendezvous.torchrdzv.ElasticNode` make
them in the store thread; the node acts on them in the loop (or, detached, the exit barrier's wait
reads them). The whole-job view's records are its own (:mod:`numarun.jobwide.results`). Each
record is a :class:`numarun.machine.model.Value` (no dataclass is defined on the launcher's paths:
DESIGN.md, "Acting on a failure imports nothing") and names its ``kind`` (a class attribute), for
logs and measurements.
"""

from __future__ import annotations

from numarun.machine.model import Value

REJOIN = "rejoin"
END = "end"


class Change(Value):
    """Why this node stopped its workers for the rendezvous: ``kind`` is :data:`REJOIN`
    (re-form the group, no restart used) or :data:`END` (the job is over for this node)."""

    _fields = ("kind", "message")
    __slots__ = _fields
    kind: str
    message: str

    def __init__(self, kind: str, message: str) -> None:
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "message", message)

    @property
    def reason(self) -> str:
        """The ``stop_reason`` given to the supervisor."""
        return f"rendezvous: {self.message}"


class Lost(Value):
    """The store stopped answering: ``error``, what the store call raised."""

    kind = "lost"
    _fields = ("error",)
    __slots__ = _fields
    error: BaseException

    def __init__(self, error: BaseException) -> None:
        object.__setattr__(self, "error", error)


class Notice(Value):
    """Another numarun node stopped: its one line (``text``, escaped and cut), and where its
    ranks were as the whole-job view read it (``digest``, ``frames``: opaque here; None and
    empty without)."""

    kind = "notice"
    _fields = ("text", "digest", "frames")
    __slots__ = _fields
    text: str
    digest: object
    frames: dict

    def __init__(self, text: str, digest: object = None, frames: dict | None = None) -> None:
        object.__setattr__(self, "text", text)
        object.__setattr__(self, "digest", digest)
        object.__setattr__(self, "frames", frames or {})


Result = object
"""What a look returns and the loop is handed: any record of this module's or of the whole-job
view's (:mod:`numarun.jobwide.results`)."""

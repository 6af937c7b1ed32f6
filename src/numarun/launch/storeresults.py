"""What the ``numarun-store`` thread reports to the supervisor's loop, as typed records.

:mod:`numarun.launch.storewatch` and :mod:`numarun.launch.jobwide` make them in the store thread;
:meth:`numarun.launch.torchrdzv.ElasticNode._on_result` acts on them in the loop (or, detached,
the exit barrier's wait reads them). Each record is a :class:`numarun.machine.model.Value` (no
dataclass is defined on the launcher's paths: DESIGN.md, "Acting on a failure imports nothing")
and names its ``kind`` (a class attribute), for logs and measurements.
"""

from __future__ import annotations

from numarun.machine.model import Value

TYPE_CHECKING = False
if TYPE_CHECKING:
    from numarun.stacks.merge import JobView

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
    """Another numarun node stopped: its one line (``text``), and where its ranks were
    (``digest``, ``frames``: :mod:`numarun.stacks.remote`'s posts, None and empty without)."""

    kind = "notice"
    _fields = ("text", "digest", "frames")
    __slots__ = _fields
    text: str
    digest: object
    frames: dict

    def __init__(self, text: str, digest: object, frames: dict) -> None:
        object.__setattr__(self, "text", text)
        object.__setattr__(self, "digest", digest)
        object.__setattr__(self, "frames", frames)


class Ask(Value):
    """A whole-job ``numarun stacks`` request (event ``number``): this node's ranks answer."""

    kind = "ask"
    _fields = ("number",)
    __slots__ = _fields
    number: int

    def __init__(self, number: int) -> None:
        object.__setattr__(self, "number", number)


class Merged(Value):
    """The merged answer to this node's request ``token`` (empty: another node's): the job's
    classes (``view``, None when unreadable) and their ``frames``."""

    kind = "merged"
    _fields = ("token", "view", "frames")
    __slots__ = _fields
    token: str
    view: JobView | None
    frames: dict[str, bytes]

    def __init__(self, token: str, view: JobView | None, frames: dict[str, bytes]) -> None:
        object.__setattr__(self, "token", token)
        object.__setattr__(self, "view", view)
        object.__setattr__(self, "frames", frames)


class Hang(Value):
    """The job's hang verdict: the merged classes (``view``), declared by node ``sender``."""

    kind = "hang"
    _fields = ("view", "sender")
    __slots__ = _fields
    view: JobView
    sender: int

    def __init__(self, view: JobView, sender: int) -> None:
        object.__setattr__(self, "view", view)
        object.__setattr__(self, "sender", sender)


Result = Change | Lost | Notice | Ask | Merged | Hang
"""Any of them (what a look returns, what the loop is handed)."""

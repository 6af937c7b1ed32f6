"""What the store thread reports to the supervisor's loop for the whole-job view: :class:`Ask`,
:class:`Merged`, :class:`Hang` (:class:`numarun.machine.model.Value` records, as the rendezvous's
own in :mod:`numarun.rendezvous.storeresults`).

:mod:`numarun.jobwide.protocol` makes them in the store thread; :class:`numarun.jobwide.notices.
JobNotices` acts on them in the loop.
"""

from __future__ import annotations

from numarun.machine.model import Value

TYPE_CHECKING = False
if TYPE_CHECKING:
    from numarun.stacks.merge import JobView


class Ask(Value):
    """A whole-job ``numarun stacks`` request (event ``number``): this node's ranks answer."""

    kind = "ask"
    _fields = ("number",)
    __slots__ = _fields
    number: int

    def __init__(self, number: int) -> None:
        object.__setattr__(self, "number", number)


class Merged(Value):
    """The merged answer to this node's request ``token``: the job's classes (``view``, None
    when there is none: ``why`` says why) and their ``frames``."""

    kind = "merged"
    _fields = ("token", "view", "frames", "why")
    __slots__ = _fields
    token: str
    view: JobView | None
    frames: dict[str, bytes]
    why: str

    def __init__(self, token: str, view: JobView | None, frames: dict[str, bytes],
                 why: str = "") -> None:  # fmt: skip
        object.__setattr__(self, "token", token)
        object.__setattr__(self, "view", view)
        object.__setattr__(self, "frames", frames)
        object.__setattr__(self, "why", why)


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



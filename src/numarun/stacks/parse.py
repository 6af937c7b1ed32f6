"""Ranks' Python stacks: faulthandler's text parsed, grouped and formatted. Pure: no effects.

The input is what :func:`faulthandler.register` (``all_threads=True``) writes for one rank::

    Thread 0x00007f3a2c5fe640 (most recent call first):
      File "/usr/lib/python3.11/threading.py", line 320 in wait
      ...

    Current thread 0x00007f3a3a1b3740 (most recent call first):
      File "/job/train.py", line 14 in step
      File "/job/train.py", line 30 in <module>

faulthandler lists threads newest first, so the main thread (the oldest) comes last; it shows
at most 100 frames per thread (then ``  ...``) and 100 threads (then ``...``). "Current
thread" only names the thread that happened to run the signal handler.

:func:`parse_dump` turns that text into :class:`Thread` objects, without numarun's bootstrap frames
(``numarun/worker/bootstrap.py``, ``spawning/childmain.py``, ``process/forkexec.py``, everything
outside them, and the :mod:`runpy` frames between them and the user's module), so a stack starts at
the user's program, and without numarun's helper thread (:mod:`numarun.worker.dumphandler`: the
one that runs the handler, not the program's); and each run of import machinery frames
(``<frozen importlib._bootstrap>``, ``<frozen importlib._bootstrap_external>``: about 35 per
nested import) collapsed into one
:data:`IMPORTING` frame, as Python's own tracebacks leave them out, so that ranks importing the same
modules group together whatever step of the import each is at. :func:`group_ranks` puts ranks with
identical stacks (every thread's file, line and function; thread ids and which thread was
"current" do not count) into one :class:`Group`: the largest group first, ties by lowest rank,
ranks without stacks last. Each group's heading (:func:`where`) names the innermost *user* frame of
its main thread first -- a frame outside the standard library, ``site-packages``/``dist-packages``,
numarun and ``<frozen ...>`` code -- then the innermost frame when that is elsewhere
(``all_reduce`` in torch), so the rank that is somewhere else stands out at a glance.
:func:`odd_ones_out` names the groups that differ from the majority (the likely culprits of a
hang).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Sequence

from numarun.machine.model import Value
from numarun.worker.dumphandler import HELPER_FUNCTION

__all__ = [
    "Frame",
    "Group",
    "RankStacks",
    "Thread",
    "format_groups",
    "format_ranks",
    "frame_lines",
    "group_ranks",
    "nodes_line",
    "odd_ones_out",
    "parse_dump",
    "stacks_to_json",
    "where",
]

_HEADER = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):$")
_FRAME = re.compile(r'^  File "(?P<file>.*)", line (?P<line>\d+|\?\?\?) in (?P<function>.*)$')
_BOOTSTRAP_FILES = tuple(
    os.sep + os.path.join("numarun", *name.split("/"))
    for name in ("worker/bootstrap.py", "spawning/childmain.py", "process/forkexec.py")
)
# The helper thread's module.
_HELPER_FILES = (os.sep + os.path.join("numarun", "worker", "dumphandler.py"),)
# numarun/stacks/parse.py -> numarun/: every frame of numarun's own code.
_NUMARUN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB = re.compile(r"/lib(?:64)?/python\d+\.\d+/")
_IMPORT_MACHINERY = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>")
_PACKAGES = ("/site-packages/", "/dist-packages/")
# A main thread with a frame here waits inside torch: a collective, a Work's wait, a backward
# (DDP all-reduces the gradients from the autograd engine, so its stack shows no collective).
WAITS_IN_TORCH = ("torch/distributed/", "torch/nn/parallel/", "torch/autograd/", "torch/_tensor.py")
# The failure and hang summaries show this many innermost frames of each group's main thread.
SUMMARY_FRAMES = 12
_set = object.__setattr__  # how a Value's __init__ fills its slots


class Frame(Value):
    """One frame as faulthandler wrote it; ``line`` None where it wrote ``???``."""

    _fields = ("file", "line", "function")
    __slots__ = _fields
    file: str
    line: int | None
    function: str

    def __init__(self, file: str, line: int | None, function: str) -> None:
        _set(self, "file", file)
        _set(self, "line", line)
        _set(self, "function", function)

    def location(self, *, short: bool = False) -> str:
        """``file:line`` (``short``: library paths from the package or stdlib module on)."""
        path = _short_path(self.file) if short else self.file
        return f"{path}:{'?' if self.line is None else self.line}"


IMPORTING = Frame("<frozen importlib._bootstrap>", None, "<import machinery>")
"""Stands for a run of import machinery frames (module docstring): a rank inside ``import``."""


class Thread(Value):
    """One thread's frames, most recent call first, bootstrap frames removed. ``ident`` is
    faulthandler's ``0x...``; ``current``: it ran the signal handler; ``truncated``: more than
    100 frames (faulthandler showed the innermost 100)."""

    _fields = ("ident", "current", "frames", "truncated", "in_bootstrap")
    __slots__ = _fields
    ident: str
    current: bool
    frames: tuple[Frame, ...]
    truncated: bool
    in_bootstrap: bool  # frames were all numarun's bootstrap: the program not begun

    def __init__(
        self,
        ident: str,
        current: bool,
        frames: tuple[Frame, ...],
        truncated: bool = False,
        in_bootstrap: bool = False,
    ) -> None:
        _set(self, "ident", ident)
        _set(self, "current", current)
        _set(self, "frames", frames)
        _set(self, "truncated", truncated)
        _set(self, "in_bootstrap", in_bootstrap)


class RankStacks(Value):
    """One rank's stacks, or why there are none.

    ``threads`` in faulthandler's order (the main thread last), empty when ``problem`` says
    why there are no stacks (``"not a Python process"``, ``"exited"``, ...). ``more_threads``:
    faulthandler stopped at 100 threads. ``text`` is the dump exactly as written. ``node``:
    which node of a multi-node job the rank runs on (``node 1 (host-b)``), set for the stacks of
    a whole job (:mod:`numarun.stacks.digest`); None for one node's own view.
    """

    _fields = (
        "rank", "local_rank", "pid", "threads", "problem", "text", "more_threads", "node"
    )  # fmt: skip
    __slots__ = _fields
    rank: int
    local_rank: int
    pid: int | None
    threads: tuple[Thread, ...]
    problem: str | None
    text: str
    more_threads: bool
    node: str | None

    def __init__(
        self,
        rank: int,
        local_rank: int,
        pid: int | None,
        threads: tuple[Thread, ...] = (),
        problem: str | None = None,
        text: str = "",
        more_threads: bool = False,
        node: str | None = None,
    ) -> None:
        _set(self, "rank", rank)
        _set(self, "local_rank", local_rank)
        _set(self, "pid", pid)
        _set(self, "threads", threads)
        _set(self, "problem", problem)
        _set(self, "text", text)
        _set(self, "more_threads", more_threads)
        _set(self, "node", node)

    @property
    def main_thread(self) -> Thread | None:
        return self.threads[-1] if self.threads else None

    def key(self) -> tuple:
        """What makes two ranks' stacks identical: every thread's frames (the main thread
        first, the others in a fixed order); ranks without stacks: their problem."""
        if not self.threads:
            return ("problem", self.problem or "no stacks")
        frames = [tuple((f.file, f.line, f.function) for f in t.frames) for t in self.threads]
        return ("stacks", frames[-1], tuple(sorted(frames[:-1])), self.more_threads)


class Group(Value):
    """Ranks whose stacks are identical (or that share the same problem); ``ranks``: the
    members' ranks, sorted."""

    _fields = ("members",)
    __slots__ = ("members", "ranks")
    members: tuple[RankStacks, ...]
    ranks: tuple[int, ...]

    def __init__(self, members: tuple[RankStacks, ...]) -> None:
        _set(self, "members", members)
        _set(self, "ranks", tuple(sorted(member.rank for member in members)))

    @property
    def sample(self) -> RankStacks:
        return min(self.members, key=lambda member: member.rank)

    @property
    def has_stacks(self) -> bool:
        return bool(self.sample.threads)


# --- parsing -------------------------------------------------------------------------------------


def parse_dump(text: str) -> tuple[tuple[Thread, ...], bool]:
    """(threads, more_threads) from one faulthandler dump; lines it does not know are skipped.

    A dump with no thread header (``Stack (most recent call first):``, one thread) gives one
    thread with an empty ``ident``.
    """
    threads: list[Thread] = []
    more = False
    ident: str | None = None
    current = False
    frames: list[Frame] = []
    truncated = False

    def close() -> None:
        if ident is not None and not _is_helper(frames):
            kept = _imports_collapsed(_without_bootstrap(frames))
            threads.append(Thread(ident, current, kept, truncated, bool(frames) and not kept))

    for line in text.split("\n"):
        if line.startswith('  File "'):  # most lines: no header to look for
            match = _FRAME.match(line)
            if match is not None and ident is not None:
                file, number, function = match.groups()
                frames.append(Frame(file, None if number == "???" else int(number), function))
            continue
        header = _HEADER.match(line)
        if header is not None or line == "Stack (most recent call first):":
            close()
            ident = header.group(2) if header is not None else ""
            current = header is None or header.group(1) == "Current thread"
            frames, truncated = [], False
            continue
        if line == "  ..." and ident is not None:
            truncated = True
        elif line == "...":
            more = True
    close()
    return tuple(threads), more


def _is_helper(frames: Sequence[Frame]) -> bool:
    """Whether these are the frames of numarun's helper thread (its bottom frame is the
    helper's function in :mod:`numarun.worker.dumphandler`): not the program's, never shown."""
    return bool(frames) and frames[-1].function == HELPER_FUNCTION and frames[-1].file.endswith(
        _HELPER_FILES
    )


def _is_bootstrap(frame: Frame) -> bool:
    return frame.file.endswith(_BOOTSTRAP_FILES)


def _is_runpy(frame: Frame) -> bool:
    return frame.file == "<frozen runpy>" or frame.file.endswith(f"{os.sep}runpy.py")


def _without_bootstrap(frames: Sequence[Frame]) -> tuple[Frame, ...]:
    """The frames inside the innermost numarun bootstrap frame, runpy's calls removed."""
    for index, frame in enumerate(frames):
        if frame.file.endswith(_BOOTSTRAP_FILES):
            kept = list(frames[:index])
            while kept and _is_runpy(kept[-1]):
                kept.pop()
            return tuple(kept)
    return tuple(frames)


def _imports_collapsed(frames: tuple[Frame, ...]) -> tuple[Frame, ...]:
    """``frames`` with each run of import machinery frames replaced by :data:`IMPORTING`."""
    if not any(frame.file in _IMPORT_MACHINERY for frame in frames):
        return frames
    kept: list[Frame] = []
    for frame in frames:
        if frame.file in _IMPORT_MACHINERY:
            if not kept or kept[-1] is not IMPORTING:
                kept.append(IMPORTING)
        else:
            kept.append(frame)
    return tuple(kept)


# --- where a rank is -----------------------------------------------------------------------------


def is_library(path: str) -> bool:
    """True for the standard library, installed packages, numarun and ``<frozen ...>`` code."""
    return (
        path.startswith("<")
        or any(part in path for part in _PACKAGES)
        or _STDLIB.search(path) is not None
        or path.startswith(_NUMARUN_DIR)
    )


def _short_path(path: str) -> str:
    for part in _PACKAGES:
        if part in path:
            return path.rsplit(part, 1)[1]
    found = list(_STDLIB.finditer(path))
    return path[found[-1].end() :] if found else path


def where(stacks: RankStacks) -> str:
    """One line saying where the main thread is: ``in step (/job/train.py:14), innermost
    all_reduce (torch/distributed/distributed_c10d.py:2501)`` -- the innermost user frame
    first; or why there are no stacks."""
    thread = stacks.main_thread
    if thread is None:
        return f"no stacks: {stacks.problem or 'unknown'}"
    if not thread.frames:
        if thread.in_bootstrap:
            return "in numarun's bootstrap (the program has not begun)"
        return "no Python frame (the interpreter is starting up or exiting)"
    importing = thread.frames[0] == IMPORTING
    real = [frame for frame in thread.frames if frame != IMPORTING]
    if not real:
        return "importing (only import machinery frames)"
    innermost = real[0]
    user = next((frame for frame in real if not is_library(frame.file)), None)
    if user is None:
        text = f"in {innermost.function} ({innermost.location(short=True)})"
    else:
        text = f"in {user.function} ({user.location()})"
        if user is not innermost:
            text += f", innermost {innermost.function} ({innermost.location(short=True)})"
    return text + (", importing" if importing else "")


# --- grouping ------------------------------------------------------------------------------------


def group_ranks(ranks: Iterable[RankStacks]) -> list[Group]:
    """Ranks with identical stacks together: groups with stacks first, largest first (ties:
    lowest rank first), then the ranks without stacks grouped by their problem."""
    by_key: dict[tuple, list[RankStacks]] = {}
    for stacks in ranks:
        by_key.setdefault(stacks.key(), []).append(stacks)
    groups = [Group(tuple(members)) for members in by_key.values()]
    return sorted(groups, key=lambda group: (not group.has_stacks, -len(group.ranks), group.ranks))


def odd_ones_out(groups: Sequence[Group]) -> tuple[Group | None, list[Group]]:
    """(the majority, the groups whose stacks differ from it): the likely culprits of a hang.

    The majority is the largest group with stacks; between groups of the same size, the one
    whose main thread waits inside torch (:data:`WAITS_IN_TORCH`: a collective, a ``wait()``,
    a backward whose gradients DDP all-reduces), if exactly one does: the others, in their own
    code, are the likely partners it waits for (two ranks, one hang). With one group there is
    no odd one; without a majority (a tie) every group is listed.
    """
    with_stacks = [group for group in groups if group.has_stacks]
    if not with_stacks:
        return None, []
    if len(with_stacks) == 1:
        return with_stacks[0], []
    size = len(with_stacks[0].ranks)
    largest = [group for group in with_stacks if len(group.ranks) == size]
    if len(largest) > 1:
        waiting = [group for group in largest if waits_in_torch(group.sample)]
        if len(waiting) != 1:
            return None, with_stacks
        largest = waiting
    majority = largest[0]
    return majority, [group for group in with_stacks if group is not majority]


def waits_in_torch(stacks: RankStacks) -> bool:
    """Whether the rank's main thread waits inside torch (:data:`WAITS_IN_TORCH`)."""
    thread = stacks.main_thread
    return thread is not None and any(
        any(part in frame.file.replace(os.sep, "/") for part in WAITS_IN_TORCH)
        for frame in thread.frames
    )


def format_ranks(ranks: Iterable[int]) -> str:
    """``0,2-7``: sorted, consecutive ranks as ranges."""
    ordered = sorted(set(ranks))
    if not ordered:
        return ""
    runs: list[str] = []
    start = previous = ordered[0]
    for rank in [*ordered[1:], None]:
        if rank is not None and rank == previous + 1:
            previous = rank
            continue
        runs.append(str(start) if start == previous else f"{start}-{previous}")
        if rank is not None:
            start = previous = rank
    return ",".join(runs)


def heading(group: Group) -> str:
    """``ranks 0,2-7: in step (/job/train.py:14), innermost all_reduce (...)``."""
    label = "rank" if len(group.ranks) == 1 else "ranks"
    return f"{label} {format_ranks(group.ranks)}: {where(group.sample)}"


def nodes_line(group: Group) -> str:
    """``on node 0 (host-a): ranks 0,1; node 1 (host-b): rank 2`` for the ranks of a whole job
    (:attr:`RankStacks.node` set); empty for one node's own ranks."""
    by_node: dict[str, list[int]] = {}
    for member in group.members:
        if member.node is not None:
            by_node.setdefault(member.node, []).append(member.rank)
    if not by_node:
        return ""
    parts = [
        f"{node}: {'rank' if len(ranks) == 1 else 'ranks'} {format_ranks(ranks)}"
        for node, ranks in sorted(by_node.items(), key=lambda item: min(item[1]))
    ]
    return "on " + "; ".join(parts)


def format_groups(
    groups: Sequence[Group], *, max_frames: int | None = None, other_threads: bool = True
) -> list[str]:
    """Text lines: per group its :func:`heading`, then its stacks indented (main thread first,
    frames most recent call first, as Python's traceback lines). ``max_frames`` keeps the
    innermost frames of each thread (``... N more frames``); ``other_threads`` False shows
    only the main thread and how many others there are."""
    lines: list[str] = []
    for group in groups:
        lines.append(heading(group))
        where_run = nodes_line(group)
        if where_run:
            lines.append(f"    {where_run}")
        sample = group.sample
        if not sample.threads:
            continue
        threads = [sample.threads[-1], *sample.threads[:-1]]
        count = len(threads)
        for index, thread in enumerate(threads):
            if index and not other_threads:
                rest = count - 1
                lines.append(f"    ({rest} other thread{'s' if rest != 1 else ''} not shown)")
                break
            name = "main thread" if index == 0 else f"thread {index + 1} of {count}"
            lines.append(f"    {name} ({thread.ident or 'id unknown'}, most recent call first):")
            lines.extend(frame_lines(thread, max_frames, "faulthandler shows at most 100 frames"))
        if sample.more_threads and other_threads:
            lines.append("    ... (faulthandler shows at most 100 threads)")
    return lines


# --- JSON ----------------------------------------------------------------------------------------


def _frame_json(frame: Frame) -> dict[str, object]:
    return {"file": frame.file, "line": frame.line, "function": frame.function}


def stacks_to_json(ranks: Sequence[RankStacks], **job: object) -> dict[str, object]:
    """The document ``numarun stacks --json`` prints: ``job`` fields (``run_id``, ``pid``,
    ``host``, ...), ``taken_at`` (epoch seconds), ``groups`` as :func:`group_ranks` orders
    them (``ranks``, ``where``: the heading's text, ``user_frame``/``innermost_frame`` or
    None, ``problem``), and ``ranks`` by rank, each with ``threads`` (main thread last, as
    faulthandler lists them; ``main`` marks it) of ``frames`` (most recent call first)."""
    groups = []
    for group in group_ranks(ranks):
        thread = group.sample.main_thread
        frames = thread.frames if thread is not None else ()
        user = next((frame for frame in frames if not is_library(frame.file)), None)
        groups.append(
            {
                "ranks": list(group.ranks),
                "where": where(group.sample),
                "user_frame": _frame_json(user) if user is not None else None,
                "innermost_frame": _frame_json(frames[0]) if frames else None,
                "problem": group.sample.problem,
            }
        )
    documents = []
    for stacks in sorted(ranks, key=lambda item: item.rank):
        last = len(stacks.threads) - 1
        documents.append(
            {
                "rank": stacks.rank,
                "local_rank": stacks.local_rank,
                **({"node": stacks.node} if stacks.node is not None else {}),
                "pid": stacks.pid,
                "problem": stacks.problem,
                "more_threads": stacks.more_threads,
                "threads": [
                    {
                        "id": thread.ident,
                        "main": index == last,
                        "current": thread.current,
                        "truncated": thread.truncated,
                        "frames": [_frame_json(frame) for frame in thread.frames],
                    }
                    for index, thread in enumerate(stacks.threads)
                ],
            }
        )
    return {**job, "taken_at": time.time(), "groups": groups, "ranks": documents}


def rank_stacks(
    rank: int,
    local_rank: int,
    pid: int | None,
    text: str | None,
    problem: str | None,
    node: str | None = None,
) -> RankStacks:
    """A :class:`RankStacks` from a dump's text (None or empty: ``problem`` says why)."""
    if not text:
        return RankStacks(rank, local_rank, pid, problem=problem or "no stacks", node=node)
    threads, more = parse_dump(text)
    if not threads:
        return RankStacks(
            rank, local_rank, pid, problem=problem or "unreadable dump", text=text, node=node
        )
    return RankStacks(rank, local_rank, pid, threads, problem, text, more, node)


def frame_lines(thread: Thread, max_frames: int | None, cut: str) -> list[str]:
    """``thread``'s frames as the summary and ``numarun stacks`` show them, most recent call
    first, indented six spaces: at most ``max_frames`` (None: all) and a line for the rest, or
    ``(no Python frame)``; ``cut`` is said when faulthandler cut the thread's frames."""
    frames = thread.frames if max_frames is None else thread.frames[:max_frames]
    lines = [] if thread.frames else ["      (no Python frame)"]
    for frame in frames:
        number = "?" if frame.line is None else frame.line
        lines.append(f'      File "{frame.file}", line {number}, in {frame.function}')
    hidden = len(thread.frames) - len(frames)
    if hidden:
        lines.append(f"      ... {hidden} more frame{'s' if hidden != 1 else ''}")
    elif thread.truncated:
        lines.append(f"      ... ({cut})")
    return lines

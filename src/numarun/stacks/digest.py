"""One node's stacks as posted for the other nodes of a job, and read back. Pure: no effects.

Under a torch rendezvous (c10d, etcd) the launchers of a job share torch's store. A node never
posts every rank's stacks: it merges its ranks into *classes* first (ranks whose stacks are the
same: every thread's file, line and function; :func:`numarun.stacks.parse.RankStacks.key`), as
LLNL's Stack Trace Analysis Tool does, and posts a **digest** of a few hundred bytes::

    {"v": 2, "node": <group rank>, "host": "<host>", "pid": <launcher pid>, "state": "answer",
     "classes": [{"id": "<16 hex>", "ranks": <rank set>, "pids": [4242]}],
     "problems": [{"problem": "exited", "ranks": <rank set>}],
     "flight": "<the ranks' flight-recorder summary, JSON text>"}

``flight`` is there when the node's ranks' flight recorders were taken with their stacks and
one of them has a process group (:func:`numarun.stacks.flightjob.node_flight`: each group's
frontier, ranks in step as one class; at most :data:`numarun.stacks.flightjob.FLIGHT_LIMIT`
characters). It is read back as text only: decoded where the digests are merged
(:func:`numarun.stacks.flightjob.job_flight`), so a broken one costs that node's flight
record, never its stacks.

A class's frames are posted once per round, whoever sees the class first, as its **frames** post
(content-addressed by the class id: a hash of the frames without thread ids), bounded by
:data:`FRAMES_LIMIT` (other threads dropped first, then the main thread's outermost frames)::

    {"v": 2, "threads": [{"id": "0x7f..", "frames": [["/job/train.py", 14, "step"], ...],
     "cut": false}], "more": false}

A rank set is a list of ``[skip, take, times]`` triples: from 0, ``times`` times skip ``skip``
numbers and take the next ``take``; so ``0-8191`` is ``[[0, 8192, 1]]`` and "local rank 0 of
each of 1,024 nodes of 8 ranks" is ``[[0, 1, 1], [7, 1, 1023]]`` (:func:`encode_ranks`).

The store is unauthenticated: whatever is read back is untrusted data. :func:`load_json` checks
size and nesting before decoding (no ``RecursionError``, no huge parse); every field is
type-checked, numbers bounded; a post that is not one raises :class:`PostError` (a
:class:`ValueError` whose message is one line naming what is wrong), so the caller names it and
skips it. Text read back is shown through :func:`printable` (control characters escaped).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Sequence

from numarun.stacks.dumps import Raw
from numarun.stacks.flightjob import FLIGHT_LIMIT, node_flight
from numarun.stacks.parse import Frame, RankStacks, Thread, rank_stacks

FORMAT = 2
DIGEST_LIMIT = 64 * 1024  # bytes of one node's digest
FRAMES_LIMIT = 32 * 1024  # bytes of one class's frames post
MAX_DEPTH = 8  # nesting of numarun's posts: object > list > object > list > list
MAX_RANKS = 1 << 22  # ranks in one rank set
MAX_TEXT = 300  # characters of a problem, a notice
_PIDS_UP_TO = 8  # a class of at most this many ranks carries their pids
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS = bytes(set(range(256)) - set(b"[]{}"))
_DEPTH = bytes.maketrans(b"[]{}", b"\x01\xff\x01\xff")


class PostError(ValueError):
    """What was read from the store is not a post of this numarun; the message is one line."""


def node_label(group_rank: int, host: str) -> str:
    """How a rank's node is named: ``node 1 (host-b)``."""
    return f"node {group_rank} ({printable(host)})"


def printable(text: str) -> str:
    """``text`` with control characters (tab excepted) shown as escapes: what another node
    posted reaches this user's terminal."""
    return "".join(
        char if char == "\t" or (char.isprintable() and char not in "\u2028\u2029") else
        (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")
        for char in text
    )  # fmt: skip


# --- untrusted JSON ------------------------------------------------------------------------------


def nesting(data: bytes) -> int:
    """How deeply ``data``'s JSON arrays and objects nest (strings skipped), without
    decoding it: linear, no recursion."""
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS).translate(_DEPTH)
    if not brackets:
        return 0
    return max(itertools.accumulate(memoryview(brackets).cast("b")))


def load_json(data: bytes, *, limit: int, what: str, depth: int = MAX_DEPTH) -> object:
    """``data`` decoded as JSON once it is known to be at most ``limit`` bytes nested at most
    ``depth`` deep; :class:`PostError` naming ``what`` otherwise, or when it is not JSON."""
    if len(data) > limit:
        raise PostError(f"{what}: {len(data):,} bytes, more than the {limit:,} numarun posts")
    if nesting(data) > depth:
        raise PostError(f"{what}: nested deeper than numarun's posts ({depth} levels)")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as error:  # JSONDecodeError, UnicodeDecodeError, digits
        raise PostError(f"{what}: not JSON ({str(error)[:80]})") from None


def whole(value: object, name: str, low: int = 0, high: int = (1 << 31) - 1) -> int:
    """``value`` as a whole number in ``[low, high]`` (not a bool, not a float)."""
    if type(value) is not int or not low <= value <= high:
        raise PostError(f"{name} is not a whole number from {low} to {high}")
    return value


def text(value: object, name: str, limit: int = MAX_TEXT) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise PostError(f"{name} is not a string of at most {limit} characters")
    return value


def listed(value: object, name: str, limit: int) -> list:
    if not isinstance(value, list) or len(value) > limit:
        raise PostError(f"{name} is not a list of at most {limit} items")
    return value


def mapping(value: object, name: str) -> dict:
    if not isinstance(value, dict):
        raise PostError(f"{name} is not an object")
    return value


# --- rank sets -----------------------------------------------------------------------------------


def encode_ranks(ranks: Sequence[int]) -> list[list[int]]:
    """Sorted distinct non-negative ranks as ``[skip, take, times]`` triples (module docstring):
    periodic sets (a local rank on every node) stay a few numbers whatever the job's size."""
    pairs: list[tuple[int, int]] = []
    position = 0
    index = 0
    ordered = list(ranks)
    while index < len(ordered):
        start = ordered[index]
        end = start
        while index + 1 < len(ordered) and ordered[index + 1] == end + 1:
            index += 1
            end += 1
        pairs.append((start - position, end - start + 1))
        position = end + 1
        index += 1
    triples: list[list[int]] = []
    for pair, same in itertools.groupby(pairs):
        triples.append([pair[0], pair[1], sum(1 for _ in same)])
    return triples


def check_ranks(value: object, name: str, *, below: int = MAX_RANKS) -> tuple[list, int]:
    """(the triples, how many ranks) of an encoded rank set whose ranks are all below
    ``below``, checked without expanding it; :class:`PostError` for anything else (a rank set
    of more than :data:`MAX_RANKS` ranks included)."""
    triples = []
    count = position = 0
    for triple in listed(value, name, 1 << 16):
        if not isinstance(triple, list) or len(triple) != 3:
            raise PostError(f"{name} is not a list of [skip, take, times]")
        skip = whole(triple[0], name, 0, below)
        take = whole(triple[1], name, 1, below)
        times = whole(triple[2], name, 1, below)
        count += take * times
        position += (skip + take) * times
        if count > MAX_RANKS or position > below:
            raise PostError(f"{name} holds ranks beyond {below - 1}")
        triples.append((skip, take, times))
    return triples, count


def expand_ranks(triples: list) -> list[int]:
    """The sorted ranks of checked triples (:func:`check_ranks`)."""
    ranks: list[int] = []
    position = 0
    for skip, take, times in triples:
        for _ in range(times):
            position += skip
            ranks.extend(range(position, position + take))
            position += take
    return ranks


def decode_ranks(value: object, name: str, *, below: int = MAX_RANKS) -> list[int]:
    """The sorted ranks of an encoded rank set (:func:`check_ranks`)."""
    return expand_ranks(check_ranks(value, name, below=below)[0])


# --- one node's digest ---------------------------------------------------------------------------


class Classes:
    """Parsed classes of one node, kept for the round: the dump without its threads' header lines
    (thread ids, which thread was current) -> (class id, frames post). A dump seen before costs
    a split, a join and a dictionary look-up (about 20 us for 160 frames); only a new one is
    parsed. At most ``limit`` kept."""

    def __init__(self, limit: int = 256) -> None:
        self._known: dict[str, tuple[str, bytes]] = {}
        self._limit = limit

    def classify(self, text: str) -> tuple[str, bytes] | None:
        """(class id, frames post) of a dump's text; None when it holds no thread."""
        # A thread per block, its header line first: the rest is what the class is made of.
        key = "\0".join(block.partition("\n")[2] for block in text.split("\n\n"))
        found = self._known.get(key)
        if found is None:
            stacks = rank_stacks(0, 0, None, text, None)
            if not stacks.threads:
                return None
            found = frames_post(stacks)
            if len(self._known) >= self._limit:
                self._known.pop(next(iter(self._known)))
            self._known[key] = found
        return found


def class_id(shape: Sequence[Sequence[list]], more: bool) -> str:
    """The id of a class: a hash of its threads' ``[file, line, function]`` lists (the main
    thread, listed last, first; the others in a fixed order), without thread ids."""
    main, others = (shape[-1], sorted(shape[:-1])) if shape else ([], [])
    canonical = json.dumps([main, others, more], separators=(",", ":")).encode()
    return hashlib.blake2b(canonical, digest_size=8).hexdigest()


def _thread_doc(thread: Thread, frames: int | None = None) -> dict:
    shown = thread.frames if frames is None else thread.frames[:frames]
    return {
        "id": thread.ident[:32],
        "frames": [[f.file[:1024], f.line, f.function[:256]] for f in shown],
        "cut": thread.truncated or len(shown) < len(thread.frames),
    }


def frames_post(stacks: RankStacks, limit: int = FRAMES_LIMIT - 512) -> tuple[str, bytes]:
    """(class id, frames post) of ``stacks``, which has threads (module docstring): within
    ``limit`` bytes, other threads dropped first (the newest first), then the main thread's
    outermost frames."""
    main, others = stacks.threads[-1], list(stacks.threads[:-1])
    docs = [_thread_doc(thread) for thread in stacks.threads]
    data = json.dumps({"v": FORMAT, "threads": docs, "more": stacks.more_threads},
                      separators=(",", ":"))  # fmt: skip
    if len(data) > limit:  # rare: faulthandler's 100 threads of 100 frames
        sizes = [len(json.dumps(doc)) + 1 for doc in docs]
        frames = len(main.frames)
        main_doc, size = docs[-1], sizes[-1]
        while frames > 1 and size > limit:
            frames //= 2
            main_doc = _thread_doc(main, frames)
            size = len(json.dumps(main_doc))
        kept: list[dict] = []
        for doc, extra in zip(reversed(docs[:-1]), reversed(sizes[:-1]), strict=True):
            if size + extra > limit:  # the oldest threads first
                break
            kept.insert(0, doc)
            size += extra
        docs = [*kept, main_doc]
        more = stacks.more_threads or len(docs) - 1 < len(others)
        data = json.dumps({"v": FORMAT, "threads": docs, "more": more}, separators=(",", ":"))
    more = stacks.more_threads or len(docs) - 1 < len(others)
    return class_id([doc["frames"] for doc in docs], more), data.encode()


def read_frames(data: bytes, wanted: str) -> tuple[tuple[Thread, ...], bool]:
    """(threads, more) of the frames post of class ``wanted``; :class:`PostError` when it is
    not one, or when its frames are not that class's (the id is recomputed)."""
    post = mapping(load_json(data, limit=FRAMES_LIMIT, what="frames"), "frames")
    if post.get("v") != FORMAT:
        raise PostError("frames of another format")
    threads = []
    shape = []
    for entry in listed(post.get("threads"), "threads", 101):
        entry = mapping(entry, "a thread")
        frames = []
        for item in listed(entry.get("frames"), "frames", 101):
            if not isinstance(item, list) or len(item) != 3:
                raise PostError("a frame is not [file, line, function]")
            line = None if item[1] is None else whole(item[1], "a line number")
            frames.append(Frame(text(item[0], "a file", 1024), line,
                                text(item[2], "a function", 256)))  # fmt: skip
        cut = entry.get("cut")
        if not isinstance(cut, bool):
            raise PostError("cut is not true or false")
        ident = text(entry.get("id"), "a thread id", 32)
        threads.append(Thread(ident, False, tuple(frames), cut))
        shape.append(entry["frames"])
    more = post.get("more")
    if not isinstance(more, bool):
        raise PostError("more is not true or false")
    if not threads:
        raise PostError("frames without a thread")
    if class_id(shape, more) != wanted:
        raise PostError(f"frames that are not those of class {wanted}")
    return tuple(threads), more


class Digest:
    """One node's digest, built (:func:`node_digest`) or read back (:func:`read_digest`):
    its classes as (id, ranks, pids by rank), its ranks without stacks as (problem, ranks),
    ``flight``: its ranks' flight-recorder summary (JSON text, unread) or None;
    ``flight_refused``: why a post's ``flight`` field was not taken (not a bounded text)."""

    def __init__(
        self,
        node: int,
        host: str,
        pid: int,
        state: str,
        classes: list[tuple[str, list[int], dict[int, int]]],
        problems: list[tuple[str, list[int]]],
        flight: str | None = None,
    ) -> None:
        self.node = node
        self.host = host
        self.pid = pid
        self.state = state
        self.classes = classes
        self.problems = problems
        self.flight = flight
        self.flight_refused: str | None = None

    @property
    def label(self) -> str:
        return node_label(self.node, self.host)

    @property
    def rank_count(self) -> int:
        """How many ranks the digest names (its classes' and problems')."""
        return sum(len(ranks) for _, ranks, _ in self.classes) + sum(
            len(ranks) for _, ranks in self.problems
        )

    def ranks(self) -> list[int]:
        found = [rank for _, ranks, _ in self.classes for rank in ranks]
        found += [rank for _, ranks in self.problems for rank in ranks]
        return sorted(found)

    def encode(self) -> bytes:
        document = {
            "v": FORMAT, "node": self.node, "host": self.host[:255], "pid": self.pid,
            "state": self.state,
            "classes": [
                {"id": ident, "ranks": encode_ranks(ranks),
                 **({"pids": [pids.get(r) for r in ranks]} if len(ranks) <= _PIDS_UP_TO else {})}
                for ident, ranks, pids in self.classes
            ],
            "problems": [{"problem": problem[:MAX_TEXT], "ranks": encode_ranks(ranks)}
                         for problem, ranks in self.problems],
        }  # fmt: skip
        if self.flight is not None:
            document["flight"] = self.flight
        return json.dumps(document, separators=(",", ":")).encode()


def node_digest(
    dumps: Sequence[Raw], *, node: int, host: str, pid: int, state: str, known: Classes
) -> tuple[Digest, dict[str, bytes]]:
    """This node's digest of ``dumps`` and the frames post of each of its classes, by id;
    with the flight recorders the dumps carry (:attr:`Raw.flight`), their summary (read here:
    the calling thread pays for it, never the loop)."""
    classes: dict[str, tuple[list[int], dict[int, int]]] = {}
    frames: dict[str, bytes] = {}
    problems: dict[str, list[int]] = {}
    for dump in sorted(dumps, key=lambda item: item.rank):
        found = known.classify(dump.text) if dump.text else None
        if found is None:
            problem = dump.problem or ("unreadable dump" if dump.text else "no stacks")
            problems.setdefault(problem, []).append(dump.rank)
            continue
        ident, post = found
        frames[ident] = post
        ranks, pids = classes.setdefault(ident, ([], {}))
        ranks.append(dump.rank)
        if dump.pid:
            pids[dump.rank] = dump.pid
    answers = [dump.flight for dump in dumps if dump.flight is not None]
    digest = Digest(
        node, host, pid, state,
        [(ident, ranks, pids) for ident, (ranks, pids) in classes.items()],
        list(problems.items()),
        node_flight(answers) if answers else None,
    )  # fmt: skip
    return digest, frames


def read_digest(data: bytes, *, below: int = MAX_RANKS, most: int | None = None) -> Digest:
    """A digest read back, every field checked (ranks below ``below``; at most ``most`` ranks
    in all, default ``below``, counted before a rank set is expanded: memory in proportion to
    the job, whatever the post says); :class:`PostError`."""
    post = mapping(load_json(data, limit=DIGEST_LIMIT, what="a digest"), "a digest")
    if post.get("v") != FORMAT:
        raise PostError("a digest of another format (another numarun version?)")
    left = below if most is None else most
    checked = []
    for entry in listed(post.get("classes"), "classes", 4096):
        entry = mapping(entry, "a class")
        ident = text(entry.get("id"), "a class id", 16)
        if not re.fullmatch(r"[0-9a-f]{16}", ident):
            raise PostError("a class id is not 16 hex digits")
        triples, count = check_ranks(entry.get("ranks"), "ranks", below=below)
        left -= count
        checked.append((ident, triples, entry))
    problems_checked = []
    for entry in listed(post.get("problems"), "problems", 64):
        problem = text(mapping(entry, "a problem").get("problem"), "a problem")
        triples, count = check_ranks(entry.get("ranks"), "ranks", below=below)
        left -= count
        problems_checked.append((problem, triples))
    if left < 0:
        raise PostError("a digest that names more ranks than the job has")
    classes = []
    for ident, triples, entry in checked:
        ranks = expand_ranks(triples)
        pids: dict[int, int] = {}
        if "pids" in entry:
            listed_pids = listed(entry["pids"], "pids", len(ranks))
            for rank, value in zip(ranks, listed_pids, strict=False):
                if value is not None:
                    pids[rank] = whole(value, "a pid")
        classes.append((ident, ranks, pids))
    problems = [(problem, expand_ranks(triples)) for problem, triples in problems_checked]
    digest = Digest(
        whole(post.get("node"), "node"), text(post.get("host"), "host", 255),
        whole(post.get("pid"), "pid"), text(post.get("state"), "state", 16), classes, problems,
    )  # fmt: skip
    flight = post.get("flight")
    if isinstance(flight, str) and len(flight) <= FLIGHT_LIMIT:
        digest.flight = flight
    elif flight is not None:  # its stacks stand; the flight record is named as refused
        digest.flight_refused = f"not a text of at most {FLIGHT_LIMIT:,} characters"
    return digest

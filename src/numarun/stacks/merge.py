"""The whole job's stacks: every node's digest (:mod:`numarun.stacks.digest`) merged into the job's
classes, posted once, read by every node, shown on one screen. Pure: no effects.

One node merges (the one asked, or the one that found the job hung): the classes of every
digest by id, each with its ranks, its nodes and their host names; the ranks without stacks by
problem; the nodes that did not answer, and why. The main threads' call paths go into a prefix
tree (:class:`CallTree`, STAT's call-path tree: a path from the outermost frame in, each node of
the tree counting the ranks through it), which says where each odd class leaves the others.
The result (:class:`JobView`) travels as one bounded JSON document (:func:`encode_view`), class
frames by id (each node reads the frames of classes it has not seen this round), and is read
back checked (:func:`read_view`).

What the user sees (:func:`format_view`) stays one screen at thousands of ranks: odd classes
first, the largest last, ranks and nodes as ranges with their count (``ranks
0-4094,4096-8191 (8,191)``), host names compressed (``gpu[0001-1024]``), each class once with
its representative's main thread in full, its other threads in one line each.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence

from numarun.stacks.digest import (
    FORMAT,
    FRAMES_LIMIT,
    MAX_RANKS,
    MAX_TEXT,
    Digest,
    PostError,
    check_ranks,
    decode_ranks,
    encode_ranks,
    expand_ranks,
    listed,
    load_json,
    mapping,
    printable,
    read_frames,
    text,
    whole,
)
from numarun.stacks.flight import FlightError
from numarun.stacks.flightjob import JobFlight, job_flight, read_flight
from numarun.stacks.parse import (
    IMPORTING,
    WAITS_IN_TORCH,
    RankStacks,
    Thread,
    format_ranks,
    frame_lines,
    is_library,
    where,
)

VIEW_LIMIT = 256 * 1024  # bytes of a merged result in the store (frames by id, not in it)
REPLY_LIMIT = 4 * 1024 * 1024  # bytes of the merged result a ``numarun stacks`` client gets
MAX_CLASSES = 64  # classes with stacks kept: the smallest half and the largest half
_SHOWN_RANGES = 12  # ranges of a rank list shown before "..."
_HOSTS_SHOWN = 200  # characters of a compressed host list
_DETAIL_NODES = 3  # a class on at most this many nodes names each node's ranks
_NOTES = 16
_PROBLEMS = 16  # kinds of ranks without stacks kept apart; more are one line
_HOST_NUMBER = re.compile(r"^(.*?)(\d+)(\D*)$")


class JobClass:
    """Ranks of the job with the same stacks (``ident`` set, ``threads`` the representative's
    when its frames were read) or the same problem (``problem``)."""

    def __init__(
        self,
        ident: str | None,
        ranks: list[int] | tuple[list, int],
        nodes: list[int] | tuple[list, int],
        *,
        hosts: str = "",
        pids: dict[int, int] | None = None,
        problem: str | None = None,
        per_node: dict[int, tuple[str, list[int]]] | None = None,
        total: int | None = None,
        node_total: int | None = None,
    ) -> None:
        self.ident = ident
        # Lists, or (checked triples, count) read back: expanded when first looked at (a
        # node that only passes the view on never builds 8,192 numbers per class). A set
        # cut to its first and last ranges on the way (encode_view) says its full count.
        self._ranks = ranks
        self._nodes = nodes
        self._total = total
        self._node_total = node_total
        self.hosts = hosts
        self.pids = pids or {}
        self.problem = problem
        self.per_node = per_node or {}
        self.threads: tuple[Thread, ...] | None = None
        self.more = False

    @property
    def ranks(self) -> list[int]:
        if isinstance(self._ranks, tuple):
            self._ranks = expand_ranks(self._ranks[0])
        return self._ranks

    @property
    def nodes(self) -> list[int]:
        if isinstance(self._nodes, tuple):
            self._nodes = expand_ranks(self._nodes[0])
        return self._nodes

    @property
    def count(self) -> int:
        """How many ranks the class has (all of them, when :attr:`ranks` was cut)."""
        if self._total is not None:
            return self._total
        return self._ranks[1] if isinstance(self._ranks, tuple) else len(self._ranks)

    @property
    def node_count(self) -> int:
        """How many nodes the class runs on (all of them, when :attr:`nodes` was cut)."""
        if self._node_total is not None:
            return self._node_total
        return self._nodes[1] if isinstance(self._nodes, tuple) else len(self._nodes)

    def sample(self) -> RankStacks:
        """The representative as a :class:`RankStacks` (no threads: the problem, or frames
        that were not read)."""
        rank = self.ranks[0] if self.ranks else -1
        if self.threads:
            return RankStacks(rank, -1, self.pids.get(rank), self.threads,
                              more_threads=self.more)  # fmt: skip
        problem = self.problem or "its frames could not be read from the store"
        return RankStacks(rank, -1, self.pids.get(rank), problem=problem)


class JobView:
    """The job's classes merged by one node (module docstring). ``kind``: ``"stacks"``,
    ``"hang"`` or ``"notice"``; ``by``: the node that merged; ``size``: nodes in the round;
    ``answered``: group ranks of the nodes merged; ``missing``: (why, nodes); ``notes``: posts
    that were not merged and why (one line each); ``idle``: seconds without progress (a hang);
    ``flight``: the job's flight-recorder verdict (:class:`numarun.stacks.flightjob.JobFlight`),
    None when no node sent a flight summary."""

    def __init__(
        self,
        kind: str,
        by: str,
        size: int,
        answered: list[int],
        classes: list[JobClass],
        missing: list[tuple[str, list[int]]] | None = None,
        notes: list[str] | None = None,
        idle: float | None = None,
    ) -> None:
        self.kind = kind
        self.by = by
        self.size = size
        self.answered = answered
        self.classes = classes
        self.missing = missing or []
        self.notes = notes or []
        self.idle = idle
        self.flight: JobFlight | None = None
        self.posts: dict[str, bytes] = {}
        self._resolved = True

    @property
    def rank_count(self) -> int:
        return sum(item.count for item in self.classes)

    def frame_ids(self) -> list[str]:
        return [item.ident for item in self.classes if item.ident is not None]

    def add_posts(self, posts: dict[str, bytes]) -> None:
        """The classes' frames posts, as read (decoded, checked, when the view is shown)."""
        self.posts.update(posts)
        self._resolved = False

    def resolve(self) -> None:
        """Decode the frames posts of the classes that have none yet, each checked against its
        class (:func:`numarun.stacks.digest.read_frames`); a post that is not its class's is
        named in :attr:`notes` and left out. Idempotent; done by every function that shows
        the view, so the thread that reads the store never pays for it."""
        if self._resolved:
            return
        self._resolved = True
        for item in self.classes:
            post = self.posts.get(item.ident) if item.ident is not None else None
            if item.threads is not None or post is None:
                continue
            try:
                item.threads, item.more = read_frames(post, item.ident)  # type: ignore[arg-type]
            except PostError as error:
                self.notes.append(f"the frames of class {item.ident}: {error}")


# --- merging -------------------------------------------------------------------------------------


def merge(
    digests: Iterable[Digest],
    *,
    kind: str,
    by: str,
    size: int,
    missing: Sequence[tuple[str, list[int]]] = (),
    notes: Sequence[str] = (),
    idle: float | None = None,
    world: int | None = None,
) -> JobView:
    """The job's classes from every node's digest: a rank claimed twice (a forged post, say)
    is kept where it came first and named in ``notes``; so is a second digest of one node.
    The digests' flight summaries merged over ``world`` ranks (default: up to the highest
    rank named) into :attr:`JobView.flight` (every rank expected unless ``kind`` is
    ``"notice"``)."""
    notes = list(notes)
    seen_nodes: set[int] = set()
    owner: dict[int, int] = {}
    groups: dict[tuple, dict] = {}
    hosts: dict[int, str] = {}
    kept_digests: list[Digest] = []
    # By node: each class's ranks then come in order (sorting them costs O(ranks), not
    # O(ranks log ranks)); the first digest of a node, as read, is the one kept.
    for digest in sorted(digests, key=lambda item: item.node):
        if digest.node in seen_nodes:
            notes.append(f"a second digest of node {digest.node} was ignored")
            continue
        seen_nodes.add(digest.node)
        kept_digests.append(digest)
        hosts[digest.node] = digest.host
        entries = [(("class", i), r, p) for i, r, p in digest.classes]
        entries += [(("problem", why), r, {}) for why, r in digest.problems]
        twice: list[int] = []
        for key, ranks, pids in entries:
            kept = []
            for rank in ranks:
                if owner.setdefault(rank, digest.node) != digest.node:
                    twice.append(rank)
                    continue
                kept.append(rank)
            if not kept:
                continue
            group = groups.setdefault(key, {"ranks": [], "per_node": {}, "pids": {}})
            group["ranks"].extend(kept)
            group["per_node"].setdefault(digest.node, (digest.host, []))[1].extend(kept)
            group["pids"].update({r: p for r, p in pids.items() if r in kept})
        if twice and len(notes) < _NOTES:
            firsts = {owner[rank] for rank in twice}
            first = f"node {min(firsts)}" if len(firsts) == 1 else "other nodes"
            kept_on = f"on {first}" if len(firsts) == 1 else "where they came first"
            notes.append(f"{ranks_text(twice)} claimed by node {digest.node} and {first}: "
                         f"kept {kept_on}")  # fmt: skip
    kept_groups = _kept(groups)
    flight = job_flight([(d.node, d.ranks(), d.flight, d.flight_refused) for d in kept_digests],
                        world or max(owner, default=-1) + 1, whole_job=kind != "notice")
    classes = []
    for (what, value), group in kept_groups.items():
        nodes = sorted(group["per_node"])
        classes.append(
            JobClass(
                value if what == "class" else None,
                sorted(group["ranks"]),
                nodes,
                hosts=compress_hosts(hosts[node] for node in nodes),
                pids=group["pids"] if len(group["ranks"]) <= 8 else {},
                problem=value if what == "problem" else None,
                per_node=group["per_node"] if len(nodes) <= _DETAIL_NODES else None,
            )
        )
    view = JobView(kind, by, size, sorted(seen_nodes), classes, list(missing), notes[:_NOTES],
                   idle)  # fmt: skip
    view.flight = flight
    return view


def _kept(groups: dict[tuple, dict]) -> dict[tuple, dict]:
    """At most :data:`MAX_CLASSES` classes with stacks (ranks computing at random lines can
    make one per rank): the smallest half (the odd ones out) and the largest half; the others
    become one group without stacks that says so."""
    problems = [key for key in groups if key[0] == "problem"]
    if len(problems) > _PROBLEMS:  # problems read back from other nodes: as many as posted
        folded_problems: dict = {"ranks": [], "per_node": {}, "pids": {}}
        for key in problems[_PROBLEMS - 1 :]:
            group = groups.pop(key)
            folded_problems["ranks"].extend(group["ranks"])
            for node, (host, ranks) in group["per_node"].items():
                folded_problems["per_node"].setdefault(node, (host, []))[1].extend(ranks)
        more = len(problems) - _PROBLEMS + 1
        groups[("problem", f"and {more:,} more problems (not shown)")] = folded_problems
    stacks = sorted((key for key in groups if key[0] == "class"),
                    key=lambda key: len(groups[key]["ranks"]))  # fmt: skip
    if len(stacks) <= MAX_CLASSES:
        return groups
    half = MAX_CLASSES // 2
    dropped = stacks[half:-half]
    gone = set(dropped)
    kept = {key: group for key, group in groups.items() if key not in gone}
    folded: dict = {"ranks": [], "per_node": {}, "pids": {}}
    for key in dropped:
        folded["ranks"].extend(groups[key]["ranks"])
        for node, (host, ranks) in groups[key]["per_node"].items():
            folded["per_node"].setdefault(node, (host, []))[1].extend(ranks)
    sizes = [len(groups[key]["ranks"]) for key in dropped]
    span = f"{min(sizes):,}" if min(sizes) == max(sizes) else f"{min(sizes):,}-{max(sizes):,}"
    kept[("problem", f"and {len(dropped):,} more classes of {span} rank"
          f"{'s' if max(sizes) > 1 else ''} (their stacks not shown)")] = folded
    return kept


# --- the call-path prefix tree -------------------------------------------------------------------


class CallTree:
    """The main threads' call paths of a view's classes, outermost frame first, merged into a
    prefix tree (STAT's): each node of the tree is one frame with the ranks that pass through
    it (counted per class). :meth:`branch` says where a class leaves the others."""

    def __init__(self, view: JobView) -> None:
        view.resolve()
        self.root: dict = {"children": {}, "count": 0, "classes": set()}
        self._paths: dict[str, list] = {}
        for index, item in enumerate(view.classes):
            if not item.threads:
                continue
            path = list(reversed(item.threads[-1].frames))
            self._paths[str(index)] = path
            node = self.root
            node["count"] += item.count
            for frame in path:
                node = node["children"].setdefault(
                    (frame.file, frame.line, frame.function),
                    {"children": {}, "count": 0, "classes": set()},
                )
                node["count"] += item.count
                node["classes"].add(index)

    def branch(self, index: int) -> tuple[str, int] | None:
        """(the innermost frame the class at ``index`` shares with other classes, the ranks
        through it), or None when it shares no frame."""
        path = self._paths.get(str(index))
        if not path:
            return None
        node = self.root
        shared = None
        for frame in path:
            node = node["children"][(frame.file, frame.line, frame.function)]
            if len(node["classes"]) < 2:
                break
            shared = (f"{frame.function} ({frame.location()})", node["count"])
        return shared

    def to_json(self, depth: int = 200) -> dict:
        def walk(node: dict, level: int) -> list[dict]:
            if level >= depth:
                return []
            return [
                {"file": key[0], "line": key[1], "function": key[2], "ranks": child["count"],
                 "children": walk(child, level + 1)}
                for key, child in node["children"].items()
            ]  # fmt: skip

        return {"ranks": self.root["count"], "children": walk(self.root, 0)}


# --- travelling: the merged result as JSON -------------------------------------------------------


def encode_view(
    view: JobView, frames: dict[str, bytes] | None = None, *, limit: int = VIEW_LIMIT
) -> bytes:
    """``view`` as one JSON document of at most ``limit`` bytes, by construction (frames by id;
    with ``frames``, those posts inline, for the ``numarun stacks`` client). Whole when it fits;
    else each rank set of more than a few ranges is cut to its first and last ranges with its
    count (what :func:`format_view` shows of it), then the details of each node dropped, then
    frames inline and classes beyond what fits folded into one line that says how many; the
    largest class and the odd ones (the smallest) are kept the longest. The header (missing
    nodes, at most 64 lines; notes, at most 16) is always whole: a few KB, at most about 50 KB
    at 8,192 nodes."""
    inline = dict(frames) if frames is not None else None
    for terse in (0, 1, 2):
        data = _encode(view, view.classes, inline, terse)
        if len(data) <= limit:
            return data
    if inline:  # frames of the odd ones and the largest first
        order = [item.ident for item in _by_interest(view.classes) if item.ident in inline]
        kept: dict[str, bytes] = {}
        for ident in order:
            trial = {**kept, ident: inline[ident]}
            if len(_encode(view, view.classes, trial, 2)) > limit:
                break
            kept = trial
        inline = kept
    classes = _by_interest(view.classes)
    hidden, hidden_ranks = 0, 0
    while True:
        data = _encode(view, classes, inline, 2)
        if len(data) <= limit or len(classes) <= 1:
            return data if len(data) <= limit else _encode(view, [], None, 2)
        shown = classes[:-1] if hidden else classes
        keep = max(1, len(shown) * 3 // 4)
        if keep >= len(shown):  # the largest class alone does not fit: the header alone
            return _encode(view, [], None, 2)
        hidden += len(shown) - keep
        hidden_ranks += sum(item.count for item in shown[keep:])
        folded = JobClass(None, [], [], problem=f"and {hidden:,} more classes of "
                          f"{hidden_ranks:,} ranks in all (not shown: the view's size limit)",
                          total=hidden_ranks)  # fmt: skip
        classes = [*shown[:keep], folded]


def _by_interest(classes: Sequence[JobClass]) -> list[JobClass]:
    """The largest class first, then the smallest (the odd ones out), then the rest."""
    by_size = sorted(classes, key=lambda item: item.count)
    if not by_size:
        return []
    return [by_size[-1], *by_size[:-1]]


def _encode(view: JobView, classes: Sequence[JobClass], frames: dict[str, bytes] | None,
            terse: int) -> bytes:  # fmt: skip
    ids = {item.ident for item in classes}
    document: dict = {
        "v": FORMAT, "kind": view.kind, "by": view.by[:300], "size": view.size,
        "answered": encode_ranks(view.answered),
        "missing": [{"why": why[:MAX_TEXT], "nodes": encode_ranks(nodes)}
                    for why, nodes in view.missing[:64]],
        "notes": [note[:MAX_TEXT] for note in view.notes[:_NOTES]],
        "idle": view.idle,
        "classes": [_class_doc(item, terse) for item in classes],
    }  # fmt: skip
    if view.flight is not None:  # bounded by construction (flightjob)
        document["flight"] = view.flight.to_doc()
    if frames is not None:  # as text: decoded by the client, not by the loop that sends it
        document["frames"] = {key: value.decode("utf-8", "replace") for key, value in
                              frames.items() if key in ids}  # fmt: skip
    return json.dumps(document, separators=(",", ":")).encode()


def _rank_set(ranks: list[int], total: int, terse: int) -> tuple[list[list[int]], int | None]:
    """(encoded ranks, their count when the set was cut, else None)."""
    triples = encode_ranks(ranks)
    if not terse or len(triples) <= _SHOWN_RANGES + 4 or total > len(ranks):
        return triples, (total if total > len(ranks) else None)
    runs = format_ranks(ranks).split(",")
    if len(runs) <= _SHOWN_RANGES:
        return triples, None
    half = _SHOWN_RANGES // 2
    shown: list[int] = []
    for run in [*runs[:half], *runs[-half:]]:
        low, _, high = run.partition("-")
        shown.extend(range(int(low), int(high or low) + 1))
    return encode_ranks(shown), total


def _class_doc(item: JobClass, terse: int = 0) -> dict:
    ranks, count = _rank_set(item.ranks, item.count, terse)
    nodes, node_count = _rank_set(item.nodes, item.node_count, terse)
    doc: dict = {"ranks": ranks, "nodes": nodes, "hosts": item.hosts[:_HOSTS_SHOWN + 40]}
    if count is not None:
        doc["count"] = count
    if node_count is not None:
        doc["node_count"] = node_count
    if item.ident is not None:
        doc["id"] = item.ident
    if item.problem is not None:
        doc["problem"] = item.problem[:MAX_TEXT]
    if item.pids:
        doc["pids"] = [[rank, pid] for rank, pid in sorted(item.pids.items())[:8]]
    if item.per_node and terse < 2:
        doc["per_node"] = [[node, host[:255], encode_ranks(ranks)]
                           for node, (host, ranks) in item.per_node.items()]  # fmt: skip
    return doc


def read_view(
    data: bytes, *, limit: int = VIEW_LIMIT, world: int = MAX_RANKS, nodes: int = 1 << 20
) -> tuple[JobView, dict[str, bytes]]:
    """A merged result read back, every field checked: (the view, frames posts found inline
    by id); :class:`PostError` when it is not one. Ranks are below ``world`` (the job's rank
    count; the classes name at most that many in all) and nodes below ``nodes`` (the round's
    size): what decoding it costs is in proportion to its size and the job's, whatever it
    says."""
    document = mapping(load_json(data, limit=limit, what="a merged result", depth=10),
                       "a merged result")  # fmt: skip
    if document.get("v") != FORMAT:
        raise PostError("a merged result of another format (another numarun version?)")
    kind = text(document.get("kind"), "kind", 16)
    if kind not in ("stacks", "hang", "notice"):
        raise PostError(f"a merged result of unknown kind {printable(kind)!r}")
    idle = document.get("idle")
    if idle is not None and (type(idle) not in (int, float) or not 0 <= idle < 1e9):
        raise PostError("idle is not a number of seconds")
    classes = []
    left = world
    for entry in listed(document.get("classes"), "classes", 4096):
        item = _read_class(mapping(entry, "a class"), world, nodes)
        left -= item.count
        if left < 0:
            raise PostError("a merged result that names more ranks than the job has")
        classes.append(item)
    view = JobView(
        kind,
        text(document.get("by"), "by"),
        whole(document.get("size"), "size", 0, nodes),
        decode_ranks(document.get("answered"), "answered", below=nodes),
        classes,
        [(text(mapping(m, "a missing node").get("why"), "why"),
          decode_ranks(m.get("nodes"), "nodes", below=nodes))
         for m in listed(document.get("missing"), "missing", 64)],
        [text(note, "a note") for note in listed(document.get("notes", []), "notes", _NOTES)],
        idle,
    )  # fmt: skip
    if document.get("flight") is not None:
        try:
            view.flight = read_flight(document["flight"], world)
        except FlightError as error:  # the stacks stand without it
            view.notes.append(f"the flight recorder's verdict: {error}")
    inline: dict[str, bytes] = {}
    if "frames" in document:
        for key, value in mapping(document["frames"], "frames").items():
            inline[str(key)] = text(value, "frames", FRAMES_LIMIT).encode()
    return view, inline


def _read_class(entry: dict, world: int, nodes: int) -> JobClass:
    ident = entry.get("id")
    if ident is not None and not (isinstance(ident, str) and re.fullmatch(r"[0-9a-f]{16}",
                                                                       ident)):  # fmt: skip
        raise PostError("a class id is not 16 hex digits")
    problem = entry.get("problem")
    if (ident is None) == (problem is None):
        raise PostError("a class has neither stacks nor a problem, or both")
    ranks = check_ranks(entry.get("ranks"), "ranks", below=world)
    node_set = check_ranks(entry.get("nodes"), "nodes", below=nodes)
    total = whole(entry.get("count", ranks[1]), "count", ranks[1], world)
    node_total = whole(entry.get("node_count", node_set[1]), "node_count", node_set[1], nodes)
    item = JobClass(
        ident, ranks, node_set,
        hosts=text(entry.get("hosts", ""), "hosts", _HOSTS_SHOWN + 40),
        problem=None if problem is None else text(problem, "a problem"),
        total=total if total > ranks[1] else None,
        node_total=node_total if node_total > node_set[1] else None,
    )  # fmt: skip
    for pair in listed(entry.get("pids", []), "pids", 8):
        pair = listed(pair, "a pid", 2)
        item.pids[whole(pair[0] if pair else None, "a rank")] = whole(pair[-1], "a pid")
    for triple in listed(entry.get("per_node", []), "per_node", _DETAIL_NODES):
        triple = listed(triple, "a node's ranks", 3)
        if len(triple) != 3:
            raise PostError("a node's ranks is not [node, host, ranks]")
        node_ranks = check_ranks(triple[2], "ranks", below=world)
        if node_ranks[1] > total:
            raise PostError("a node's ranks are more than its class's")
        item.per_node[whole(triple[0], "a node", 0, nodes)] = (
            text(triple[1], "a host", 255), expand_ranks(node_ranks[0])
        )
    return item


# --- one screen ----------------------------------------------------------------------------------


def count(number: int) -> str:
    return f"{number:,}"


def ranks_text(ranks: Sequence[int], noun: str = "rank", total: int | None = None) -> str:
    """``rank 3`` or ``ranks 0-4094,4096-8191 (8,191)``; a long list shows its first and last
    ranges around ``...``. ``total``: how many there are when ``ranks`` is a list cut to its
    first and last ranges (:func:`encode_view`)."""
    number = max(len(ranks), total or 0)
    if not ranks:
        return f"{count(number)} {noun}{'s' if number != 1 else ''}"
    if number == 1:
        return f"{noun} {ranks[0]}"
    ranges = format_ranks(ranks).split(",")
    half = _SHOWN_RANGES // 2
    if len(ranges) > _SHOWN_RANGES or (number > len(ranks) and len(ranges) > half):
        ranges = [*ranges[:half], "...", *ranges[-half:]]
    elif number > len(ranks):
        ranges = [*ranges, "..."]
    return f"{noun}s {','.join(ranges)} ({count(number)})"


def compress_hosts(names: Iterable[str]) -> str:
    """Host names as ranges of their numbers, as Slurm writes them: ``gpu[0001-0004,0007],
    login``; at most about 200 characters (then ``... and N more``). Escaped."""
    unique = sorted(set(names))
    numbered: dict[tuple[str, str], list[str]] = {}
    plain: list[str] = []
    for name in unique:
        match = _HOST_NUMBER.match(name)
        if match is None:
            plain.append(name)
            continue
        prefix, digits, suffix = match.groups()
        numbered.setdefault((prefix, suffix), []).append(digits)
    by_pattern: dict[tuple[str, str, int], list[int]] = {}
    for (prefix, suffix), all_digits in numbered.items():
        # Zero-padded numbers (gpu0007) share their width with unpadded ones as long (gpu1000).
        padded = [len(d) for d in all_digits if d.startswith("0") and len(d) > 1]
        width = max(padded) if padded else 0
        for digits in all_digits:
            fits = width if len(digits) == width else 0
            by_pattern.setdefault((prefix, suffix, fits), []).append(int(digits))
    parts: list[tuple[int, str]] = []
    for (prefix, suffix, width), numbers in by_pattern.items():
        numbers.sort()
        if len(numbers) == 1:
            parts.append((1, f"{prefix}{numbers[0]:0{width}d}{suffix}"))
            continue
        runs, length, shown_count = [], len(prefix) + len(suffix) + 6, 0
        for chunk in format_ranks(numbers).split(","):
            low, _, high = chunk.partition("-")
            run = f"{int(low):0{width}d}" + (f"-{int(high):0{width}d}" if high else "")
            if runs and length + len(run) > _HOSTS_SHOWN:  # one pattern of no regularity
                runs.append("...")
                break
            runs.append(run)
            length += len(run) + 1
            shown_count += int(high or low) - int(low) + 1
        cut = len(numbers) - shown_count
        parts.append((len(numbers), f"{prefix}[{','.join(runs)}]{suffix}"
                      + (f" ({len(numbers):,})" if cut else "")))
    parts += [(1, name) for name in plain]
    shown, used, hidden = [], 0, 0
    for size, part in sorted(parts, key=lambda item: item[1]):
        if used + len(part) > _HOSTS_SHOWN and shown:
            hidden += size
            continue
        shown.append(part)
        used += len(part) + 1
    joined = ",".join(shown) + (f", ... and {hidden} more" if hidden else "")
    return printable(joined)


def nodes_text(item: JobClass) -> str:
    """Where a class runs: ``on node 1 (host-b)``, a few nodes with each one's ranks, or
    ``on nodes 0-1023 (gpu[0001-1024])``."""
    if not item.nodes:
        return ""
    if item.node_count == 1:
        return f"on node {item.nodes[0]} ({item.hosts})"
    if item.per_node and len(item.per_node) == item.node_count:
        parts = [f"node {node} ({host}): {ranks_text(ranks)}"
                 for node, (host, ranks) in sorted(item.per_node.items())]  # fmt: skip
        return f"on {'; '.join(parts)}"
    return f"on {ranks_text(item.nodes, 'node', item.node_count)} ({item.hosts})"


def ordered(view: JobView) -> tuple[list[JobClass], JobClass | None]:
    """The classes as shown: odd ones first (smallest first), ranks without stacks, the
    largest class with stacks last; and that majority (None without a single one: a tie that
    no collective breaks, or no stacks at all)."""
    view.resolve()
    with_stacks = sorted((c for c in view.classes if c.problem is None),
                         key=lambda c: (-c.count, c.ranks[:1]))  # fmt: skip
    problems = sorted((c for c in view.classes if c.problem is not None),
                      key=lambda c: c.ranks[:1])  # fmt: skip
    majority = None
    if with_stacks:
        size = with_stacks[0].count
        largest = [c for c in with_stacks if c.count == size]
        if len(largest) == 1:
            majority = largest[0]
        else:
            waiting = [c for c in largest if _in_collective(c)]
            majority = waiting[0] if len(waiting) == 1 else None
        if len(with_stacks) == 1 and problems:
            majority = None  # what still runs while the others ended is the odd one
    odd = [c for c in reversed(with_stacks) if c is not majority]
    return [*odd, *problems, *([majority] if majority is not None else [])], majority


def _in_collective(item: JobClass) -> bool:
    threads = item.threads or ()
    return bool(threads) and any(
        any(part in frame.file for part in WAITS_IN_TORCH) for frame in threads[-1].frames
    )


def heading(item: JobClass, *, pid: bool = False) -> str:
    """``ranks 0-2 (3): in step (/job/train.py:14)``; one rank with ``pid``: ``rank 3 (pid
    4242): ...``."""
    label = ranks_text(item.ranks, total=item.count)
    if pid and item.count == 1 and item.pids.get(item.ranks[0]):
        label += f" (pid {item.pids[item.ranks[0]]})"
    return f"{label}: {where(item.sample())}"


def format_view(
    view: JobView,
    *,
    max_frames: int | None = None,
    other_threads: bool = True,
    tree: CallTree | None = None,
) -> list[str]:
    """The classes, one screen (module docstring), every line escaped: per class its heading,
    its nodes, where it leaves the others (odd classes), its representative's main thread
    (``max_frames`` innermost frames, or all) and one line per other thread."""
    view.resolve()
    tree = tree or CallTree(view)
    shown, majority = ordered(view)
    index_of = {id(item): index for index, item in enumerate(view.classes)}
    lines = []
    for item in shown:
        lines.append(heading(item, pid=True))
        where_run = nodes_text(item)
        if where_run:
            lines.append(f"    {where_run}")
        if item.problem is not None or not item.threads:
            continue
        branch = tree.branch(index_of[id(item)]) if item is not majority else None
        if branch is not None and majority is not None:
            lines.append(f"    leaves the other ranks' path after {branch[0]}")
        main = item.threads[-1]
        lines.append(f"    main thread ({main.ident or 'id unknown'}, most recent call first):")
        lines.extend(frame_lines(main, max_frames, "frames cut"))
        others = item.threads[:-1]
        if others and other_threads:
            for number, thread in enumerate(reversed(others), start=2):
                lines.append(f"    thread {number} of {len(others) + 1} ({thread.ident}): "
                             f"{_thread_where(thread)}")  # fmt: skip
        elif others:
            lines.append(f"    ({len(others)} other thread{'s' if len(others) != 1 else ''} "
                         "not shown)")  # fmt: skip
        if item.more and other_threads:
            lines.append("    ... (more threads than shown)")
    return [printable(line) for line in lines]


def _thread_where(thread: Thread) -> str:
    real = [frame for frame in thread.frames if frame != IMPORTING]
    if not real:
        return "no Python frame"
    user = next((frame for frame in real if not is_library(frame.file)), real[0])
    return f"in {user.function} ({user.location(short=True)})"


def summary_lines(view: JobView) -> list[str]:
    """The lines above the classes: nodes that did not answer and why, posts left out."""
    view.resolve()
    lines = [f"{ranks_text(nodes, 'node')}: {why}" for why, nodes in view.missing]
    lines += [f"left out: {note}" for note in view.notes]
    return [printable(line) for line in lines]


def view_to_json(view: JobView, **job: object) -> dict[str, object]:
    """The document ``numarun stacks --json`` prints for a whole job: ``job`` fields, the
    ``classes`` as shown (ranks, nodes, hosts, where, the representative's threads), the
    missing nodes, and the call-path ``tree``."""
    view.resolve()
    tree = CallTree(view)
    shown, _ = ordered(view)
    classes = []
    for item in shown:
        sample = item.sample()
        classes.append(
            {"ranks": item.ranks, "nodes": item.nodes, "hosts": item.hosts,
             "rank_count": item.count, "node_count": item.node_count,
             "cut": item.count > len(item.ranks) or item.node_count > len(item.nodes),
             "where": where(sample), "problem": item.problem,
             "pids": {str(rank): pid for rank, pid in item.pids.items()},
             "threads": [{"id": t.ident, "main": index == len(sample.threads) - 1,
                          "frames": [{"file": f.file, "line": f.line, "function": f.function}
                                     for f in t.frames]}
                         for index, t in enumerate(sample.threads)]}
        )  # fmt: skip
    return {
        **job, "nodes": view.size, "answered_nodes": view.answered,
        "missing_nodes": [{"why": why, "nodes": nodes} for why, nodes in view.missing],
        "notes": view.notes, "classes": classes, "tree": tree.to_json(),
        "flight": view.flight.to_json() if view.flight is not None else None,
    }  # fmt: skip

"""torch's flight recorder, read: one rank's dump into its per-group *frontier*, and the compact
per-node summary those frontiers travel in. Pure: no I/O, no torch.

A dump is what a rank's helper sends (:mod:`numarun.worker.dumphandler`): torch's pickle, as
``torch._C._distributed_c10d._dump_fr_trace`` (gloo and other CPU backends) or
``_dump_nccl_trace`` return it and torch's analyzer reads it, or the JSON form of
``_dump_fr_trace_json``. Both hold ``version``, ``pg_config`` (each group's name, description
and members, as ``"[0, 1]"``), ``pg_status`` (per group id: the last collective enqueued,
started and completed), and ``entries``, oldest first, each with ``record_id``, ``pg_id``,
``process_group`` (name, description), ``collective_seq_id`` (per group, from 1),
``p2p_seq_id``, ``profiling_name`` (``gloo:all_reduce``, ``nccl:send 0->1``), ``input_sizes``,
``input_dtypes``, ``output_sizes``, ``output_dtypes``, ``state`` and ``retired``. The
backends differ in what they fill: NCCL's ``state`` moves through ``scheduled``, ``started``
and ``completed`` (its watchdog queries CUDA events; ``retired`` without ``completed`` is a
timeout) and its ``pg_config`` is filled; gloo's (torch 2.13) stays ``scheduled`` while
``retired`` turns true when the work is done, its ``last_started_collective`` is -1 and its
``pg_config`` is empty (numarun's helper fills it). JSON gives ``process_group`` as a list,
``pg_status`` values as strings, and 0 for a time not known.

The dump comes from the user's process: it is read as untrusted. Its size is checked first
(:data:`DUMP_LIMIT`); the pickle is read by :class:`_DataOnly`, which refuses every global
(no class or function is ever looked up: only dicts, lists, tuples, strings, numbers); every
field is checked and bounded (:data:`GROUPS_KEPT` groups, :data:`ENTRIES_KEPT` recent entries
per group, strings and shapes cut); what does not fit is skipped, and a dump that cannot be read
at all is one line (:class:`FlightError`). Text is never trusted to be printable: whoever shows
it escapes it.

:func:`read_record` gives a :class:`RankRecord`; :func:`node_summary` folds a node's records
into ranks with identical frontiers (a few hundred bytes for 8 ranks in step), and
:func:`read_summary` reads one back, checked; :mod:`numarun.stacks.flightverdict` merges them.
"""

from __future__ import annotations

import io
import json
import pickle

from numarun.machine.model import Value

__all__ = [
    "DUMP_PREFIX",
    "Entry",
    "FlightError",
    "GroupFrontier",
    "RankRecord",
    "dtype_name",
    "load_dump",
    "node_summary",
    "read_record",
    "read_summary",
]

DUMP_PREFIX = "comm_lib_trace_rank_"  # torch's own file name for a rank's dump (+ its rank)
DUMP_LIMIT = 64 * 1024 * 1024  # bytes of one dump read, at most
GROUPS_KEPT = 16  # groups kept per rank: those most recently used
ENTRIES_KEPT = 6  # most recent collectives kept per group and rank
SUMMARY_LIMIT = 256 * 1024  # bytes of one node's summary read back, at most
_ENTRIES_READ = 100_000  # entries of one dump looked at, at most
_TEXT = 64  # characters kept of a name
_TENSORS = 8  # tensors kept per entry
_DIMS = 8  # dimensions kept per tensor
_MEMBERS = 1 << 20  # members of one group, at most
_SEQ_MAX = 1 << 62
_set = object.__setattr__


class FlightError(ValueError):
    """A dump or a summary that cannot be read; the message is one line."""


# --- reading a dump ------------------------------------------------------------------------------


class _DataOnly(pickle.Unpickler):
    """An unpickler that builds data and nothing else: any global (a class, a function: what
    makes a pickle run code) and any persistent id is refused."""

    def find_class(self, module: str, name: str) -> object:
        raise FlightError(f"the dump names {module[:40]}.{name[:40]}: not a flight recorder dump")

    def persistent_load(self, pid: object) -> object:
        raise FlightError("the dump refers to outside objects: not a flight recorder dump")


def load_dump(data: bytes) -> dict:
    """A dump's top-level dictionary, from torch's pickle or JSON form; :class:`FlightError`
    when it is neither, too large, or not a dictionary."""
    if len(data) > DUMP_LIMIT:
        raise FlightError(f"the dump is {len(data):,} bytes, over {DUMP_LIMIT:,}")
    if data[:1] == b"\x80":
        try:
            loaded = _DataOnly(io.BytesIO(data)).load()
        except FlightError:
            raise
        except Exception as error:  # any malformed pickle: one line
            raise FlightError(f"unreadable pickle: {type(error).__name__}") from None
    elif data.lstrip()[:1] == b"{":
        try:
            loaded = json.loads(data.decode("utf-8"))
        except (ValueError, RecursionError) as error:
            raise FlightError(f"unreadable JSON: {type(error).__name__}") from None
    else:
        raise FlightError("not a flight recorder dump (neither torch's pickle nor JSON)")
    if not isinstance(loaded, dict):
        raise FlightError("not a flight recorder dump (no dictionary at its top)")
    return loaded


def _text(value: object, limit: int = _TEXT) -> str:
    if not isinstance(value, str):
        return "" if value is None else "?"
    return value if len(value) <= limit else value[: limit - 3] + "..."


def _int(value: object, default: int = -1) -> int:
    """An int from an int or a numeric string (JSON's pg_status); ``default`` otherwise."""
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value if -_SEQ_MAX < value < _SEQ_MAX else default
    if isinstance(value, str) and len(value) < 20:
        text = value[1:] if value.startswith("-") else value
        if text.isdigit():
            return int(value)
    return default


def _shapes(value: object) -> tuple[tuple[int, ...], ...]:
    if not isinstance(value, (list, tuple)):
        return ()
    shapes = []
    for shape in value[:_TENSORS]:
        if not isinstance(shape, (list, tuple)):
            continue
        shapes.append(tuple(_int(dim, -1) for dim in shape[:_DIMS]))
    return tuple(shapes)


def _dtypes(value: object) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)):
        return ()
    return tuple(_text(item, 24) for item in value[:_TENSORS])


# torch's c10 ScalarType names (what the recorder writes) -> torch's Python names.
_DTYPES = {
    "Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16",
    "Long": "int64", "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8",
    "Bool": "bool", "ComplexFloat": "complex64", "ComplexDouble": "complex128",
    "ComplexHalf": "complex32", "UInt16": "uint16", "UInt32": "uint32", "UInt64": "uint64",
}  # fmt: skip


def dtype_name(name: str) -> str:
    """``Float`` -> ``float32`` as torch's Python calls it; other names lowercased."""
    return _DTYPES.get(name) or name.lower()


class Entry(Value):
    """One collective (or point-to-point operation) of one rank in one group: ``seq`` (the
    group's ``collective_seq_id``; point-to-point: ``p2p_seq_id``), ``op`` (``all_reduce``;
    point-to-point with its peers, ``send 0->1``), shapes and dtypes, ``state``:
    ``"completed"``, ``"started"``, ``"scheduled"`` (not known to have started), or
    ``"timed out"`` (retired, never completed: NCCL's watchdog gave up on it)."""

    _fields = ("seq", "op", "in_sizes", "in_dtypes", "out_sizes", "out_dtypes", "state", "p2p")
    __slots__ = _fields
    seq: int
    op: str
    in_sizes: tuple[tuple[int, ...], ...]
    in_dtypes: tuple[str, ...]
    out_sizes: tuple[tuple[int, ...], ...]
    out_dtypes: tuple[str, ...]
    state: str
    p2p: bool

    def __init__(
        self,
        seq: int,
        op: str,
        in_sizes: tuple[tuple[int, ...], ...] = (),
        in_dtypes: tuple[str, ...] = (),
        out_sizes: tuple[tuple[int, ...], ...] = (),
        out_dtypes: tuple[str, ...] = (),
        state: str = "scheduled",
        p2p: bool = False,
    ) -> None:
        _set(self, "seq", seq)
        _set(self, "op", op)
        _set(self, "in_sizes", in_sizes)
        _set(self, "in_dtypes", in_dtypes)
        _set(self, "out_sizes", out_sizes)
        _set(self, "out_dtypes", out_dtypes)
        _set(self, "state", state)
        _set(self, "p2p", p2p)

    @property
    def done(self) -> bool:
        return self.state == "completed"

    def call(self) -> tuple:
        """What must agree across ranks: the operation, shapes and dtypes."""
        return (self.op, self.in_sizes, self.in_dtypes, self.out_sizes, self.out_dtypes)


class GroupFrontier(Value):
    """Where one rank is in one process group: ``name`` (torch's group name: ``"0"`` for the
    default group), ``desc`` (``default_pg``, ``undefined``), ``members`` (global ranks in the
    group's order; empty when the dump does not say), ``enqueued`` (the highest collective
    sequence number the rank entered; 0: none), ``completed`` (the highest it knows finished;
    -1: none), ``started`` (-1: not known), and ``recent``: its last :data:`ENTRIES_KEPT`
    entries, oldest first. ``waiting``: it is inside a collective not completed. Its hash is
    computed once (a default group's members are the whole job: merging 8,192 ranks' frontiers
    would hash 8,192 members per rank)."""

    _fields = ("name", "desc", "members", "enqueued", "started", "completed", "recent")
    __slots__ = (*_fields, "_hash")
    name: str
    desc: str
    members: tuple[int, ...]
    enqueued: int
    started: int
    completed: int
    recent: tuple[Entry, ...]

    def __init__(
        self,
        name: str,
        desc: str,
        members: tuple[int, ...],
        enqueued: int,
        started: int,
        completed: int,
        recent: tuple[Entry, ...],
    ) -> None:
        _set(self, "name", name)
        _set(self, "desc", desc)
        _set(self, "members", members)
        _set(self, "enqueued", enqueued)
        _set(self, "started", started)
        _set(self, "completed", completed)
        _set(self, "recent", recent)
        _set(self, "_hash", None)

    def __hash__(self) -> int:
        if self._hash is None:
            _set(self, "_hash", hash(self._values()))
        return self._hash  # type: ignore[return-value]

    __eq__ = Value.__eq__  # defining __hash__ alone would leave the class unhashable elsewhere

    @property
    def waiting(self) -> bool:
        return self.enqueued > max(self.completed, 0)

    def entry(self, seq: int) -> Entry | None:
        """Its collective ``seq``, when kept."""
        for entry in self.recent:
            if entry.seq == seq and not entry.p2p:
                return entry
        return None


class RankRecord(Value):
    """One rank's flight recorder read: ``version`` (the dump format's), ``backend`` (``gloo``,
    ``nccl``, from the entries' names; empty without entries), ``groups`` (most recently used
    first, at most :data:`GROUPS_KEPT`), ``skipped``: entries not understood."""

    _fields = ("rank", "version", "backend", "groups", "skipped")
    __slots__ = _fields
    rank: int
    version: str
    backend: str
    groups: tuple[GroupFrontier, ...]
    skipped: int

    def __init__(
        self, rank: int, version: str, backend: str, groups: tuple[GroupFrontier, ...],
        skipped: int = 0,
    ) -> None:  # fmt: skip
        _set(self, "rank", rank)
        _set(self, "version", version)
        _set(self, "backend", backend)
        _set(self, "groups", groups)
        _set(self, "skipped", skipped)

    def signature(self) -> tuple:
        """What makes two ranks' records the same for the merge (the rank aside)."""
        return (self.version, self.backend, self.groups)


def _members(value: object) -> tuple[int, ...]:
    """Members from ``pg_config``'s ``ranks`` (``"[0, 1]"``, or a list)."""
    if isinstance(value, str):
        inner = value.strip()
        if len(inner) > 16 * _MEMBERS or not (inner.startswith("[") and inner.endswith("]")):
            return ()
        parts = [part.strip() for part in inner[1:-1].split(",") if part.strip()]
    elif isinstance(value, (list, tuple)):
        parts = list(value)
    else:
        return ()
    members = tuple(_int(part, -1) for part in parts[:_MEMBERS])
    return () if any(member < 0 for member in members) else members


def _entry(raw: object) -> tuple[str, str, str, int, Entry] | None:
    """(group name, desc, backend, pg_id, entry) from one raw entry; None when unreadable."""
    if not isinstance(raw, dict):
        return None
    group = raw.get("process_group")
    if not isinstance(group, (list, tuple)) or len(group) != 2:
        return None
    name, desc = _text(group[0]), _text(group[1])
    profiling = raw.get("profiling_name")
    if not isinstance(profiling, str) or ":" not in profiling:
        return None
    backend, _, op = profiling[:200].partition(":")
    p2p = raw.get("is_p2p") is True or op.split(" ", 1)[0] in ("send", "recv")
    seq = _int(raw.get("p2p_seq_id" if p2p else "collective_seq_id"), -1)
    if seq < 0:
        return None
    state = raw.get("state")
    retired = raw.get("retired") is True
    if state == "completed" or (retired and backend == "gloo"):
        state = "completed"  # gloo marks a finished work retired and never moves its state
    elif retired:
        state = "timed out"
    elif state not in ("started", "scheduled"):
        state = "scheduled"
    entry = Entry(seq, _text(op), _shapes(raw.get("input_sizes")), _dtypes(raw.get("input_dtypes")),
                  _shapes(raw.get("output_sizes")), _dtypes(raw.get("output_dtypes")), state,
                  p2p)  # fmt: skip
    return name, desc, _text(backend, 16), _int(raw.get("pg_id"), -1), entry


def read_record(dump: dict, rank: int) -> RankRecord:
    """``dump`` (:func:`load_dump`'s) as rank ``rank``'s :class:`RankRecord`."""
    config = dump.get("pg_config") if isinstance(dump.get("pg_config"), dict) else {}
    status = dump.get("pg_status") if isinstance(dump.get("pg_status"), dict) else {}
    entries = dump.get("entries") if isinstance(dump.get("entries"), (list, tuple)) else []
    seen: dict[str, dict] = {}  # group name -> desc, pg_id, recent entries, last use
    backends: dict[str, int] = {}
    skipped = 0
    for order, raw in enumerate(entries[-_ENTRIES_READ:]):
        read = _entry(raw)
        if read is None:
            skipped += 1
            continue
        name, desc, backend, pg_id, entry = read
        backends[backend] = backends.get(backend, 0) + 1
        group = seen.setdefault(name, {"desc": desc, "pg_id": pg_id, "entries": [], "last": 0})
        group["entries"].append(entry)
        group["last"] = order + 1
        if len(group["entries"]) > 4 * ENTRIES_KEPT:
            del group["entries"][: -ENTRIES_KEPT]
    for key, value in list(config.items())[:4096]:
        if isinstance(value, dict) and _text(key):
            seen.setdefault(_text(key), {"desc": _text(value.get("desc")), "pg_id": -1,
                                          "entries": [], "last": 0})  # fmt: skip
    groups = []
    for name, group in seen.items():
        value = config.get(name)
        members = _members(value.get("ranks")) if isinstance(value, dict) else ()
        desc = group["desc"] or (_text(value.get("desc")) if isinstance(value, dict) else "")
        recent = group["entries"][-ENTRIES_KEPT:]
        counters = status.get(str(group["pg_id"])) if group["pg_id"] >= 0 else None
        counters = counters if isinstance(counters, dict) else {}
        collectives = [entry for entry in group["entries"] if not entry.p2p]
        enqueued = max([_int(counters.get("last_enqueued_collective"), 0),
                        *(entry.seq for entry in collectives)])  # fmt: skip
        completed = max([_int(counters.get("last_completed_collective"), -1),
                         *(entry.seq for entry in collectives if entry.done)])  # fmt: skip
        started = _int(counters.get("last_started_collective"), -1)
        groups.append((group["last"], GroupFrontier(name, desc, members, enqueued, started,
                                                    completed, tuple(recent))))  # fmt: skip
    groups.sort(key=lambda item: (-item[0], item[1].name))
    backend = max(backends, key=backends.__getitem__) if backends else ""
    version = _text(dump.get("version"), 16)
    return RankRecord(rank, version, backend, tuple(g for _, g in groups[:GROUPS_KEPT]), skipped)


# --- the compact per-node summary ----------------------------------------------------------------


def ranges(ranks: object) -> list[list[int]]:
    """Sorted ranks as ``[[first, last], ...]`` runs."""
    ordered = sorted(set(ranks))  # type: ignore[call-overload]
    runs: list[list[int]] = []
    for rank in ordered:
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return runs


def unranges(value: object, limit: int) -> tuple[int, ...]:
    """The ranks of ``[[first, last], ...]`` runs (:func:`ranges`), at most ``limit`` in
    all; :class:`FlightError` for anything else."""
    if not isinstance(value, list) or len(value) > limit:
        raise FlightError("a rank set is not a list of runs")
    ranks: list[int] = []
    for run in value:
        if (not isinstance(run, list) or len(run) != 2 or not all(
                isinstance(x, int) and not isinstance(x, bool) for x in run)
                or not 0 <= run[0] <= run[1] < _MEMBERS * 64
                or len(ranks) + run[1] - run[0] >= limit):  # fmt: skip
            raise FlightError("a rank set holds a bad run")
        ranks.extend(range(run[0], run[1] + 1))
    return tuple(ranks)


def _entry_doc(entry: Entry) -> list:
    return [entry.seq, entry.op, [list(s) for s in entry.in_sizes], list(entry.in_dtypes),
            [list(s) for s in entry.out_sizes], list(entry.out_dtypes), entry.state,
            int(entry.p2p)]  # fmt: skip


def _group_doc(group: GroupFrontier) -> dict:
    return {"name": group.name, "desc": group.desc, "members": ranges(group.members),
            "enqueued": group.enqueued, "started": group.started, "completed": group.completed,
            "recent": [_entry_doc(entry) for entry in group.recent]}  # fmt: skip


def node_summary(records: list[RankRecord], problems: dict[int, str]) -> dict:
    """This node's flight recorders as one JSON-able document: ``classes`` (ranks with the same
    record: ``ranks`` as runs, ``version``, ``backend``, ``groups``), ``problems`` (a reason ->
    the ranks without a record for it). Bounded: at most one class per rank, each as
    :func:`read_record` bounds it; typically one class for every rank in step."""
    by_signature: dict[tuple, list[RankRecord]] = {}
    for record in records:
        by_signature.setdefault(record.signature(), []).append(record)
    classes = []
    for members in by_signature.values():
        sample = members[0]
        classes.append({"ranks": ranges(record.rank for record in members),
                        "version": sample.version, "backend": sample.backend,
                        "groups": [_group_doc(group) for group in sample.groups]})  # fmt: skip
    reasons: dict[str, list[int]] = {}
    for rank, reason in problems.items():
        reasons.setdefault(_text(reason, 300), []).append(rank)
    problem_docs = [{"reason": k, "ranks": ranges(v)} for k, v in reasons.items()]
    return {"classes": classes, "problems": problem_docs}


def _read_entry(doc: object) -> Entry:
    if not isinstance(doc, list) or len(doc) != 8:
        raise FlightError("an entry is not a list of 8")
    seq, op, in_sizes, in_dtypes, out_sizes, out_dtypes, state, p2p = doc
    if (_int(seq) < 0 or not isinstance(op, str) or state not in
            ("completed", "started", "scheduled", "timed out")):  # fmt: skip
        raise FlightError("an entry has a bad field")
    return Entry(_int(seq), _text(op), _shapes(in_sizes), _dtypes(in_dtypes), _shapes(out_sizes),
                 _dtypes(out_dtypes), state, p2p == 1)  # fmt: skip


class _Reading:
    """What reading summaries may still cost: ``below`` bounds every member's rank, ``budget``
    the members expanded in all (a forged summary of short runs naming a million members per
    group degrades to groups without members); ``known``: groups read before, by their text,
    so that identical frontiers of many nodes are one object (hashed once)."""

    __slots__ = ("below", "budget", "known")

    def __init__(self, below: int, budget: int, known: dict | None) -> None:
        self.below = below
        self.budget = budget
        self.known: dict[str, GroupFrontier] = {} if known is None else known


def _read_group(doc: object, reading: _Reading) -> GroupFrontier:
    if not isinstance(doc, dict):
        raise FlightError("a group is not an object")
    key = json.dumps(doc, separators=(",", ":"), sort_keys=True)
    found = reading.known.get(key)
    if found is not None:
        return found
    recent = doc.get("recent")
    if not isinstance(recent, list) or len(recent) > ENTRIES_KEPT:
        raise FlightError("a group's entries are not a short list")
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise FlightError("a group has no name")
    runs = doc.get("members")
    members: tuple[int, ...] = ()
    if isinstance(runs, list) and len(runs) <= _MEMBERS and all(
        isinstance(run, list) and len(run) == 2 and all(type(x) is int for x in run)
        for run in runs
    ):  # fmt: skip
        size = sum(run[1] - run[0] + 1 for run in runs)
        if size <= reading.budget:
            members = unranges(runs, min(_MEMBERS, reading.budget) + 1)
            reading.budget -= len(members)
            if members and max(members) >= reading.below:
                raise FlightError(f"a group's members go beyond rank {reading.below - 1}")
        else:
            reading.budget = 0  # past the bound: this group and the later ones without members
    else:
        raise FlightError("a group's members are not a list of runs")
    entries = tuple(_read_entry(entry) for entry in recent)
    group = GroupFrontier(_text(name), _text(doc.get("desc")), members,
                          _int(doc.get("enqueued"), 0), _int(doc.get("started")),
                          _int(doc.get("completed")), entries)  # fmt: skip
    if len(reading.known) < 4096:
        reading.known[key] = group
    return group


def read_summary(
    data: bytes, *, max_ranks: int = 1 << 16, world: int | None = None,
    known: dict | None = None,
) -> tuple[list[RankRecord], dict[int, str]]:  # fmt: skip
    """A node's summary (:func:`node_summary`, as JSON bytes) back as one record per rank and
    the problems per rank; read as untrusted (size, shape, every field), :class:`FlightError`
    in one line. At most ``max_ranks`` ranks; with ``world`` (the job's rank count) every
    group member below it and at most ``4 * world + 4096`` members expanded in all (groups
    past that have none); ``known`` (a dict kept by the caller across summaries): identical
    groups read as one object."""
    if len(data) > SUMMARY_LIMIT:
        raise FlightError(f"the summary is {len(data):,} bytes, over {SUMMARY_LIMIT:,}")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as error:
        raise FlightError(f"unreadable summary: {type(error).__name__}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("classes"), list):
        raise FlightError("the summary has no classes")
    below = _MEMBERS * 64 if world is None else world
    reading = _Reading(below, 4 * min(below, _MEMBERS) + 4096, known)
    records: list[RankRecord] = []
    for item in doc["classes"][:max_ranks]:
        if not isinstance(item, dict) or not isinstance(item.get("groups"), list):
            raise FlightError("a class is not an object with groups")
        groups = tuple(_read_group(group, reading) for group in item["groups"][:GROUPS_KEPT])
        version, backend = _text(item.get("version"), 16), _text(item.get("backend"), 16)
        for rank in unranges(item.get("ranks"), max_ranks - len(records)):
            records.append(RankRecord(rank, version, backend, groups))
    problems: dict[int, str] = {}
    listed = doc.get("problems") if isinstance(doc.get("problems"), list) else []
    left = max_ranks
    for item in listed[:64]:
        if isinstance(item, dict) and isinstance(item.get("reason"), str):
            ranks = unranges(item.get("ranks"), left)
            left -= len(ranks)
            for rank in ranks:
                problems[rank] = _text(item["reason"], 300)
    return records, problems

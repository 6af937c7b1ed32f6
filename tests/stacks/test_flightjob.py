"""numarun.stacks.flightjob: the flight recorder over several nodes. Each node's summary in its
digest (bounded, read back as text), every node's merged by the node that merges the digests
into the view's flight verdict, carried in the merged view and read back checked; forged or
broken summaries are one line and change nothing else. On dumps recorded from a real 4-rank
gloo job (``tests/data/flight/skip``: rank 3 skipped one all_reduce), split over two nodes."""

from __future__ import annotations

import json
from pathlib import Path

from numarun.stacks import flight, flightjob
from numarun.stacks.digest import Classes, Raw, node_digest, read_digest
from numarun.stacks.merge import encode_view, merge, read_view, view_to_json
from numarun.stacks.rankhelper import FlightAnswer

DATA = Path(__file__).resolve().parents[1] / "data" / "flight"
STACK = ('Thread 0x00007f0000000001 (most recent call first):\n'
         '  File "/job/train.py", line 14 in main\n')
SKIP_LINE = (
    "group 0 (default_pg): ranks 0-2 wait in all_reduce #4 ([8] float32); rank 3 is one "
    "collective behind, waiting in all_reduce #3 ([8] float32): at #3 ranks 0-2 called "
    "all_reduce [4] float32, rank 3 called all_reduce [8] float32 (size mismatch)"
)


def answer(rank: int, case: str = "skip") -> FlightAnswer:
    data = (DATA / case / f"comm_lib_trace_rank_{rank}").read_bytes()
    return FlightAnswer(rank, rank % 2, "ok", data)


def node(number: int, ranks: list[int], answers: list[FlightAnswer | None]) -> bytes:
    """Node ``number``'s digest post, its ranks' stacks the same, each with its answer."""
    dumps = [Raw(rank, index, 100 + rank, STACK, None, found)
             for index, (rank, found) in enumerate(zip(ranks, answers, strict=True))]  # fmt: skip
    digest, _ = node_digest(dumps, node=number, host=f"host-{number}", pid=1, state="still",
                            known=Classes())  # fmt: skip
    return digest.encode()


def two_nodes() -> list[bytes]:
    return [node(0, [0, 1], [answer(0), answer(1)]), node(1, [2, 3], [answer(2), answer(3)])]


def merged(posts: list[bytes], world: int = 4) -> object:
    digests = [read_digest(post, below=world) for post in posts]
    return merge(digests, kind="hang", by="node 0 (host-0)", size=2, world=world)


def test_two_nodes_summaries_merge_into_the_one_node_verdict_and_travel_in_the_view() -> None:
    posts = two_nodes()
    assert all(len(post) < 4096 for post in posts)  # a node's digest stays small
    view = merged(posts)
    assert view.flight is not None
    assert view.flight.lines == [SKIP_LINE] and view.flight.culprits == [3]
    assert view.rank_count == 4 and len(view.classes) == 1  # the stacks: one class
    back, _ = read_view(encode_view(view), world=4, nodes=2)
    assert back.flight.shown_lines() == [SKIP_LINE] and back.flight.culprits == [3]
    detail = view_to_json(back)["flight"]
    assert detail["culprits"] == "3"
    assert detail["verdict"]["groups"][0]["mismatch"]["match_state"] == "SIZE_OR_SYNTAX_MISMATCH"


def test_a_node_without_a_summary_leaves_its_ranks_unknown_and_the_rest_stands() -> None:
    posts = [node(0, [0, 1], [answer(0), answer(1)]), node(1, [2, 3], [None, None])]
    view = merged(posts)
    assert view.flight is not None
    (line, *_) = view.flight.lines
    assert line.startswith("group 0 (default_pg): ranks 0-1 ")
    assert "ranks 2-3: no flight record (its node sent no flight summary)" in view.flight.lines


def test_a_job_without_a_process_group_has_no_flight_field_and_no_line() -> None:
    none = [FlightAnswer(r, r, "none", reason="torch.distributed not imported") for r in (0, 1)]
    post = node(0, [0, 1], none)
    assert b'"flight"' not in post
    assert merged([post, node(1, [2, 3], [None, None])]).flight is None


def test_a_broken_or_forged_summary_is_one_line_and_the_stacks_are_untouched() -> None:
    honest = merged(two_nodes())
    for forged in ("{not json", json.dumps({"classes": [{"ranks": [[0, 10 ** 9]], "groups": []}]}),
                   json.dumps({"classes": "x"}), "[" * 5000 + "]" * 5000):  # fmt: skip
        document = json.loads(two_nodes()[1])
        document["flight"] = forged
        view = merged([two_nodes()[0], json.dumps(document).encode()])
        assert [c.ranks for c in view.classes] == [c.ranks for c in honest.classes]
        assert view.notes == honest.notes
        (note,) = view.flight.notes
        assert note.startswith("node 1's flight summary: ")
        assert "ranks 2-3: no flight record (its node's flight summary was unreadable)" in \
            view.flight.lines  # fmt: skip
    # A field that is not a text: the digest stands, its flight record refused.
    document = json.loads(two_nodes()[1])
    document["flight"] = {"classes": []}
    view = merged([two_nodes()[0], json.dumps(document).encode()])
    assert view.rank_count == 4
    assert view.flight.notes == ["node 1's flight summary: not a text of at most 16,384 characters"]


def test_a_summary_naming_another_nodes_ranks_is_left_out_there() -> None:
    records = [flight.read_record(flight.load_dump(answer(r).data), r) for r in range(4)]
    document = json.loads(two_nodes()[1])
    # Node 1 claims ranks 0-1 (node 0's) and 3: those not its own are left out.
    document["flight"] = json.dumps(flight.node_summary([records[0], records[3]], {}))
    view = merged([two_nodes()[0], json.dumps(document).encode()])
    assert "node 1's flight summary names 1 rank(s) not its own: left out" in view.flight.notes
    assert "rank 2 unknown (its node's flight summary named other ranks)" in \
        view.flight.lines[0]  # fmt: skip
    assert "rank 3 is one collective behind" in view.flight.lines[0]  # its own record, read
    # More ranks than its digest names: the whole summary is refused, in one line.
    document["flight"] = json.dumps(flight.node_summary(records, {}))
    view = merged([two_nodes()[0], json.dumps(document).encode()])
    assert view.flight.notes == ["node 1's flight summary: a rank set holds a bad run"]
    assert view.rank_count == 4


def test_members_are_bounded_by_the_job_and_expanded_within_a_budget() -> None:
    group = {"name": "0", "desc": "default_pg", "members": [[0, 8191]], "enqueued": 1,
             "started": -1, "completed": 1, "recent": []}  # fmt: skip
    wide = [dict(group, name=str(index)) for index in range(16)]
    summary = json.dumps({"classes": [{"ranks": [[0, 0]], "version": "2", "backend": "gloo",
                                       "groups": wide}]}).encode()  # fmt: skip
    records, _ = flight.read_summary(summary, max_ranks=1, world=8192)
    sizes = [len(g.members) for g in records[0].groups]
    assert sum(sizes) <= 4 * 8192 + 4096 and sizes[-1] == 0 and sizes[0] == 8192
    beyond = summary.replace(b"8191", b"9000")
    try:
        flight.read_summary(beyond, max_ranks=1, world=8192)
    except flight.FlightError as error:
        assert "beyond rank 8191" in str(error)
    else:
        raise AssertionError("members beyond the job were read")


def test_a_node_summary_stays_within_its_bound_whatever_the_ranks_hold() -> None:
    def record(rank: int) -> flight.RankRecord:
        groups = []
        for index in range(flight.GROUPS_KEPT):
            recent = tuple(flight.Entry(seq, "all_reduce_" + "x" * 60, ((rank, seq) * 4,) * 8,
                                        ("Float",) * 8, ((1,),) * 8, ("Float",) * 8, "completed")
                           for seq in range(rank, rank + flight.ENTRIES_KEPT))  # fmt: skip
            groups.append(flight.GroupFrontier(f"g{index}" * 8, "d" * 60, tuple(range(64)),
                                               rank + 6, -1, rank + 5, recent))  # fmt: skip
        return flight.RankRecord(rank, "2.13", "gloo", tuple(groups))

    for count in (8, 16, 64):
        records = [record(rank) for rank in range(count)]
        summary = flightjob.node_flight([FlightAnswer(r.rank, r.rank, "ok", _dumped(r))
                                         for r in records])  # fmt: skip
        assert summary is not None and len(json.dumps(summary)) <= flightjob.FLIGHT_LIMIT
        back, problems = flight.read_summary(summary.encode(), max_ranks=count)
        assert {r.rank for r in back} | set(problems) == set(range(count))
        # What does not fit is cut (fewer entries, fewer groups) or said: never dropped silently.
        kept = [len(g.recent) for r in back for g in r.groups]
        assert all(n <= flightjob.CUT_ENTRIES for n in kept) or not problems
    assert set(problems.values()) == {flightjob.TOO_LARGE.format(flightjob.FLIGHT_LIMIT)}


def _dumped(record: flight.RankRecord) -> bytes:
    """A dump (torch's JSON form) holding ``record``'s groups."""
    entries = []
    for group in record.groups:
        for entry in group.recent:
            entries.append({"record_id": len(entries), "pg_id": 0, "process_group":
                            [group.name, group.desc], "collective_seq_id": entry.seq,
                            "p2p_seq_id": 0, "profiling_name": f"gloo:{entry.op}",
                            "input_sizes": [list(s) for s in entry.in_sizes],
                            "input_dtypes": list(entry.in_dtypes),
                            "output_sizes": [list(s) for s in entry.out_sizes],
                            "output_dtypes": list(entry.out_dtypes), "state": "scheduled",
                            "retired": True})  # fmt: skip
    return json.dumps({"version": "2.13", "pg_config": {}, "pg_status": {},
                       "entries": entries}).encode()  # fmt: skip


def test_a_forged_flight_verdict_in_a_merged_view_is_a_note_and_the_view_stands() -> None:
    view = merged(two_nodes())
    document = json.loads(encode_view(view))
    for forged in ({"lines": ["x"] * 100, "culprits": []},
                   {"lines": [], "culprits": [[0, 10 ** 9]]}, "text",
                   {"lines": [], "culprits": [], "verdict": "x" * (1 << 16)}):  # fmt: skip
        document["flight"] = forged
        back, _ = read_view(json.dumps(document).encode(), world=4, nodes=2)
        assert back.flight is None and back.rank_count == 4
        assert back.notes[-1].startswith("the flight recorder's verdict: ")


def test_a_notice_merged_over_the_jobs_world_reads_groups_wider_than_its_ranks() -> None:
    # Node 1's notice names rank 2 only (rank 3 failed: no dump); its group's members are 0-3.
    # Merged with node 0's ranks over the job's 4 ranks, every summary is read; bounded by the
    # ranks the two digests name (3), both were refused (what a stopped node printed).
    posts = [node(0, [0, 1], [answer(0), answer(1)]), node(1, [2], [answer(2)])]
    digests = [read_digest(post, below=4) for post in posts]
    view = merge(digests, kind="notice", by="this node", size=2, world=4)
    assert view.flight is not None and view.flight.notes == []
    assert view.flight.lines[0].startswith("group 0 (default_pg): ranks 0-2 wait in all_reduce #4")
    narrow = merge(digests, kind="notice", by="this node", size=2)
    assert narrow.flight.notes == [f"node {number}'s flight summary: a group's members go beyond "
                                   "rank 2" for number in (0, 1)]  # fmt: skip

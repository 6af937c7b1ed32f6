"""numarun.stacks.flight and flightverdict: torch's flight-recorder dumps read into frontiers and
merged into a verdict. On dumps recorded from real gloo jobs (torch 2.13, ``tests/data/flight/``,
``record.py`` there), on NCCL dumps built to torch's NCCL format, at 1,024 nodes x 8 ranks, and
on hostile content."""

from __future__ import annotations

import json
import pickle
import time
from pathlib import Path

import pytest

from numarun.stacks import flight
from numarun.stacks.flight import FlightError, load_dump, node_summary, read_record, read_summary
from numarun.stacks.flightverdict import Verdict, merge

DATA = Path(__file__).resolve().parents[1] / "data" / "flight"


def recorded(case: str) -> list[flight.RankRecord]:
    """The records of one recorded case, one per rank (the rank from torch's file name)."""
    found = []
    for path in sorted((DATA / case).iterdir()):
        name = path.name.removesuffix(".json")
        rank = int(name[len(name.rstrip("0123456789")) :])
        found.append(read_record(load_dump(path.read_bytes()), rank))
    return found


def verdict_of(case: str, world: int | None = None) -> Verdict:
    records = recorded(case)
    return merge(records, world=range(world if world is not None else len(records)))


# --- recorded gloo jobs --------------------------------------------------------------------------


def test_a_skipped_collective_names_the_rank_behind_and_the_size_mismatch() -> None:
    verdict = verdict_of("skip")
    assert verdict.lines() == [
        "group 0 (default_pg): ranks 0-2 wait in all_reduce #4 ([8] float32); rank 3 is one "
        "collective behind, waiting in all_reduce #3 ([8] float32): at #3 ranks 0-2 called "
        "all_reduce [4] float32, rank 3 called all_reduce [8] float32 (size mismatch)"
    ]
    assert verdict.culprits == {3}
    group = verdict.to_json()["groups"][0]
    assert group["mismatch"]["match_state"] == "SIZE_OR_SYNTAX_MISMATCH"
    assert group["mismatch"]["seq"] == 3 and group["missing"] == "3" and group["lead"] == 4


def test_the_json_form_of_the_same_hang_gives_the_same_verdict() -> None:
    from_json = verdict_of("skip-json")
    assert from_json.lines() == verdict_of("skip").lines()


def test_gloo_records_work_done_as_retired_and_the_helper_fills_the_members() -> None:
    ranks = recorded("skip")
    default = ranks[0].groups[0]
    assert ranks[0].backend == "gloo" and ranks[0].version
    assert default.name == "0" and default.desc == "default_pg"
    assert default.members == (0, 1, 2, 3)  # pg_config, which torch 2.13 leaves empty for gloo
    assert [entry.state for entry in default.recent] == ["completed"] * 3 + ["scheduled"]
    assert (default.enqueued, default.completed, default.waiting) == (4, 3, True)


def test_a_broadcast_where_the_others_all_reduce_is_a_type_mismatch() -> None:
    verdict = verdict_of("type")
    (line,) = verdict.lines()
    assert "ranks 0,2 wait in all_reduce #4 ([4] float32); rank 1 waits in broadcast #4" in line
    assert line.endswith("(collective type mismatch)")
    assert verdict.culprits == {1}
    assert verdict.to_json()["groups"][0]["mismatch"]["match_state"] == "COLLECTIVE_TYPE_MISMATCH"


def test_a_subgroup_and_the_default_group_waiting_on_each_other_are_both_named() -> None:
    verdict = verdict_of("subgroup")
    default, pair = verdict.lines()
    assert default.startswith("group 0 (default_pg): ranks 1-2 wait in all_reduce #4")
    assert "rank 0 is one collective behind" in default
    assert "it waits in group 1 all_reduce #1 ([2] float64)" in default
    assert pair.startswith("group 1: rank 0 waits in all_reduce #1 ([2] float64)")
    assert "it waits in group 0 (default_pg) all_reduce #4" in pair
    assert verdict.culprits == {0, 1}


def test_the_others_at_a_failure_are_named_with_their_collective() -> None:
    records = recorded("raise")  # rank 2 raised: no dump
    verdict = merge(records, {2: "exited"}, world=range(3))
    assert verdict.lines() == [
        "group 1: rank 0 waits in all_reduce #1 ([4] float32); rank 1 is one collective "
        "behind, in none of its collectives yet",
        "rank 2: no flight record (exited)",
    ]
    assert [group.stuck for group in verdict.groups] == [True, False]  # the default: all passed


def test_ddp_the_rank_that_never_entered_the_backward_all_reduce_is_named() -> None:
    verdict = verdict_of("ddp")
    (line,) = verdict.lines()
    assert line.startswith("group 0 (default_pg): rank 0 waits in all_reduce #")
    assert "rank 1 is one collective behind, its last, all_reduce #" in line
    assert line.endswith("completed")
    assert verdict.culprits == {1}


@pytest.mark.slow
def test_torchs_analyzer_reads_the_recorded_dumps_as_numarun_keeps_them() -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(DATA / "skip")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-2000:]
    # Its "Culprit rank" is whichever side it read second (files in directory order).
    assert "SIZE_OR_SYNTAX_MISMATCH" in output and "missing ranks: {3}" in output


# --- NCCL's format ---------------------------------------------------------------------------


def nccl_entry(seq: int, op: str, size: int, state: str, *, dtype: str = "Float",
               group: tuple[str, str] = ("0", "default_pg"), retired: bool = False,
               p2p: bool = False) -> dict:  # fmt: skip
    """One entry as torch's NCCL recorder writes it (FlightRecorderDetail: every key, the
    discovery times set as the watchdog saw the CUDA events)."""
    started = state in ("started", "completed")
    return {
        "record_id": seq - 1, "pg_id": int(group[0]) if group[0].isdigit() else 7,
        "process_group": group, "thread_name": "pt_main_thread", "thread_id": "1407",
        "collective_seq_id": 0 if p2p else seq, "p2p_seq_id": seq if p2p else 0,
        "op_id": seq, "profiling_name": f"nccl:{op}", "time_created_ns": 1_000 * seq,
        "input_sizes": [[size]], "input_dtypes": [dtype], "output_sizes": [[size]],
        "output_dtypes": [dtype], "state": state,
        "time_discovered_started_ns": 2_000 * seq if started else None,
        "time_discovered_completed_ns": 3_000 * seq if state == "completed" else None,
        "retired": retired, "timeout_ms": 600_000, "is_p2p": p2p, "duration_ms": 0.25,
    }  # fmt: skip


def nccl_dump(entries: list[dict], ranks: str, status: dict[str, int]) -> dict:
    return {
        "version": "2.10", "comm_lib_version": "2.21.5",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": ranks}},
        "pg_status": {"0": {"last_enqueued_collective": status["enqueued"],
                            "last_started_collective": status["started"],
                            "last_completed_collective": status["completed"]}},
        "nccl_comm_state": {"abcd": {"commHash": "1", "status": "ok"}},
        "entries": entries,
    }  # fmt: skip


def nccl_pair_skipping() -> list[bytes]:
    """Two ranks on NCCL: rank 1 skipped collective 2 ([4]); both then all_reduce [8]."""
    rank0 = [nccl_entry(1, "all_reduce", 4, "completed", retired=True),
             nccl_entry(2, "all_reduce", 4, "started"),
             nccl_entry(3, "all_reduce", 8, "scheduled")]  # fmt: skip
    rank1 = [nccl_entry(1, "all_reduce", 4, "completed", retired=True),
             nccl_entry(2, "all_reduce", 8, "started")]  # fmt: skip
    return [
        pickle.dumps(nccl_dump(rank0, "[0, 1]", {"enqueued": 3, "started": 2, "completed": 1})),
        pickle.dumps(nccl_dump(rank1, "[0, 1]", {"enqueued": 2, "started": 2, "completed": 1})),
    ]


def test_nccl_dumps_give_the_rank_behind_and_the_size_mismatch() -> None:
    records = [read_record(load_dump(data), rank) for rank, data in enumerate(nccl_pair_skipping())]
    assert records[0].backend == "nccl"
    frontier = records[0].groups[0]
    assert [e.state for e in frontier.recent] == ["completed", "started", "scheduled"]
    assert (frontier.enqueued, frontier.started, frontier.completed) == (3, 2, 1)
    verdict = merge(records)
    (line,) = verdict.lines()
    assert line == (
        "group 0 (default_pg): rank 0 waits in all_reduce #3 ([8] float32); rank 1 is one "
        "collective behind, waiting in all_reduce #2 ([8] float32): at #2 rank 0 called "
        "all_reduce [4] float32, rank 1 called all_reduce [8] float32 (size mismatch)"
    )
    assert verdict.culprits == {1}


def test_nccl_json_form_strings_and_lists_read_the_same() -> None:
    dumps = []
    for data in nccl_pair_skipping():
        loaded = pickle.loads(data)
        for entry in loaded["entries"]:
            entry["process_group"] = list(entry["process_group"])
            for key in ("time_discovered_started_ns", "time_discovered_completed_ns"):
                entry[key] = entry[key] or 0
        loaded["pg_status"] = {k: {n: str(v) for n, v in d.items()}
                               for k, d in loaded["pg_status"].items()}  # fmt: skip
        dumps.append(json.dumps(loaded).encode())
    from_json = merge([read_record(load_dump(data), rank) for rank, data in enumerate(dumps)])
    from_pickle = merge(
        [read_record(load_dump(data), rank) for rank, data in enumerate(nccl_pair_skipping())]
    )
    assert from_json.lines() == from_pickle.lines()


def test_nccl_dtype_mismatch_timeouts_and_point_to_point() -> None:
    a = [nccl_entry(1, "all_reduce", 4, "completed", retired=True),
         nccl_entry(2, "all_reduce", 4, "started", dtype="BFloat16"),
         nccl_entry(1, "send 0->1", 4, "started", p2p=True)]  # fmt: skip
    b = [nccl_entry(1, "all_reduce", 4, "completed", retired=True),
         nccl_entry(2, "all_reduce", 4, "scheduled", retired=True)]  # fmt: skip
    status = {"enqueued": 2, "started": 2, "completed": 1}
    records = [read_record(nccl_dump(a, "[0, 1]", status), 0),
               read_record(nccl_dump(b, "[0, 1]", status), 1)]  # fmt: skip
    assert records[1].groups[0].recent[-1].state == "timed out"
    assert records[0].groups[0].recent[-1].p2p  # kept, never matched as a collective
    (line,) = merge(records).lines()
    expected = "at #2 rank 0 called all_reduce [4] bfloat16, rank 1 called all_reduce [4] float32"
    assert expected in line
    assert line.endswith("(dtype mismatch)")


def test_shapes_of_uneven_collectives_are_not_a_mismatch() -> None:
    a = [nccl_entry(1, "all_to_all", 4, "started")]
    b = [nccl_entry(1, "all_to_all", 6, "started")]
    status = {"enqueued": 1, "started": 1, "completed": 0}
    verdict = merge([read_record(nccl_dump(a, "[0, 1]", status), 0),
                     read_record(nccl_dump(b, "[0, 1]", status), 1)])  # fmt: skip
    assert verdict.groups[0].mismatch is None and not verdict.culprits


# --- a whole job at scale --------------------------------------------------------------------


def synthetic_node(node: int, *, lagging: int | None) -> bytes:
    """One node of 8 ranks in step at all_reduce #120 ([1024] bfloat16), as its summary; the
    rank ``lagging`` (global) skipped #118 and waits in #119 with the next size."""
    records = []
    for local in range(8):
        rank = node * 8 + local
        behind = rank == lagging
        top = 119 if behind else 120
        recent = []
        for seq in range(top - 5, top + 1):
            size = 2048 if behind and seq >= 118 else (2048 if seq == 120 else 1024)
            state = "scheduled" if seq == top else "completed"
            recent.append(flight.Entry(seq, "all_reduce", ((size,),), ("BFloat16",), ((size,),),
                                       ("BFloat16",), state))  # fmt: skip
        group = flight.GroupFrontier("0", "default_pg", (), top, -1, top - 1, tuple(recent))
        records.append(flight.RankRecord(rank, "2.10", "nccl", (group,)))
    return json.dumps(node_summary(records, {})).encode()


def test_1024_nodes_of_8_ranks_merge_into_one_line_naming_the_rank_behind() -> None:
    summaries = [synthetic_node(node, lagging=8191) for node in range(1024)]
    assert max(len(data) for data in summaries) < 4096  # a node's post stays small
    records = []
    for data in summaries:
        records.extend(read_summary(data)[0])
    assert len(records) == 8192
    started = time.process_time()
    verdict = merge(records, world=range(8192))
    spent = time.process_time() - started
    (line,) = verdict.lines()
    assert line.startswith("group 0 (default_pg): ranks 0-8190 wait in all_reduce #120 ([2048]")
    behind = "rank 8191 is one collective behind, waiting in all_reduce #119 ([2048] bfloat16)"
    assert behind in line
    assert "at #118 ranks 0-8190 called all_reduce [1024] bfloat16, rank 8191 called" in line
    assert verdict.culprits == {8191}
    assert len(line) < 500
    # Every rank somewhere else: the text and the document stay bounded.
    scattered = [flight.RankRecord(r.rank, r.version, r.backend, (r.groups[0].replace(
        enqueued=100 + r.rank, recent=()),)) for r in records]  # fmt: skip
    wide = merge(scattered, world=range(8192))
    assert len("\n".join(wide.lines())) < 2000
    assert len(json.dumps(wide.to_json())) < 64 * 1024
    assert wide.to_json()["groups"][0]["more_positions"] == 8192 - 64
    assert spent < 60  # a sanity bound only; benchmarks/bench_flight.py measures it


def test_a_node_summary_folds_ranks_in_step_and_reads_back_what_it_holds() -> None:
    records = recorded("skip")
    summary = node_summary(records, {7: "exited"})
    assert len(summary["classes"]) == 2  # ranks 0-2 in step, rank 3 on its own
    back, problems = read_summary(json.dumps(summary).encode())
    assert sorted(r.rank for r in back) == [0, 1, 2, 3] and problems == {7: "exited"}
    assert merge(back, problems).lines()[0] == merge(records).lines()[0]


# --- hostile content -------------------------------------------------------------------------

RAN: list[str] = []


def _would_run(text: str) -> None:  # what a forged pickle would call
    RAN.append(text)


class _Forged:
    def __reduce__(self) -> tuple:
        return (_would_run, ("owned",))


def test_a_pickle_that_would_run_code_is_refused_and_runs_nothing() -> None:
    forged = pickle.dumps({"entries": [_Forged()]}, protocol=2)
    with pytest.raises(FlightError, match="not a flight recorder dump"):
        load_dump(forged)
    assert RAN == []
    with pytest.raises(FlightError):
        load_dump(pickle.dumps({"x": print}))  # a builtin is a global too


@pytest.mark.parametrize(
    "data",
    [b"", b"garbage", b"\x80\x02}q\x00(", b"[1, 2]", b"{" * 100_000, b'{"entries": 5',
     pickle.dumps([1, 2]), b"\x80\x05\x95"],
)  # fmt: skip
def test_what_is_not_a_dump_is_one_line(data: bytes) -> None:
    with pytest.raises(FlightError) as caught:
        load_dump(data)
    assert "\n" not in str(caught.value)


def test_an_oversized_dump_is_refused_before_it_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flight, "DUMP_LIMIT", 1000)
    with pytest.raises(FlightError, match="over 1,000"):
        load_dump(b"{" + b" " * 1000 + b"}")


def test_fields_of_the_wrong_type_are_skipped_not_raised() -> None:
    cycle: list = []
    cycle.append(cycle)
    dump = {
        "version": ["x"], "pg_config": {"0": {"ranks": "[0, x]"}, "": 5, 3: None},
        "pg_status": {"0": {"last_completed_collective": "99999999999999999999999"}},
        "entries": [
            None, 5, {"process_group": "0"}, {"process_group": ("0", "d"), "profiling_name": 7},
            {"process_group": ("0", "d"), "profiling_name": "gloo:all_reduce",
             "collective_seq_id": -4},
            {"process_group": ("0", "d"), "profiling_name": "gloo:all_reduce",
             "collective_seq_id": True},
            {"process_group": ("0", "d"), "profiling_name": "gloo:all_reduce",
             "collective_seq_id": 2, "input_sizes": cycle, "input_dtypes": "Float",
             "state": "weird"},
        ],
    }  # fmt: skip
    record = read_record(load_dump(pickle.dumps(dump)), 0)
    assert record.skipped == 6
    (group,) = [g for g in record.groups if g.recent]
    assert group.recent[0].in_sizes == ((-1,),)  # not a shape: its dimension unknown ("?")
    assert group.recent[0].in_dtypes == () and group.recent[0].state == "scheduled"
    assert group.members == ()  # "[0, x]" is no member list
    merge([record])  # no exception


def test_names_from_a_dump_are_escaped_in_the_verdict() -> None:
    evil = "all_reduce\x1b]0;owned\x07\u202e"
    a = [nccl_entry(1, evil, 4, "started", group=("0\x1b[2J", "default_pg\u202e"))]
    b = [nccl_entry(1, "all_reduce", 8, "started", group=("0\x1b[2J", "default_pg\u202e"))]
    status = {"enqueued": 1, "started": 1, "completed": 0}
    dumps = [nccl_dump(a, "[0, 1]", status), nccl_dump(b, "[0, 1]", status)]
    for dump in dumps:
        dump["pg_config"] = {"0\x1b[2J": {"name": "0", "desc": "x", "ranks": "[0, 1]"}}
    text = "\n".join(merge([read_record(d, r) for r, d in enumerate(dumps)]).lines())
    assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text
    assert "\\x1b" in text and "\\u202e" in text


def test_a_forged_summary_is_refused_in_one_line_or_bounded() -> None:
    for forged in (
        b"[]", b'{"classes": 5}', b'{"classes": [{"ranks": [[5, 2]], "groups": []}]}',
        b'{"classes": [{"ranks": [[0, 99999999]], "groups": []}]}',
        b'{"classes": [{"ranks": [[0, 0]], "groups": [{"name": "0", "recent": [[1]]}]}]}',
        b'{"classes": [{"ranks": [[0, 0]], "groups": [{"name": "", "recent": []}]}]}',
        b"x" * (flight.SUMMARY_LIMIT + 1),
    ):  # fmt: skip
        with pytest.raises(FlightError) as caught:
            read_summary(forged, max_ranks=8192)
        assert "\n" not in str(caught.value)


def test_forged_sequence_numbers_far_apart_cost_nothing() -> None:
    def node(seq: int) -> flight.RankRecord:
        entries = (flight.Entry(1, "all_reduce", ((4,),), ("Float",), ((4,),), ("Float",),
                                "completed"),
                   flight.Entry(seq, "all_reduce", ((8,),), ("Float",), ((8,),), ("Float",),
                                "scheduled"))  # fmt: skip
        return flight.RankRecord(seq % 7, "2.10", "gloo",
                                 (flight.GroupFrontier("0", "default_pg", (), seq, -1, 1,
                                                       entries),))  # fmt: skip
    started = time.process_time()
    verdict = merge([node(2), node(10**15)])
    assert time.process_time() - started < 5
    assert verdict.culprits

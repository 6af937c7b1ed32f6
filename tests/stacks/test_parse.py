"""numarun.stacks.parse: stacks parsed, grouped and formatted from real faulthandler output
(``tests/faulthandler_dumps.py``). The arming is ``test_dumphandler.py``'s, the completeness rule
``test_dumps.py``'s."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numarun
from faulthandler_dumps import body_line
from numarun.stacks.parse import (
    Frame,
    RankStacks,
    Thread,
    format_groups,
    format_ranks,
    group_ranks,
    heading,
    odd_ones_out,
    parse_dump,
    rank_stacks,
    stacks_to_json,
    where,
)


def test_parse_real_dump_main_thread_last_without_bootstrap_frames(
    dumps: dict[str, tuple[str, bytes]], tmp_path: Path
) -> None:
    threads, more = parse_dump(dumps["a"][1].decode())
    assert not more and len(threads) == 2
    main, helper = threads[-1], threads[0]
    assert [f.function for f in main.frames] == ["park_main_here", "<module>"]
    assert main.frames[0].file.endswith("parked.py")
    assert main.frames[0].line == body_line("park_main_here")
    package = os.path.dirname(numarun.__file__)  # the bootstrap's frames are removed
    assert all(not f.file.startswith(package) and f.file != "<string>" for f in main.frames)
    assert [f.function for f in helper.frames][:1] == ["helper_thread_loop"]
    assert helper.frames[-1].function == "_bootstrap"  # threading's own frames stay
    assert all(thread.ident.startswith("0x") for thread in threads)


def test_faulthandler_limits_are_read(dumps: dict[str, tuple[str, bytes]]) -> None:
    threads, more = parse_dump(dumps["deep"][1].decode())
    main = threads[-1]
    assert main.truncated and len(main.frames) == 100
    assert main.frames[0].function == "park_main_here"
    threads, more = parse_dump(dumps["many"][1].decode())
    assert more and len(threads) == 100
    lines = format_groups(group_ranks([rank_stacks(0, 0, 1, dumps["many"][1].decode(), None)]))
    assert lines[-1] == "    ... (faulthandler shows at most 100 threads)"


def _three_ranks(dumps: dict[str, tuple[str, bytes]]) -> list[RankStacks]:
    # Ranks 0 and 2 park in the same place (two different processes), rank 1 elsewhere.
    return [
        rank_stacks(rank, rank, 100 + rank, dumps[name][1].decode(), None)
        for rank, name in [(0, "a"), (1, "c"), (2, "b")]
    ]


def test_identical_stacks_group_and_the_odd_one_stands_out(
    dumps: dict[str, tuple[str, bytes]],
) -> None:
    ranks = _three_ranks(dumps)
    groups = group_ranks(ranks)
    assert [group.ranks for group in groups] == [(0, 2), (1,)]
    assert heading(groups[0]).startswith("ranks 0,2: in park_main_here (")
    assert heading(groups[1]).startswith("rank 1: in park_elsewhere (")
    assert f"parked.py:{body_line('park_elsewhere')})" in heading(groups[1])
    majority, odd = odd_ones_out(groups)
    assert majority is groups[0] and odd == [groups[1]]
    text = "\n".join(format_groups(groups))
    assert text.count("main thread (0x") == 2 and "thread 2 of 2 (0x" in text
    assert '      File "' in text and ", in park_elsewhere" in text
    short = format_groups(groups, max_frames=1, other_threads=False)
    assert "      ... 1 more frame" in short and "    (1 other thread not shown)" in short


def test_json_document(dumps: dict[str, tuple[str, bytes]]) -> None:
    document = json.loads(json.dumps(stacks_to_json(_three_ranks(dumps), run_id="r1", pid=7)))
    assert document["run_id"] == "r1" and document["pid"] == 7
    assert [group["ranks"] for group in document["groups"]] == [[0, 2], [1]]
    assert document["groups"][1]["user_frame"]["function"] == "park_elsewhere"
    rank1 = document["ranks"][1]
    assert rank1["rank"] == 1 and rank1["pid"] == 101 and rank1["problem"] is None
    assert rank1["threads"][-1]["main"] and not rank1["threads"][0]["main"]
    assert rank1["threads"][-1]["frames"][0] == {
        "file": rank1["threads"][-1]["frames"][0]["file"],
        "line": body_line("park_elsewhere"),
        "function": "park_elsewhere",
    }


def _stack(rank: int, *frames: tuple[str, int, str], problem: str | None = None) -> RankStacks:
    if problem is not None:
        return RankStacks(rank, rank, None, problem=problem)
    thread = Thread("0x1", True, tuple(Frame(*frame) for frame in frames))
    return RankStacks(rank, rank, 1000 + rank, (thread,))


TORCH = "/usr/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def test_heading_names_the_innermost_user_frame_first() -> None:
    group = group_ranks([_stack(3, (TORCH, 2501, "all_reduce"), ("/job/train.py", 14, "step"))])
    assert heading(group[0]) == (
        "rank 3: in step (/job/train.py:14), innermost all_reduce "
        "(torch/distributed/distributed_c10d.py:2501)"
    )
    only_library = _stack(0, ("/usr/lib/python3.11/threading.py", 320, "wait"))
    assert where(only_library) == "in wait (threading.py:320)"
    assert where(_stack(0, problem="exited")) == "no stacks: exited"


def test_a_tie_goes_to_the_ranks_waiting_in_a_collective() -> None:
    waiting = [_stack(r, (TORCH, 2501, "all_reduce"), ("/j.py", 9, "step")) for r in (0, 1)]
    stuck = [_stack(r, ("/j.py", 3, "load_batch")) for r in (2, 3)]
    majority, odd = odd_ones_out(group_ranks([*waiting, *stuck]))
    assert majority is not None and majority.ranks == (0, 1)
    assert [group.ranks for group in odd] == [(2, 3)]
    # Two groups of one, neither in a collective: no single culprit.
    majority, odd = odd_ones_out(group_ranks([stuck[0], _stack(5, ("/j.py", 4, "other"))]))
    assert majority is None and len(odd) == 2
    # All in one place: nobody differs.
    majority, odd = odd_ones_out(group_ranks(waiting))
    assert majority is not None and odd == []


def test_ranks_without_stacks_come_last_grouped_by_why() -> None:
    ranks = [
        _stack(0, problem="not a Python process (--no-python)"),
        _stack(1, ("/j.py", 3, "f")),
        _stack(2, problem="not a Python process (--no-python)"),
    ]
    groups = group_ranks(ranks)
    assert [group.ranks for group in groups] == [(1,), (0, 2)]
    assert format_groups(groups)[-1] == "ranks 0,2: no stacks: not a Python process (--no-python)"


def test_format_ranks() -> None:
    assert format_ranks([7, 0, 2, 3, 4, 5, 6]) == "0,2-7"
    assert format_ranks([1]) == "1"

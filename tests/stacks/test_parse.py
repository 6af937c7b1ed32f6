"""Stacks parsed, grouped and formatted from real faulthandler output (numarun.stacks.parse), the
worker-side arming (numarun.stacks.arm) and the dump-completeness rule (numarun.stacks.dumps)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from numarun.launch.workers import SCRIPT_BOOTSTRAP
from numarun.stacks.arm import STACKS_FILE_ENV, STACKS_SIGNAL
from numarun.stacks.dumps import _signal_state, _structurally_complete, normalized
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

# A worker that parks its main thread in a function named on its command line, with a helper
# thread parked elsewhere; it prints what it sees of numarun's variable and its dump fd.
PARKED = textwrap.dedent(
    """
    import os, sys, threading, time

    def helper_thread_loop():
        while True:
            time.sleep(60)

    def recurse(n):
        if n == 0:
            park_main_here()
        recurse(n - 1)

    def park_main_here():
        time.sleep(60)

    def park_elsewhere():
        time.sleep(60)

    mode = sys.argv[1]
    threading.Thread(target=helper_thread_loop, daemon=True).start()
    if mode == "many-threads":
        for _ in range(105):
            threading.Thread(target=helper_thread_loop, daemon=True).start()
    fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
    print(repr(os.environ.get("NUMARUN_STACKS_FILE")), max(fds), flush=True)
    if mode == "deep":
        recurse(150)
    elif mode == "elsewhere":
        park_elsewhere()
    else:
        park_main_here()
    """
)


def _body_line(function: str) -> int:
    """The line number, in PARKED, of the first line of ``function``'s body."""
    return PARKED.split("\n").index(f"def {function}():") + 2


def _armed(pid: int, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        state = _signal_state(pid)
        if state is not None and state[0]:
            return
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} never installed the dump handler")


def real_dump(tmp_path: Path, mode: str, name: str) -> tuple[str, bytes]:
    """(what the worker printed, its dump) for PARKED started through numarun's bootstrap."""
    script = tmp_path / "parked.py"
    script.write_text(PARKED)
    dump = tmp_path / f"{name}.dump"
    dump.write_bytes(b"")
    env = {**os.environ, STACKS_FILE_ENV: str(dump)}
    proc = subprocess.Popen(
        [sys.executable, "-u", "-c", SCRIPT_BOOTSTRAP, str(script), mode],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        seen = proc.stdout.readline()
        _armed(proc.pid)
        where = {"elsewhere": b"park_elsewhere", "deep": b"  ...", "many-threads": b"\n...\n"}
        marker = where.get(mode, b"park_main_here")
        deadline = time.monotonic() + 20
        while True:  # until the main thread has reached its parking place
            dump.write_bytes(b"")
            os.kill(proc.pid, STACKS_SIGNAL)
            data = b""
            while time.monotonic() < deadline:
                data = dump.read_bytes()
                if _structurally_complete(data) or data.endswith(b"  ...\n"):
                    break
                time.sleep(0.01)
            time.sleep(0.1)  # nothing more comes
            assert dump.read_bytes() == data
            if marker in data.rsplit(b"(most recent call first):", 1)[-1]:
                return seen, data
            assert time.monotonic() < deadline, data
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, bytes]]:
    tmp = tmp_path_factory.mktemp("dumps")
    return {
        name: real_dump(tmp, mode, name)
        for name, mode in [
            ("a", "main"),
            ("b", "main"),
            ("c", "elsewhere"),
            ("deep", "deep"),
            ("many", "many-threads"),
        ]
    }


def test_the_bootstrap_arms_the_dump_invisibly(dumps: dict[str, tuple[str, bytes]]) -> None:
    seen, data = dumps["a"]
    variable, highest_fd = seen.split()
    assert variable == "None"  # the program never sees numarun's variable
    assert int(highest_fd) >= 1000  # the dump fd moved out of the program's way
    text = data.decode()
    assert text.startswith(("Thread 0x", "Current thread 0x"))
    assert "park_main_here" in text and "helper_thread_loop" in text


def test_parse_real_dump_main_thread_last_without_bootstrap_frames(
    dumps: dict[str, tuple[str, bytes]], tmp_path: Path
) -> None:
    threads, more = parse_dump(dumps["a"][1].decode())
    assert not more and len(threads) == 2
    main, helper = threads[-1], threads[0]
    assert [f.function for f in main.frames] == ["park_main_here", "<module>"]
    assert main.frames[0].file.endswith("parked.py")
    assert main.frames[0].line == _body_line("park_main_here")
    assert all("numarun" not in f.file and f.file != "<string>" for f in main.frames)
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


def test_complete_only_at_the_end_of_a_real_dump(dumps: dict[str, tuple[str, bytes]]) -> None:
    for name in ("a", "c", "deep", "many"):
        data = dumps[name][1]
        # The main thread's bottom (the bootstrap's -c code) is known; a stack cut after 100
        # frames is not, and waits for the dump to be quiet instead.
        assert _structurally_complete(data) == (name != "deep"), name
        cuts = [i + 1 for i, byte in enumerate(data[:-1]) if byte == ord("\n")]
        assert not any(_structurally_complete(data[:cut]) for cut in cuts), name


def test_normalized_ignores_which_thread_ran_the_handler() -> None:
    one = b"Current thread 0x1 (most recent call first):\n  File \"x\", line 1 in f\n"
    two = b"Thread 0x1 (most recent call first):\n  File \"x\", line 1 in f\n"
    assert normalized(one) == normalized(two)
    assert normalized(one) != normalized(one.replace(b"line 1", b"line 2"))


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
    assert f"parked.py:{_body_line('park_elsewhere')})" in heading(groups[1])
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
        "line": _body_line("park_elsewhere"),
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


def test_signal_state_reads_proc(tmp_path: Path) -> None:
    # A process with a Python handler for the signal shows it caught; before, not.
    proc = subprocess.Popen(
        [sys.executable, "-c",
         "import signal, sys, time\n"
         f"print('go', flush=True); sys.stdin.readline()\n"
         f"signal.signal({STACKS_SIGNAL}, lambda *a: None)\n"
         "print('set', flush=True); time.sleep(60)"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdin is not None
        proc.stdout.readline()
        assert _signal_state(proc.pid) == (False, False)
        proc.stdin.write("\n")
        proc.stdin.flush()
        proc.stdout.readline()
        assert _signal_state(proc.pid) == (True, False)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert _signal_state(proc.pid) is None


# --- --hang-timeout and the exit status ----------------------------------------------------------


def test_hang_timeout_option() -> None:
    from numarun.errors import UsageError
    from numarun.launch.config import parse_args

    assert parse_args(["t.py"]).hang_timeout is None
    assert parse_args(["--hang-timeout", "7.5", "t.py"]).hang_timeout == 7.5
    assert parse_args(["--hang_timeout=0", "t.py"]).hang_timeout is None  # 0: off
    assert parse_args(["t.py"], environ={"PET_HANG_TIMEOUT": "30"}).hang_timeout == 30.0
    assert parse_args(["--hang-t", "3", "t.py"]).hang_timeout == 3.0  # a prefix, as torchrun's
    for bad in ("-1", "soon", "inf"):
        with pytest.raises(UsageError, match="--hang-timeout must be"):
            parse_args(["--hang-timeout", bad, "t.py"])
    with pytest.raises(UsageError, match="add --redirects 3 or --tee 3"):
        parse_args(["--hang-timeout", "5", "--no-python", "prog"])
    assert parse_args(["--hang-timeout", "5", "--tee", "3", "--no-python", "prog"]).hang_timeout


def test_a_hang_exits_124_unless_a_signal_came_first() -> None:
    from numarun.launch.report import exit_code_for
    from numarun.process.spec import RunResult, WorkerExit

    ended = WorkerExit(0, 0, 1, -15, "SIGTERM", "terminated", 1.0)
    failed = WorkerExit(1, 1, 2, 1, None, "failed", 1.0)
    assert exit_code_for(RunResult([ended], None, None, [], "hang: no rank moved")) == 124
    assert exit_code_for(RunResult([ended, failed], failed, None, [], "hang: x")) == 124
    assert exit_code_for(RunResult([ended], None, signal.SIGINT, [], "hang: x")) == 130

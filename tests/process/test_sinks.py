"""Tests for the output sinks, redirect/tee specs, the log layout and lossless line framing."""

from __future__ import annotations

import fcntl
import os
import re
import selectors
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numarun.errors import UsageError
from numarun.launch.logdir import error_file_path, make_log_dirs, rank_log_dir
from numarun.launch.output import (
    PREFIX_TEMPLATE_ENV,
    Std,
    make_prefix,
    parse_ranks_filter,
    parse_std_spec,
    ranks_filter_warning,
    sinks_for,
)
from numarun.process.sinks import FileSink, NullSink, TeeSink

# ---------------------------------------------------------------- --redirects / --tee specs


@pytest.mark.parametrize(
    ("text", "nprocs", "expected"),
    [
        ("0", 2, {0: 0, 1: 0}),
        ("1", 3, {0: 1, 1: 1, 2: 1}),
        ("2", 1, {0: 2}),
        (" 3 ", 2, {0: 3, 1: 3}),
        ("0:3,1:0", 2, {0: 3, 1: 0}),
        ("1:2", 4, {0: 0, 1: 2, 2: 0, 3: 0}),
        ("3:1, 0:2", 4, {0: 2, 1: 0, 2: 0, 3: 1}),
        ("10:3", 11, {**dict.fromkeys(range(10), 0), 10: 3}),
    ],
)
def test_parse_std_spec_accepts_torchrun_forms(text: str, nprocs: int, expected: dict) -> None:
    assert parse_std_spec(text, nprocs) == expected


@pytest.mark.parametrize(
    "text",
    ["4", "a", "0:", "5:1", "0:1,0:2", "", "-1", "0:4", ":1", "0:1,", "01", "0:1;1:2", "1:a", "٣"],
)
def test_parse_std_spec_rejects_malformed_values_in_one_line(text: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_std_spec(text, 2, flag="--tee")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"--tee {text!r} is not valid")
    assert "0:3,1:0" in message and "3 (both)" in message


def test_parse_std_spec_names_the_missing_rank() -> None:
    with pytest.raises(UsageError, match="local rank 5 does not exist with 2 processes"):
        parse_std_spec("5:1", 2)


def test_std_values_are_torchruns() -> None:
    assert (Std.NONE, Std.OUT, Std.ERR, Std.ALL) == (0, 1, 2, 3)
    assert Std.ALL == Std.OUT | Std.ERR


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0,2", {0, 2}), ("", {0, 1, 2, 3}), ("  ", {0, 1, 2, 3}), (" 3 , 1,1", {1, 3})],
)
def test_parse_ranks_filter(text: str, expected: set[int]) -> None:
    assert parse_ranks_filter(text, 4) == expected


@pytest.mark.parametrize("text", ["a", "0,,1", "-1", "1.5", "0;1", ","])
def test_parse_ranks_filter_rejects_bad_values(text: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_ranks_filter(text, 4)
    assert "\n" not in str(info.value)
    assert str(info.value).startswith(f"--local-ranks-filter {text!r}")
    with pytest.raises(UsageError):
        ranks_filter_warning(text, 4)


@pytest.mark.parametrize(
    ("text", "shown", "warning"),
    [
        # torchchat-style scripts pass 0,1,2,3 whatever the machine: torchrun accepts it.
        ("0,1,2,3", {0, 1}, "names local ranks 2, 3, which do not exist with 2 processes per "
         "node: only local ranks 0, 1 will be shown"),
        ("1,7", {1}, "names local rank 7, which does not exist with 2 processes per node: "
         "only local rank 1 will be shown"),
        ("5", set(), "no rank's output will be shown on the console"),
        ("0,1", {0, 1}, None),
        ("", {0, 1}, None),
    ],
)  # fmt: skip
def test_a_ranks_filter_naming_ranks_that_do_not_exist_is_accepted_with_a_warning(
    text: str, shown: set[int], warning: str | None
) -> None:
    assert parse_ranks_filter(text, 2) == shown
    said = ranks_filter_warning(text, 2)
    if warning is None:
        assert said is None
    else:
        assert said is not None and warning in said and "\n" not in said


# ---------------------------------------------------------------- layout


def test_make_log_dirs_builds_the_layout(tmp_path: Path) -> None:
    attempt = make_log_dirs(tmp_path / "logs", "job7", 3)
    assert attempt == tmp_path / "logs" / "job7" / "attempt_0"
    assert sorted(p.name for p in attempt.iterdir()) == ["0", "1", "2"]
    assert rank_log_dir(attempt, 2) == attempt / "2"
    assert error_file_path(attempt, 1) == attempt / "1" / "error.json"


def test_make_log_dirs_never_reuses_or_deletes_an_earlier_runs_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = make_log_dirs(tmp_path, "job", 2)
    error_file_path(first, 1).write_text('{"message": "old failure"}')
    (first / "0" / "stdout.log").write_text("old output")
    capsys.readouterr()
    second = make_log_dirs(tmp_path, "job", 2)
    assert second != first
    assert second.parent.parent == tmp_path and second.parent.name.startswith("job_")
    assert second.name == "attempt_0" and sorted(p.name for p in second.iterdir()) == ["0", "1"]
    assert not error_file_path(second, 1).exists()  # no stale failure to misread
    assert error_file_path(first, 1).read_text() == '{"message": "old failure"}'
    assert (first / "0" / "stdout.log").read_text() == "old output"
    assert capsys.readouterr().err == (
        f"numarun: {tmp_path / 'job'} already exists; this run's logs go to {second.parent}\n"
    )
    third = make_log_dirs(tmp_path, "job", 1, announce=False)
    assert third not in (first, second)
    assert capsys.readouterr().err == ""


def test_make_log_dirs_without_log_dir_uses_a_temp_dir_and_says_where(
    capsys: pytest.CaptureFixture[str],
) -> None:
    attempt = make_log_dirs(None, "r1", 1)
    try:
        base = attempt.parent.parent
        assert base.name.startswith("numarun_") and (attempt / "0").is_dir()
        assert capsys.readouterr().err == f"numarun: worker logs go to {base}\n"
    finally:
        shutil.rmtree(attempt.parent.parent)


@pytest.mark.parametrize("run_id", ["", ".", "..", "a/b", "x\0y"])
def test_make_log_dirs_rejects_run_ids_that_are_not_a_directory_name(
    tmp_path: Path, run_id: str
) -> None:
    with pytest.raises(UsageError, match="run id"):
        make_log_dirs(tmp_path, run_id, 1)
    assert list(tmp_path.iterdir()) == []


def test_make_log_dirs_rejects_a_file_as_log_dir(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(UsageError, match="not a directory"):
        make_log_dirs(tmp_path / "f", "run", 1)


def test_make_log_dirs_reports_an_uncreatable_dir_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(UsageError) as info:
        make_log_dirs(tmp_path / "f" / "below", "run", 1)
    assert "cannot create --log-dir" in str(info.value) and "\n" not in str(info.value)
    assert "f exists and is not a directory" in str(info.value)


# ---------------------------------------------------------------- prefixes


def test_default_prefix_is_torchruns_role_and_local_rank() -> None:
    assert make_prefix(3, 1, environ={}) == b"[default1]:"
    assert make_prefix(3, 1, role_name="trainer", environ={}) == b"[trainer1]:"


def test_prefix_template_like_torchrun() -> None:
    template = "[${role_name}${local_rank}|${rank}]:"
    assert make_prefix(9, 1, role_name="trainer", template=template) == b"[trainer1|9]:"
    env = {PREFIX_TEMPLATE_ENV: "${rank} $unknown ${local_rank}> "}
    assert make_prefix(4, 0, environ=env) == b"4 $unknown 0> "
    assert make_prefix(4, 0, environ={PREFIX_TEMPLATE_ENV: ""}) == b"[default0]:"


def test_prefix_template_comes_from_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PREFIX_TEMPLATE_ENV, "<${local_rank}>")
    assert make_prefix(5, 2) == b"<2>"


# ---------------------------------------------------------------- sinks


def _console(tmp_path: Path, name: str = "console") -> tuple[int, Path]:
    path = tmp_path / name
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND), path


def _expected_console(data: bytes, prefix: bytes) -> bytes:
    if not data:
        return b""
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return b"".join(prefix + line + b"\n" for line in lines)


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(cut, len(data)) for cut in cuts})
    pieces, start = [], 0
    for point in [*points, len(data)]:
        pieces.append(data[start:point])
        start = point
    return pieces


def test_file_sink_keeps_every_byte_including_a_half_line(tmp_path: Path) -> None:
    sink = FileSink(tmp_path / "stdout.log")
    assert (tmp_path / "stdout.log").read_bytes() == b""
    sink.feed(b"one\ntw")
    # Unbuffered: already on disk before close (a killed launcher loses nothing).
    assert (tmp_path / "stdout.log").read_bytes() == b"one\ntw"
    sink.feed(b"o\x00\xff\r")
    sink.close()
    sink.close()
    assert (tmp_path / "stdout.log").read_bytes() == b"one\ntwo\x00\xff\r"
    with pytest.raises(ValueError, match="after close"):
        sink.feed(b"x")


def test_file_sink_truncates_an_old_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"old content that is long")
    sink = FileSink(tmp_path / "f")
    sink.feed(b"new")
    sink.close()
    assert (tmp_path / "f").read_bytes() == b"new"


_TEXT = st.lists(
    st.sampled_from([b"a", b"bc", b"\n", b"\r", b"\x00", b"\xc3\xa9", b" ", b"\n\n"]), max_size=60
).map(b"".join)


@settings(max_examples=300, deadline=None)
@given(data=_TEXT, cuts=st.lists(st.integers(min_value=0, max_value=130), max_size=12))
def test_tee_output_does_not_depend_on_chunking(
    tmp_path_factory: pytest.TempPathFactory, data: bytes, cuts: list[int]
) -> None:
    tmp_path = tmp_path_factory.mktemp("tee")
    console, console_path = _console(tmp_path)
    try:
        sink = TeeSink(tmp_path / "out.log", console, b"[rank1]: ")
        for piece in _chunks(data, cuts):
            sink.feed(piece)
        sink.close()
    finally:
        os.close(console)
    assert (tmp_path / "out.log").read_bytes() == data
    assert console_path.read_bytes() == _expected_console(data, b"[rank1]: ")


@settings(max_examples=200, deadline=None)
@given(
    data=_TEXT,
    cuts=st.lists(st.integers(min_value=0, max_value=130), max_size=12),
    max_held=st.integers(min_value=1, max_value=8),
)
def test_tee_with_a_tiny_bound_still_shows_every_byte_once(
    tmp_path_factory: pytest.TempPathFactory, data: bytes, cuts: list[int], max_held: int
) -> None:
    tmp_path = tmp_path_factory.mktemp("tee")
    console, console_path = _console(tmp_path)
    try:
        sink = TeeSink(tmp_path / "out.log", console, b"P> ", max_held=max_held)
        longest_chunk = 0
        for piece in _chunks(data, cuts):
            sink.feed(piece)
            longest_chunk = max(longest_chunk, len(piece))
            assert len(sink._held) <= max_held
        sink.close()
    finally:
        os.close(console)
    assert (tmp_path / "out.log").read_bytes() == data
    shown = console_path.read_bytes()
    assert shown.endswith(b"\n") or not data
    bodies = shown.split(b"\n")[:-1]
    assert all(body.startswith(b"P> ") for body in bodies)
    # Splitting long lines adds newlines but never loses, repeats or reorders a byte.
    assert b"".join(body[3:] for body in bodies) == data.replace(b"\n", b"")
    assert len(bodies) >= data.count(b"\n")


def test_tee_shows_complete_lines_at_once_and_holds_the_partial_one(tmp_path: Path) -> None:
    console, console_path = _console(tmp_path)
    sink = TeeSink(tmp_path / "out.log", console, b"P: ")
    sink.feed(b"first\nsec")
    assert console_path.read_bytes() == b"P: first\n"
    assert (tmp_path / "out.log").read_bytes() == b"first\nsec"
    sink.feed(b"ond\rprogress 50%\rprogress 100%")
    assert console_path.read_bytes() == b"P: first\n"
    sink.close()
    sink.close()
    os.close(console)
    assert console_path.read_bytes() == b"P: first\nP: second\rprogress 50%\rprogress 100%\n"
    with pytest.raises(ValueError, match="after close"):
        sink.feed(b"x")


def test_tee_bounds_a_line_without_newline(tmp_path: Path) -> None:
    console, console_path = _console(tmp_path)
    sink = TeeSink(tmp_path / "out.log", console, b"P: ", max_held=10)
    data = b"x" * 25 + b"\nshort\n" + b"y" * 12
    for start in range(0, len(data), 7):
        sink.feed(data[start : start + 7])
        assert len(sink._held) <= 10  # the bound the docstring promises
    sink.close()
    os.close(console)
    # 14 x's overflow the 10-byte bound and go out alone; the next 11 end with a newline.
    assert console_path.read_bytes() == (
        b"P: " + b"x" * 14 + b"\nP: " + b"x" * 11 + b"\nP: short\nP: " + b"y" * 12 + b"\n"
    )
    assert (tmp_path / "out.log").read_bytes() == data


def test_tee_with_show_false_only_writes_the_file(tmp_path: Path) -> None:
    console, console_path = _console(tmp_path)
    sink = TeeSink(tmp_path / "out.log", console, b"P: ", show=False)
    sink.feed(b"hidden\nalso hidden")
    sink.close()
    os.close(console)
    assert console_path.read_bytes() == b""
    assert (tmp_path / "out.log").read_bytes() == b"hidden\nalso hidden"


def test_tee_without_a_file_only_frames_the_console(tmp_path: Path) -> None:
    console, console_path = _console(tmp_path)
    sink = TeeSink(None, console, b"[rank0]: ")
    sink.feed(b"a\nb")
    sink.close()
    os.close(console)
    assert console_path.read_bytes() == b"[rank0]: a\n[rank0]: b\n"
    assert list(tmp_path.iterdir()) == [console_path]


def test_two_ranks_half_lines_never_merge_on_a_shared_console(tmp_path: Path) -> None:
    console, console_path = _console(tmp_path)
    rank0 = TeeSink(None, console, b"[rank0]: ")
    rank1 = TeeSink(None, console, b"[rank1]: ")
    # print() under -u writes the text and the newline separately: the classic merge.
    for i in range(50):
        rank0.feed(f"zero {i}".encode())
        rank1.feed(f"one {i}".encode())
        rank0.feed(b"\n")
        rank1.feed(b"\n")
    rank0.close()
    rank1.close()
    os.close(console)
    lines = console_path.read_text().splitlines()
    assert [line for line in lines if line.startswith("[rank0]")] == [
        f"[rank0]: zero {i}" for i in range(50)
    ]
    assert [line for line in lines if line.startswith("[rank1]")] == [
        f"[rank1]: one {i}" for i in range(50)
    ]
    assert len(lines) == 100


def test_file_sink_reports_a_full_disk_once_and_keeps_going(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sink = FileSink("/dev/full")
    sink.feed(b"lost\n")
    sink.feed(b"also lost\n")
    sink.close()
    assert sink.error is not None and sink.error.strerror == os.strerror(28)
    assert sink.lost == len(b"lost\nalso lost\n")
    disk_full = os.strerror(28)
    assert capsys.readouterr().err == (
        f"numarun: cannot write /dev/full: {disk_full}; keeping up to 1024 KiB of it in "
        "memory and trying again\n"
    )
    with pytest.raises(ValueError, match="after close"):
        sink.feed(b"x")


def test_tee_keeps_the_console_when_the_file_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    console, console_path = _console(tmp_path)
    sink = TeeSink("/dev/full", console, b"P: ")
    sink.feed(b"still shown\n")
    sink.close()
    os.close(console)
    assert console_path.read_bytes() == b"P: still shown\n"
    assert "cannot write /dev/full" in capsys.readouterr().err


def _small_nonblocking_pipe() -> tuple[int, int]:
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
    os.set_blocking(write_end, False)
    return read_end, write_end


def _drain(fd: int, into: bytearray, start_after: threading.Event | None = None) -> None:
    if start_after is not None:
        start_after.wait(timeout=0.3)  # let the writer fill the pipe and meet EAGAIN first
    while chunk := os.read(fd, 1000):
        into += chunk


def test_tee_queues_on_eagain_instead_of_blocking_or_losing_output(tmp_path: Path) -> None:
    read_end, write_end = _small_nonblocking_pipe()
    received = bytearray()
    sink = TeeSink(tmp_path / "out.log", write_end, b"[rank2]: ")
    data = b"".join(b"line %d of a console that cannot keep up\n" % i for i in range(20000))
    # Nobody reads yet: every feed returns at once, the console queues what the pipe refuses.
    for start in range(0, len(data), 5000):
        sink.feed(data[start : start + 5000])
    sink.close()
    assert sink.console is not None and sink.console.pending()
    reader = threading.Thread(target=_drain, args=(read_end, received))
    reader.start()
    assert sink.console.drain(timeout=60)
    sink.console.close()
    os.close(write_end)
    reader.join(timeout=60)
    os.close(read_end)
    assert bytes(received) == _expected_console(data, b"[rank2]: ")
    assert (tmp_path / "out.log").read_bytes() == data


def test_tee_survives_a_closed_console_and_keeps_the_file(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # e.g. `numarun ... | head` after head exited
    sink = TeeSink(tmp_path / "out.log", write_end, b"P: ")
    sink.feed(b"one\n")
    sink.feed(b"two\nthree")
    sink.close()
    os.close(write_end)
    assert (tmp_path / "out.log").read_bytes() == b"one\ntwo\nthree"


# ---------------------------------------------------------------- sinks_for


def test_sinks_for_inherits_when_nothing_is_asked(tmp_path: Path) -> None:
    assert sinks_for(0, 0, 0, 0, tmp_path, True) == (None, None)
    assert list(tmp_path.iterdir()) == []


def test_sinks_for_redirects_both_streams_to_files(tmp_path: Path) -> None:
    out, err = sinks_for(1, 5, int(Std.ALL), 0, tmp_path, True)
    assert isinstance(out, FileSink) and isinstance(err, FileSink)
    out.feed(b"to stdout")
    err.feed(b"to stderr")
    out.close()
    err.close()
    assert (tmp_path / "stdout.log").read_bytes() == b"to stdout"
    assert (tmp_path / "stderr.log").read_bytes() == b"to stderr"


def test_sinks_for_tees_stdout_and_redirects_stderr(tmp_path: Path) -> None:
    console, console_path = _console(tmp_path, "console_out")
    out, err = sinks_for(2, 6, int(Std.ERR), int(Std.OUT), tmp_path, True, console_out=console)
    assert isinstance(out, TeeSink) and isinstance(err, FileSink)
    out.feed(b"shown\n")
    err.feed(b"only in the file\n")
    out.close()
    err.close()
    os.close(console)
    assert console_path.read_bytes() == b"[default2]:shown\n"
    assert (tmp_path / "stdout.log").read_bytes() == b"shown\n"
    assert (tmp_path / "stderr.log").read_bytes() == b"only in the file\n"


def test_sinks_for_stderr_tee_uses_the_stderr_console_and_given_prefix(tmp_path: Path) -> None:
    console, console_path = _console(tmp_path, "console_err")
    out, err = sinks_for(0, 0, 0, int(Std.ERR), None, True, console_err=console, prefix=b"E> ")
    assert out is None and isinstance(err, TeeSink)
    err.feed(b"oops\n")
    err.close()
    os.close(console)
    assert console_path.read_bytes() == b"E> oops\n"


def test_sinks_for_hidden_rank_drops_unredirected_streams(tmp_path: Path) -> None:
    out, err = sinks_for(3, 3, int(Std.OUT), 0, tmp_path, False)
    assert isinstance(out, FileSink) and isinstance(err, NullSink)
    out.close()
    err.feed(b"dropped")
    err.close()
    (tmp_path / "again").mkdir()  # files are only ever new (O_EXCL): another rank's directory
    hidden_tee, _ = sinks_for(3, 3, 0, int(Std.OUT), tmp_path / "again", False)
    assert isinstance(hidden_tee, TeeSink)
    hidden_tee.close()
    with pytest.raises(FileExistsError):  # a file (or a planted link) there is never reused
        sinks_for(3, 3, int(Std.OUT), 0, tmp_path, False)


def test_sinks_for_redirect_without_a_log_dir_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="no log directory"):
        sinks_for(0, 0, int(Std.OUT), 0, None, True)


# ---------------------------------------------------------------- real processes, lossless

_LINES_PER_WORKER = 250_000

# Ranks 0 and 1 write in big buffered blocks; ranks 2 and 3 write the text and the newline
# in separate unbuffered writes (what print() does under -u), so pipe reads end mid-line.
_WORKER = """
import os, sys
rank, n, split = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "split"
if split:
    for i in range(n):
        os.write(1, b"r%d line %d" % (rank, i))
        os.write(1, b"\\n")
else:
    out = sys.stdout.buffer
    for i in range(n):
        out.write(b"r%d line %d\\n" % (rank, i))
    out.flush()
"""


def test_four_real_workers_lose_duplicate_and_merge_nothing(tmp_path: Path) -> None:
    console, console_path = _console(tmp_path)
    selector = selectors.DefaultSelector()
    workers, sinks = [], []
    for rank in range(4):
        read_end, write_end = os.pipe()
        mode = "split" if rank >= 2 else "block"
        args = [sys.executable, "-c", _WORKER, str(rank), str(_LINES_PER_WORKER), mode]
        workers.append(subprocess.Popen(args, stdout=write_end))
        os.close(write_end)
        sink = TeeSink(tmp_path / f"stdout{rank}.log", console, b"[rank%d]: " % rank)
        sinks.append(sink)
        selector.register(read_end, selectors.EVENT_READ, sink)
    open_streams = 4
    while open_streams:
        for key, _ in selector.select():
            chunk = os.read(key.fd, 65536)
            if chunk:
                key.data.feed(chunk)
                continue
            key.data.close()
            selector.unregister(key.fd)
            os.close(key.fd)
            open_streams -= 1
    selector.close()
    os.close(console)
    assert [worker.wait(timeout=60) for worker in workers] == [0, 0, 0, 0]

    lines = console_path.read_bytes().split(b"\n")
    assert lines.pop() == b""
    assert len(lines) == 4 * _LINES_PER_WORKER
    shape = re.compile(rb"\[rank(\d)\]: r(\d) line (\d+)")
    next_line = [0, 0, 0, 0]
    for line in lines:
        match = shape.fullmatch(line)
        assert match is not None, f"merged or broken line: {line[:200]!r}"
        rank = int(match[1])
        assert int(match[2]) == rank
        assert int(match[3]) == next_line[rank]
        next_line[rank] += 1
    assert next_line == [_LINES_PER_WORKER] * 4
    for rank in range(4):
        expected = b"".join(b"r%d line %d\n" % (rank, i) for i in range(_LINES_PER_WORKER))
        assert (tmp_path / f"stdout{rank}.log").read_bytes() == expected

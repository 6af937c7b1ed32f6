"""numarun.process.sinks: file and tee sinks (every byte kept, lines framed whole, a full disk
and a stalled or closed console survived), and real workers that lose, duplicate and merge
nothing."""

from __future__ import annotations

import fcntl
import os
import re
import selectors
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numarun.process.sinks import FileSink, TeeSink

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

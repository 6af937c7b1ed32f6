"""A stalled console (a terminal under Ctrl-S, `numarun ... | sleep 60`) never freezes numarun:
tee'd lines queue without blocking, come out in order once the reader is back, are dropped as
whole lines with a note beyond the limit, and the console's own file description is never
made non-blocking."""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from numarun.process.console import Console, console_for
from numarun.process.sinks import TeeSink

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
FLOOD = str(PROGRAMS / "stdout_flood.py")
LINE = b"line %07d " + b"x" * 100 + b"\n"


def _lines(first: int, count: int) -> bytes:
    return b"".join(LINE % i for i in range(first, first + count))


def _read_all(fd: int, into: bytearray) -> None:
    while chunk := os.read(fd, 65536):
        into += chunk


def _reader(fd: int) -> tuple[threading.Thread, bytearray]:
    received = bytearray()
    thread = threading.Thread(target=_read_all, args=(fd, received), daemon=True)
    thread.start()
    return thread, received


def _blocking(fd: int) -> bool:
    return not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK


# --- the Console itself --------------------------------------------------------------------------


def test_a_stalled_pipe_queues_in_order_and_the_callers_fd_stays_blocking() -> None:
    read_end, write_end = os.pipe()
    console = Console(write_end)
    try:
        data = _lines(0, 20_000)  # 2.2 MB: 30 times what the pipe holds
        for start in range(0, len(data), LINE.__len__() * 100):
            console.write(data[start : start + len(LINE) * 100])  # returns although nobody reads
        assert console.pending()
        assert _blocking(write_end)  # the shared description was never made non-blocking
        thread, received = _reader(read_end)
        assert console.drain(timeout=60)
        console.close()
        os.close(write_end)
        thread.join(timeout=60)
        assert bytes(received) == data
        assert console.dropped_lines == 0
    finally:
        os.close(read_end)


def test_beyond_the_limit_whole_lines_are_dropped_and_the_gap_is_marked() -> None:
    read_end, write_end = os.pipe()
    console = Console(write_end, limit=200_000)
    try:
        early = _lines(0, 1000)  # 110 KB: the pipe takes 64 KiB, the rest waits
        console.write(early)
        dropped = _lines(1000, 2000)  # 220 KB more: beyond the limit, dropped
        console.write(dropped)
        late = _lines(3000, 10)
        thread, received = _reader(read_end)
        assert console.drain(timeout=60)
        console.write(late)  # the console takes output again: the note comes first
        assert console.drain(timeout=60)
        console.close()
        os.close(write_end)
        thread.join(timeout=60)
        assert bytes(received) == early + b"[numarun: 2000 lines dropped from console]\n" + late
        assert console.dropped_lines == 2000
    finally:
        os.close(read_end)


def test_abandon_ends_a_half_written_line_before_its_note() -> None:
    read_end, write_end = os.pipe()
    console = Console(write_end)
    try:
        console.write(b"y" * 100_000 + b"\n" + _lines(0, 5))
        console.abandon()
        assert not console.pending()
        taken = b""
        os.set_blocking(read_end, False)
        while True:
            try:
                chunk = os.read(read_end, 65536)
            except BlockingIOError:
                break
            taken += chunk
        # The pipe was full: the note did not fit; what came out is a prefix of the line.
        assert set(taken) == {ord("y")}
        assert console.dropped_lines == 6
    finally:
        console.close()
        os.close(write_end)
        os.close(read_end)


def test_a_closed_reader_makes_the_console_gone() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)
    console = Console(write_end)
    console.write(b"one\n")
    assert console.gone and not console.pending()
    console.write(b"two\n")
    console.close()
    os.close(write_end)


def test_a_socket_console_is_written_without_blocking_and_stays_blocking() -> None:
    ours, theirs = socket.socketpair()
    try:
        console = Console(theirs.fileno())
        data = _lines(0, 20_000)
        console.write(data)
        assert console.pending()
        assert theirs.getblocking()
        received = bytearray()

        def read() -> None:
            while chunk := ours.recv(65536):
                received.extend(chunk)

        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        assert console.drain(timeout=60)
        console.close()
        theirs.close()
        thread.join(timeout=60)
        assert bytes(received) == data
    finally:
        ours.close()
        theirs.close()


def test_without_proc_the_console_still_never_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = os.open

    def no_proc(path: object, *args: object, **kwargs: object) -> int:
        if str(path).startswith("/proc/self/fd/"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", no_proc)
    read_end, write_end = os.pipe()
    try:
        console = Console(write_end)
        data = _lines(0, 5000)
        console.write(data)
        assert console.pending() and _blocking(write_end)
        thread, received = _reader(read_end)
        assert console.drain(timeout=60)
        os.close(write_end)
        thread.join(timeout=60)
        assert bytes(received) == data
    finally:
        os.close(read_end)


def test_stdout_and_stderr_on_one_pipe_share_one_console() -> None:
    read_end, write_end = os.pipe()
    other = os.dup(write_end)
    try:
        assert console_for(write_end) is console_for(other)
        elsewhere_r, elsewhere_w = os.pipe()
        assert console_for(elsewhere_w) is not console_for(write_end)
        for fd in (elsewhere_r, elsewhere_w):
            os.close(fd)
    finally:
        for fd in (read_end, write_end, other):
            os.close(fd)


def test_two_tee_sinks_on_a_stalled_console_keep_whole_lines_in_order(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    console = Console(write_end)
    rank0 = TeeSink(tmp_path / "0.log", console, b"[rank0]: ")
    rank1 = TeeSink(tmp_path / "1.log", console, b"[rank1]: ")
    for i in range(3000):
        rank0.feed(b"zero %d " % i + b"z" * 40)
        rank1.feed(b"one %d " % i + b"o" * 40)
        rank0.feed(b"\n")
        rank1.feed(b"\n")
    rank0.close()
    rank1.close()
    thread, received = _reader(read_end)
    assert console.drain(timeout=60)
    console.close()
    os.close(write_end)
    thread.join(timeout=60)
    os.close(read_end)
    lines = bytes(received).decode().splitlines()
    assert [x for x in lines if x.startswith("[rank0]")] == [
        f"[rank0]: zero {i} " + "z" * 40 for i in range(3000)
    ]
    assert len(lines) == 6000


# --- the launcher with a stalled console ----------------------------------------------------------


def _launch(tmp_path: Path, mode: str, lines: int, *extra: str) -> tuple[subprocess.Popen, int]:
    read_end, write_end = os.pipe()
    try:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "numarun",
                "--nproc-per-node",
                "2",
                "--tee",
                "3",
                "--log-dir",
                str(tmp_path / "logs"),
                *extra,
                FLOOD,
                str(tmp_path),
                str(lines),
                mode,
            ],
            stdout=write_end,
            stderr=subprocess.PIPE,
            cwd=tmp_path,
        )
    finally:
        os.close(write_end)
    return process, read_end


def _wait_for(condition, what: str, limit: float = 120.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def _stdout_log(tmp_path: Path) -> bytes:
    found = list((tmp_path / "logs").glob("*/attempt_0/0/stdout.log"))
    return found[0].read_bytes() if found else b""


def test_sigterm_is_handled_while_the_console_is_stalled_and_nothing_is_lost(
    tmp_path: Path,
) -> None:
    lines = 10_000  # 1.1 MB on a pipe nobody reads (it holds 64 KiB)
    process, read_end = _launch(tmp_path, "sleep", lines)
    received = bytearray()
    try:
        # The loop keeps reading the workers although the console takes nothing: the rank's
        # log file gets every line while the pipe is full.
        _wait_for(lambda: (tmp_path / "printed").exists(), "rank 0 to finish printing")
        _wait_for(lambda: _stdout_log(tmp_path).count(b"\n") == lines, "the log file")
        _wait_for(lambda: (tmp_path / "1.pid").exists(), "rank 1 to start")
        pids = [int((tmp_path / f"{rank}.pid").read_text()) for rank in (0, 1)]
        process.send_signal(signal.SIGTERM)
        # The teardown happens while the console is still stalled.
        _wait_for(lambda: not any(_alive(pid) for pid in pids), "the workers to be torn down")
        assert process.poll() is None  # still holding the console's lines for its reader
        thread, received = _reader(read_end)
        process.wait(timeout=120)
        thread.join(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(read_end)
    assert process.returncode == 128 + signal.SIGTERM
    shown = [line for line in bytes(received).splitlines() if line.startswith(b"[")]
    expected = [b"[default0]:" + line for line in _lines(0, lines).splitlines()]
    ours = [line for line in shown if b"line " in line]
    # The prefix format belongs to --tee (torchrun's "[default0]:" or "[rank0]: "): compare
    # the text after it.
    assert [line.split(b"]:", 1)[1].lstrip() for line in ours] == [
        line.split(b"]:", 1)[1] for line in expected
    ]


def test_a_failure_is_noticed_while_the_console_is_stalled(tmp_path: Path) -> None:
    process, read_end = _launch(tmp_path, "fail", 10_000)
    try:
        # Nobody ever reads the console (`| sleep 60`): the launcher still notices rank 1's
        # failure, tears rank 0 down and exits, giving the stalled console up after kill_wait.
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(read_end)
    assert process.returncode == 3, err.decode(errors="replace")[-3000:]
    assert b"Root cause: rank 1" in err
    assert _stdout_log(tmp_path).count(b"\n") == 10_000  # the file is lossless

"""A full disk: log files keep what they can (bounded memory), continue when space comes back,
mark the gap, and the end of the run says how many bytes of which rank's log were lost."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from numarun.process.sinks import FileSink, TeeSink, log_loss

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
DISK_FULL = os.strerror(errno.ENOSPC)


class Disk:
    """A write function whose disk is full while ``full`` (after ``room`` more bytes)."""

    def __init__(self) -> None:
        self.full = False
        self.room = 0

    def write(self, fd: int, data: memoryview) -> int:
        if self.full:
            if self.room <= 0:
                raise OSError(errno.ENOSPC, DISK_FULL)
            data = data[: self.room]
            self.room -= len(data)
        return os.write(fd, data)


def test_bytes_written_while_the_disk_is_full_arrive_when_space_comes_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    disk = Disk()
    sink = FileSink(tmp_path / "stdout.log", write=disk.write)
    sink.feed(b"before\n")
    disk.full, disk.room = True, 3
    sink.feed(b"during 1\n")  # 3 bytes fit, the rest waits
    sink.feed(b"during 2\n")
    assert (tmp_path / "stdout.log").read_bytes() == b"before\ndur"
    disk.full = False
    sink.feed(b"after\n")
    sink.close()
    assert (tmp_path / "stdout.log").read_bytes() == b"before\nduring 1\nduring 2\nafter\n"
    assert sink.lost == 0 and log_loss(sink) is None
    assert capsys.readouterr().err.count("cannot write") == 1


def test_memory_is_bounded_and_the_gap_is_marked_in_the_file(tmp_path: Path) -> None:
    disk = Disk()
    sink = FileSink(tmp_path / "stdout.log", write=disk.write, max_pending=1000)
    sink.feed(b"kept\n")
    disk.full = True
    lines = [b"%04d %s\n" % (i, b"x" * 94) for i in range(100)]  # 100 bytes each
    for line in lines:
        sink.feed(line)
        assert len(sink._pending) <= 1000
    disk.full = False
    sink.feed(b"end\n")
    sink.close()
    # The newest 1000 bytes (the last 10 lines) were kept; 9000 bytes are marked lost.
    expected = (
        b"kept\n"
        + b"[numarun: 9000 bytes lost here: "
        + DISK_FULL.encode()
        + b"]\n"
        + b"".join(lines[-10:])
        + b"end\n"
    )
    assert sink.lost == 9000
    assert (tmp_path / "stdout.log").read_bytes() == expected


def test_what_still_waits_at_close_is_counted_lost(tmp_path: Path) -> None:
    disk = Disk()
    sink = TeeSink(tmp_path / "stderr.log", os.open(os.devnull, os.O_WRONLY), b"P: ")
    assert sink.file is not None
    sink.file._write = disk.write
    sink.feed(b"saved\n")
    disk.full = True
    sink.feed(b"a" * 5000)
    sink.close()
    assert log_loss(sink) == (tmp_path / "stderr.log", 5000, DISK_FULL)
    assert (tmp_path / "stderr.log").read_bytes() == b"saved\n"


@contextlib.contextmanager
def small_disk(path: Path) -> Iterator[bool]:
    """A 64 KiB tmpfs at ``path`` when this process may mount one (root), else a plain dir."""
    path.mkdir()
    mounted = (
        os.geteuid() == 0
        and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(path)],
            capture_output=True,
        ).returncode
        == 0
    )
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _full_disk_env(tmp_path: Path, mounted: bool, flag: Path) -> dict[str, str]:
    env = dict(os.environ)
    if not mounted:
        env["NUMARUN_TEST_FULL_DISK_FLAG"] = str(flag)  # read by FULL_DISK_SITE
        site = tmp_path / "site"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(FULL_DISK_SITE)
        env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")])
    return env


def _wait_for(condition, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 120
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _run_with_full_disk(tmp_path: Path, logs: Path, mounted: bool) -> tuple[int, str]:
    """Rank 0 writes 40 KB while the disk is full (a filler file on the tmpfs, or an injected
    write that fails when there is no tmpfs), then space comes back and it writes its last
    line. Returns the launcher's exit status and stderr."""
    space_back = tmp_path / "space_back"
    err_path = tmp_path / "launcher.err"
    with open(err_path, "wb") as err:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "numarun",
                "--nproc-per-node",
                "1",
                "--redirects",
                "3",
                "--log-dir",
                str(logs),
                str(PROGRAMS / "full_disk_writer.py"),
                str(tmp_path),
            ],
            env=_full_disk_env(tmp_path, mounted, space_back),
            stdout=subprocess.DEVNULL,
            stderr=err,
            cwd=tmp_path,
        )
    try:
        filler = logs / "filler"
        if mounted:
            _wait_for(lambda: list(logs.glob("*/attempt_0/0/stdout.log")), "the log file")
            with contextlib.suppress(OSError), open(filler, "wb", buffering=0) as out:
                while True:  # fill the tmpfs to its last byte
                    out.write(b"f" * 512)
        (tmp_path / "go").touch()
        _wait_for(lambda: b"cannot write" in err_path.read_bytes(), "the launcher to hit ENOSPC")
        _wait_for(lambda: (tmp_path / "wrote").exists(), "rank 0 to write")
        if mounted:
            filler.unlink()
        space_back.touch()
        (tmp_path / "go_on").touch()
        process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, err_path.read_text(errors="replace")


# Without a mountable tmpfs: the launcher's os.write fails with ENOSPC on log files until the
# flag file exists, as a full disk would.
FULL_DISK_SITE = """
import errno, os
flag = os.environ.get("NUMARUN_TEST_FULL_DISK_FLAG")
if flag:
    real_write = os.write
    def write(fd, data):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if target.endswith(".log") and not os.path.exists(flag):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)
    os.write = write
"""


def test_a_full_disk_that_frees_up_loses_nothing(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    with small_disk(logs) as mounted:
        code, err = _run_with_full_disk(tmp_path, logs, mounted)
        assert code == 0, err[-3000:]
        log = next(logs.glob("*/attempt_0/0/stdout.log")).read_bytes()
    expected = b"".join(b"%d" % i * 10_000 + b"\n" for i in range(4))
    assert log == b"first line\n" + expected + b"last line\n"
    assert "cannot write" in err and "lost" not in err


def test_the_end_of_the_run_says_which_log_lost_how_much(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    with small_disk(logs) as mounted:
        done = _run_lossy(tmp_path, logs, mounted)
    err = done.stderr.decode(errors="replace")
    assert done.returncode == 0, err[-3000:]
    assert "Log data lost" in err
    assert "rank 0 (local_rank 0) stdout.log:" in err and DISK_FULL in err


def _run_lossy(tmp_path: Path, logs: Path, mounted: bool) -> subprocess.CompletedProcess:
    """Rank 0 writes 3 MB (more than the 1 MiB kept in memory) while the disk stays full."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "numarun",
            "--nproc-per-node",
            "1",
            "--redirects",
            "3",
            "--log-dir",
            str(logs),
            "--no-python",
            "sh",
            "-c",
            "head -c 3000000 /dev/zero | tr '\\0' y",
        ],
        env=_full_disk_env(tmp_path, mounted, tmp_path / "never"),
        capture_output=True,
        timeout=120,
        cwd=tmp_path,
    )

"""A worker's error text reaches the terminal only escaped: no ESC, C1 or bidi controls."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from numarun.launch.summary import RankReport, format_summary
from numarun.worker.errorfile import WorkerError

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
# Retitle the window, clear the screen, hide text, a C1 CSI, a bidi override, a bell.
HOSTILE = "boom\x1b]0;pwned\x07\x1b[2J\x1b[8mhidden\x9b31m\u202eevil\r\x00end"
RAW = ("\x1b", "\x07", "\x9b", "\u202e", "\x00", "\r")


def _report(tmp_path: Path, message: str, traceback: str | None) -> RankReport:
    return RankReport(
        local_rank=0,
        rank=0,
        pid=123,
        exit_code=1,
        signal_name=None,
        state="failed",
        error=WorkerError(message=message, traceback=traceback, timestamp=1_700_000_000),
        log_dir=tmp_path,
        ended_at=1_700_000_000.5,
    )


def test_summary_escapes_control_characters_in_message_and_traceback(tmp_path: Path) -> None:
    traceback = f"Traceback (most recent call last):\n  File 'x.py'\nRuntimeError: {HOSTILE}\n"
    text = format_summary(
        [_report(tmp_path, f"RuntimeError: {HOSTILE}", traceback)],
        entrypoint="train.py --tag \x1b[31mred",
        host="vm",
        log_dir=None,
    )
    assert not any(char in text for char in RAW)
    assert "boom\\x1b]0;pwned\\x07\\x1b[2J\\x1b[8mhidden\\x9b31m\\u202eevil\\x0d\\x00end" in text
    assert "train.py --tag \\x1b[31mred FAILED" in text
    assert "\t" not in text  # nothing here had tabs; they would have been kept


def test_summary_escapes_the_stderr_tail(tmp_path: Path) -> None:
    (tmp_path / "stderr.log").write_bytes(b"plain\n\x1b[2Jcleared\tscreen\n")
    text = format_summary([_report(tmp_path, "", None)], entrypoint="t.py", host="vm", log_dir=None)
    assert "    \\x1b[2Jcleared\tscreen" in text
    assert "\x1b" not in text


def test_launcher_summary_never_prints_a_workers_escape_sequence(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "numarun",
            "--nproc-per-node",
            "2",
            str(PROGRAMS / "rank_exit.py"),
            "1",
            "raise",
            HOSTILE.replace("\x00", ""),  # argv cannot hold NUL
        ],
        capture_output=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
        cwd=tmp_path,
    )
    assert done.returncode == 1
    summary = done.stderr[done.stderr.rindex(b"=" * 72 + b"\n" + b"numarun:") :]
    assert b"Root cause: rank 1" in summary
    assert b"RuntimeError: boom\\x1b]0;pwned\\x07" in summary
    # The entry point's argv (HOSTILE again) and the traceback are escaped too.
    assert not any(char.encode("utf-8") in summary for char in RAW if char != "\x00")
    assert b"\xc2\x9b" not in summary and b"\x9b" not in summary

"""numarun.stacks.pending: the status record of a job waiting in its rendezvous, written by the
launcher and read by ``numarun stacks`` as untrusted data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from numarun.stacks import pending

STATUS = {"where": "c10d rendezvous 'job42' at node0:29400", "since": 1000.0, "doing": "joining",
          "wanted": "2", "there": ["node0 pid 9"], "awaited": 1,
          "text": "1 of 2 node(s) there (node0 pid 9), 1 more awaited"}  # fmt: skip


def _record(tmp_path: Path) -> pending.PendingRecord:
    return pending.PendingRecord(str(tmp_path), {"run_id": "job42", "host": "node1",
                                                 "entrypoint": "train.py"})  # fmt: skip


def test_a_written_record_is_read_back_and_said_in_one_line(tmp_path: Path) -> None:
    record = _record(tmp_path)
    record.update(STATUS)
    assert oct(os.stat(record.path).st_mode & 0o777) == "0o600"
    read = pending.read_record(record.path)
    assert read is not None and read["pid"] == os.getpid() and read["waiting"] == STATUS
    line = pending.waiting_line(read, now=1035.0)
    assert line.startswith(f"numarun stacks: job job42 (launcher pid {os.getpid()} on node1) "
                           "has no ranks yet: it waits in the c10d rendezvous 'job42' at "
                           "node0:29400 since ")  # fmt: skip
    assert line.endswith("(35 s): 1 of 2 node(s) there (node0 pid 9), 1 more awaited")
    record.update(None)
    assert not os.path.exists(record.path)


def test_a_record_whose_launcher_is_gone_is_removed(tmp_path: Path) -> None:
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    record = _record(tmp_path)
    record.update(STATUS)
    data = json.loads(Path(record.path).read_text())
    data["pid"] = int(child.stdout)  # ended: no such process (or another one, started later)
    Path(record.path).write_text(json.dumps(data))
    assert pending.read_record(record.path) is None
    assert not os.path.exists(record.path)


@pytest.mark.parametrize(
    "forged",
    [
        b"not json",
        b"[1, 2]",
        json.dumps({"pid": "1", "proc_start": 1, "started": 1, "waiting": STATUS}).encode(),
        json.dumps({"pid": 1, "proc_start": 1, "started": 1, "waiting": "x"}).encode(),
        json.dumps({"pid": 1, "proc_start": 1, "started": 1,
                    "waiting": {**STATUS, "since": "noon"}}).encode(),
        b"{" + b" " * (pending.RECORD_LIMIT + 10) + b"}",
    ],
)
def test_what_is_not_a_record_is_skipped(tmp_path: Path, forged: bytes) -> None:
    path = tmp_path / f"1-abcd{pending.SUFFIX}"
    path.write_bytes(forged)
    assert pending.read_record(str(path)) is None


def test_a_link_or_a_directory_is_not_followed(tmp_path: Path) -> None:
    record = _record(tmp_path)
    record.update(STATUS)
    link = tmp_path / f"2-link{pending.SUFFIX}"
    link.symlink_to(record.path)
    assert pending.read_record(str(link)) is None
    folder = tmp_path / f"3-dir{pending.SUFFIX}"
    folder.mkdir()
    assert pending.read_record(str(folder)) is None


def test_hostile_text_is_escaped_in_the_line(tmp_path: Path) -> None:
    record = _record(tmp_path)
    record.update({**STATUS, "text": "\x1b]0;pwned\x07" + "y" * 5000})
    read = pending.read_record(record.path)
    assert read is not None
    line = pending.waiting_line(read)
    assert "\x1b" not in line and "\x07" not in line and len(line) < 1500

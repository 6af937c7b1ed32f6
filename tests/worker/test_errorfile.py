"""numarun.worker.errorfile: torchrun's error files read (every format torch writes, partial,
corrupt, hostile) and written (torch's own format, read back by torch). The summary that shows
them is ``test_summary.py``'s; the bootstrap that writes them, ``test_bootstrap.py``'s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from numarun.worker.errorfile import (
    WorkerError,
    _error_from_json,
    read_error_file,
    write_error_file,
)

# ---------------------------------------------------------------- reading error files


def _write(path: Path, content: object) -> Path:
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def test_reads_the_record_format(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "error.json",
        {
            "message": {
                "message": "RuntimeError: boom",
                "extraInfo": {
                    "py_callstack": "Traceback...\nRuntimeError: boom\n",
                    "timestamp": "1712345678",
                },
            }
        },
    )
    assert read_error_file(path) == WorkerError(
        "RuntimeError: boom", "Traceback...\nRuntimeError: boom\n", 1712345678
    )


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (
            {"message": "boom", "extraInfo": {"py_callstack": "tb"}, "timestamp": "17"},
            WorkerError("boom", "tb", 17),
        ),
        ({"message": "boom", "timestamp": 18}, WorkerError("boom", None, 18)),
        (
            {"message": "boom", "extraInfo": {"timestamp": "19", "py_callstack": ""}},
            WorkerError("boom", None, 19),
        ),
        (
            {"message": {"message": "m", "extraInfo": {"timestamp": "soon"}}},
            WorkerError("m", None, None),
        ),
        ({"message": {"message": "m", "errorCode": -11}}, WorkerError("m", None, None)),
        ({"message": "m", "timestamp": True}, WorkerError("m", None, None)),
        ({"message": "m", "timestamp": 20.7}, WorkerError("m", None, 20)),
    ],
)
def test_reads_the_newer_format_and_partial_files(
    tmp_path: Path, content: dict, expected: WorkerError
) -> None:
    assert read_error_file(_write(tmp_path / "e.json", content)) == expected


@pytest.mark.parametrize(
    "content",
    [
        "",
        "  \n",
        "{",
        '{"message": {"message": "half',
        "[1, 2]",
        '{"x": 1}',
        '{"message": 5}',
        "null",
    ],
)
def test_corrupt_error_files_read_as_none(tmp_path: Path, content: str) -> None:
    assert read_error_file(_write(tmp_path / "e.json", content)) is None


def test_missing_odd_and_hostile_error_files_read_as_none(tmp_path: Path) -> None:
    assert read_error_file(None) is None
    assert read_error_file("") is None
    assert read_error_file(tmp_path / "missing.json") is None
    assert read_error_file(tmp_path) is None  # a directory
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    assert read_error_file(tmp_path / "deep.json") is None
    (tmp_path / "bytes.json").write_bytes(b'{"message": "caf\xe9 \xff"}')
    assert read_error_file(tmp_path / "bytes.json") == WorkerError("caf\ufffd \ufffd", None, None)


# ---------------------------------------------------------------- writing error files


def _raise_nested() -> None:
    try:
        {}["missing"]
    except KeyError as err:
        raise ValueError("bad value") from err


def test_write_error_file_uses_torchruns_format(tmp_path: Path) -> None:
    try:
        _raise_nested()
    except ValueError as exc:
        caught = exc
    path = tmp_path / "error.json"
    write_error_file(path, caught, now=1712345678.9)
    data = json.loads(path.read_text())
    assert set(data) == {"message"}
    assert data["message"]["message"] == "ValueError: bad value"
    assert set(data["message"]["extraInfo"]) == {"py_callstack", "timestamp", "numarun_raised_at"}
    assert data["message"]["extraInfo"]["timestamp"] == "1712345678"
    assert data["message"]["extraInfo"]["numarun_raised_at"] == "1712345678.900000"
    callstack = data["message"]["extraInfo"]["py_callstack"]
    assert "in _raise_nested" in callstack and "KeyError: 'missing'" in callstack
    assert callstack.endswith("ValueError: bad value\n")
    assert read_error_file(path) == WorkerError(
        "ValueError: bad value", callstack, 1712345678, 1712345678.9
    )
    assert [p.name for p in tmp_path.iterdir()] == ["error.json"]


def test_write_error_file_into_a_missing_directory_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        write_error_file(tmp_path / "no" / "error.json", RuntimeError("x"))
    assert list(tmp_path.iterdir()) == []


_TORCH_ROUND_TRIP = """
import json, sys
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure, record
from numarun.worker.errorfile import write_error_file

@record
def main():
    raise RuntimeError("from torch's @record")

ours = sys.argv[2]
try:
    raise KeyError("from numarun")
except KeyError as exc:
    write_error_file(ours, exc)
failure = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=ours)
print(json.dumps({"message": failure.message["message"], "timestamp": failure.timestamp}))
sys.stdout.flush()
main()
"""


def test_error_files_interoperate_with_torch(tmp_path: Path) -> None:
    theirs, ours = tmp_path / "theirs.json", tmp_path / "ours.json"
    env = {**os.environ, "TORCHELASTIC_ERROR_FILE": str(theirs)}
    done = subprocess.run(
        [sys.executable, "-c", _TORCH_ROUND_TRIP, str(theirs), str(ours)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    torch_read = json.loads(done.stdout.splitlines()[0])
    assert torch_read["message"] == "KeyError: 'from numarun'"
    assert torch_read["timestamp"] == read_error_file(ours).timestamp
    error = read_error_file(theirs)
    assert error is not None and error.message == "RuntimeError: from torch's @record"
    assert "in main" in error.traceback and isinstance(error.timestamp, int)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1712345678.250000", 1712345678.25),
        (1712345678.25, 1712345678.25),
        ("nan", None),
        ("inf", None),
        ("-5.0", None),
        ("soon", None),
        (True, None),
        (None, None),
        ([1.0], None),
    ],
)
def test_the_exact_raise_time_is_read_only_when_it_is_a_time(
    value: object, expected: object
) -> None:
    data = {
        "message": {
            "message": "RuntimeError: x",
            "extraInfo": {
                "py_callstack": "tb", "timestamp": "1712345678", "numarun_raised_at": value,
            },
        }
    }
    error = _error_from_json(data)
    assert error is not None and error.timestamp == 1712345678
    assert error.raised_at == expected

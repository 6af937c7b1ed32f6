"""numarun.files.logdir: the log layout (torchrun's), never reusing or deleting an earlier
run's directory, a temporary one when no ``--log-dir`` is given, and bad directories in one
line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from numarun.errors import UsageError
from numarun.files.logdir import error_file_path, make_log_dirs, rank_log_dir

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

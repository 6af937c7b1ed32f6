"""Tests for numarun.launch.errorfile, numarun.launch.failures (root cause, summary) and
numarun.launch.bootstrap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from numarun.launch.errorfile import WorkerError, read_error_file, write_error_file
from numarun.launch.failures import (
    RankReport,
    describe_exit,
    format_summary,
    rank_report,
    root_cause,
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
    assert set(data["message"]["extraInfo"]) == {"py_callstack", "timestamp"}
    assert data["message"]["extraInfo"]["timestamp"] == "1712345678"
    callstack = data["message"]["extraInfo"]["py_callstack"]
    assert "in _raise_nested" in callstack and "KeyError: 'missing'" in callstack
    assert callstack.endswith("ValueError: bad value\n")
    assert read_error_file(path) == WorkerError("ValueError: bad value", callstack, 1712345678)
    assert [p.name for p in tmp_path.iterdir()] == ["error.json"]


def test_write_error_file_into_a_missing_directory_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        write_error_file(tmp_path / "no" / "error.json", RuntimeError("x"))
    assert list(tmp_path.iterdir()) == []


_TORCH_ROUND_TRIP = """
import json, sys
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure, record
from numarun.launch.errorfile import write_error_file

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


# ---------------------------------------------------------------- root cause and summary


def _report(
    rank: int,
    state: str,
    exit_code: int | None = None,
    *,
    error: WorkerError | None = None,
    ended_at: float | None = 1000.0,
    signal_name: str | None = None,
    log_dir: Path | None = None,
    pid: int | None = None,
    proc_state: str | None = None,
) -> RankReport:
    return RankReport(
        local_rank=rank % 8,
        rank=rank,
        pid=4000 + rank if pid is None else pid,
        exit_code=exit_code,
        signal_name=signal_name,
        state=state,
        error=error,
        log_dir=log_dir,
        ended_at=ended_at,
        proc_state=proc_state,
    )


def test_describe_exit() -> None:
    assert describe_exit(3) == "exit code 3"
    assert describe_exit(0) == "exit code 0"
    assert describe_exit(-11) == "signal SIGSEGV (-11)"
    assert describe_exit(-9, "SIGKILL") == "signal SIGKILL (-9)"
    assert describe_exit(-200) == "signal SIG200 (-200)"
    assert describe_exit(None) == "no exit status"


def test_root_cause_is_the_smallest_error_timestamp() -> None:
    late = _report(0, "failed", 1, error=WorkerError("late", "tb", 2000), ended_at=1000.5)
    early = _report(1, "failed", 1, error=WorkerError("early", "tb", 1000), ended_at=2000.5)
    assert root_cause([late, early]) is early


def test_root_cause_without_error_files_is_the_first_observed_death() -> None:
    reports = [
        _report(0, "failed", 1, ended_at=1000.9),
        _report(1, "failed", -11, ended_at=1000.2),
        _report(2, "terminated", -15, ended_at=999.0),  # killed by us: never the cause
        _report(3, "succeeded", 0, ended_at=900.0),
    ]
    assert root_cause(reports) is reports[1]


def test_root_cause_same_second_is_decided_by_the_observed_death() -> None:
    # Rank 1 segfaulted at 1000.2 (no file); rank 0 raised later in the same second.
    raised = _report(0, "failed", 1, error=WorkerError("peer gone", "tb", 1000), ended_at=1000.9)
    crashed = _report(1, "failed", -11, ended_at=1000.2)
    assert root_cause([raised, crashed]) is crashed
    earlier_second = _report(2, "failed", 1, error=WorkerError("m", "tb", 999), ended_at=1001.0)
    assert root_cause([raised, crashed, earlier_second]) is earlier_second


def test_root_cause_none_when_nothing_failed_on_its_own() -> None:
    assert root_cause([_report(0, "terminated", -15), _report(1, "succeeded", 0)]) is None
    assert root_cause([]) is None


def test_summary_shows_the_root_cause_with_traceback_then_the_others(tmp_path: Path) -> None:
    traceback_text = (
        'Traceback (most recent call last):\n  File "train.py", line 9\nValueError: boom\n'
    )
    reports = [
        _report(0, "succeeded", 0),
        _report(2, "terminated", -15, signal_name="SIGTERM"),
        _report(
            1,
            "failed",
            3,
            error=WorkerError("ValueError: boom", traceback_text, 1712345678),
            log_dir=tmp_path / "1",
        ),
    ]
    text = format_summary(reports, entrypoint="train.py", host="node7", log_dir=tmp_path)
    lines = text.splitlines()
    assert lines[0] == lines[-1] == "=" * 72
    assert "train.py FAILED on node7" in lines[1] and "3 workers" in lines[1]
    cause = text.index("Root cause: rank 1 (local_rank 1, pid 4001) failed with exit code 3")
    assert text.index("ValueError: boom", cause) > cause
    assert "    Traceback (most recent call last):" in lines
    assert f"  logs     : {tmp_path / '1'}" in lines
    assert "  error    : ValueError: boom" in lines
    others = text.index("Other ranks:")
    assert others > text.index("    ValueError: boom")
    assert lines.index("  rank 0: succeeded") < lines.index(
        "  rank 2: terminated by numarun after rank 1 failed"
    )
    assert f"Logs: {tmp_path}" in lines
    assert not text.endswith("\n")


def test_summary_for_a_signal_death_without_error_file_shows_stderr_tail(tmp_path: Path) -> None:
    (tmp_path / "stderr.log").write_text(
        "".join(f"noise {i}\n" for i in range(100))
        + 'Fatal Python error: Segmentation fault\n  File "train.py", line 3 in <module>\n'
    )
    reports = [_report(0, "failed", -11, signal_name="SIGSEGV", log_dir=tmp_path)]
    text = format_summary(reports, entrypoint="train.py", host="h", log_dir=None)
    assert "failed with signal SIGSEGV (-11)" in text
    assert "traceback: no traceback (worker did not write an error file)" in text
    assert "    Fatal Python error: Segmentation fault" in text.splitlines()
    assert "noise 80" not in text and "noise 85" in text  # the last 20 lines only
    assert "Other ranks" not in text and "Logs:" not in text


def test_summary_without_logs_says_there_is_no_traceback() -> None:
    text = format_summary([_report(0, "failed", 1)], entrypoint="x", host="h", log_dir=None)
    assert "traceback: no traceback (worker did not write an error file)" in text
    assert "last lines" not in text


def test_summary_collapses_512_ranks() -> None:
    reports = [_report(0, "succeeded", 0)]
    reports.append(_report(1, "failed", 1, ended_at=10.0))
    reports += [_report(r, "terminated", -15, ended_at=20.0) for r in range(2, 256)]
    reports += [_report(r, "failed", 1, ended_at=30.0 + r) for r in range(256, 510)]
    reports.append(_report(510, "unkillable", None, pid=123, proc_state="D"))
    reports.append(_report(511, "terminated", -15))
    text = format_summary(reports[::-1], entrypoint="train.py", host="h", log_dir="/logs")
    lines = text.splitlines()
    assert len(lines) < 20
    assert "Root cause: rank 1 (local_rank 1, pid 4001) failed with exit code 1" in text
    assert "  ranks 2-255,511: terminated by numarun after rank 1 failed" in lines
    assert "  ranks 256-509: failed with exit code 1" in lines
    assert "  rank 510: unkillable pid 123 state D" in lines
    assert "  rank 0: succeeded" in lines
    assert "512 workers: " in lines[1]


def test_summary_lists_many_unkillable_pids_bounded() -> None:
    reports = [_report(0, "failed", 1)]
    reports += [_report(r, "unkillable", None, proc_state="D") for r in range(1, 21)]
    text = format_summary(reports, entrypoint="x", host="h", log_dir=None)
    pids = ",".join(str(4000 + rank) for rank in range(1, 9))
    assert f"  ranks 1-20: unkillable pids {pids},... (12 more) state D" in text.splitlines()


def test_summary_when_numarun_stopped_the_run() -> None:
    reports = [_report(0, "terminated", -15), _report(1, "terminated", -15)]
    text = format_summary(reports, entrypoint="x", host="h", log_dir=None)
    assert "no worker failed on its own" in text
    assert "  ranks 0-1: terminated by numarun" in text.splitlines()


def test_rank_report_reads_the_error_file(tmp_path: Path) -> None:
    class Exit:  # the shape of supervisor.WorkerExit
        local_rank, rank, pid, exit_code, signal_name = 1, 9, 77, 1, None
        state, ended_at, proc_state = "failed", 5.0, None

    path = _write(tmp_path / "e.json", {"message": "boom", "timestamp": "4"})
    report = rank_report(Exit(), error_file=path, log_dir=tmp_path)
    assert report == RankReport(
        1, 9, 77, 1, None, "failed", WorkerError("boom", None, 4), tmp_path, 5.0
    )
    assert rank_report(Exit(), error_file=None, log_dir=None).error is None


# ---------------------------------------------------------------- numarun.launch.bootstrap


def _python(
    args: list[str], cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "TORCHELASTIC_ERROR_FILE"}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-u", *args], cwd=cwd, env=full_env, capture_output=True, timeout=60
    )


def _bootstrap(
    args: list[str], cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """The bootstrap as the launcher runs it (``-c``, see numarun.launch.workers.worker_argv)."""
    from numarun.launch.workers import SCRIPT_BOOTSTRAP

    return _python(["-c", SCRIPT_BOOTSTRAP, *args], cwd, env)


_PROBE = textwrap.dedent(
    """
    import json, os, sys
    print(json.dumps({"argv": sys.argv, "file": __file__, "path0": sys.path[0],
                      "name": __name__, "package": __package__,
                      "spec": None if __spec__ is None else __spec__.name,
                      "main_is_me": sys.modules["__main__"].__dict__ is globals(),
                      "cwd": os.getcwd()}))
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    def fail():
        raise ValueError("boom from the worker")
    if what == "raise":
        fail()
    if what == "exit3":
        sys.exit(3)
    if what == "exitmsg":
        sys.exit("goodbye")
    if what == "ctrlc":
        raise KeyboardInterrupt
    """
)

_ODD_ARGS = ["with space", "'single'", '"double"', "$HOME", "a\nb", "--node", "-m", "", "*"]


@pytest.fixture
def probe(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    path = tmp_path / "scripts" / "probe.py"
    path.write_text(_PROBE)
    return path


@pytest.mark.parametrize(
    ("what", "returncode"), [("", 0), ("exit3", 3), ("exitmsg", 1), ("raise", 1), ("ctrlc", -2)]
)
def test_script_behaves_exactly_like_python(
    tmp_path: Path, probe: Path, what: str, returncode: int
) -> None:
    args = ["scripts/probe.py", what, *_ODD_ARGS]
    plain = _python(args, tmp_path)
    ours = _bootstrap(["--", *args], tmp_path)
    assert plain.returncode == returncode
    assert (ours.returncode, ours.stdout, ours.stderr) == (
        plain.returncode,
        plain.stdout,
        plain.stderr,
    )
    facts = json.loads(ours.stdout.splitlines()[0])
    assert facts["argv"] == ["scripts/probe.py", what, *_ODD_ARGS]
    assert facts["file"] == str(probe)
    assert facts["path0"] == str(probe.parent)
    assert facts["name"] == "__main__" and facts["main_is_me"]


def test_dash_m_form_of_the_bootstrap_behaves_the_same(tmp_path: Path, probe: Path) -> None:
    args = ["scripts/probe.py", "raise", *_ODD_ARGS]
    plain = _python(args, tmp_path)
    ours = _python(["-m", "numarun.launch.bootstrap", "--", *args], tmp_path)
    assert (ours.returncode, ours.stdout, ours.stderr) == (1, plain.stdout, plain.stderr)
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text(_PROBE)
    ours = _python(["-m", "numarun.launch.bootstrap", "-m", "pkg.mod"], tmp_path)
    facts = json.loads(ours.stdout.splitlines()[0])
    assert facts["path0"] == str(tmp_path) and facts["spec"] == "pkg.mod"


def test_script_form_without_double_dash(tmp_path: Path, probe: Path) -> None:
    ours = _bootstrap([str(probe), "x"], tmp_path)
    assert ours.returncode == 0
    assert json.loads(ours.stdout)["argv"] == [str(probe), "x"]


def test_symlinked_script_gets_the_real_directory_on_sys_path(tmp_path: Path, probe: Path) -> None:
    (tmp_path / "link.py").symlink_to(probe)
    plain, ours = _python(["link.py"], tmp_path), _bootstrap(["link.py"], tmp_path)
    assert ours.stdout == plain.stdout
    assert json.loads(ours.stdout)["path0"] == str(probe.parent)


def test_uncaught_exception_writes_the_error_file(tmp_path: Path, probe: Path) -> None:
    error_file = tmp_path / "error.json"
    ours = _bootstrap(
        ["scripts/probe.py", "raise"], tmp_path, {"TORCHELASTIC_ERROR_FILE": str(error_file)}
    )
    assert ours.returncode == 1
    assert ours.stderr == _python(["scripts/probe.py", "raise"], tmp_path).stderr
    error = read_error_file(error_file)
    assert error is not None
    assert error.message == "ValueError: boom from the worker"
    assert error.traceback.startswith("Traceback (most recent call last):\n")
    assert f'File "{probe}", line' in error.traceback and "in fail" in error.traceback
    assert "_script" not in error.traceback and "runpy" not in error.traceback
    assert isinstance(error.timestamp, int)


@pytest.mark.parametrize("what", ["", "exit3", "ctrlc"])
def test_no_error_file_for_success_exit_or_ctrl_c(tmp_path: Path, probe: Path, what: str) -> None:
    error_file = tmp_path / "error.json"
    _bootstrap(["scripts/probe.py", what], tmp_path, {"TORCHELASTIC_ERROR_FILE": str(error_file)})
    assert not error_file.exists()


def test_record_style_error_file_is_not_overwritten(tmp_path: Path) -> None:
    error_file = tmp_path / "error.json"
    (tmp_path / "recorded.py").write_text(
        textwrap.dedent(
            """
            import json, os
            try:
                raise RuntimeError("inner")
            except RuntimeError:
                with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as f:
                    json.dump({"message": {"message": "written by @record",
                               "extraInfo": {"py_callstack": "user tb", "timestamp": "5"}}}, f)
                raise
            """
        )
    )
    ours = _bootstrap(["recorded.py"], tmp_path, {"TORCHELASTIC_ERROR_FILE": str(error_file)})
    assert ours.returncode == 1 and b"RuntimeError: inner" in ours.stderr
    assert read_error_file(error_file) == WorkerError("written by @record", "user tb", 5)


def test_unwritable_error_file_does_not_hide_the_traceback(tmp_path: Path, probe: Path) -> None:
    error_file = tmp_path / "missing-dir" / "error.json"
    ours = _bootstrap(
        ["scripts/probe.py", "raise"], tmp_path, {"TORCHELASTIC_ERROR_FILE": str(error_file)}
    )
    assert ours.returncode == 1
    assert b"numarun: could not write error file" in ours.stderr
    assert ours.stderr.endswith(b"ValueError: boom from the worker\n")


def test_syntax_error_is_reported_like_python(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("x = (\n")
    plain, ours = _python(["bad.py"], tmp_path), _bootstrap(["bad.py"], tmp_path)
    assert (ours.returncode, ours.stderr) == (plain.returncode, plain.stderr) == (1, plain.stderr)
    assert b"SyntaxError" in ours.stderr


def test_missing_script_is_reported_like_python(tmp_path: Path) -> None:
    plain, ours = _python(["nope.py"], tmp_path), _bootstrap(["nope.py"], tmp_path)
    assert (ours.returncode, ours.stderr) == (plain.returncode, plain.stderr)
    assert ours.returncode == 2


def test_segfault_prints_a_python_traceback(tmp_path: Path) -> None:
    (tmp_path / "crash.py").write_text(
        "import ctypes\ndef crash():\n    ctypes.string_at(0)\ncrash()\n"
    )
    ours = _bootstrap(["crash.py"], tmp_path)
    assert ours.returncode == -11
    assert b"Fatal Python error: Segmentation fault" in ours.stderr
    assert b'crash.py", line 3 in crash' in ours.stderr


def test_module_form_behaves_like_python_dash_m(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text(_PROBE)
    for what, returncode in [("", 0), ("exit3", 3), ("raise", 1)]:
        plain = _python(["-m", "pkg.mod", what, *_ODD_ARGS], tmp_path)
        ours = _bootstrap(["-m", "pkg.mod", what, *_ODD_ARGS], tmp_path)
        assert (ours.returncode, ours.stdout) == (plain.returncode, plain.stdout)
        assert ours.returncode == returncode
        assert ours.stderr.splitlines()[-1:] == plain.stderr.splitlines()[-1:]
    facts = json.loads(ours.stdout.splitlines()[0])
    assert facts["argv"] == [str(package / "mod.py"), "raise", *_ODD_ARGS]
    assert facts["path0"] == str(tmp_path) and facts["spec"] == "pkg.mod"
    assert facts["name"] == "__main__" and facts["main_is_me"]


def test_module_form_writes_the_error_file_without_bootstrap_frames(tmp_path: Path) -> None:
    (tmp_path / "failing.py").write_text("raise OSError('disk gone')\n")
    error_file = tmp_path / "error.json"
    ours = _bootstrap(["-m", "failing"], tmp_path, {"TORCHELASTIC_ERROR_FILE": str(error_file)})
    assert ours.returncode == 1
    assert b"runpy" not in ours.stderr and b"_script" not in ours.stderr
    error = read_error_file(error_file)
    assert error is not None and error.message == "OSError: disk gone"


def test_unknown_module_is_reported_like_python(tmp_path: Path) -> None:
    plain = _python(["-m", "no_such_module_xyz"], tmp_path)
    ours = _bootstrap(["-m", "no_such_module_xyz"], tmp_path)
    assert (ours.returncode, ours.stderr) == (plain.returncode, plain.stderr) == (1, plain.stderr)


@pytest.mark.parametrize("args", [[], ["--"], ["-m"], ["-x"], ["-m", "-x"]])
def test_bad_bootstrap_usage_exits_2(tmp_path: Path, args: list[str]) -> None:
    ours = _bootstrap(args, tmp_path)
    assert ours.returncode == 2
    assert ours.stderr.startswith(b"usage: python -m numarun.launch.bootstrap")


def test_directory_and_zip_archive_run_like_python(tmp_path: Path) -> None:
    import zipfile

    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__main__.py").write_text(_PROBE)
    with zipfile.ZipFile(tmp_path / "app.zip", "w") as archive:
        archive.write(tmp_path / "app" / "__main__.py", "__main__.py")
    (tmp_path / "empty").mkdir()
    for target, what in [("app", "exit3"), ("app.zip", ""), ("app.zip", "raise"), ("empty", "")]:
        plain = _python([target, what, *_ODD_ARGS], tmp_path)
        ours = _bootstrap([target, what, *_ODD_ARGS], tmp_path)
        assert (ours.returncode, ours.stdout) == (plain.returncode, plain.stdout)
        assert ours.stderr.splitlines()[-1:] == plain.stderr.splitlines()[-1:]
    facts = json.loads(_bootstrap(["app"], tmp_path).stdout.splitlines()[0])
    assert facts["path0"] == str(tmp_path / "app") and facts["argv"] == ["app"]


def test_script_starting_with_a_dash_needs_double_dash(tmp_path: Path) -> None:
    (tmp_path / "-odd.py").write_text("import sys; print(sys.argv)")
    ours = _bootstrap(["--", "-odd.py", "a"], tmp_path)
    assert (ours.returncode, ours.stdout) == (0, b"['-odd.py', 'a']\n")


def test_multiprocessing_spawn_inside_a_worker_works(tmp_path: Path) -> None:
    (tmp_path / "mp.py").write_text(
        textwrap.dedent(
            """
            import multiprocessing as mp

            class Box:
                def __init__(self, v):
                    self.v = v

            def double(box):
                return Box(box.v * 2)

            if __name__ == "__main__":
                with mp.get_context("spawn").Pool(1) as pool:
                    print(pool.apply(double, (Box(21),)).v)
            """
        )
    )
    ours = _bootstrap(["mp.py"], tmp_path)
    assert (ours.returncode, ours.stdout) == (0, b"42\n"), ours.stderr


# ---------------------------------------------------------------- with the real supervisor

_RANKED_WORKER = textwrap.dedent(
    """
    import os, sys
    rank = int(os.environ["RANK"])
    for i in range(20000):
        print(f"r{rank} line {i}")
    print(f"r{rank} to stderr", file=sys.stderr)
    if rank == 1:
        raise ValueError("rank 1 gave up")
    """
)


def test_tee_error_file_and_summary_through_the_supervisor(tmp_path: Path) -> None:
    from numarun.launch.logdir import error_file_path, make_log_dirs
    from numarun.launch.output import sinks_for
    from numarun.launch.workers import SCRIPT_BOOTSTRAP
    from numarun.process.spec import WorkerSpec
    from numarun.process.supervisor import Supervisor

    (tmp_path / "worker.py").write_text(_RANKED_WORKER)
    attempt = make_log_dirs(tmp_path / "logs", "run1", 2)
    console_out = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT)
    console_err = os.open(tmp_path / "err", os.O_WRONLY | os.O_CREAT)
    specs = []
    for rank in range(2):
        out, err = sinks_for(rank, rank, 0, 3, attempt / str(rank), True, console_out, console_err)
        env = {**os.environ, "RANK": str(rank)}
        env["TORCHELASTIC_ERROR_FILE"] = str(error_file_path(attempt, rank))
        argv = [sys.executable, "-u", "-c", SCRIPT_BOOTSTRAP, "--", "worker.py"]
        specs.append(WorkerSpec(rank, rank, env, argv, stdout=out, stderr=err, cwd=str(tmp_path)))
    supervisor = Supervisor(specs, grace_period=5.0, use_watchdog=False)
    supervisor.start()
    result = supervisor.wait(timeout=60)
    os.close(console_out)
    os.close(console_err)
    assert result is not None

    # Rank 1 raised; rank 0 either finished first or was torn down: its output up to then is
    # whole lines, in order, and exactly what its stdout.log holds.
    out_lines = (tmp_path / "out").read_text().splitlines()
    for rank in range(2):
        mine = [line for line in out_lines if line.startswith(f"[default{rank}]:")]
        assert mine == [f"[default{rank}]:r{rank} line {i}" for i in range(len(mine))]
        logged = (attempt / str(rank) / "stdout.log").read_text().splitlines()
        assert logged == [line.removeprefix(f"[default{rank}]:") for line in mine]
    assert len([line for line in out_lines if line.startswith("[default1]:")]) == 20000
    assert len(out_lines) == len([line for line in out_lines if line.startswith("[default")])
    assert "[default1]:ValueError: rank 1 gave up" in (tmp_path / "err").read_text().splitlines()

    reports = [
        rank_report(
            worker,
            error_file=error_file_path(attempt, worker.local_rank),
            log_dir=attempt / str(worker.local_rank),
        )
        for worker in result.workers
    ]
    text = format_summary(reports, entrypoint="worker.py", host="h", log_dir=attempt)
    assert "Root cause: rank 1 (local_rank 1" in text and "exit code 1" in text
    assert "    ValueError: rank 1 gave up" in text.splitlines()
    assert 'worker.py", line 8, in <module>' in text


def test_no_empty_stacks_heading_when_the_other_ranks_had_all_ended() -> None:
    # Rank 0 finished, then rank 1 called sys.exit(3): nobody was left to take stacks from.
    reports = [_report(0, "succeeded", 0), _report(1, "failed", 3)]
    text = format_summary(
        reports, entrypoint="x", host="h", log_dir=None, stacks_at_failure=(1, [])
    )
    assert "Other ranks when rank 1 failed:" not in text
    assert "Root cause: rank 1 (local_rank 1, pid 4001) failed with exit code 3" in text


def test_a_rank_still_starting_is_described_in_the_users_words() -> None:
    from numarun.stacks.dumps import NOT_ARMED
    from numarun.stacks.parse import RankStacks

    # A syntax error in the script: another rank had not reached the program yet.
    still_starting = RankStacks(rank=1, local_rank=1, pid=4001, problem=NOT_ARMED)
    reports = [_report(0, "failed", 1), _report(1, "terminated", -15)]
    text = format_summary(
        reports, entrypoint="x", host="h", log_dir=None, stacks_at_failure=(0, [still_starting])
    )
    (line,) = [line for line in text.splitlines() if line.startswith("  rank 1: no stacks")]
    assert "had not started the program's code" in line
    assert "signal" not in line and "handler" not in line  # numarun's internals stay inside

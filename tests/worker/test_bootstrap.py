"""numarun.worker.bootstrap: the worker's first frame runs the user's script or module exactly as
``python`` would (sys.argv, sys.path, ``__main__``, errors reported as Python reports them) and
writes torchrun's error file for an uncaught exception."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from numarun.worker.errorfile import WorkerError, read_error_file


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
    """The bootstrap as the launcher runs it (``-c``; numarun.launch.workersetup.worker_argv)."""
    from numarun.launch.workersetup import SCRIPT_BOOTSTRAP

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
    ours = _python(["-m", "numarun.worker.bootstrap", "--", *args], tmp_path)
    assert (ours.returncode, ours.stdout, ours.stderr) == (1, plain.stdout, plain.stderr)
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text(_PROBE)
    ours = _python(["-m", "numarun.worker.bootstrap", "-m", "pkg.mod"], tmp_path)
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
    assert ours.stderr.startswith(b"usage: python -m numarun.worker.bootstrap")


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


def test_a_launched_worker_has_loaded_only_the_worker_wing_of_numarun(tmp_path: Path) -> None:
    # The worker wing's import budget (DESIGN.md): when the user's script starts, every numarun
    # module in the rank is the worker wing's or a base module, with stacks armed (--hang-timeout
    # arms them on every launch) and with --preload's standby path.
    script = tmp_path / "report.py"
    script.write_text(
        "import json, os, sys\n"
        "names = sorted(m for m in sys.modules if m == 'numarun' or m.startswith('numarun.'))\n"
        "with open(os.environ['REPORT'] + os.environ['LOCAL_RANK'], 'w') as f:\n"
        "    json.dump(names, f)\n"
    )
    allowed = {"numarun", "numarun.worker", "numarun.errors", "numarun._version"}
    for extra in ([], ["--hang-timeout", "60"], ["--preload", "json"]):
        report = tmp_path / f"report{len(extra)}-"
        done = subprocess.run(
            [sys.executable, "-m", "numarun", "--nproc-per-node", "2", *extra, str(script)],
            capture_output=True, text=True, timeout=120, env={**os.environ, "REPORT": str(report)},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        for local_rank in (0, 1):
            loaded = json.loads(Path(f"{report}{local_rank}").read_text())
            assert "numarun.worker.bootstrap" in loaded, (extra, loaded)
            strangers = [m for m in loaded
                         if m not in allowed and not m.startswith("numarun.worker.")]  # fmt: skip
            assert strangers == [], (extra, strangers)

"""The entry script compiled once by the launcher for all its workers (issue 32 item 13):
:class:`numarun.launch.workersetup.MainCode` writes it, :mod:`numarun.worker.bootstrap` runs it
when it is whole and made for what the worker would compile itself, and compiles the script
itself otherwise. Either way the user's program sees what ``python script.py`` shows it, and
never the launcher's fd.

Whether a worker compiled the script is seen through the ``compile`` audit event (raised by
``compile()``, which the bootstrap calls only when it does not use the launcher's code)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from numarun.launch.launcher import LaunchConfig, parse_args
from numarun.launch.workersetup import MAIN_CODE_FD_ENV, SCRIPT_BOOTSTRAP, MainCode
from numarun.worker import bootstrap

TIMEOUT = 120  # the suite runs at load averages of 10-30

# The bootstrap as the launcher runs it, with every compile of the script reported first.
AUDITED = (
    "import sys\n"
    "def _seen(event, args):\n"
    "    if event == 'compile' and args[1] == sys.argv[-2]:\n"
    "        sys.stderr.write('COMPILED ' + args[1] + '\\n')\n"
    "sys.addaudithook(_seen)\n" + SCRIPT_BOOTSTRAP
)

# What the user's program sees: its argv, __file__, the environment and fds numarun might
# leave, and where a traceback points.
PROBE = """\
import json, os, sys, traceback
fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
try:
    raise ValueError("where")
except ValueError:
    frame = traceback.extract_tb(sys.exc_info()[2])[-1]
sys.stdout.write(json.dumps({  # one write: the ranks share the console
    "argv": sys.argv, "file": __file__, "env": "NUMARUN_MAIN_CODE_FD" in os.environ, "fds": fds,
    "raised_at": [frame.filename, frame.lineno, frame.line], "optimize": sys.flags.optimize,
    "asserts": __debug__,
}) + "\\n")
"""


def _config(*argv: str, **environ: str) -> LaunchConfig:
    return parse_args(list(argv), {"PATH": os.environ.get("PATH", os.defpath), **environ})


def _env(**changes: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONOPTIMIZE", MAIN_CODE_FD_ENV)}
    env.update(changes)
    return env


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "probe.py"
    path.write_text(PROBE)
    return path


def _run_worker(
    script: Path, code: MainCode | None, cwd: Path, **environ: str
) -> tuple[dict, bool, str]:
    """The bootstrap on ``script`` as a worker of ``code``: (what the program printed, whether
    the worker compiled the script, its stderr)."""
    env = _env(**environ)
    fds: tuple[int, ...] = ()
    if code is not None:
        env[MAIN_CODE_FD_ENV] = str(code.fd)
        os.set_inheritable(code.fd, True)  # as pass_fds makes it in the exec'd worker
        fds = (code.fd,)
    done = subprocess.run(
        [sys.executable, "-u", "-c", AUDITED, "--", str(script), "arg"],
        cwd=cwd, env=env, pass_fds=fds, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    return seen, f"COMPILED {script}" in done.stderr, done.stderr


def _python(script: Path, cwd: Path, **environ: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-u", str(script), "arg"],
        cwd=cwd, env=_env(**environ), capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def _written(script: Path, **environ: str) -> MainCode:
    code = MainCode.open(_config(str(script)))
    assert code is not None
    assert code.write(str(script), _env(**environ))
    return code


def test_a_worker_runs_the_launchers_code_without_compiling(script: Path, tmp_path: Path) -> None:
    code = _written(script)
    try:
        seen, compiled, _ = _run_worker(script, code, tmp_path)
    finally:
        code.close()
    assert not compiled
    plain = _python(script, tmp_path)
    assert seen == {**plain, "fds": seen["fds"]}  # argv, __file__, traceback, flags: python's
    assert seen["raised_at"] == [str(script), 4, 'raise ValueError("where")']
    assert code.fd not in seen["fds"] and seen["env"] is False


@pytest.mark.parametrize("change", ["source", "optimize", "nothing written", "torn", "cwd"])
def test_a_worker_compiles_the_script_itself_when_the_code_is_not_for_it(
    script: Path, tmp_path: Path, change: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = MainCode.open(_config(str(script)))
    assert code is not None
    environ: dict[str, str] = {}
    cwd = tmp_path
    if change != "nothing written":
        assert code.write(str(script), _env())
    if change == "source":
        script.write_text(PROBE.replace('"where"', '"changed"'))
    elif change == "optimize":
        environ["PYTHONOPTIMIZE"] = "1"
    elif change == "torn":
        os.pwrite(code.fd, b"\0" * 20, 0)  # the header half there: not whole
    elif change == "cwd":
        # The code names the script by its absolute path from here; a worker elsewhere
        # names it otherwise (a relative script path), and compiles.
        monkeypatch.chdir(tmp_path)
        code.close()
        code = MainCode.open(_config("probe.py"))
        assert code is not None
        assert code.write("probe.py", _env())
        monkeypatch.undo()
        cwd = tmp_path / "elsewhere"
        cwd.mkdir()
        (cwd / "probe.py").write_text(PROBE)
        script = cwd / "probe.py"
    try:
        seen, compiled, _ = _run_worker(script, code, cwd, **environ)
    finally:
        code.close()
    assert compiled
    assert seen == {**_python(script, cwd, **environ), "fds": seen["fds"]}
    assert code.fd not in seen["fds"] and seen["env"] is False


def test_the_fd_is_closed_however_the_entry_point_runs(tmp_path: Path) -> None:
    """A module, or a script path that is a directory, runs through runpy: the launcher's fd
    is closed before it runs all the same."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__main__.py").write_text(PROBE)
    code = MainCode.open(_config("t.py"))
    assert code is not None
    try:
        os.set_inheritable(code.fd, True)
        for args in (["-m", "pkg"], ["--", "pkg"]):
            done = subprocess.run(
                [sys.executable, "-u", "-c", SCRIPT_BOOTSTRAP, *args],
                cwd=tmp_path, env=_env(**{MAIN_CODE_FD_ENV: str(code.fd)}),
                pass_fds=(code.fd,), capture_output=True, text=True, timeout=TIMEOUT,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            seen = json.loads(done.stdout.splitlines()[-1])
            assert code.fd not in seen["fds"] and seen["env"] is False
    finally:
        code.close()


def test_only_a_script_run_by_this_python_without_preload_gets_it() -> None:
    assert MainCode.open(_config("-m", "pkg.mod")) is None
    assert MainCode.open(_config("--no-python", "prog")) is None
    assert MainCode.open(_config("--preload", "json", "t.py")) is None
    assert MainCode.open(_config("t.py", PYTHON_EXEC="/opt/other/python")) is None
    code = MainCode.open(_config("t.py"))
    assert code is not None
    assert code.worker_env() == {MAIN_CODE_FD_ENV: str(code.fd)}
    code.close()
    code.close()  # idempotent
    assert code.fd == -1


@pytest.mark.parametrize(
    ("source", "environ"),
    [
        ("x = 1 is 1\n", {}),  # a SyntaxWarning: each worker's python says it
        ("def f(:\n", {}),  # a SyntaxError: each worker's python reports it
        ("x = 1\n", {"PYTHONOPTIMIZE": "7"}),  # a level compile() has no name for
    ],
    ids=["warns", "syntax error", "odd level"],
)
def test_what_the_workers_must_say_themselves_is_not_written(
    tmp_path: Path, source: str, environ: dict[str, str]
) -> None:
    path = tmp_path / "s.py"
    path.write_text(source)
    code = MainCode.open(_config(str(path)))
    assert code is not None
    try:
        assert code.write(str(path), _env(**environ)) is False
        assert os.fstat(code.fd).st_size == 0
    finally:
        code.close()


def test_the_key_names_what_the_code_is_for() -> None:
    assert bootstrap.MAIN_CODE_FD_ENV == MAIN_CODE_FD_ENV  # the bootstrap reads what we set
    key = bootstrap.main_code_key(b"x = 1\n", 0)
    assert key == bootstrap.main_code_key(b"x = 1\n", 0)
    assert key != bootstrap.main_code_key(b"x = 2\n", 0)
    assert key != bootstrap.main_code_key(b"x = 1\n", 1)


def test_a_launch_compiles_the_script_once_for_its_workers(tmp_path: Path) -> None:
    """Through ``numarun``: no worker compiles the script (a sitecustomize on PYTHONPATH
    reports every compile of it, in the launcher and in each rank), and each rank sees what
    ``python probe.py`` shows it. The sitecustomize also holds each rank until the launcher
    has written the code, which a rank on a loaded machine could otherwise outrun (it would
    then compile the script itself, correctly, which this test is not about)."""
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(
        "import os, sys\n"
        "def _seen(event, args):\n"
        f"    if event == 'compile' and args[1] == {str(script)!r}:\n"
        "        sys.stderr.write('COMPILED in ' + os.environ.get('RANK', 'the launcher') + "
        "'\\n')\n"
        "sys.addaudithook(_seen)\n"
        f"fd = int(os.environ.get({MAIN_CODE_FD_ENV!r}, '-1'))\n"
        "if fd >= 0:\n"
        "    import time\n"
        "    deadline = time.monotonic() + 60\n"
        "    while os.fstat(fd).st_size == 0 and time.monotonic() < deadline:\n"
        "        time.sleep(0.01)\n"
    )
    src = Path(bootstrap.__file__).parents[2]
    env = _env(PYTHONPATH=os.pathsep.join([str(hooks), str(src)]))
    env = {k: v for k, v in env.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env.pop("MASTER_PORT", None)
    done = subprocess.run(
        [sys.executable, "-m", "numarun", "--nproc-per-node", "2", str(script), "arg"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    compiled = [line for line in done.stderr.splitlines() if line.startswith("COMPILED")]
    assert compiled == ["COMPILED in the launcher"]
    ranks = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(ranks) == 2
    plain = _python(script, tmp_path)
    for seen in ranks:
        assert seen["argv"] == plain["argv"] and seen["file"] == plain["file"]
        assert seen["raised_at"] == plain["raised_at"] and seen["env"] is False

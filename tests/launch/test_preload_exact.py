"""A preloaded worker is the cold worker, exactly; and ``--preload`` mistakes are said at once.

The standby's imports run where the cold worker's would: the script directory's module wins
over the working directory's (``sys.path[0]``, ``sys.argv``, ``__main__`` and the working
directory at import are the cold worker's); a hang inside a preloaded import is declared by
``--hang-timeout`` naming the module's function, and ``numarun stacks`` shows it; CUDA
initialised by a preloaded module's thread after its import is caught at the hand-over; the
hand-over's environment reaches a preloaded thread that calls ``getenv`` without ``setenv``
under it. A module name that is not there is a did-you-mean before anything starts, an
import's error text is shown escaped, and ``--preload-required`` makes either an error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from job_processes import nothing_left

SRC = str(Path(__file__).resolve().parents[2] / "src")
NUMARUN = [sys.executable, "-m", "numarun"]
LIMIT = 120.0  # generous: a shared machine at load 30 starts interpreters slowly


def _env(*paths: Path | str, **extra: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PET_", "TORCHELASTIC_", "NUMARUN_", "SLURM_", "OMPI_"))
        and key not in ("MASTER_ADDR", "MASTER_PORT", "PYTHON_EXEC", "OMP_NUM_THREADS")
    }
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), SRC])
    env.update(extra)
    return env


def _run(*argv: str, cwd: Path, paths: tuple[Path, ...] = (), **env: str) -> (
    subprocess.CompletedProcess[str]
):
    return subprocess.run(
        [*NUMARUN, *argv], capture_output=True, text=True, env=_env(*paths, **env), cwd=cwd,
        timeout=LIMIT,
    )  # fmt: skip


def _private(path: Path) -> Path:
    path.mkdir(mode=0o700)
    return path


# --- the same files ------------------------------------------------------------------------------

SCRIPT_DIR_MODULE = textwrap.dedent(
    """\
    import os, sys, __main__
    VALUE = "the script directory's"
    # What the import saw: what a cold worker sees at its script's first line.
    SEEN = {"argv0": sys.argv[0], "path0": sys.path[0], "cwd": os.getcwd(),
            "main_file": getattr(__main__, "__file__", None), "main_is_the_scripts":
            getattr(__main__, "__name__", None) == "__main__" and "__builtins__" in vars(__main__)}
    """
)
TRAIN = textwrap.dedent(
    """\
    import json, sys
    warm = "mymod" in sys.modules
    import mymod
    print(json.dumps({"value": mymod.VALUE, "warm": warm, "seen": mymod.SEEN,
                      "argv": sys.argv}))
    """
)


@pytest.mark.parametrize("form", ["script", "module"])
def test_the_script_directorys_module_wins_under_preload_as_it_does_cold(
    tmp_path: Path, form: str
) -> None:
    # A script directory and a working directory, each with its own mymod.py: the cold worker
    # imports the script directory's (-m: the working directory is the script directory), and
    # so does the warm one, which saw at its import what the cold one saw.
    scripts, cwd = tmp_path / "scripts", tmp_path / "cwd"
    scripts.mkdir()
    cwd.mkdir()
    (scripts / "mymod.py").write_text(SCRIPT_DIR_MODULE)
    (scripts / "train.py").write_text(TRAIN)
    (cwd / "mymod.py").write_text("VALUE = \"the working directory's\"\nSEEN = None\n")
    if form == "module":  # python -m finds train in the working directory: the same place
        cwd, scripts = scripts, cwd
    entry = ["../scripts/train.py"] if form == "script" else ["-m", "train"]
    seen = {}
    for mode, flags in (("cold", []), ("warm", ["--preload", "mymod"])):
        done = _run(*flags, *entry, "an", "argument", cwd=cwd)
        assert done.returncode == 0, done.stderr
        seen[mode] = json.loads(done.stdout)
        assert ("preload: mymod (on standbys)" in done.stderr) == (mode == "warm")
    assert seen["cold"]["value"] == seen["warm"]["value"] == "the script directory's"
    assert (seen["cold"]["warm"], seen["warm"]["warm"]) == (False, True)
    assert seen["cold"]["seen"] == seen["warm"]["seen"]
    assert seen["cold"]["argv"] == seen["warm"]["argv"]
    at_import = seen["warm"]["seen"]
    train = str(tmp_path / "scripts" / "train.py")
    assert at_import["path0"] == str(tmp_path / "scripts")
    assert at_import["cwd"] == str(cwd)
    assert at_import["main_file"] == train and at_import["main_is_the_scripts"]
    assert at_import["argv0"] == (train if form == "module" else "../scripts/train.py")


# --- a hang inside a preloaded import ------------------------------------------------------------

HANGS = textwrap.dedent(
    """\
    import time

    def waits_for_a_server_that_never_answers():
        while True:
            time.sleep(0.05)

    waits_for_a_server_that_never_answers()
    """
)


def test_a_hang_inside_a_preloaded_import_is_declared_naming_it(tmp_path: Path) -> None:
    # The rank is handed its attempt while its preload still imports: its stacks are armed
    # from before the import, so the hang watch sees it stand still there and `numarun stacks`
    # shows where.
    runtime = _private(tmp_path / "rt")
    (tmp_path / "wm_hangs.py").write_text(HANGS)
    (tmp_path / "train.py").write_text("print('never reached')\n")
    run_id = f"px-hang-{os.getpid()}"
    flags = ["--rdzv-id", run_id, "--preload", "wm_hangs", "train.py"]
    env = _env(tmp_path, NUMARUN_RUNTIME_DIR=str(runtime))
    proc = subprocess.Popen(
        [*NUMARUN, *flags], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + LIMIT
        while True:
            stacks = subprocess.run(
                [*NUMARUN, "stacks", run_id], capture_output=True, text=True, env=env,
                timeout=LIMIT,
            )  # fmt: skip
            if "waits_for_a_server_that_never_answers" in stacks.stdout:
                break
            assert time.monotonic() < deadline, (stacks.stdout, stacks.stderr)
            time.sleep(0.2)
    finally:
        proc.terminate()
        proc.communicate(timeout=LIMIT)
    assert nothing_left(run_id)
    assert os.listdir(runtime) == []
    done = _run("--hang-timeout", "3", *flags, cwd=tmp_path, paths=(tmp_path,),
                NUMARUN_RUNTIME_DIR=str(runtime))  # fmt: skip
    assert done.returncode == 124, done.stderr
    assert "rank 0: in waits_for_a_server_that_never_answers (" in done.stderr
    assert "never reached" not in done.stdout
    assert nothing_left(run_id)
    assert os.listdir(runtime) == []  # no socket, no dump files, the standbys' included


# --- CUDA after the import -----------------------------------------------------------------------

# A stand-in for torch (no GPU here): `torch.cuda.is_initialized()`, the check numarun makes,
# turns true from a thread the import started, once the standby waits for its hand-over (its
# main thread in numarun's wait) and the flag file the first attempt writes exists; so the
# first attempt's worker, running its script by then, never turns it.
FAKE_TORCH = textwrap.dedent(
    """\
    import os, sys, threading, time
    from . import cuda

    def _initialise_later():
        main = threading.main_thread().ident
        while True:
            frame = sys._current_frames().get(main)
            waiting = frame is not None and frame.f_code.co_name == "_receive"
            if waiting and os.path.exists(os.environ["PX_FLAG"]):
                cuda.initialised = True
                open(os.environ["PX_FLAG"] + ".done", "w").close()
                return
            time.sleep(0.01)

    threading.Thread(target=_initialise_later, daemon=True).start()
    """
)
CUDA_PROBE = textwrap.dedent(
    """\
    import os, sys, time
    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    print("attempt", attempt, "torch" in sys.modules, flush=True)
    if attempt == "0":
        open(os.environ["PX_FLAG"], "w").close()
        while not os.path.exists(os.environ["PX_FLAG"] + ".done"):
            time.sleep(0.01)
        sys.exit(3)
    """
)


def test_cuda_initialised_by_a_preloaded_thread_after_its_import_is_caught_at_the_hand_over(
    tmp_path: Path,
) -> None:
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(FAKE_TORCH)
    (fake / "cuda.py").write_text("initialised = False\n\ndef is_initialized():\n"
                                  "    return initialised\n")  # fmt: skip
    (tmp_path / "probe.py").write_text(CUDA_PROBE)
    run_id = f"px-cuda-{os.getpid()}"
    done = _run(
        "--rdzv-id", run_id, "--max-restarts", "1", "--preload", "torch", "probe.py",
        cwd=tmp_path, paths=(tmp_path / "fake",), PX_FLAG=str(tmp_path / "flag"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # The second attempt's standby was ready at its import, CUDA found at its hand-over: it
    # ran its attempt cold (exec'd anew: no torch), and the launch runs cold from then on.
    assert done.stdout.splitlines() == ["attempt 0 True", "attempt 1 False"]
    warnings = [line for line in done.stderr.splitlines() if "warning" in line]
    assert warnings == [
        "numarun: warning: --preload: CUDA was initialised in local rank 0's standby after its "
        "imports of torch (by a thread one of them started), found at its hand-over (a standby "
        "must never hold a GPU; that rank started cold); the job runs cold"
    ], done.stderr
    assert nothing_left(run_id)


# --- the hand-over's environment and a preloaded thread's getenv ---------------------------------

GETENV_THREAD = textwrap.dedent(
    """\
    import ctypes, os, threading, time
    os.environ["WM_SET_AT_IMPORT"] = "kept"  # a cold worker's import sets it too
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    environ = ctypes.c_void_p.in_dll(libc, "environ")
    BEFORE = environ.value  # the C environment's array while the standby imports
    SEEN = {"reads": 0}

    def entries(address):
        array = ctypes.cast(address, ctypes.POINTER(ctypes.c_char_p))
        found, index = [], 0
        while array[index] is not None:
            found.append(array[index])
            index += 1
        return found

    AT_IMPORT = entries(BEFORE)

    def read_all_the_time():
        while True:
            SEEN["rank"] = libc.getenv(b"RANK")
            SEEN["reads"] += 1
            time.sleep(0.0005)

    threading.Thread(target=read_all_the_time, daemon=True).start()
    """
)
GETENV_PROBE = textwrap.dedent(
    """\
    import json, os, subprocess, sys, time
    import wm_getenv
    reads = wm_getenv.SEEN["reads"]
    while wm_getenv.SEEN["reads"] == reads or wm_getenv.SEEN.get("rank") is None:
        time.sleep(0.001)  # the thread goes on reading, and reads the handed-over RANK
    child = subprocess.run([sys.executable, "-c", "import os; print(os.environ['RANK'])"],
                           capture_output=True, text=True).stdout.strip()
    print(json.dumps({
        "thread_sees": wm_getenv.SEEN["rank"].decode(), "rank": os.environ["RANK"],
        "child_sees": child, "set_at_import": os.environ.get("WM_SET_AT_IMPORT"),
        "old_array_intact": wm_getenv.entries(wm_getenv.BEFORE) == wm_getenv.AT_IMPORT,
        "swapped": wm_getenv.environ.value != wm_getenv.BEFORE,
    }))
    """
)


def test_the_hand_over_reaches_a_preloaded_thread_that_calls_getenv_without_racing_it(
    tmp_path: Path,
) -> None:
    # setenv is not thread-safe (glibc may move and free the array a getenv walks, here the
    # one its setenv at import made): with another thread running, the standby installs a
    # new array in one store and leaves the old one as it was. What the import set stays.
    (tmp_path / "wm_getenv.py").write_text(GETENV_THREAD)
    (tmp_path / "probe.py").write_text(GETENV_PROBE)
    run_id = f"px-getenv-{os.getpid()}"
    done = _run("--rdzv-id", run_id, "--nproc-per-node", "2", "--preload", "wm_getenv",
                "probe.py", cwd=tmp_path, paths=(tmp_path,))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "preload: wm_getenv (on standbys)" in done.stderr
    seen = sorted((json.loads(line) for line in done.stdout.splitlines()),
                  key=lambda s: s["rank"])  # fmt: skip
    assert seen == [
        {"thread_sees": rank, "rank": rank, "child_sees": rank, "set_at_import": "kept",
         "old_array_intact": True, "swapped": True}
        for rank in ("0", "1")
    ]  # fmt: skip
    assert nothing_left(run_id)


# --- mistakes ------------------------------------------------------------------------------------


def test_a_module_name_that_is_not_there_is_a_did_you_mean_and_the_job_runs_cold(
    tmp_path: Path,
) -> None:
    (tmp_path / "wm_trainer_utils.py").write_text("")
    (tmp_path / "train.py").write_text(
        "import sys\nprint('ran', 'wm_trainer_utils' in sys.modules)\n"
    )
    run_id = f"px-typo-{os.getpid()}"
    done = _run("--rdzv-id", run_id, "--max-restarts", "1", "--preload", "wm_trainer_utlis",
                "train.py", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["ran False"]
    assert (
        "numarun: warning: --preload: no module named 'wm_trainer_utlis' where the workers "
        "import from (did you mean 'wm_trainer_utils'?); the job runs cold"
    ) in done.stderr.splitlines()
    assert "preload: wm_trainer_utlis (cold: " in done.stderr
    assert nothing_left(run_id)
    required = _run("--rdzv-id", run_id, "--preload-required", "--preload",
                    "wm_trainer_utlis", "train.py", cwd=tmp_path)  # fmt: skip
    assert (required.returncode, required.stdout) == (2, "")
    assert required.stderr.splitlines() == [
        "numarun: error: --preload-required: no module named 'wm_trainer_utlis' where the "
        "workers import from (did you mean 'wm_trainer_utils'?)"
    ]


def test_preload_required_makes_a_failed_import_an_error_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    # The module is there; its import fails in the standbys (an escape in the error's text):
    # one line, exit status 1, the worker it became torn down, nothing left.
    (tmp_path / "wm_broken.py").write_text("raise ImportError('no \\x1b[31mGPU\\x1b[0m here')\n")
    (tmp_path / "train.py").write_text("import time\nprint('ran', flush=True)\ntime.sleep(600)\n")
    runtime = _private(tmp_path / "rt")
    run_id = f"px-required-{os.getpid()}"
    done = _run(
        "--rdzv-id", run_id, "--max-restarts", "2", "--preload-required", "--preload",
        "wm_broken", "train.py", cwd=tmp_path, NUMARUN_RUNTIME_DIR=str(runtime),
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if not line.startswith("numarun: run ")]
    assert lines == [
        "numarun: error: --preload-required: local rank 0 could not import 'wm_broken' "
        "(ImportError: no \\x1b[31mGPU\\x1b[0m here)"
    ], done.stderr
    assert nothing_left(run_id)
    assert os.listdir(runtime) == []

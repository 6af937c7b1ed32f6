"""Acting on a failure imports nothing, so no import in progress elsewhere can break it (issue
24 item 1).

A failing job once ended with numarun's own traceback, ``partially initialized module 'typing'
has no attribute 'ClassVar'``: a background thread was importing the failure summary's modules
(``typing`` half made in ``sys.modules``) when the main thread, acting on the failure, created a
dataclass, which reads ``typing`` from ``sys.modules`` without the import lock. These tests
force that race (``typing`` held half made in another thread) and check the rule that removes
it: whatever a failure, a restart, a hang or the summary needs is imported in the main thread
before any failure is acted on, and nothing is imported in another thread.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
HARNESS = str(PROGRAMS / "cli_imports_watched.py")
RANK = str(PROGRAMS / "rank_fails_on_go.py")
TIMEOUT = 240  # generous: the suite runs at load averages of 10-30


def _env() -> dict[str, str]:
    return {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PET_", "SLURM_", "OMPI_", "TORCHELASTIC_"))
        and key not in ("MASTER_ADDR", "MASTER_PORT", "PYTHON_EXEC")
    }


def _launch(
    tmp_path: Path, name: str, hold: str, flags: list[str], mode: str, *, go_now: bool
) -> tuple[subprocess.CompletedProcess[str], list[tuple[str, str]]]:
    """Run the launcher under cli_imports_watched.py; (its result, the imports it made as (thread,
    module))."""
    log, go = tmp_path / f"{name}.log", tmp_path / f"{name}.go"
    if go_now:
        go.touch()
    done = subprocess.run(
        [sys.executable, HARNESS, str(log), str(go), hold, "--", "--nproc-per-node", "2",
         *flags, RANK, str(go), mode, "30"],
        capture_output=True, text=True, timeout=TIMEOUT, env=_env(),
    )  # fmt: skip
    imports = [tuple(line.split("\t", 1)) for line in log.read_text().splitlines() if line]
    return done, imports  # type: ignore[return-value]


def _numarun_traceback(stderr: str) -> list[str]:
    """Lines of stderr that show numarun's own code failing: a frame in numarun's package (the
    workers' tracebacks name rank_fails_on_go.py only; a checkout in a folder named numarun
    puts that word in their paths too), or the error itself."""
    import numarun

    package = str(Path(numarun.__file__).resolve().parent) + os.sep
    return [
        line
        for line in stderr.splitlines()
        if "partially initialized" in line or package in line or "AttributeError" in line
    ]


@pytest.mark.parametrize("flags", [[], ["--max-restarts", "1"]], ids=["one attempt", "restart"])
def test_a_failure_while_another_thread_imports_typing_ends_in_the_summary(
    tmp_path: Path, flags: list[str]
) -> None:
    # Any import of typing outside the main thread is held half made for the rest of the run;
    # rank 0 fails once that happened (or once the launcher prepares its failure path).
    done, imports = _launch(tmp_path, "race", "typing", flags, "fail", go_now=False)
    assert done.returncode == 1, done.stderr
    assert "Root cause: rank 0 (local_rank 0" in done.stderr
    assert "RuntimeError: rank 0 fails on purpose" in done.stderr
    assert _numarun_traceback(done.stderr) == []
    assert [name for thread, name in imports if thread != "MainThread"] == []


@pytest.mark.parametrize(
    "flags",
    [[], ["--max-restarts", "1"], ["--tee", "3"], ["--hang-timeout", "30"]],
    ids=["one attempt", "restart", "tee", "hang watch"],
)
def test_a_failure_imports_nothing_a_successful_run_does_not(
    tmp_path: Path, flags: list[str]
) -> None:
    ok, ok_imports = _launch(tmp_path, "ok", "-", flags, "ok", go_now=True)
    assert ok.returncode == 0, ok.stderr
    failed, failed_imports = _launch(tmp_path, "failed", "-", flags, "fail", go_now=True)
    assert failed.returncode == 1, failed.stderr
    assert "Root cause: rank 0 (local_rank 0" in failed.stderr
    # The failure path (the other ranks' stacks, the teardown, the restart, the summary)
    # imports nothing that the successful run had not imported too, all in the main thread.
    assert {name for _, name in failed_imports} - {name for _, name in ok_imports} == set()
    assert {thread for thread, _ in ok_imports + failed_imports} == {"MainThread"}


def test_a_hang_imports_nothing_a_successful_run_does_not(tmp_path: Path) -> None:
    flags = ["--hang-timeout", "1"]
    ok, ok_imports = _launch(tmp_path, "ok", "-", flags, "ok", go_now=True)
    assert ok.returncode == 0, ok.stderr
    hung, hung_imports = _launch(tmp_path, "hung", "-", flags, "sleep", go_now=True)
    assert hung.returncode == 124, hung.stderr
    assert "hung" in hung.stderr
    assert {name for _, name in hung_imports} - {name for _, name in ok_imports} == set()
    assert {thread for thread, _ in hung_imports} == {"MainThread"}


def test_a_teardown_signal_inside_an_import_is_acted_on_after_it(tmp_path: Path) -> None:
    # SIGTERM arrives while the main thread imports the failure path's modules with the
    # workers running: the handler only notes it (the loop's wake-up socket), the import
    # completes, and the teardown follows.
    done, imports = _launch(tmp_path, "signal", "sigterm", [], "sleep", go_now=False)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    assert _numarun_traceback(done.stderr) == []
    assert "numarun.launch.summary" in {name for _, name in imports}


SPAWN_PROGRAM = textwrap.dedent(
    """
    import os, sys
    import numarun

    def ok(rank):
        return rank

    def fails(rank):
        if rank == 0:
            raise RuntimeError("rank 0 fails on purpose")
        import time
        time.sleep(30)

    def exits(rank):
        os._exit(3 if rank == 0 else 0)

    if __name__ == "__main__":
        method = sys.argv[1]
        assert numarun.spawn(ok, nprocs=2, start_method=method) == [0, 1]
        before = set(sys.modules)
        for fn, error in ((fails, numarun.ProcessRaisedException),
                          (exits, numarun.ProcessExitedException)):
            try:
                numarun.spawn(fn, nprocs=2, start_method=method, grace_period=5)
            except error:
                pass
            else:
                raise SystemExit("no exception")
        print(sorted(set(sys.modules) - before))
    """
)


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_a_spawn_failure_imports_nothing_a_successful_spawn_did_not(
    tmp_path: Path, method: str
) -> None:
    program = tmp_path / "program.py"
    program.write_text(SPAWN_PROGRAM)
    done = subprocess.run(
        [sys.executable, str(program), method],
        capture_output=True, text=True, timeout=TIMEOUT, env=_env(), cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_looking_at_a_failed_spawn_worker_leaves_the_others_running_as_torch_does(
    tmp_path: Path, method: str
) -> None:
    # Issue 24 item 3: exitcode, is_alive() and join(0.05) of a failed worker used to make
    # numarun tear the other workers down; torch's only look, and so do numarun's now.
    pytest.importorskip("torch")
    reports = {}
    for library in ("torch", "numarun"):
        folder = tmp_path / library
        folder.mkdir()
        done = subprocess.run(
            [sys.executable, str(PROGRAMS / "failed_worker_poll.py"), library, method, str(folder)],
            capture_output=True, text=True, timeout=TIMEOUT, env=_env(), cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        reports[library] = json.loads(done.stdout.strip().splitlines()[-1])
    expected = {
        "exitcodes_read": [1, None],  # rank 0's 1 (every look), rank 1's None
        "second_alive": True,
        "second_signalled": False,
        "join": "ProcessRaisedException",
        "second_signalled_by_join": True,
        "second_alive_after_join": False,
    }
    assert reports == {"torch": expected, "numarun": expected}

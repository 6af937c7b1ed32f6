"""Warm workers (``--preload``): standbys born as their rank's worker, handed each attempt.

A warm worker's view (environment, argv, ``__main__``, sys.path, cwd, umask, binding, memory
policy, signals, limits, fds) is compared with a cold worker's, field by field, over the two
attempts of a restarting job, as a script and as ``-m``; every attempt of a job restarted three
times runs on standbys, and no standby is started that is not used; a module that cannot be
imported, and an import that initialised CUDA, are one warning line and the job runs cold; a
re-formed group whose local world size changed starts cold and says so; nothing is left after
success, failure, SIGTERM while standbys wait (next to running workers, and before any worker,
in a rendezvous) and a launcher killed by SIGKILL. Most tests preload ``tests/programs/
light_preload_module.py`` (it records which process imported it); one preloads torch.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from job_processes import nothing_left, processes_with_run_id
from numarun.cmdline.config import parse_args
from numarun.errors import UsageError
from numarun.placement.workerenv import free_port

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
VIEW = str(PROGRAMS / "worker_view.py")
SRC = str(Path(__file__).resolve().parents[2] / "src")
NUMARUN = [sys.executable, "-m", "numarun"]
LIMIT = 120.0  # generous: a shared machine at load 30 starts interpreters slowly


def _env(**extra: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PET_", "TORCHELASTIC_", "NUMARUN_", "SLURM_", "OMPI_"))
        and key not in ("MASTER_ADDR", "MASTER_PORT", "PYTHON_EXEC", "OMP_NUM_THREADS")
    }
    env["PYTHONPATH"] = os.pathsep.join([str(PROGRAMS), SRC])
    env.update(extra)
    return env


def _run(*argv: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*NUMARUN, *argv], capture_output=True, text=True, env=_env(**env), cwd=cwd,
        timeout=LIMIT,
    )  # fmt: skip


def _wait_for(condition: Callable[[], bool], what: str, limit: float = LIMIT) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


# --- the flag ------------------------------------------------------------------------------------


def test_preload_takes_module_names_each_once() -> None:
    config = parse_args(["--preload", " torch, transformers.models ,torch", "train.py"], {})
    assert config.preload == ("torch", "transformers.models")
    assert parse_args(["train.py"], {}).preload == ()
    for bad in ("", "torch,,x", "my-module", "torch.", "1torch"):
        with pytest.raises(UsageError, match="--preload takes comma-separated module names"):
            parse_args(["--preload", bad, "train.py"], {})


def test_preload_required_and_late_go_with_preload() -> None:
    config = parse_args(["--preload", "torch", "--preload-required", "--preload-late", "t.py"], {})
    assert (config.preload_required, config.preload_late) == (True, True)
    assert not parse_args(["--preload", "torch", "t.py"], {}).preload_required
    for flag in ("--preload-required", "--preload-late"):
        with pytest.raises(UsageError, match=f"^{flag} goes with --preload MODULES"):
            parse_args([flag, "t.py"], {})


def test_preload_with_no_python_is_refused_in_one_line() -> None:
    done = _run("--preload", "torch", "--no-python", "true")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "numarun: error: --preload imports Python modules ahead of Python workers; a "
        "--no-python binary has nothing to preload"
    ]


def test_the_dry_run_says_what_preload_does_and_starts_nothing(tmp_path: Path) -> None:
    done = _run(
        "--nproc-per-node", "2", "--preload", "light_preload_module", "--dry-run", VIEW,
        str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith(
        "preload: light_preload_module: one standby per local rank, started as its worker below"
    )
    assert "(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...)" in done.stdout.splitlines()[0]
    assert list(tmp_path.iterdir()) == []


# --- the view of a warm worker -------------------------------------------------------------------


def _views(out: Path, logs: Path) -> dict[str, dict]:
    """Each ``view.<attempt>.<rank>.json`` under ``out``, with what differs between any two
    launches by design made comparable: the run marker dropped, the log directory and the
    stack-dump directory (the launcher's pid) cut out."""
    views = {}
    for path in sorted(out.glob("view.*.json")):
        seen = json.loads(path.read_text())
        seen["environ"].pop("NUMARUN_RUN_ID")
        error_file = seen["environ"]["TORCHELASTIC_ERROR_FILE"]
        assert error_file.startswith(str(logs) + os.sep), error_file
        seen["environ"]["TORCHELASTIC_ERROR_FILE"] = error_file[len(str(logs)) :]
        seen["fds"] = [f"{fd.partition(':')[0]}:{os.path.basename(fd)}" for fd in seen["fds"]]
        views[path.name] = seen
    return views


@pytest.mark.parametrize("form", ["script", "module"])
def test_a_warm_workers_view_equals_a_cold_workers(tmp_path: Path, form: str) -> None:
    # Two launches of the same job, cold and with --preload: each rank bound to its own CPU
    # with a memory policy, two attempts (rank 0 fails the first), every field the worker can
    # see compared. Only the preloaded module itself may differ.
    run_id = f"wm-view-{form}-{os.getpid()}"
    port = str(free_port())
    entry = [VIEW] if form == "script" else ["-m", "worker_view"]
    cpus = sorted(os.sched_getaffinity(0))
    views = {}
    for mode in ("cold", "warm"):
        out, logs = tmp_path / "out", tmp_path / f"logs-{mode}"
        out.mkdir()
        flags = [
            "--nproc-per-node", "2", "--rank-cpus", str(cpus[0]), "--rank-cpus", str(cpus[-1]),
            "--mem-binding", "bind", "--max-restarts", "1", "--rdzv-id", run_id,
            "--master-port", port, "--log-dir", str(logs),
        ]  # fmt: skip
        if mode == "warm":
            flags += ["--preload", "light_preload_module"]
        done = _run(*flags, *entry, str(out), cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert ("preload: light_preload_module (on standbys)" in done.stderr) == (mode == "warm")
        views[mode] = _views(out, logs)
        out.rename(tmp_path / f"out-{mode}")
        assert nothing_left(run_id)
    cold, warm = views["cold"], views["warm"]
    assert sorted(cold) == sorted(warm) == [
        "view.0.0.json", "view.0.1.json", "view.1.0.json", "view.1.1.json",
    ]  # fmt: skip
    for name in cold:
        assert (cold[name].pop("light"), warm[name].pop("light")) == (False, True), name
        differing = {
            key: (cold[name][key], warm[name][key])
            for key in cold[name]
            if cold[name][key] != warm[name][key]
        }
        assert differing == {}, name
    first = warm["view.0.1.json"]
    assert first["rank_at_import"] == "1" and first["main_is_me"]
    assert first["affinity"] == [cpus[-1]] and first["mem_policy"][0] == "bind"
    assert "NUMARUN_PRELOAD" not in first["environ"]
    if form == "module":
        assert first["name"] == "__main__" and first["spec"][0] == "worker_view"
        assert first["argv"][0] == str(PROGRAMS / "worker_view.py")
    else:
        assert first["file"] == VIEW and first["path"][0] == str(PROGRAMS)


# --- restarts ------------------------------------------------------------------------------------

ATTEMPTS = textwrap.dedent(
    """\
    import json, os, sys, time
    start = time.monotonic()
    RANK, attempt = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
    with open(os.path.join(sys.argv[1], f"attempt.{attempt}.{RANK}"), "w") as file:
        json.dump({"pid": os.getpid(), "start": start,
                   "light": "light_preload_module" in sys.modules}, file)
    if RANK == "0":
        time.sleep(0.5)
        sys.exit(3)
    time.sleep(600)
    """
)


def test_every_attempt_of_a_restarting_job_runs_on_standbys_and_none_is_wasted(
    tmp_path: Path,
) -> None:
    # Four attempts, rank 0 failing in each: every worker of every attempt imported the
    # module in its own process before its script started, and no standby was started that
    # no attempt used (the last attempt, with no restart left, starts none). The job fails
    # with rank 0's status, leaving nothing.
    imports, out = tmp_path / "imports", tmp_path / "out"
    imports.mkdir()
    out.mkdir()
    script = tmp_path / "attempts.py"
    script.write_text(ATTEMPTS)
    run_id = f"wm-restarts-{os.getpid()}"
    done = _run(
        "--nproc-per-node", "2", "--max-restarts", "3", "--rdzv-id", run_id,
        "--preload", "light_preload_module", str(script), str(out), WM_IMPORTS=str(imports),
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert "preload: light_preload_module (on standbys)" in done.stderr
    assert "cold" not in done.stderr
    assert done.stderr.count("failed with exit code 3; restarting") == 3
    imported = {int(path.name): float(path.read_text()) for path in imports.iterdir()}
    workers = [json.loads(path.read_text()) for path in sorted(out.iterdir())]
    assert len(workers) == 8  # 4 attempts of 2 ranks
    for worker in workers:
        assert worker["light"] and worker["pid"] in imported
        assert imported[worker["pid"]] < worker["start"]
    assert sorted(imported) == sorted(worker["pid"] for worker in workers)
    assert nothing_left(run_id)


def test_a_module_that_cannot_be_imported_is_one_warning_and_the_job_runs_cold(
    tmp_path: Path,
) -> None:
    # The module is there (the launcher finds it) but its import fails in the standbys; the
    # exception's text, with a terminal escape in it, is shown escaped.
    out, modules = tmp_path / "out", tmp_path / "modules"
    out.mkdir()
    modules.mkdir()
    (modules / "wm_broken_module.py").write_text(
        "raise ImportError('needs libfoo \\x1b[31mred\\x1b[0m')\n"
    )
    run_id = f"wm-missing-{os.getpid()}"
    done = _run(
        "--nproc-per-node", "2", "--max-restarts", "1", "--rdzv-id", run_id,
        "--preload", "light_preload_module,wm_broken_module", VIEW, str(out),
        PYTHONPATH=os.pathsep.join([str(PROGRAMS), str(modules), SRC]),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1, done.stderr
    assert (
        "could not import 'wm_broken_module' (ImportError: needs libfoo \\x1b[31mred\\x1b[0m)"
    ) in warnings[0]
    assert "\x1b" not in done.stderr
    assert warnings[0].endswith("; the job runs cold")
    # Cold: the attempts' workers did not import the module that did import either.
    views = [json.loads(path.read_text()) for path in out.glob("view.*.json")]
    assert len(views) == 4 and not any(view["light"] for view in views)
    assert nothing_left(run_id)


def test_a_preload_that_initialises_cuda_is_refused_and_the_job_runs_cold(
    tmp_path: Path,
) -> None:
    # A stand-in for torch whose import leaves CUDA initialised (a GPU context held): the
    # standby says so, and the worker becomes its rank's cold worker (exec'd anew).
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("from . import cuda\n")
    (fake / "cuda.py").write_text("def is_initialized():\n    return True\n")
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "probe.py"
    script.write_text(
        "import os, sys\n"
        "print('worker', os.environ['RANK'], 'torch' in sys.modules, flush=True)\n"
    )
    run_id = f"wm-cuda-{os.getpid()}"
    done = _run(
        "--nproc-per-node", "1", "--rdzv-id", run_id, "--preload", "torch", str(script),
        PYTHONPATH=os.pathsep.join([str(tmp_path / "fake"), SRC]),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["worker 0 False"]
    warnings = [line for line in done.stderr.splitlines() if "warning" in line]
    assert warnings == [
        "numarun: warning: --preload: importing 'torch' initialised CUDA in local rank 0's "
        "standby (a standby only imports, it must never hold a GPU); the job runs cold"
    ]
    assert nothing_left(run_id)


# --- teardown ------------------------------------------------------------------------------------

SLEEPER = textwrap.dedent(
    """\
    import os, time
    # One write: print() writes the line and its end apart, and two ranks' halves would mix.
    os.write(1, f"ready {os.environ['RANK']} {os.getpid()}\\n".encode())
    time.sleep(600)
    """
)


def _ready_pids(proc: subprocess.Popen[str], count: int) -> dict[int, int]:
    """rank -> pid from the workers' ``ready <rank> <pid>`` lines (read from the raw fd, so
    that nothing waits unseen in a file object's buffer)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    pids: dict[int, int] = {}
    pending = b""
    deadline = time.monotonic() + LIMIT
    while len(pids) < count:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 1) if ready else b""  # byte by byte: never past the last line
        if not chunk:
            proc.kill()
            _, err = proc.communicate()
            raise AssertionError(f"no ready lines ({pids}): {proc.returncode} {err}")
        pending += chunk
        if chunk == b"\n":
            words = pending.decode().split()
            pending = b""
            if words[:1] == ["ready"]:
                pids[int(words[1])] = int(words[2])
    return pids


def _standbys(run_id: str, workers: set[int]) -> set[int]:
    """The job's processes that are not its workers: its waiting standbys."""
    return set(processes_with_run_id(run_id)) - workers


@pytest.mark.parametrize("ending", ["SIGTERM", "SIGKILL"])
def test_standbys_waiting_beside_running_workers_are_no_ranks_and_leave_nothing(
    tmp_path: Path, ending: str
) -> None:
    # Two workers run, two standbys wait for the next attempt: `numarun stacks` shows the two
    # ranks only; a SIGTERM ends all four (exit 143), and so does a SIGKILL of the launcher
    # (through the watchdogs).
    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    run_id = f"wm-{ending.lower()}-{os.getpid()}"
    env = _env(NUMARUN_RUNTIME_DIR=str(runtime))
    proc = subprocess.Popen(
        [*NUMARUN, "--nproc-per-node", "2", "--max-restarts", "1", "--rdzv-id", run_id,
         "--preload", "light_preload_module", str(script)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        workers = set(_ready_pids(proc, 2).values())
        _wait_for(lambda: len(_standbys(run_id, workers)) == 2, "the next standbys")
        standbys = _standbys(run_id, workers)
        if ending == "SIGTERM":
            stacks = subprocess.run(
                [*NUMARUN, "stacks", run_id, "--json"], capture_output=True, text=True,
                env=env, timeout=LIMIT,
            )  # fmt: skip
            assert stacks.returncode == 0, stacks.stderr
            document = json.loads(stacks.stdout)
            assert {rank["pid"] for rank in document["ranks"]} == workers
            assert not standbys & {rank["pid"] for rank in document["ranks"]}
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=LIMIT)
            assert proc.returncode == 128 + signal.SIGTERM, err
        else:
            proc.kill()
            proc.communicate(timeout=LIMIT)
        assert nothing_left(run_id)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for pid in processes_with_run_id(run_id):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("late", [False, True])
def test_sigterm_while_standbys_wait_for_the_rendezvous_leaves_nothing(
    tmp_path: Path, late: bool
) -> None:
    # One node of two in a c10d rendezvous: the standbys start at once, the first attempt's
    # and the next one's (a torch rendezvous may re-form the group at any time; with
    # --preload-late the first attempt's only), and wait with the launcher for the other
    # node, which never comes; a SIGTERM ends them all.
    pytest.importorskip("torch")
    run_id = f"wm-rdzv-{late}-{os.getpid()}"
    proc = subprocess.Popen(
        [*NUMARUN, "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
         "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", run_id,
         "--preload", "light_preload_module", *(["--preload-late"] if late else []), VIEW,
         str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
    )  # fmt: skip
    try:
        wanted = 2 if late else 4
        _wait_for(lambda: len(processes_with_run_id(run_id)) == wanted, "the standbys")
        time.sleep(0.5)  # no more come
        assert len(processes_with_run_id(run_id)) == wanted
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=LIMIT)
        assert proc.returncode == 128 + signal.SIGTERM, err
        assert "no worker was running" in err
        assert nothing_left(run_id)
        assert not list(tmp_path.glob("view.*"))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for pid in processes_with_run_id(run_id):
            os.kill(pid, signal.SIGKILL)


# --- a group re-formed with another local world size ---------------------------------------------

REFORM = textwrap.dedent(
    """\
    import os, sys
    from numarun.launch import attempts as job_module, launcher
    from numarun.launch import workersetup as workers
    from numarun.rendezvous import torchrdzv as elastic
    from numarun.rendezvous.round import Round, WorkerPlace
    from numarun.placement.workerenv import free_port

    out = sys.argv[1]
    JOBS = []
    init = job_module.Job.__init__

    def remember(self, *args, **kwargs):
        init(self, *args, **kwargs)
        JOBS.append(self)

    job_module.Job.__init__ = remember

    class Node:
        # A torch rendezvous stand-in: round 1 re-forms once both workers started; round 2
        # gives this node three local ranks (torch's rendezvous never changes them; this
        # stands for a launch whose standbys were born for another local world size).
        where = "a stand-in rendezvous"
        verdict = None  # no hang verdict ever reaches this node
        ended_elsewhere = None  # nor another node's failure
        watch = diagnostics = None

        class waiting:  # where the waits' status goes (numarun stacks on a waiting job)
            on_change = None

        def __init__(self, config):
            self.change, self.rounds = None, 0

        def connect(self):
            pass

        def next_round(self):
            self.rounds += 1
            self.change = None
            job = JOBS[0]
            if self.rounds == 2:
                job.config = job.config.replace(nproc_per_node=3)
                job.outputs = workers.output_levels(job.config)
                job.mem_policies = [None] * 3
            n = job.config.nproc_per_node
            places = tuple(WorkerPlace(rank, rank, n, n) for rank in range(n))
            return Round(0, 1, "127.0.0.1", free_port(), places)

        def begin_watch(self, supervisor):
            if self.rounds != 1:
                return

            def look():
                started = [name for name in os.listdir(out) if name.startswith("2.")]
                if len(started) == 2 and self.change is None:
                    self.change = elastic.Change(elastic.REJOIN, "a node joined")
                    supervisor.request_stop(self.change.reason)

            supervisor.call_every(0.05, look)

        def unwatch(self):
            pass

        def guarded(self, what, call, *args):
            return call(*args)

        def on_worker_failure(self, ended, dumps=None):
            pass

        def finish(self, succeeded):
            return None

        def announce_and_linger(self, message):
            pass

        def close(self):
            pass

    elastic.ElasticNode = Node
    sys.exit(launcher.main(sys.argv[2:]))
    """
)

STAY = textwrap.dedent(
    """\
    import os, sys, time
    out = sys.argv[1]
    name = f"{os.environ['LOCAL_WORLD_SIZE']}.{os.environ['RANK']}"
    with open(os.path.join(out, name), "w") as file:
        file.write("warm" if "light_preload_module" in sys.modules else "cold")
    if os.environ["LOCAL_WORLD_SIZE"] == "2":
        time.sleep(600)  # until the group re-forms
    """
)


def test_a_group_re_formed_with_another_local_world_size_starts_cold_and_says_so(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "reform.py").write_text(REFORM)
    (tmp_path / "stay.py").write_text(STAY)
    run_id = f"wm-reform-{os.getpid()}"
    done = subprocess.run(
        [sys.executable, str(tmp_path / "reform.py"), str(out), "--nproc-per-node", "2",
         "--rdzv-backend", "c10d", "--rdzv-id", run_id, "--preload", "light_preload_module",
         str(tmp_path / "stay.py"), str(out)],
        capture_output=True, text=True, env=_env(), timeout=LIMIT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = {path.name: path.read_text() for path in out.iterdir()}
    assert seen == {
        "2.0": "warm", "2.1": "warm",  # the first round, on standbys
        "3.0": "cold", "3.1": "cold", "3.2": "cold",  # three local ranks: cold
    }, done.stderr  # fmt: skip
    assert "preload: light_preload_module (on standbys)" in done.stderr
    assert (
        "numarun: attempt_0.1: cold start: the local world size changed from 2 to 3, which "
        "standbys are born with"
    ) in done.stderr
    assert nothing_left(run_id)


# --- torch ---------------------------------------------------------------------------------------


def test_torch_preloaded_workers_start_past_import_torch_without_cuda(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "torch_worker.py"
    script.write_text(
        "import os, sys\n"
        "loaded = 'torch' in sys.modules\n"
        "import torch\n"
        "attempt = os.environ['TORCHELASTIC_RESTART_COUNT']\n"
        "print('attempt', attempt, loaded, torch.cuda.is_initialized(), flush=True)\n"
        "sys.exit(3 if attempt == '0' else 0)\n"
    )
    run_id = f"wm-torch-{os.getpid()}"
    done = _run(
        "--nproc-per-node", "1", "--max-restarts", "1", "--rdzv-id", run_id, "--preload",
        "torch", str(script),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["attempt 0 True False", "attempt 1 True False"]
    assert "preload: torch (on standbys)" in done.stderr
    assert nothing_left(run_id)


STAMP = textwrap.dedent(
    """\
    import os, time
    with open(os.path.join(os.environ["WM_OUT"], f"{__name__}.{os.getpid()}"), "w") as file:
        file.write(repr(time.monotonic()))
    """
)
EARLY = textwrap.dedent(
    """\
    import os, sys, time
    start = time.monotonic()
    out, attempt = os.environ["WM_OUT"], os.environ["TORCHELASTIC_RESTART_COUNT"]
    with open(os.path.join(out, f"start.{attempt}.{os.getpid()}"), "w") as file:
        file.write(repr(start))
    if attempt == "0":
        # One second after its start, or once one import time has passed since the launch
        # (both sets of standbys past torch) on a machine too loaded for one second.
        time.sleep(1.0)
        while len([n for n in os.listdir(out) if n.startswith("wm_ready.")]) < 2:
            time.sleep(0.01)
        with open(os.path.join(out, "failed"), "w") as file:
            file.write(repr(time.monotonic()))
        sys.exit(1)
    """
)


@pytest.mark.parametrize("backend", ["static", "c10d"])
def test_a_failure_a_second_into_the_first_attempt_restarts_on_waiting_standbys(
    tmp_path: Path, backend: str
) -> None:
    # The next attempt's standbys start at launch beside the first attempt's, on every
    # backend (on c10d, before the launcher's own torch import and the rendezvous): when the
    # first attempt's worker fails a second after its start, they are past `import torch`
    # already, and the restart is a hand-over.
    pytest.importorskip("torch")
    out = tmp_path / "out"
    out.mkdir()
    for name in ("wm_born", "wm_ready"):
        (tmp_path / f"{name}.py").write_text(STAMP)
    (tmp_path / "early.py").write_text(EARLY)
    run_id = f"wm-early-{backend}-{os.getpid()}"
    flags = ["--rdzv-id", run_id, "--max-restarts", "1", "--preload", "wm_born,torch,wm_ready"]
    if backend == "c10d":
        flags += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
    done = _run(*flags, str(tmp_path / "early.py"), WM_OUT=str(out),
                PYTHONPATH=os.pathsep.join([str(tmp_path), SRC]))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "preload: wm_born, torch, wm_ready (on standbys)" in done.stderr
    assert "cold" not in done.stderr
    stamps = {path.name: float(path.read_text()) for path in out.iterdir()}
    (first,) = [name for name in stamps if name.startswith("start.0.")]
    (second,) = [name for name in stamps if name.startswith("start.1.")]
    pid = second.rsplit(".", 1)[1]
    # The second attempt's worker was born before the first attempt's script started, and
    # past its imports before the failure: nothing was imported after it.
    assert stamps[f"wm_born.{pid}"] < stamps[first]
    assert stamps[f"wm_ready.{pid}"] < stamps["failed"] < stamps[second]
    assert nothing_left(run_id)


# --- numarun.spawn -------------------------------------------------------------------------------

FORKSERVER = textwrap.dedent(
    """\
    import multiprocessing, sys
    import numarun

    def target(rank):
        assert "light_preload_module" in sys.modules, "not preloaded"

    if __name__ == "__main__":
        multiprocessing.set_forkserver_preload(["light_preload_module"])
        numarun.spawn(target, nprocs=2, start_method="forkserver")
        print("preloaded")
    """
)


def test_spawn_under_forkserver_takes_multiprocessings_own_preload(tmp_path: Path) -> None:
    # Why numarun.spawn has no preload= of its own: multiprocessing's fork server imports what
    # set_forkserver_preload names once, and every worker numarun.spawn starts there has it.
    script = tmp_path / "spawn_preload.py"
    script.write_text(FORKSERVER)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=_env(),
        timeout=LIMIT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["preloaded"]

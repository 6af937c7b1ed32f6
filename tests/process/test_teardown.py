"""Teardown that never touches another process and leaves none of the job's behind.

Each test makes the situation real: strangers given a dead worker's pid in a pid namespace,
another user's process carrying the run marker, daemons that detach every way they can, jobs
inside jobs, an empty PATH, stopped processes. A test's own processes are killed in its
``finally`` (by pidfd, so that only they are hit).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

import numarun
from job_processes import processes_with_env
from numarun.process.spec import WorkerSpec
from numarun.process.supervisor import Supervisor
from programs import teardown_spawn_funcs

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
PY = sys.executable
ENV = {key: value for key, value in os.environ.items() if key != "NUMARUN_RUN_ID"}
NUMARUN = [PY, "-m", "numarun"]
START_LIMIT = 90.0  # the machine is shared: starts can be slow
GONE_LIMIT = 10.0  # every process of a job must be gone this long after its end


def launcher_env(**extra: str) -> dict[str, str]:
    env = dict(ENV)
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("PET_NPROC_PER_NODE", None)
    env.update(extra)
    return env


def wait_for(condition: Callable[[], bool], limit: float = START_LIMIT) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.02)


def pids_in(directory: Path, prefix: str) -> list[int]:
    """The pids of the files ``directory/<prefix>.<pid>[.<anything>]`` (escaping_daemons.py's
    notes)."""
    names = [path.name for path in directory.glob(f"{prefix}.*")]
    return sorted(int(name.split(".")[1]) for name in names if not name.endswith(".tmp"))


def survivors(pids: Iterable[int], limit: float = GONE_LIMIT) -> list[int]:
    """The pids still running ``limit`` seconds from now (a zombie has ended); each is then
    SIGKILLed through its pidfd, so that the test leaves nothing and hits nothing else."""
    pidfds = {}
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            pidfds[pid] = os.pidfd_open(pid)
    try:
        deadline = time.monotonic() + limit
        pending = dict(pidfds)
        while pending:  # at least one look, also with limit 0
            wait = min(0.05, max(0.0, deadline - time.monotonic()))
            ready, _, _ = select.select(list(pending.values()), [], [], wait)
            pending = {pid: fd for pid, fd in pending.items() if fd not in ready}
            if time.monotonic() >= deadline:
                break
        survived = []
        for pid, fd in pending.items():
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except ProcessLookupError:
                continue  # it ended between the last look and now: not a survivor
            survived.append(pid)
        return sorted(survived)
    finally:
        for fd in pidfds.values():
            os.close(fd)


def zombie_children() -> list[int]:
    me = str(os.getpid())
    found = []
    for name in os.listdir("/proc"):
        with contextlib.suppress(OSError, IndexError):
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
            if fields[1] == me and fields[0] == "Z":
                found.append(int(name))
    return found


def carrying(token: str) -> list[int]:
    """The live processes whose environment holds ``TD_TOKEN=<token>``."""
    return processes_with_env(f"TD_TOKEN={token}")


def lines_of(stream: object, count: int, prefix: str, limit: float = START_LIMIT) -> list[str]:
    """Read lines from a Popen pipe until ``count`` of them start with ``prefix``."""
    fd = stream.fileno()  # type: ignore[attr-defined]
    lines: list[str] = []
    pending = b""
    deadline = time.monotonic() + limit
    while sum(line.startswith(prefix) for line in lines) < count:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"timed out: {lines}"
        chunk = os.read(fd, 65536)
        assert chunk, f"ended early: {lines}"
        pending += chunk
        *new, pending = pending.split(b"\n")
        lines += [line.decode() for line in new]
    return lines


# --- item 1: a reused pid never makes numarun signal a stranger ---------------------------------


def _unshare() -> list[str]:
    unshare = shutil.which("unshare")
    assert unshare is not None, "util-linux's unshare builds the pid namespace fixture"
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return [unshare, *user, "--pid", "--fork", "--mount-proc"]


@pytest.mark.parametrize("mode", ["fail", "kill"])
def test_strangers_reusing_ended_workers_pids_are_never_signalled(
    mode: str, tmp_path: Path
) -> None:
    """In a pid namespace, a stranger is forked with ns_last_pid set so that it gets an ended
    worker's pid if that pid is free, and makes it its session and group id (a shell, another
    job's worker). Whether the supervisor tears down (a failure) or the watchdog does (the
    launcher SIGKILLed), neither the stranger nor a member of its session gets any signal."""
    report = subprocess.run(
        [*_unshare(), PY, str(PROGRAMS / "pidns_teardown_strangers.py"), mode, str(tmp_path)],
        env=launcher_env(),
        capture_output=True,
        timeout=180,
        check=True,
    )
    result = json.loads(report.stdout.decode().splitlines()[-1])
    assert len(result["strangers"]) == 4
    for stranger in result["strangers"]:
        assert stranger["signals"] == [] and stranger["alive"], result
        # The pid could not be had: the ended worker still held it (a zombie of the watchdog).
        assert stranger["pid"] != stranger["wanted"], result
    assert result["job_left"] == []


# --- item 3: another user's process with the run marker ------------------------------------------

OUTSIDER = (
    "import os, signal, sys, time\n"
    "uid = int(sys.argv[1])\n"
    "if uid != os.getuid(): os.setresuid(uid, uid, uid)\n"
    "def record(signum, frame):\n"
    "    os.write(1, b'%d\\n' % signum)\n"
    "for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCONT):\n"
    "    signal.signal(signum, record)\n"
    "os.write(1, b'ready %d\\n' % os.getuid())\n"
    "time.sleep(120)\n"
)


def outsider(run_id: str, uid: int) -> subprocess.Popen[bytes]:
    """A process outside the run (our child) with the run's marker, running as ``uid``."""
    env = {**ENV, "NUMARUN_RUN_ID": run_id}
    process = subprocess.Popen([PY, "-c", OUTSIDER, str(uid)], env=env, stdout=subprocess.PIPE)
    assert process.stdout is not None
    assert lines_of(process.stdout, 1, "ready") == [f"ready {uid}"]
    return process


def outsider_report(process: subprocess.Popen[bytes]) -> tuple[bool, bytes]:
    """(still running, what it recorded); ends it."""
    alive = process.poll() is None
    process.kill()
    output, _ = process.communicate()
    return alive, output


needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="a second uid needs root (setuid in the child)"
)


# Exits 3 once the file named by its argument exists (at most 300 s from now).
FAIL_WHEN_TOLD = (
    "import os, sys, time\n"
    "deadline = time.monotonic() + 300\n"
    "while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:\n"
    "    time.sleep(0.01)\n"
    "sys.exit(3)\n"
)


@needs_root
@pytest.mark.parametrize("start", ["exec", "forkserver"])
def test_another_users_process_with_the_marker_is_never_signalled(
    start: str, tmp_path: Path
) -> None:
    """As root: a process of uid 65534 carrying NUMARUN_RUN_ID=<this run> survives the
    teardown untouched. In a forkserver run, where the marker does count, a process of root's
    carrying it is torn down with the run (so it is the uid that spares the other). Both start
    once the run has: a process older than the run cannot be one of its own, and is never
    looked at. The failure that tears the run down comes once both run (a worker told so),
    never on a clock their start could outlast under load: the teardown must find them."""
    target = teardown_spawn_funcs.sleep_target if start == "forkserver" else None
    argv = None if target else [PY, "-c", "import time; time.sleep(120)"]
    told = tmp_path / "fail now"
    sup = Supervisor(
        [
            WorkerSpec(0, 0, ENV, argv=argv, start=start, fork_target=target),
            WorkerSpec(1, 1, ENV, argv=[PY, "-c", FAIL_WHEN_TOLD, str(told)]),
        ],
        grace_period=2.0,
    )
    stranger = ours = None
    try:
        sup.start()
        stranger = outsider(sup.run_id, 65534)
        ours = outsider(sup.run_id, 0) if start == "forkserver" else None
        told.touch()
        result = sup.wait()
        assert result is not None and result.workers[1].exit_code == 3
        assert outsider_report(stranger) == (True, b"")
        if ours is not None:
            assert ours.wait(timeout=GONE_LIMIT) is not None
    finally:
        for process in (stranger, ours):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()


def watchdog_of(host: int) -> int:
    """The watchdog of the supervisor in process ``host``: its child that is a copy of it (the
    fork server and the resource tracker, its other children, run other command lines)."""
    with open(f"/proc/{host}/cmdline", "rb") as command:
        cmdline = command.read()
    for task in os.listdir(f"/proc/{host}/task"):
        with open(f"/proc/{host}/task/{task}/children") as listing:
            children = listing.read().split()
        for child in children:
            with contextlib.suppress(OSError), open(f"/proc/{child}/cmdline", "rb") as command:
                if command.read() == cmdline:
                    return int(child)
    raise AssertionError(f"no watchdog among the children of {host}")


@needs_root
def test_the_watchdog_spares_another_users_process_with_the_marker() -> None:
    """The supervisor is SIGKILLed during a forkserver run (the watchdog then kills marked
    processes of root's): the marked process of uid 65534 is not touched. It is looked at once
    the watchdog has exited, after everything it kills (not after a fixed time, which a loaded
    machine can outlast: the look would come before the watchdog's and prove nothing)."""
    host = subprocess.Popen(
        [PY, str(PROGRAMS / "teardown_supervisor_host.py"), "forkserver", "1"],
        stdout=subprocess.PIPE,
        env=launcher_env(),
    )
    assert host.stdout is not None
    stranger: subprocess.Popen[bytes] | None = None
    worker = 0
    try:
        lines = lines_of(host.stdout, 1, "W ")
        run_id = next(line.split()[1] for line in lines if line.startswith("R "))
        worker = int(next(line.split()[1] for line in lines if line.startswith("W ")))
        stranger = outsider(run_id, 65534)
        watchdog = os.pidfd_open(watchdog_of(host.pid))
        try:
            host.kill()
            host.wait()
            ended, _, _ = select.select([watchdog], [], [], START_LIMIT)
            assert ended, "the watchdog did not exit after its supervisor's death"
        finally:
            os.close(watchdog)
        assert survivors([worker]) == []
        assert outsider_report(stranger) == (True, b"")
    finally:
        host.kill()
        host.wait()
        host.stdout.close()
        if stranger is not None and stranger.poll() is None:
            stranger.kill()
            stranger.wait()
        survivors([worker], limit=0)


# --- item 4: processes that detach every way they can ------------------------------------------


@pytest.mark.parametrize("mode", ["fail", "exit", "kill"])
def test_detached_processes_end_with_the_job(mode: str, tmp_path: Path) -> None:
    """Each worker leaves a daemon (double fork, setsid, exec with an empty environment: no
    run marker) and a Popen(start_new_session=True, env={}) child. None survives a failure, a
    success, or the launcher's SIGKILL."""
    escape = str(PROGRAMS / "escaping_daemons.py")
    worker_mode = "stay" if mode == "kill" else mode
    job = subprocess.Popen(
        [*NUMARUN, "--nproc-per-node", "2", escape, str(tmp_path), worker_mode],
        env=launcher_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    escapees: list[int] = []
    try:
        wait_for(lambda: len(pids_in(tmp_path, "ready")) == 2)
        escapees = pids_in(tmp_path, "escapee")
        assert len(escapees) == 4
        if mode == "kill":
            job.kill()
        code = job.wait(timeout=START_LIMIT)
        assert code == {"fail": 1, "exit": 0, "kill": -signal.SIGKILL}[mode]
        assert survivors(escapees + pids_in(tmp_path, "worker")) == []
    finally:
        job.kill()
        job.wait()
        survivors(escapees, limit=0)


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_spawn_leaves_no_detached_process_and_no_zombie(method: str, tmp_path: Path) -> None:
    """numarun.spawn: the escapees of workers that returned are torn down, and none of them
    ends as a zombie of the caller's process (it is never their reaper)."""
    escapees: list[int] = []
    try:
        pids = numarun.spawn(
            teardown_spawn_funcs.escape_then_return,
            args=(str(tmp_path),),
            nprocs=2,
            start_method=method,
        )
        assert len(pids) == 2
        escapees = pids_in(tmp_path, "escapee")
        assert len(escapees) == 4
        assert survivors(escapees) == []
        assert zombie_children() == []
    finally:
        survivors(escapees, limit=0)


@pytest.mark.slow
def test_torchrun_and_torch_multiprocessing_leave_the_same_processes_running(
    tmp_path: Path,
) -> None:
    """The README's row, side by side: the same escapees outlive a failed torchrun job and a
    successful torch.multiprocessing.spawn (numarun ends them: the tests above)."""
    import torch.multiprocessing

    under_torchrun, under_mp = tmp_path / "torchrun", tmp_path / "mp"
    under_torchrun.mkdir()
    under_mp.mkdir()
    escapees: list[int] = []
    try:
        torchrun = [PY, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
        job = subprocess.run(
            [*torchrun, str(PROGRAMS / "escaping_daemons.py"), str(under_torchrun), "fail"],
            env=launcher_env(OMP_NUM_THREADS="1", TMPDIR=str(tmp_path)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=START_LIMIT,
        )
        assert job.returncode != 0
        escapees = pids_in(under_torchrun, "escapee")
        assert len(escapees) == 4
        torch.multiprocessing.spawn(
            teardown_spawn_funcs.escape_then_return, args=(str(under_mp),), nprocs=2
        )
        escapees += pids_in(under_mp, "escapee")
        assert len(escapees) == 8
        assert survivors(escapees, limit=1.0) == escapees  # (then killed by survivors())
    finally:
        survivors(escapees, limit=0)


def test_fork_workers_get_the_callers_state_not_the_watchdogs() -> None:
    """Fork workers are forks of the watchdog: they must not inherit what the watchdog sets
    for itself (its garbage collection off, its process group, its subreaper flag)."""
    states = numarun.spawn(teardown_spawn_funcs.process_state, nprocs=2, start_method="fork")
    assert states == [(gc.isenabled(), False, True)] * 2


# --- item 5: jobs inside jobs --------------------------------------------------------------------


def test_nested_jobs_leave_nothing_when_the_outer_launcher_is_killed(tmp_path: Path) -> None:
    """Outer rank 0 becomes an inner numarun launcher, outer rank 1 calls numarun.spawn; each
    of their 4 workers leaves two detached escapees. SIGKILL the outer launcher: the inner
    launcher, the spawn caller, both inner watchdogs, the inner workers and every escapee end."""
    token = os.urandom(8).hex()
    job = subprocess.Popen(
        [*NUMARUN, "--nproc-per-node", "2", str(PROGRAMS / "nested_job.py"), str(tmp_path)],
        env=launcher_env(TD_TOKEN=token),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    everyone: list[int] = []
    try:
        wait_for(lambda: len(pids_in(tmp_path, "ready")) == 2)  # the inner launcher's workers
        wait_for(lambda: len(pids_in(tmp_path, "spawned")) == 2)  # spawn's
        escapees = pids_in(tmp_path, "escapee")
        assert len(escapees) == 8
        everyone = sorted({*escapees, *pids_in(tmp_path, "worker"), *carrying(token)})
        everyone.remove(job.pid)
        assert len(everyone) >= 8 + 4 + 2 + 2  # + inner workers, outer workers, watchdogs
        job.kill()
        job.wait()
        assert survivors(everyone) == []
        assert carrying(token) == []
    finally:
        job.kill()
        job.wait()
        survivors(everyone, limit=0)
        survivors(carrying(token), limit=0)


# --- item 6: the watchdog needs nothing on PATH --------------------------------------------------


def test_the_watchdog_works_with_an_empty_path() -> None:
    """PATH is empty for the supervisor and its workers; SIGKILL the supervisor: the workers'
    children in new sessions and the double-forked ones (found only by the watchdog, whose
    former version ran grep and sleep from PATH) all end."""
    host = subprocess.Popen(
        [PY, str(PROGRAMS / "supervisor_host.py"), "2"],
        stdout=subprocess.PIPE,
        env=launcher_env(PATH=""),
    )
    assert host.stdout is not None
    pids: list[int] = []
    try:
        lines = lines_of(host.stdout, 8, ("W ", "G "))  # type: ignore[arg-type]
        pids = [int(line.split()[1]) for line in lines if line[:2] in ("W ", "G ")]
        host.kill()
        host.wait()
        assert survivors(pids, limit=5.0) == []
    finally:
        host.kill()
        host.wait()
        host.stdout.close()
        survivors(pids, limit=0)


# --- item 7: stopped processes -------------------------------------------------------------------

ON_TERM = (
    "import os, signal, sys, time\n"
    "def on_term(signum, frame):\n"
    "    open(os.path.join(sys.argv[1], sys.argv[2]), 'w').close()\n"
    "    os._exit(0)\n"
    "signal.signal(signal.SIGTERM, on_term)\n"
)
STOPPED_WORKER = ON_TERM + (
    "import subprocess\n"
    "child = subprocess.Popen([sys.executable, '-c', sys.argv[3], sys.argv[1], 'child-term',"
    " ''], start_new_session=True, stdout=subprocess.PIPE)\n"
    "child.stdout.readline()\n"
    "print('ready', child.pid, flush=True)\n"
    "while True:\n"
    "    time.sleep(1)\n"
)
STOPPED_CHILD = ON_TERM + "print('up', flush=True)\nwhile True:\n    time.sleep(1)\n"


class Lines:
    """An OutputSink that calls ``on_line`` for each whole line."""

    def __init__(self, on_line: Callable[[str], None]) -> None:
        self.on_line = on_line
        self.pending = b""

    def feed(self, data: bytes) -> None:
        self.pending += data
        *lines, self.pending = self.pending.split(b"\n")
        for line in lines:
            self.on_line(line.decode())

    def close(self) -> None:
        pass


def test_stopped_processes_act_on_the_stop_signal_at_once(tmp_path: Path) -> None:
    """A worker and its new-session child are SIGSTOPped, then another worker fails. Both run
    their SIGTERM handler at once, not when the 20 s grace period ends in SIGKILL."""
    stopped: list[int] = []

    def on_line(line: str) -> None:
        if line.startswith("ready "):
            stopped.extend([sup.pids()[0], int(line.split()[1])])
            for pid in stopped:
                os.kill(pid, signal.SIGSTOP)
            (tmp_path / "go").touch()

    fail_later = (
        "import os, sys, time\n"
        "while not os.path.exists(sys.argv[1]): time.sleep(0.02)\n"
        "sys.exit(5)\n"
    )
    sup = Supervisor(
        [
            WorkerSpec(
                0,
                0,
                ENV,
                argv=[PY, "-c", STOPPED_WORKER, str(tmp_path), "worker-term", STOPPED_CHILD],
                stdout=Lines(on_line),
            ),
            WorkerSpec(1, 1, ENV, argv=[PY, "-c", fail_later, str(tmp_path / "go")]),
        ],
        grace_period=20.0,
    )
    try:
        sup.start()
        result = sup.wait()
        assert result is not None
        failed_at = result.workers[1].ended_at
        ended_at = result.workers[0].ended_at
        assert failed_at is not None and ended_at is not None
        assert ended_at - failed_at < 10.0, "the stopped worker waited for SIGKILL"
        assert (tmp_path / "worker-term").exists() and (tmp_path / "child-term").exists()
        assert result.workers[0].exit_code == 0 and result.workers[1].exit_code == 5
    finally:
        sup.stop(grace_period=0)
        survivors(stopped, limit=0)

"""Stacks of real jobs: ``numarun stacks`` on a running gloo job, ``--hang-timeout``, the stacks
shown at a failure, numarun.spawn and ``-m`` workers, and that no other user can get stacks
or trigger anything. Every job runs with its own ``NUMARUN_RUNTIME_DIR``."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from numarun.stacks import channel as jobs
from rdzv_jobs import ask_until
from rdzv_jobs import read_ready as read_ready_of

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
GLOO = str(PROGRAMS / "gloo_stuck_rank.py")
NOBODY = 65534


@pytest.fixture
def runtime() -> Iterator[Path]:
    """A private runtime directory under /tmp (traversable once opened up, for the other-user
    test; pytest's own tmp_path sits under a 0700 directory)."""
    path = Path(tempfile.mkdtemp(prefix="numarun-rt-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _env(runtime: Path, **extra: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PET_", "TORCHELASTIC_", "NUMARUN_"))
    }
    env.update(NUMARUN_RUNTIME_DIR=str(runtime), OMP_NUM_THREADS="1", **extra)
    return env


def start(runtime: Path, *args: str, cwd: Path | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "numarun", *args],
        env=_env(runtime),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
    )


def job_socket(runtime: Path, limit: float = 60.0) -> Path:
    """The job's ``numarun stacks`` socket once it is there: the launcher makes it once every
    worker started, and a worker may say it is ready before that (under load, by seconds)."""
    deadline = time.monotonic() + limit
    while True:
        found = [entry for entry in os.listdir(runtime) if entry.endswith(".sock")]
        if found:
            return runtime / found[0]
        assert time.monotonic() < deadline, f"no socket in {runtime} after {limit} s"
        time.sleep(0.02)


def read_ready(proc: subprocess.Popen[str], count: int, limit: float = 90.0) -> dict[int, int]:
    """rank -> pid from the workers' ``ready <rank> <pid>`` lines (later output stays in the
    pipe)."""
    return read_ready_of([proc], count, limit)


def stacks(runtime: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "numarun", "stacks", *args],
        env=_env(runtime),
        capture_output=True,
        text=True,
        timeout=60,
    )


def stacks_until(runtime: Path, *wanted: str, args: tuple[str, ...] = ()) -> str:
    """``numarun stacks`` until its output holds every ``wanted`` string."""
    return ask_until(lambda: stacks(runtime, *args), wanted)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def gone(pids: list[int], limit: float = 10.0) -> bool:
    deadline = time.monotonic() + limit
    while any(alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()  # the workers die of their parent-death signal
    proc.communicate(timeout=30)


# --- the gloo jobs -------------------------------------------------------------------------------


def test_hang_timeout_names_the_rank_that_is_elsewhere_and_exits_124(runtime: Path) -> None:
    proc = start(
        runtime, "--nproc-per-node", "3", "--hang-timeout", "5",
        GLOO, "--stuck-rank", "1", "--stuck-in", "blocked_here_by_the_test",
    )  # fmt: skip
    try:
        pids = read_ready(proc, 3)
        hung_at = time.monotonic()
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - hung_at
    finally:
        stop(proc)
    assert proc.returncode == 124, err
    assert took < 10, took
    assert "HUNG on" in err and "(--hang-timeout 5)" in err
    culprit = f"Likely culprit (stacks differ from the other ranks'):\n  rank 1 (pid {pids[1]}): "
    assert culprit + "in blocked_here_by_the_test (" in err
    assert "while ranks 0,2: in wait_for_the_others (" in err and "innermost all_reduce" in err
    assert "ranks 0-2: terminated by numarun after the hang" in err
    assert gone(list(pids.values()))  # nothing left running
    assert os.listdir(runtime) == []  # no socket, no dump files


def test_numarun_stacks_on_a_running_job_which_goes_on_undisturbed(runtime: Path) -> None:
    proc = start(
        runtime, "--nproc-per-node", "3", "--rdzv-id", "stackjob",
        GLOO, "--stuck-rank", "1", "--stuck-in", "sleep_in_the_named_function",
    )  # fmt: skip
    try:
        pids = read_ready(proc, 3)
        text = stacks_until(runtime, "innermost all_reduce", "rank 1: in sleep_in_the_named")
        lines = text.splitlines()
        assert lines[0].startswith("numarun stacks: job stackjob (launcher pid ")
        assert "3 ranks on" in lines[0]
        groups = [line for line in lines if line.startswith("rank")]
        assert groups[0].startswith("ranks 0,2: in wait_for_the_others (")
        assert groups[1].startswith("rank 1: in sleep_in_the_named_function (")
        assert text.count("main thread (0x") == 2

        document = json.loads(stacks(runtime, "stackjob", "--json").stdout)
        assert [group["ranks"] for group in document["groups"]] == [[0, 2], [1]]
        assert [rank["pid"] for rank in document["ranks"]] == [pids[0], pids[1], pids[2]]
        assert document["groups"][1]["user_frame"]["function"] == "sleep_in_the_named_function"

        # The job goes on: every rank alive, still where it was, and it stops cleanly.
        time.sleep(0.5)
        assert proc.poll() is None and all(alive(pid) for pid in pids.values())
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        stop(proc)
    assert proc.returncode == 128 + signal.SIGTERM
    assert "numarun stopped the run on SIGTERM" in err
    assert gone(list(pids.values()))
    assert os.listdir(runtime) == []


def test_a_failure_shows_where_the_other_ranks_were(runtime: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    proc = start(
        runtime, "--nproc-per-node", "3", "--log-dir", str(logs), "--rdzv-id", "failing",
        GLOO, "--raise-at", "1",
    )  # fmt: skip
    try:
        pids = read_ready(proc, 3)
        _, err = proc.communicate(timeout=60)
    finally:
        stop(proc)
    assert proc.returncode == 1, err
    assert "Root cause: rank 1 (local_rank 1" in err
    section = err.split("Other ranks when rank 1 failed:\n", 1)[1]
    assert section.startswith("  ranks 0,2: in wait_for_the_failing_rank (")
    assert f"full stacks: {logs}/failing/attempt_0/<local_rank>/stacks.log" in section
    for local_rank in (0, 2):
        full = (logs / "failing" / "attempt_0" / str(local_rank) / "stacks.log").read_text()
        assert full.startswith(f"# numarun: rank {local_rank} (local_rank {local_rank}, pid ")
        assert "when rank 1 failed" in full.splitlines()[0]
        assert "in wait_for_the_failing_rank" in full
    assert not (logs / "failing" / "attempt_0" / "1" / "stacks.log").exists()
    assert gone(list(pids.values()))


# --- without torch -------------------------------------------------------------------------------


SILENT = textwrap.dedent(
    """
    import sys, time

    def compute(depth):
        if depth:
            return compute(depth - 1) + 1
        return sum(i * i for i in range(20000))

    end = time.monotonic() + float(sys.argv[1])
    step = 0
    while time.monotonic() < end:
        compute(step % 40)
        step += 1
    """
)


def test_a_job_computing_silently_for_three_timeouts_is_not_killed(
    runtime: Path, tmp_path: Path
) -> None:
    (tmp_path / "silent.py").write_text(SILENT)
    proc = start(
        runtime, "--nproc-per-node", "2", "--hang-timeout", "1.5", str(tmp_path / "silent.py"),
        "4.5", cwd=tmp_path,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        stop(proc)
    assert (proc.returncode, out) == (0, "")
    (first,) = err.splitlines()  # numarun's start line, and nothing about a hang
    assert first.startswith("numarun: run ") and "2 workers (ranks 0-1)" in first


PARKED = textwrap.dedent(
    """
    import os, signal, sys, time

    def parked_in_a_module_function():
        while not os.path.exists(sys.argv[1]):
            time.sleep(0.02)

    if os.environ["RANK"] == "1" and len(sys.argv) > 2:
        signal.signal(42, lambda *a: os.write(1, b"user handler ran\\n"))
    os.write(1, f"ready {os.environ['RANK']} {os.getpid()}\\n".encode())
    parked_in_a_module_function()
    """
)


def test_module_workers_a_user_handler_and_no_python_workers(
    runtime: Path, tmp_path: Path
) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "parked.py").write_text(PARKED)
    flag = tmp_path / "go"
    proc = start(
        runtime, "--nproc-per-node", "2", "--rdzv-id", "modjob", "-m", "pkg.parked",
        str(flag), "take-the-signal", cwd=tmp_path,
    )  # fmt: skip
    binary = tmp_path / "binary.sh"
    binary.write_text(
        '#!/bin/sh\necho "ready $RANK $$"\nwhile [ ! -e "$1" ]; do sleep 0.05; done\n'
    )
    binary.chmod(0o755)
    other = start(
        runtime, "--nproc-per-node", "1", "--rdzv-id", "binjob", "--no-python", str(binary),
        str(flag),
    )  # fmt: skip
    try:
        read_ready(proc, 2)
        read_ready(other, 1)
        # Two jobs: without RUN_ID they are listed, exit 2 (a rank can say ready before its
        # launcher's socket listens, as ask_until knows: asked again for at most 30 s).
        deadline = time.monotonic() + 30
        while (several := stacks(runtime)).returncode != 2 and time.monotonic() < deadline:
            time.sleep(0.3)
        assert several.returncode == 2
        assert "2 jobs running; name one: numarun stacks RUN_ID" in several.stderr
        assert "modjob" in several.stderr and "binjob" in several.stderr
        # Rank 1's own handler took signal 42; its helper answers all the same, signal-free.
        text = stacks_until(runtime, "ranks 0-1: in parked_in_a_module_function", args=("modjob",))
        assert f"{tmp_path}/pkg/parked.py:" in text
        binary_text = stacks(runtime, "binjob").stdout
        assert "rank 0: no stacks: not a Python process (--no-python)" in binary_text
        assert stacks(runtime, "nosuchjob").returncode == 1
        flag.touch()
        out, err = proc.communicate(timeout=60)
        other.communicate(timeout=60)
    finally:
        flag.touch()
        stop(proc)
        stop(other)
    assert proc.returncode == 0, err
    assert out.count("user handler ran") == 0  # its GIL was free: no signal was ever sent
    assert os.listdir(runtime) == []
    none = stacks(runtime)
    assert none.returncode == 1 and "no running numarun job" in none.stderr


SPAWNED = textwrap.dedent(
    """
    import os, sys, time
    import numarun

    def parked_in_fn(local_rank, flag):
        os.write(1, f"ready {local_rank} {os.getpid()}\\n".encode())
        while not os.path.exists(flag):
            time.sleep(0.02)
        return local_rank

    if __name__ == "__main__":
        print(numarun.spawn(parked_in_fn, args=(sys.argv[2],), nprocs=2,
                            start_method=sys.argv[1]), flush=True)
    """
)


@pytest.mark.parametrize("method", ["spawn", "fork", "forkserver"])
def test_numarun_spawn_workers_are_dumped(runtime: Path, tmp_path: Path, method: str) -> None:
    (tmp_path / "spawner.py").write_text(SPAWNED)
    flag = tmp_path / "go"
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "spawner.py"), method, str(flag)],
        env=_env(runtime),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        read_ready(proc, 2)
        text = stacks_until(runtime, "ranks 0-1: in parked_in_fn (")
        assert "ranks 0-1: in parked_in_fn (" in text, text
        assert "numarun.spawn(parked_in_fn)" in text.splitlines()[0]
        assert "spawning/childmain.py" not in text and "forkexec.py" not in text
        flag.touch()
        out, err = proc.communicate(timeout=60)
    finally:
        flag.touch()
        stop(proc)
    assert proc.returncode == 0, err
    assert out.splitlines()[-1] == "[0, 1]"
    assert os.listdir(runtime) == []


# --- another user --------------------------------------------------------------------------------


def _as_nobody(action: str, path: str) -> str:
    """Run ``action`` in a forked child that setuid()s to 65534; what it saw."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            if action == "list":
                seen = f"jobs={len(jobs.find_jobs(timeout=2))}"
            else:
                with socket.socket(socket.AF_UNIX) as conn:
                    conn.settimeout(5)
                    conn.connect(path)
                    try:
                        conn.sendall(b'{"op": "stacks"}\n')
                        answer = conn.recv(65536)
                    except (BrokenPipeError, ConnectionResetError):
                        answer = b""  # closed on us before or after the request
                    seen = "disconnected" if answer == b"" else f"answer={answer!r}"
        except OSError as error:
            seen = f"{type(error).__name__}"
        except BaseException as error:
            seen = f"unexpected {error!r}"
        os.write(write_end, seen.encode())
        os._exit(0)
    os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as pipe:
            return pipe.read().decode()
    finally:
        os.waitpid(pid, 0)


def test_another_user_cannot_get_stacks_or_trigger_anything(runtime: Path) -> None:
    proc = start(
        runtime, "--nproc-per-node", "2", GLOO, "--stuck-rank", "1", "--sleep", "60",
    )  # fmt: skip
    try:
        pids = read_ready(proc, 2)
        sock = job_socket(runtime)
        dumps = runtime / next(e for e in sorted(os.listdir(runtime)) if e.endswith(".d"))
        # The channel: private directories, owner-only socket and files.
        for path, mode in [(runtime, 0o700), (sock, 0o600), (dumps, 0o700)]:
            info = os.lstat(path)
            assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (os.geteuid(), mode), path
        rank_files = sorted(dumps.iterdir())
        assert [f.name for f in rank_files] == [
            f"rank{rank}{suffix}" for rank in (0, 1) for suffix in ("", ".fr", ".req", ".sig")
        ]  # each rank's dump file, its helper's answers, requests (a FIFO), signal dumps
        assert {stat.S_IMODE(f.lstat().st_mode) for f in rank_files} == {0o600}
        dump_files = [f for f in rank_files if f.suffix in ("", ".sig")]

        # Another user finds no job and cannot reach the socket...
        env_before = os.environ.get(jobs.RUNTIME_DIR_ENV)
        os.environ[jobs.RUNTIME_DIR_ENV] = str(runtime)
        try:
            assert _as_nobody("list", "") == "jobs=0"
        finally:
            if env_before is None:
                del os.environ[jobs.RUNTIME_DIR_ENV]
            else:
                os.environ[jobs.RUNTIME_DIR_ENV] = env_before
        assert _as_nobody("connect", str(sock)) == "PermissionError"
        # ... and when the owner opened both up, the launcher still checks who is calling:
        # not one byte of answer, nothing asked (the rank dump files stay empty).
        runtime.chmod(0o711)
        sock.chmod(0o666)
        try:
            assert _as_nobody("connect", str(sock)) == "disconnected"
        finally:
            runtime.chmod(0o700)
            sock.chmod(0o600)
        assert [f.stat().st_size for f in dump_files] == [0, 0, 0, 0]
        assert proc.poll() is None and all(alive(pid) for pid in pids.values())
        # The owner gets the stacks.
        assert "rank 1: in sleep_in_the_named_function" in stacks_until(
            runtime, "rank 1: in sleep_in_the_named_function"
        )
    finally:
        stop(proc)
    assert gone(list(pids.values()))


def test_stale_sockets_are_removed_without_following_links(runtime: Path, tmp_path: Path) -> None:
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(runtime / "123-deadbeef.sock"))
    dead.close()  # a launcher that died: the file stays, nobody listens
    (runtime / "123-deadbeef.d").mkdir(mode=0o700)
    (runtime / "123-deadbeef.d" / "rank0").write_text("old dump")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("not numarun's")
    other = socket.socket(socket.AF_UNIX)
    other.bind(str(runtime / "456-cafef00d.sock"))
    other.close()
    (runtime / "456-cafef00d.d").symlink_to(victim)
    done = stacks(runtime)
    assert done.returncode == 1 and "no running numarun job of uid" in done.stderr
    assert sorted(os.listdir(runtime)) == ["456-cafef00d.d"]  # the link is left alone
    assert (victim / "keep").read_text() == "not numarun's"


def test_a_dead_launchers_standby_dump_directories_are_removed(runtime: Path) -> None:
    # --preload standbys get their dump directory before any socket exists: one whose
    # launcher is gone is removed at the next look; a live launcher's stays.
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    dead, alive_pid = int(ended.stdout), os.getpid()
    for pid in (dead, alive_pid):
        (runtime / f"{pid}-0badc0de.d").mkdir(mode=0o700)
        (runtime / f"{pid}-0badc0de.d" / "rank0").write_text("")
    done = stacks(runtime)
    assert done.returncode == 1 and "no running numarun job of uid" in done.stderr
    assert os.listdir(runtime) == [f"{alive_pid}-0badc0de.d"]


def test_a_runtime_directory_that_is_not_private_is_refused(runtime: Path, tmp_path: Path) -> None:
    script = tmp_path / "quick.py"
    script.write_text("print('ran')\n")
    runtime.chmod(0o755)
    done = subprocess.run(
        [sys.executable, "-m", "numarun", str(script)],
        env=_env(runtime), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout == "ran\n"  # the job runs, without stacks
    warning, first = done.stderr.splitlines()  # the warning, then the start line
    assert first.startswith("numarun: run ") and "1 worker (rank 0)" in first
    assert "`numarun stacks` will not reach this job:" in warning
    assert "is open to other users (mode 755)" in warning
    os.chown(runtime, NOBODY, NOBODY)
    runtime.chmod(0o700)
    done = subprocess.run(
        [sys.executable, "-m", "numarun", "--hang-timeout", "5", str(script)],
        env=_env(runtime), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (2, "")  # nothing started
    assert done.stderr == (
        f"numarun: error: --hang-timeout needs numarun's stack dumps: {runtime} belongs to uid "
        f"{NOBODY}, not to you (uid {os.geteuid()}); numarun will not use it for its job "
        "sockets\n"
    )
    assert os.listdir(runtime) == []


def test_with_max_restarts_a_hang_fails_the_attempt_and_the_job_goes_on(
    runtime: Path, tmp_path: Path
) -> None:
    # Issue 9: "With --max-restarts, a hang counts as a failure of the attempt." Attempt 0 hangs
    # (both ranks asleep in a named function); attempt 1 finishes.
    script = tmp_path / "hang_once.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, sys, time

            def stuck_in_attempt_zero():
                time.sleep(600)

            if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
                stuck_in_attempt_zero()
            # One write per line: print() writes the text and the newline apart, and the two
            # ranks share the launcher's stdout.
            line = f"done {os.environ['RANK']} {os.environ['TORCHELASTIC_RESTART_COUNT']}\\n"
            os.write(1, line.encode())
            """
        )
    )
    proc = start(
        runtime, "--nproc-per-node", "2", "--hang-timeout", "3", "--max-restarts", "1",
        "--log-dir", str(tmp_path / "logs"), str(script),
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert sorted(out.splitlines()) == ["done 0 1", "done 1 1"]
    assert "attempt_0" in err and "hang" in err
    assert "restarting (restart 1 of 1)" in err


# --- clients that misbehave ------------------------------------------------------------------


FLAGGED = textwrap.dedent(
    """
    import os, sys, time

    def parked_until_the_flag(path):
        while not os.path.exists(path):
            time.sleep(0.02)

    os.write(1, f"ready {os.environ['RANK']} {os.getpid()}\\n".encode())
    parked_until_the_flag(sys.argv[1])
    if os.environ["RANK"] == "1":
        sys.exit(3)
    time.sleep(600)
    """
)


@pytest.mark.parametrize("trigger", ["a worker's failure", "SIGTERM"])
def test_slow_and_idle_clients_never_delay_the_launcher(
    runtime: Path, tmp_path: Path, trigger: str
) -> None:
    # Issue 16: a client dribbling a byte every 0.4 s into the stacks socket delayed the
    # reaction to a worker's failure by 37 s, 40 idle connections by 17 s, a SIGTERM by 22 s.
    import threading

    script = tmp_path / "flagged.py"
    script.write_text(FLAGGED)
    flag = tmp_path / "go"
    proc = start(runtime, "--nproc-per-node", "2", str(script), str(flag))
    idle: list[socket.socket] = []
    stop_dribbling = threading.Event()

    def dribble(path: str) -> None:
        with socket.socket(socket.AF_UNIX) as conn:
            conn.settimeout(2.0)
            with contextlib.suppress(OSError):
                conn.connect(path)
                for byte in b'{"op": "stacks"}\n' * 20:
                    if stop_dribbling.wait(0.4):
                        return
                    conn.send(bytes([byte]))

    dribbler = None
    try:
        read_ready(proc, 2)
        sock = str(job_socket(runtime))
        dribbler = threading.Thread(target=dribble, args=(sock,))
        dribbler.start()
        for _ in range(40):
            conn = socket.socket(socket.AF_UNIX)
            conn.settimeout(0.5)
            try:
                conn.connect(sock)  # and never a byte
                idle.append(conn)
            except OSError:  # the backlog is full: enough of them
                conn.close()
        time.sleep(1.5)  # the dribbler is mid-request, the idle ones wait
        # A well-behaved client is still served meanwhile.
        assert "in parked_until_the_flag (" in stacks_until(runtime, "in parked_until_the_flag")
        sent = time.monotonic()
        if trigger == "SIGTERM":
            proc.send_signal(signal.SIGTERM)
        else:
            flag.touch()
        _, err = proc.communicate(timeout=90)
        took = time.monotonic() - sent
    finally:
        stop_dribbling.set()
        flag.touch()
        if dribbler is not None:
            dribbler.join(10)
        for conn in idle:
            conn.close()
        stop(proc)
    assert proc.returncode == (128 + signal.SIGTERM if trigger == "SIGTERM" else 3), err
    assert took < 10.0, took  # milliseconds when nothing else runs; load cannot make it 10 s
    assert os.listdir(runtime) == []


# --- finding a job ---------------------------------------------------------------------------


def test_several_jobs_are_listed_and_any_pid_of_a_job_finds_it(
    runtime: Path, tmp_path: Path
) -> None:
    script = tmp_path / "flagged.py"
    script.write_text(FLAGGED)
    # The second job runs under timeout(1), as in `timeout 600 numarun ... &`: $! is the pid of
    # timeout, the launcher's parent.
    first = start(runtime, "--nproc-per-node", "1", "--rdzv-id", "first-job", str(script),
                  str(tmp_path / "never"))  # fmt: skip
    second = subprocess.Popen(
        ["timeout", "600", sys.executable, "-m", "numarun", "--nproc-per-node", "2",
         "--rdzv-id", "second-job", str(script), str(tmp_path / "never")],
        env=_env(runtime), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        read_ready(first, 1)
        workers = read_ready(second, 2)
        listed = stacks(runtime)
        assert listed.returncode == 2
        lines = listed.stderr.splitlines()
        at = lines.index("numarun: error: 2 jobs running; name one: numarun stacks RUN_ID")
        assert lines[at + 1].split() == ["RUN_ID", "PID", "RANKS", "STARTED", "COMMAND"]
        # Both were started from this test's session: marked as the caller's own.
        assert [line[:2] for line in lines[at + 2 : at + 4]] == ["* ", "* "]
        assert lines[at + 4] == "  (*: started from this session or terminal)"
        rows = {line[2:].split()[0]: line[2:].split() for line in lines[at + 2 : at + 4]}
        assert sorted(rows) == ["first-job", "second-job"]
        assert rows["first-job"][1] == str(first.pid)
        assert rows["second-job"][2] == "2"
        assert rows["second-job"][4] == str(script)
        for pid in (second.pid, workers[1]):  # timeout's pid, a worker's pid
            found = stacks(runtime, str(pid))
            assert found.returncode == 0, found.stderr
            assert found.stdout.startswith("numarun stacks: job second-job (launcher pid ")
        assert stacks(runtime, str(os.getpid())).returncode == 2  # an ancestor of both: listed
        assert stacks(runtime, "1").returncode == 1  # init is nobody's job
    finally:
        stop(first)
        second.send_signal(signal.SIGTERM)  # timeout(1) passes it on to the launcher
        try:
            second.communicate(timeout=60)
        finally:
            for pid in workers.values() if "workers" in locals() else ():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    assert gone(list(workers.values()))


def test_a_static_job_over_several_nodes_says_its_stacks_are_this_nodes_only(
    runtime: Path, tmp_path: Path
) -> None:
    # The static rendezvous shares no store between the launchers: say so, and how to see more.
    script = tmp_path / "flagged.py"
    script.write_text(FLAGGED)
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    number = port.getsockname()[1]
    port.close()
    proc = start(
        runtime, "--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1",
        "--master-port", str(number), "--nproc-per-node", "2", "--rdzv-id", "static-two",
        str(script), str(tmp_path / "never"),
    )  # fmt: skip
    try:
        pids = read_ready(proc, 2)
        text = stacks_until(runtime, "in parked_until_the_flag")
        assert "this node's ranks only, of a job on 2 nodes" in text
        assert "--rdzv-backend c10d" in text
    finally:
        stop(proc)
    assert gone(list(pids.values()))

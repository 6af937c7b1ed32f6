"""The launcher's files: error files that a planted symbolic link cannot redirect, log
directories of other users refused, what becomes of the temporary directory, and running out of
file descriptors. Each job runs as ``python -m numarun`` in a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from job_processes import processes_with_env
from numarun.worker import errorfile

PY = sys.executable
ENV = {key: value for key, value in os.environ.items() if key != "NUMARUN_RUN_ID"}
LIMIT = 120.0

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="a directory of another user needs root (chown)"
)


def launcher_env(**extra: str) -> dict[str, str]:
    env = dict(ENV)
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("PET_NPROC_PER_NODE", None)
    env.update(extra)
    return env


def script(tmp_path: Path, name: str, code: str) -> str:
    path = tmp_path / name
    path.write_text(code)
    return str(path)


def numarun(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "numarun", *args],
        env=launcher_env(**env),
        capture_output=True,
        text=True,
        timeout=LIMIT,
    )


def carrying(token: str) -> list[int]:
    """The live processes whose environment holds ``TD_TOKEN=<token>``."""
    return processes_with_env(f"TD_TOKEN={token}")


# --- item 2: error files and log directories -----------------------------------------------------


def test_error_file_never_follows_a_link_planted_at_its_temporary_name(tmp_path: Path) -> None:
    """Whoever controls the directory can plant a symbolic link at the name the temporary file
    used to get (``.error.json.<pid>.tmp``): the link's target stays untouched."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    planted = tmp_path / f".error.json.{os.getpid()}.tmp"
    planted.symlink_to(victim)
    target = tmp_path / "error.json"
    try:
        raise ValueError("boom")
    except ValueError as exc:
        errorfile.write_error_file(target, exc)
    assert victim.read_text() == "precious"
    assert json.loads(target.read_text())["message"]["message"] == "ValueError: boom"
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        [planted.name, "error.json", "victim"]
    )


@needs_root
@pytest.mark.parametrize("where", ["--log-dir", "TMPDIR"])
def test_a_directory_of_another_user_is_refused_and_nothing_starts(
    where: str, tmp_path: Path
) -> None:
    """As root, a --log-dir (or, without it, a TMPDIR) owned by uid 65534 is refused in one
    line, exit status 2: its owner could swap our directories for links and make root write
    anywhere."""
    logs = tmp_path / "logs"
    logs.mkdir()
    os.chown(logs, 65534, 65534)
    started = tmp_path / "started"
    worker = script(tmp_path, "w.py", f"open({str(started)!r}, 'w').close()\n")
    flags = ["--log-dir", str(logs)] if where == "--log-dir" else []
    job = numarun(*flags, "--nproc-per-node", "1", worker, TMPDIR=str(logs))
    assert job.returncode == 2
    (line,) = job.stderr.splitlines()
    assert line.startswith("numarun: error: ") and "belongs to another user (uid 65534)" in line
    assert not started.exists() and list(logs.iterdir()) == []


OTHER_UID = 65534  # nobody: the attacker, where the machine lets root act as another user


def as_other_user(where: Path, action: Callable[[int], None]) -> None:
    """Run ``action(fd of where)`` in a child that has become uid/gid 65534 (what another local
    user can do); fails the test when it raises. The directory is opened before the uid changes:
    pytest's temporary directories are root-only, while a real attacker reaches a log directory
    by its path."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            fd = os.open(where, os.O_PATH | os.O_DIRECTORY)
            os.setgid(OTHER_UID)
            os.setuid(OTHER_UID)
            action(fd)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the other user's action failed"


def root_only_victim(tmp_path: Path) -> Path:
    """A root-only directory holding ``0/stdout.log`` (0600): what an attack would overwrite."""
    victim = tmp_path / "victim"
    (victim / "0").mkdir(parents=True)
    (victim / "0" / "stdout.log").write_text("root only\n")
    os.chmod(victim / "0" / "stdout.log", 0o600)
    os.chmod(victim, 0o700)
    return victim


def refused(job: subprocess.CompletedProcess[str], words: str) -> None:
    """Exit status 2 and one ``numarun: error:`` line saying ``words`` (other lines, such as a
    start line, may come before it)."""
    assert job.returncode == 2, job.stderr
    errors = [line for line in job.stderr.splitlines() if line.startswith("numarun: error: ")]
    assert len(errors) == 1 and words in errors[0], job.stderr
    assert "Traceback" not in job.stderr


@needs_root
@pytest.mark.parametrize("where", ["--log-dir", "TMPDIR"])
def test_a_log_dir_reached_through_another_users_link_is_refused_and_nothing_is_written(
    where: str, tmp_path: Path
) -> None:
    """Another user's symbolic link to a root directory, given as --log-dir (or TMPDIR): only
    the target's owner used to be checked (root: accepted), and root wrote through the link."""
    target = tmp_path / "root_dir"
    target.mkdir(mode=0o700)
    link = tmp_path / "theirs"
    link.symlink_to(target)
    os.lchown(link, OTHER_UID, OTHER_UID)
    started = tmp_path / "started"
    worker = script(tmp_path, "w.py", f"open({str(started)!r}, 'w').close()\n")
    flags = ["--log-dir", str(link), "--redirects", "3"] if where == "--log-dir" else ["-r", "3"]
    job = numarun(*flags, "--nproc-per-node", "1", worker, TMPDIR=str(link))
    refused(job, f"symbolic link {link} of another user (uid {OTHER_UID})")
    assert not started.exists() and list(target.iterdir()) == []


@needs_root
@pytest.mark.parametrize(
    ("layout", "words"),
    [
        ("open log dir", "is writable by other users (mode 777) without the sticky bit"),
        ("open parent", "lies inside"),
        ("parent of another user", f"which belongs to another user (uid {OTHER_UID})"),
    ],
)
@pytest.mark.parametrize("where", ["--log-dir", "TMPDIR"])
def test_a_log_dir_another_user_could_swap_is_refused_and_nothing_is_written(
    layout: str, words: str, where: str, tmp_path: Path
) -> None:
    """A log directory (or TMPDIR) writable by others without the sticky bit, or inside a
    directory that is, or inside another user's directory: its directories could be swapped
    for links between numarun's mkdir and open. Refused in one line, exit status 2."""
    parent = tmp_path / "parent"
    logs = parent / "logs"
    logs.mkdir(parents=True)
    if layout == "open log dir":
        os.chmod(logs, 0o777)
    elif layout == "open parent":
        os.chmod(parent, 0o777)
    else:
        os.chown(parent, OTHER_UID, OTHER_UID)
    started = tmp_path / "started"
    worker = script(tmp_path, "w.py", f"open({str(started)!r}, 'w').close()\n")
    flags = ["--log-dir", str(logs)] if where == "--log-dir" else []
    job = numarun(*flags, "-r", "3", "--nproc-per-node", "1", worker, TMPDIR=str(logs))
    refused(job, words)
    if layout == "open parent":
        assert "which is writable by other users (mode 777)" in job.stderr
    assert not started.exists() and list(logs.iterdir()) == []


@needs_root
def test_a_sticky_log_dir_open_to_all_is_used(tmp_path: Path) -> None:
    """Mode 1777 (as /tmp): others may add entries but never rename or remove ours."""
    logs = tmp_path / "shared"
    logs.mkdir()
    os.chmod(logs, 0o1777)
    worker = script(tmp_path, "w.py", "print('out')\n")
    job = numarun("--log-dir", str(logs), "--rdzv-id", "job", "-r", "3", worker, TMPDIR=str(logs))
    assert job.returncode == 0, job.stderr
    assert (logs / "job" / "attempt_0" / "0" / "stdout.log").read_text() == "out\n"


@needs_root
@pytest.mark.parametrize(("group", "accepted"), [(0, True), (OTHER_UID, False)])
def test_group_write_is_refused_unless_the_group_is_the_callers_own(
    group: int, accepted: bool, tmp_path: Path
) -> None:
    """``umask 002`` systems make every directory group-writable, with the user's own private
    group (root's is "root", with no other member): harmless. Group write for another group
    (its members could swap directories) is refused."""
    from numarun.errors import UsageError
    from numarun.files.safedir import open_directory

    logs = tmp_path / "logs"
    logs.mkdir()
    os.chown(logs, 0, group)
    os.chmod(logs, 0o775)
    if accepted:
        open_directory(str(logs), what="--log-dir").close()
    else:
        with pytest.raises(UsageError, match=r"writable by other users \(mode 775\)"):
            open_directory(str(logs), what="--log-dir")


# The attack of the outside review, made deterministic: right after numarun made attempt_1's
# rank directory (the second mkdir of a directory named "0"), uid 65534 moves the run directory
# away and puts its own in its place, whose attempt_1 is a link to a root-only directory. The
# old code then opened LOG/run/attempt_1/0/stdout.log by path, O_CREAT|O_TRUNC, through the link.
SWAPPING_LAUNCHER = """
import os, sys
log, victim = sys.argv[1], sys.argv[2]
real_mkdir = os.mkdir
seen = []

def swap():
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            fd = os.open(log, os.O_PATH | os.O_DIRECTORY)  # see as_other_user
            os.setgid(65534)
            os.setuid(65534)
            os.rename("run", "run.moved", src_dir_fd=fd, dst_dir_fd=fd)
            real_mkdir("run", 0o755, dir_fd=fd)
            theirs = os.open("run", os.O_PATH | os.O_DIRECTORY, dir_fd=fd)
            os.symlink(victim, "attempt_1", dir_fd=theirs)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if status:
        sys.exit("the swap failed")

def mkdir(path, mode=0o777, *, dir_fd=None):
    real_mkdir(path, mode, dir_fd=dir_fd)
    if os.path.basename(os.fspath(path)) == "0":
        seen.append(path)
        if len(seen) == 2:
            swap()

os.mkdir = mkdir
from numarun.cli import main
sys.exit(main(sys.argv[3:]))
"""

FAIL_FIRST = """\
import os, sys
print("output of attempt", os.environ["TORCHELASTIC_RESTART_COUNT"], flush=True)
sys.exit(1 if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" else 0)
"""


@needs_root
def test_swapping_the_attempt_directory_between_mkdir_and_open_is_refused(
    tmp_path: Path,
) -> None:
    """The swap race in a log directory writable by others without the sticky bit: the run is
    refused before anything is made, and the root-only file keeps its content (the old code
    overwrote it with the worker's output, 3 of 3 times in the review)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    os.chmod(logs, 0o777)
    victim = root_only_victim(tmp_path)
    worker = script(tmp_path, "w.py", FAIL_FIRST)
    job = subprocess.run(
        [PY, "-c", SWAPPING_LAUNCHER, str(logs), str(victim),
         "--log-dir", str(logs), "--rdzv-id", "run", "--max-restarts", "1", "-r", "3", worker],
        env=launcher_env(), capture_output=True, text=True, timeout=LIMIT,
    )  # fmt: skip
    assert (victim / "0" / "stdout.log").read_text() == "root only\n"
    refused(job, "writable by other users")
    assert list(logs.iterdir()) == []


@needs_root
@pytest.mark.parametrize("moment", ["after the rank directory's mkdir", "before the file's open"])
def test_directories_made_relative_to_descriptors_never_follow_a_swapped_link(
    moment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mechanism under the refusal, with the refusal bypassed (a Directory opened directly
    on a directory open to all): uid 65534 swaps the run directory for its own, whose attempt_1
    links to a root-only directory, at two pause points. The attempt is made and its files are
    opened relative to the descriptors of the directories numarun made, so the output lands in
    the real (moved) directory, and nothing reaches the victim."""
    from numarun.files import logdir
    from numarun.files.safedir import Directory
    from numarun.launch.output import sinks_for

    logs = tmp_path / "logs"
    logs.mkdir()
    os.chmod(logs, 0o777)
    victim = root_only_victim(tmp_path)

    def swap() -> None:
        def attack(fd: int) -> None:
            os.rename("run", "run.moved", src_dir_fd=fd, dst_dir_fd=fd)
            real_mkdir("run", 0o755, dir_fd=fd)
            theirs = real_open("run", os.O_PATH | os.O_DIRECTORY, dir_fd=fd)
            os.symlink(victim, "attempt_1", dir_fd=theirs)

        as_other_user(logs, attack)

    base = Directory(str(logs), os.open(logs, os.O_PATH | os.O_DIRECTORY))
    run, first = logdir.make_run(base, "run", 1, fresh=False)
    first.close()
    real_mkdir, real_open = os.mkdir, os.open

    def mkdir_then_swap(path, mode=0o777, *, dir_fd=None):  # type: ignore[no-untyped-def]
        real_mkdir(path, mode, dir_fd=dir_fd)
        if moment.startswith("after") and path == "0":
            swap()

    def swap_then_open(path, flags, mode=0o777, *, dir_fd=None):  # type: ignore[no-untyped-def]
        if moment.startswith("before") and path == "stdout.log":
            swap()
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "mkdir", mkdir_then_swap)
    monkeypatch.setattr(os, "open", swap_then_open)
    try:
        attempt = logdir.make_attempt(run, "attempt_1", 1)
        with attempt, attempt.open("0") as rank_dir:
            out, err = sinks_for(0, 0, 3, 0, rank_dir, True)
    finally:
        monkeypatch.undo()
        run.close()
        base.close()
    assert out is not None and err is not None
    out.feed(b"the job's output\n")
    out.close()
    err.close()
    assert (victim / "0" / "stdout.log").read_text() == "root only\n"
    assert sorted(p.name for p in (victim / "0").iterdir()) == ["stdout.log"]
    moved = logs / "run.moved" / "attempt_1" / "0" / "stdout.log"
    assert moved.read_text() == "the job's output\n"


# --- item 12: out of file descriptors ------------------------------------------------------------

LOW_FD_LIMIT = (
    "import resource, sys\n"
    "resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))\n"
    "from numarun.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


@pytest.mark.parametrize("flags", [["--tee", "3"], ["--local-ranks-filter", "0"]])
def test_running_out_of_fds_is_one_line_and_leaves_nothing(
    flags: list[str], tmp_path: Path
) -> None:
    """ulimit -n 64 and 40 ranks: with --tee the log files run out, with hidden ranks the
    pipes (inside the supervisor). Either way: one line naming the limit, exit status 2, no
    traceback, no temporary directory, no process."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    token = os.urandom(8).hex()
    worker = script(tmp_path, "w.py", "import time; time.sleep(30)\n")
    job = subprocess.run(
        # -q: the start line (printed before the supervisor runs out of fds) is not the point
        [PY, "-c", LOW_FD_LIMIT, "-q", "--nproc-per-node", "40", *flags, worker],
        env=launcher_env(TMPDIR=str(temp), TD_TOKEN=token),
        capture_output=True,
        text=True,
        timeout=LIMIT,
    )
    assert job.returncode == 2, job.stderr
    (line,) = job.stderr.splitlines()
    assert line.startswith("numarun: error: ") and "limit is 64" in line and "ulimit -n" in line
    assert list(temp.iterdir()) == []
    assert carrying(token) == []


# --- item 17: the temporary log directory --------------------------------------------------------

OK = "print('hello from', __import__('os').environ['RANK'])\n"
FAIL = "import os, sys\nprint('bye'); sys.exit(3 if os.environ['RANK'] == '1' else 0)\n"


def test_tee_copies_are_removed_after_success_and_kept_and_named_after_failure(
    tmp_path: Path,
) -> None:
    """--tee without --log-dir: the console showed every line, so the files go when the run
    succeeds; after a failure they stay, and the summary says where."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    ok = numarun(
        "--nproc-per-node", "2", "--tee", "3", script(tmp_path, "ok.py", OK), TMPDIR=str(temp)
    )
    assert ok.returncode == 0 and "[default1]:hello from 1" in ok.stdout
    assert list(temp.iterdir()) == []
    assert "removed if the run succeeds" in ok.stderr
    bad = numarun(
        "--nproc-per-node", "2", "--tee", "3", script(tmp_path, "bad.py", FAIL), TMPDIR=str(temp)
    )
    assert bad.returncode == 3
    (kept,) = temp.iterdir()
    assert str(kept) in bad.stderr.split("Root cause")[1]  # named by the summary, too
    assert next(kept.glob("*/attempt_0/1/stdout.log")).read_text() == "bye\n"


def test_output_only_in_files_is_kept_and_announced(tmp_path: Path) -> None:
    """--redirects without --log-dir: the files hold the only copy; they stay, announced."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    job = numarun(
        "--nproc-per-node", "2", "--redirects", "3", script(tmp_path, "ok.py", OK), TMPDIR=str(temp)
    )
    assert job.returncode == 0 and job.stdout == ""
    (kept,) = temp.iterdir()
    (start,) = job.stderr.splitlines()
    assert start.startswith("numarun: run ") and start.endswith(f", logs in {kept}")
    assert (next(kept.glob("*/attempt_0/1/stdout.log"))).read_text() == "hello from 1\n"


def test_a_directory_of_error_files_goes_even_when_numarun_is_killed(tmp_path: Path) -> None:
    """No --tee/--redirects: the directory only holds the workers' error files. SIGKILL the
    launcher: its watchdog removes the directory after killing the workers."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    running = tmp_path / "running"
    worker = script(
        tmp_path,
        "w.py",
        f"import time\nopen({str(running)!r} + __import__('os').environ['RANK'], 'w').close()\n"
        "time.sleep(60)\n",
    )
    job = subprocess.Popen(
        [PY, "-m", "numarun", "--nproc-per-node", "2", worker],
        env=launcher_env(TMPDIR=str(temp)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + LIMIT
        while not all(Path(f"{running}{rank}").exists() for rank in (0, 1)):
            assert time.monotonic() < deadline and job.poll() is None
            time.sleep(0.02)
        assert len(list(temp.iterdir())) == 1
        job.send_signal(signal.SIGKILL)
        job.wait()
        deadline = time.monotonic() + 10
        while list(temp.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(temp.iterdir()) == []
    finally:
        job.kill()
        job.wait()

"""Files named on the command line (``topo --svg``, ``plan --svg``, ``snapshot OUT``): another
user's link or directory on the way is refused in one line, and a write that fails leaves the
existing target as it was. Each command runs as ``python -m numarun`` in a subprocess; the
attacker is uid 65534, as in the log-directory tests."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from sysfs_fixtures import dgx_h100, write_sysfs

OTHER_UID = 65534
SRC = str(Path(__file__).resolve().parents[2] / "src")

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="a link of another user needs root (lchown)"
)


def _numarun(
    *args: str, preexec: Callable[[], None] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, "-m", "numarun", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=preexec,
    )


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sysfs(dgx_h100(), tmp_path_factory.mktemp("machine") / "tree")


def _commands(tree: Path, target: Path) -> dict[str, list[str]]:
    root = ["--sysfs-root", str(tree)]
    return {
        "topo --svg": ["topo", *root, "--svg", str(target)],
        "plan --svg": ["plan", *root, "--svg", str(target)],
        "snapshot": ["snapshot", *root, str(target)],
    }


COMMANDS = ["topo --svg", "plan --svg", "snapshot"]


def _refused(done: subprocess.CompletedProcess[str], words: str) -> None:
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("numarun: error: ") and words in line, line
    assert "Traceback" not in done.stderr


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    victim.write_text("root only\n")
    victim.chmod(0o600)
    return victim


@needs_root
@pytest.mark.parametrize("command", COMMANDS)
def test_another_users_link_in_a_sticky_directory_is_refused(
    command: str, tree: Path, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # as /tmp: anyone may add a name
    victim = _victim(tmp_path)
    link = shared / "out"
    link.symlink_to(victim)
    os.lchown(link, OTHER_UID, OTHER_UID)
    done = _numarun(*_commands(tree, link)[command])
    _refused(done, f"symbolic link {link} of another user (uid {OTHER_UID})")
    assert victim.read_text() == "root only\n"
    assert sorted(p.name for p in shared.iterdir()) == ["out"]  # nothing left beside it


@needs_root
@pytest.mark.parametrize("command", COMMANDS)
def test_a_file_in_another_users_directory_is_refused(
    command: str, tree: Path, tmp_path: Path
) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, OTHER_UID, OTHER_UID)
    done = _numarun(*_commands(tree, theirs / "out")[command])
    _refused(done, f"belongs to another user (uid {OTHER_UID})")
    assert list(theirs.iterdir()) == []


@pytest.mark.parametrize("command", COMMANDS)
def test_a_failing_write_leaves_the_existing_target_untouched(
    command: str, tree: Path, tmp_path: Path
) -> None:
    # A file size limit below the output's size: the write fails (EFBIG) half way, as on a
    # full disk. The old file used to be truncated to 0 bytes first.
    target = tmp_path / "out"
    target.write_text("the previous picture\n")

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (512, 512))

    done = _numarun(*_commands(tree, target)[command], preexec=small_files)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "cannot write" in errors[0] and "too large" in errors[0]
    assert "Traceback" not in done.stderr
    assert target.read_text() == "the previous picture\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("command", COMMANDS)
def test_the_callers_own_link_is_followed_and_an_existing_files_mode_kept(
    command: str, tree: Path, tmp_path: Path
) -> None:
    real = tmp_path / "real"
    real.write_text("old\n")
    real.chmod(0o600)
    link = tmp_path / "link"
    link.symlink_to("real")
    done = _numarun(*_commands(tree, link)[command])
    assert done.returncode == 0, done.stderr
    assert link.is_symlink() and os.readlink(link) == "real"
    assert real.stat().st_size > 100 and real.read_bytes() != b"old\n"
    assert real.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]


def test_a_directory_or_a_missing_parent_is_one_line(tree: Path, tmp_path: Path) -> None:
    _refused(_numarun("topo", "--sysfs-root", str(tree), "--svg", str(tmp_path)), "not a regular")
    missing = tmp_path / "no" / "x.svg"
    _refused(
        _numarun("plan", "--sysfs-root", str(tree), "--svg", str(missing)),
        f"{missing}': {tmp_path / 'no'} does not exist",
    )

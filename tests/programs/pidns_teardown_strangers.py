"""pid 1 of a new pid namespace, for tests/process/test_teardown.py: makes strangers reuse the pids
of workers that ended, lets numarun tear the job down, and reports what the strangers received.

``unshare --pid --fork --mount-proc python pidns_teardown_strangers.py MODE DIR``. MODE ``fail``:
rank 0 fails, so the supervisor tears down; ``kill``: the launcher is SIGKILLed, so the watchdog
does. A stranger is forked right after ``/proc/sys/kernel/ns_last_pid`` was set to the ended
worker's pid - 1, so it gets that pid if it is free, then calls ``setsid`` (its session and
group id are then that number too) and forks a second process in its session, as a shell
does; both record every catchable signal they receive. Prints one JSON line:
``{"strangers": [{"wanted": pid, "pid": pid, "alive": bool, "signals": [...]}, ...],
"job_left": [pids]}`` (two entries per ended worker: the session leader, then its member).
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REUSE = str(Path(__file__).with_name("pid_reuse_worker.py"))


def state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def wait_until(condition, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.02)


def stranger(wanted: int, directory: str) -> int:
    """Fork a process that gets ``wanted`` as its pid if that pid is free."""
    with open("/proc/sys/kernel/ns_last_pid", "w") as last:
        last.write(str(wanted - 1))
    pid = os.fork()
    if pid:
        return pid
    try:
        os.setsid()
        member = os.fork()

        def record(signum: int, frame: object) -> None:
            with open(os.path.join(directory, f"signals.{os.getpid()}"), "a") as file:
                file.write(f"{signum}\n")

        # SIGCHLD left out: the leader gets it from its own member's death.
        for signum in range(1, signal.NSIG):
            if signum not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
                with contextlib.suppress(OSError, ValueError):
                    signal.signal(signum, record)
        if member:
            with open(os.path.join(directory, f"member.{os.getpid()}"), "w") as file:
                file.write(str(member))
        open(os.path.join(directory, f"stranger.{os.getpid()}"), "w").close()
        while True:
            time.sleep(1)
    finally:
        os._exit(0)


def main(mode: str, directory: str) -> int:
    launcher = subprocess.Popen(
        [sys.executable, "-m", "numarun", "--nproc-per-node", "3", REUSE, directory],
        stdout=subprocess.DEVNULL,
    )
    paths = [Path(directory, f"worker.{rank}") for rank in range(3)]
    wait_until(lambda: all(path.exists() for path in paths))
    workers = [int(path.read_text()) for path in paths]
    for ended in workers[1:]:
        wait_until(lambda ended=ended: state(ended) in (None, "Z"))
    leaders = {wanted: stranger(wanted, directory) for wanted in workers[1:]}
    wait_until(lambda: all(Path(directory, f"member.{pid}").exists() for pid in leaders.values()))
    strangers = []
    for wanted, leader in leaders.items():
        member = int(Path(directory, f"member.{leader}").read_text())
        strangers += [(wanted, leader), (wanted, member)]
    wait_until(lambda: all(Path(directory, f"stranger.{pid}").exists() for _, pid in strangers))
    if mode == "fail":
        Path(directory, "go").touch()
        launcher.wait(timeout=60)
    else:
        launcher.kill()
        launcher.wait()
    mine = {1, *(pid for _, pid in strangers)}

    def job_left() -> list[int]:
        names = [int(name) for name in os.listdir("/proc") if name.isdigit()]
        return [pid for pid in names if pid not in mine and state(pid) not in (None, "Z")]

    # The watchdog (after a SIGKILL) or the supervisor's last sweep: everything of the job ends.
    deadline = time.monotonic() + 10
    while job_left() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # a late signal would still be recorded
    report = []
    for wanted, pid in strangers:
        log = Path(directory, f"signals.{pid}")
        signals = [int(line) for line in log.read_text().split()] if log.exists() else []
        report.append(
            {
                "wanted": wanted,
                "pid": pid,
                "alive": state(pid) not in (None, "Z"),
                "signals": signals,
            }
        )
    print(json.dumps({"strangers": report, "job_left": job_left()}), flush=True)
    for _, pid in strangers:
        os.kill(pid, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))

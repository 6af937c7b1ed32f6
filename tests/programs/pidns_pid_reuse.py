"""pid 1 of a new pid namespace, for tests/process/test_teardown_pid_reuse.py: strangers take the
pids of workers that ended before the supervisor knew it, and the run is then signalled and torn
down; prints what the strangers received.

``unshare --pid --fork --mount-proc python pidns_pid_reuse.py MODE DIR``. A stranger is forked right
after ``/proc/sys/kernel/ns_last_pid`` was set to an ended worker's pid - 1, so it gets that pid
if it is free; it calls ``setsid`` (its session and group id are then that number too) and
forks a member of its session, as a shell does; both record every catchable signal they get.

* ``reaped``: a Supervisor starts three exec workers that exit at once. Once each has ended
  (a zombie or gone from /proc), a stranger wants its pid; then, before the supervisor has read
  the workers' ends, ``send_signal(SIGUSR1)`` and ``stop()`` (issue 20, item 6: the watchdog
  must keep ended workers unreaped until the run is over).
* ``forkserver-fail``: a Supervisor starts two ``"forkserver"`` workers; rank 0 fails at once,
  rank 1 sleeps. Rank 0's pinning is held back until the fork server has reaped it and a
  stranger took its pid; then rank 0's failure tears the run down (item 5).
* ``forkserver-kill``: the same start, in a child process (the supervisor), which is then
  SIGKILLed: its watchdog kills the run.

Prints one JSON line: ``{"strangers": [{"wanted": pid, "pid": pid, "alive": bool, "signals":
[...]}, ...], "job_left": [pids]}`` (a session leader, then its member, for each ended worker).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

LIMIT = 60.0


def state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def wait_until(condition, limit: float = LIMIT) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.01)


def stranger(wanted: int, directory: str) -> int:
    """Fork a process that gets ``wanted`` as its pid if that pid is free, and the member of
    its session; returns once both record signals."""
    with open("/proc/sys/kernel/ns_last_pid", "w") as last:
        last.write(str(wanted - 1))
    pid = os.fork()
    if pid:
        wait_until(lambda: Path(directory, f"ready.{pid}").exists())
        return pid
    try:
        signal.set_wakeup_fd(-1)  # forked inside the supervisor's signal scope
        os.closerange(3, 1 << 16)  # nothing of the supervisor's
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
            wait_until(lambda: Path(directory, f"ready.{member}").exists())
            Path(directory, f"member.{os.getpid()}").write_text(str(member))
        Path(directory, f"ready.{os.getpid()}").touch()
        while True:
            time.sleep(1)
    finally:
        os._exit(0)


def strangers_of(leaders: dict[int, int], directory: str) -> list[tuple[int, int]]:
    """(wanted pid, pid) of each stranger leader and its member."""
    found = []
    for wanted, leader in leaders.items():
        member = int(Path(directory, f"member.{leader}").read_text())
        found += [(wanted, leader), (wanted, member)]
    return found


def report(found: list[tuple[int, int]], directory: str, helpers: set[int] = frozenset()) -> None:
    """Print the line; ``helpers``: processes of this one that are no part of the run
    (multiprocessing's fork server and resource tracker)."""
    mine = {1, *helpers, *(pid for _, pid in found)}

    def job_left() -> list[int]:
        names = [int(name) for name in os.listdir("/proc") if name.isdigit()]
        return [pid for pid in names if pid not in mine and state(pid) not in (None, "Z")]

    deadline = time.monotonic() + 10
    while job_left() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # a late signal would still be recorded
    lines = []
    for wanted, pid in found:
        log = Path(directory, f"signals.{pid}")
        signals = [int(line) for line in log.read_text().split()] if log.exists() else []
        alive = state(pid) not in (None, "Z")
        lines.append({"wanted": wanted, "pid": pid, "alive": alive, "signals": signals})
    print(json.dumps({"strangers": lines, "job_left": job_left()}), flush=True)
    for _, pid in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def reaped(directory: str) -> None:
    from numarun.process.spec import WorkerSpec
    from numarun.process.supervisor import Supervisor

    specs = [
        WorkerSpec(local_rank=rank, rank=rank, env={}, argv=["/bin/sh", "-c", "exit 0"])
        for rank in range(3)
    ]
    supervisor = Supervisor(specs, grace_period=5)
    supervisor.start()
    pids = supervisor.pids()
    wait_until(lambda: all(state(pid) in (None, "Z") for pid in pids))
    time.sleep(0.2)  # an early-reaping watchdog has reaped them by now
    leaders = {pid: stranger(pid, directory) for pid in pids}
    found = strangers_of(leaders, directory)
    supervisor.send_signal(signal.SIGUSR1)
    supervisor.stop()
    report(found, directory)


def forkserver_start(directory: str) -> tuple[object, list[tuple[int, int]]]:
    """Start the forkserver run with rank 0's pinning held back (module docstring)."""
    import pidns_fork_targets

    from numarun.process import proctable
    from numarun.process.spec import WorkerSpec
    from numarun.process.supervisor import Supervisor

    real_open = proctable.open_pidfd
    leaders: dict[int, int] = {}
    me = os.getpid()

    def held_back(pid: int) -> int | None:
        # In the supervisor only (its watchdog, a fork of it, holds the wrapper too), and for
        # the first process pinned that is not its watchdog: rank 0.
        if os.getpid() == me and not leaders and parent(pid) != me:
            # Reaped by the fork server, then its pid taken.
            wait_until(lambda: state(pid) is None)
            leaders[pid] = stranger(pid, directory)
        return real_open(pid)

    proctable.open_pidfd = held_back  # type: ignore[assignment]
    specs = [
        WorkerSpec(
            local_rank=rank,
            rank=rank,
            env=dict(os.environ),
            start="forkserver",
            fork_target=pidns_fork_targets.exit_at_once
            if rank == 0
            else pidns_fork_targets.sleep_long,
        )
        for rank in range(2)
    ]
    supervisor = Supervisor(specs, grace_period=5)
    supervisor.start()
    proctable.open_pidfd = real_open  # type: ignore[assignment]
    return supervisor, strangers_of(leaders, directory)


def forkserver_fail(directory: str) -> None:
    from multiprocessing import forkserver, resource_tracker

    supervisor, found = forkserver_start(directory)
    supervisor.wait()  # type: ignore[attr-defined]
    helpers = {
        getattr(forkserver._forkserver, "_forkserver_pid", None),
        getattr(resource_tracker._resource_tracker, "_pid", None),
    }
    report(found, directory, {pid for pid in helpers if pid})


def forkserver_supervisor(directory: str) -> None:
    """The supervisor of ``forkserver-kill``: starts, says so, waits to be killed."""
    _supervisor, found = forkserver_start(directory)  # kept alive until killed
    Path(directory, "found.json").write_text(json.dumps(found))
    Path(directory, "started").touch()
    time.sleep(LIMIT)  # not watching: rank 0's failure must not tear the run down first


def forkserver_kill(directory: str) -> None:
    child = subprocess.Popen(
        [sys.executable, __file__, "forkserver-supervisor", directory], stdout=subprocess.DEVNULL
    )
    wait_until(lambda: Path(directory, "started").exists() or child.poll() is not None)
    found = [tuple(pair) for pair in json.loads(Path(directory, "found.json").read_text())]
    child.kill()
    child.wait()
    report(found, directory)  # type: ignore[arg-type]


if __name__ == "__main__":
    mode, where = sys.argv[1], sys.argv[2]
    {
        "reaped": reaped,
        "forkserver-fail": forkserver_fail,
        "forkserver-supervisor": forkserver_supervisor,
        "forkserver-kill": forkserver_kill,
    }[mode](where)

"""Real jobs of several numarun launchers meeting in a c10d rendezvous on this machine, for the
end-to-end tests of the whole-job view (``tests/e2e/test_jobwide_jobs.py``,
``tests/e2e/test_jobwide_faults.py``).

Each "node" is one launcher with its own ``NUMARUN_RUNTIME_DIR`` (as two hosts have); every job
has its own ``--rdzv-id``, carried by every worker, so :meth:`Job.close` can end what is left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from job_processes import processes_with_run_id
from numarun.placement.workerenv import free_port
from torch_python import TORCH_PYTHON

PROGRAMS = Path(__file__).resolve().parent / "programs"
NUMARUN = [TORCH_PYTHON, "-m", "numarun"]
SRC = str(Path(__file__).resolve().parents[1] / "src")
LIMIT = 120.0


def env(runtime: Path | None = None, *, path: tuple[str, ...] = (), **extra: str) -> dict[str, str]:
    """The environment of a launcher of these tests (``path``: more ``PYTHONPATH`` entries,
    after this checkout's ``src``)."""
    found = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PET_", "SLURM_", "OMPI_", "TORCHELASTIC_", "TORCH_", "NUMARUN_"))
        and key not in ("MASTER_ADDR", "MASTER_PORT", "PYTHON_EXEC")
    }
    found["PYTHONPATH"] = os.pathsep.join([SRC, *path, found.get("PYTHONPATH", "")])
    found["GLOO_SOCKET_IFNAME"] = "lo"
    found["OMP_NUM_THREADS"] = "1"
    if runtime is not None:
        found["NUMARUN_RUNTIME_DIR"] = str(runtime)
    found.update(extra)
    return found


class Job:
    """The launchers of one test's job; :meth:`close` kills what is left, workers included."""

    def __init__(self, run_id: str, tmp: Path) -> None:
        self.run_id = run_id
        self.port = free_port()
        self.tmp = tmp
        self.started: list[subprocess.Popen[bytes]] = []

    def runtime(self, node: int) -> Path:
        path = self.tmp / f"rt{node}"
        path.mkdir(mode=0o700, exist_ok=True)
        return path

    def flags(self, nnodes: str = "2", nproc: int = 2) -> list[str]:
        return [
            "--nnodes", nnodes, "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{self.port}", "--rdzv-id", self.run_id,
        ]  # fmt: skip

    def start(self, node: int, *argv: str, launcher: list[str] = NUMARUN,
              path: tuple[str, ...] = (), **extra: str) -> subprocess.Popen:  # fmt: skip
        proc = subprocess.Popen(
            [*launcher, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env(self.runtime(node), path=path, **extra),
        )
        self.started.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                with_signal(proc, signal.SIGCONT)
                proc.kill()
            proc.communicate()
        for pid in processes_with_run_id(self.run_id):
            os.kill(pid, signal.SIGKILL)


def started_job(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Job]:
    """The body of a test module's ``job`` fixture: a :class:`Job` closed after the test."""
    name = f"jw-{request.node.name[:30]}-{os.getpid()}".replace("[", "-").strip("]")
    started = Job(name, tmp_path)
    try:
        yield started
    finally:
        started.close()


def with_signal(proc: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signum)


def read_ready(procs: list[subprocess.Popen], count: int, limit: float = LIMIT) -> dict[int, int]:
    """rank -> pid from the workers' ``ready <rank> <pid>`` lines on the launchers' stdout
    (read byte by byte from the raw fds: later output stays in the pipes)."""
    import select

    fds = {proc.stdout.fileno(): proc for proc in procs}  # type: ignore[union-attr]
    pending = {fd: b"" for fd in fds}
    ready: dict[int, int] = {}
    deadline = time.monotonic() + limit
    while len(ready) < count:
        left = deadline - time.monotonic()
        readable, _, _ = select.select(list(fds), [], [], max(0.0, left))
        if not readable:
            raise AssertionError(f"only {sorted(ready)} ready after {limit} s")
        for fd in readable:
            chunk = os.read(fd, 1)
            if not chunk:
                proc = fds.pop(fd)
                raise AssertionError(f"a launcher ended: {proc.wait()} {proc.stderr.read()!r}")
            pending[fd] += chunk
            if chunk == b"\n":
                line, pending[fd] = pending[fd].decode(), b""
                if line.startswith("ready "):
                    _, rank, pid = line.split()
                    ready[int(rank)] = int(pid)
    return ready


def stacks(runtime: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*NUMARUN, "stacks", *args], env=env(runtime), capture_output=True, text=True, timeout=60
    )


def stacks_until(runtime: Path, *wanted: str) -> str:
    return ask_until(lambda: stacks(runtime), wanted)


def ask_until(
    ask: Callable[[], subprocess.CompletedProcess[str]], wanted: tuple[str, ...]
) -> str:
    """``ask()`` (a ``numarun stacks``) until its output holds every ``wanted`` string (the
    ranks reach their places a moment after they say ready), for at most 30 s."""
    deadline = time.monotonic() + 30
    while True:
        done = ask()
        if "no running numarun job" in done.stderr and time.monotonic() < deadline:
            time.sleep(0.3)  # a rank can say ready before its launcher's socket listens
            continue
        assert done.returncode == 0, done.stderr
        if all(text in done.stdout for text in wanted) or time.monotonic() > deadline:
            return done.stdout
        time.sleep(0.3)


def finish(proc: subprocess.Popen, limit: float = LIMIT) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"{proc.args} did not end: {err.decode()[-3000:]}") from None
    return proc.returncode, out.decode(), err.decode()


def gone(pids: list[int], limit: float = 15.0) -> bool:
    deadline = time.monotonic() + limit
    while True:
        alive = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as file:
                    if file.read().rsplit(")", 1)[1].split()[0] not in "ZX":
                        alive.append(pid)
            except OSError:
                pass
        if not alive:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def numarun_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("numarun: ")]


def round_store(job: Job) -> object:
    """The job's round in its store, as anyone who can reach the port sees it."""
    from datetime import timedelta

    import torch.distributed as dist

    client = dist.TCPStore("127.0.0.1", job.port, is_master=False, wait_for_workers=False,
                           timeout=timedelta(seconds=30))  # fmt: skip
    deadline = time.monotonic() + LIMIT
    while time.monotonic() < deadline:
        keys = [key for key in client.list_keys() if key.endswith("/numarun/nodes")]
        if keys:
            return dist.PrefixStore(keys[0][: -len("/numarun/nodes")], client)
        time.sleep(0.2)
    raise AssertionError("no numarun keys in the store")




def view_store(job: Job) -> object:
    """The store the job's whole-job view uses this round, as anyone who can reach its port
    sees it: its own (``--diagnostics-store own``, the default: the address its node 0
    published in the rendezvous store), else the round's rendezvous store."""
    from datetime import timedelta

    import torch.distributed as dist

    store = round_store(job)
    deadline = time.monotonic() + LIMIT
    while time.monotonic() < deadline:
        if store.check(["numarun/diagstore"]):  # type: ignore[attr-defined]
            host, _, port = bytes(store.get("numarun/diagstore")).decode().rpartition(":")  # type: ignore[attr-defined]
            return dist.TCPStore(host, int(port), is_master=False, wait_for_workers=False,
                                 timeout=timedelta(seconds=30))  # fmt: skip
        if store.check(["numarun/events"]):  # type: ignore[attr-defined]
            return store
        time.sleep(0.2)
    raise AssertionError("no store of the whole-job view found")

"""Supervisor tests with real processes on this machine (2 CPUs): start, watch, teardown."""

from __future__ import annotations

import contextlib
import gc
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from numarun.errors import BindingError, UsageError
from numarun.placement import binding
from numarun.process import proctable
from numarun.process.spec import RunResult, WorkerExit, WorkerSpec
from numarun.process.starting import Starter
from numarun.process.supervisor import Supervisor

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
TREE = str(PROGRAMS / "grandchildren_tree.py")
HOST = str(PROGRAMS / "supervisor_host.py")
PY = sys.executable
ENV = {key: value for key, value in os.environ.items() if key != "NUMARUN_RUN_ID"}
CPUS = sorted(os.sched_getaffinity(0))

# Reads its binding before anything else, then reports it on the result pipe.
REPORT_CPUS = (
    "import os\n"
    "line = [l for l in open('/proc/self/status') if l.startswith('Cpus_allowed_list')][0]\n"
    "os.write(int(os.environ['NUMARUN_RESULT_FD']), line.split()[1].encode())\n"
)


class Collect:
    """An OutputSink that keeps what it is fed and can react to lines."""

    def __init__(self, on_line: Callable[[str], None] | None = None) -> None:
        self.data = bytearray()
        self.closed = 0
        self.on_line = on_line
        self._seen = 0

    def feed(self, data: bytes) -> None:
        assert self.closed == 0, "feed after close"
        self.data += data
        lines = self.data.decode().split("\n")[:-1]
        for line in lines[self._seen :]:
            if self.on_line is not None:
                self.on_line(line)
        self._seen = len(lines)

    def close(self) -> None:
        self.closed += 1

    def lines(self) -> list[str]:
        return self.data.decode().splitlines()


def spec(rank: int, code: str, **kwargs: object) -> WorkerSpec:
    return WorkerSpec(local_rank=rank, rank=rank, env=ENV, argv=[PY, "-c", code], **kwargs)


def run(specs: Sequence[WorkerSpec], **kwargs: object) -> RunResult:
    sup = Supervisor(specs, **kwargs)
    sup.start()
    result = sup.wait()
    assert result is not None
    return result


def stat_fields(pid: int | str) -> list[bytes] | None:
    """/proc/<pid>/stat after the command name (state, ppid, ...); None once it is gone.
    Parsed here rather than with numarun.process.proctable, whose ownership logic these tests
    check."""
    try:
        text = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return text[text.rfind(b")") + 2 :].split()


def proc_state(pid: int) -> str | None:
    fields = stat_fields(pid)
    return None if fields is None else fields[0].decode()


def alive(pid: int) -> bool:
    return proc_state(pid) not in (None, "Z", "X")


def children_of_us(state: bytes | None = None) -> set[int]:
    """Our child processes, or those of them in ``state`` (b"Z": zombies)."""
    me = os.getpid()
    found = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = stat_fields(name)
            if fields is not None and int(fields[1]) == me and state in (None, fields[0]):
                found.add(int(name))
    return found


def our_zombies() -> list[int]:
    return sorted(children_of_us(b"Z"))


def tree_pids(sink: Collect) -> list[int]:
    return [int(line.split()[1]) for line in sink.lines() if line[:2] in ("W ", "G ")]


def kill_later(pid: int, signum: int) -> Callable[[str], None]:
    """on_line callback: send ``signum`` to ``pid()`` at the line 'ready'."""

    def on_line(line: str) -> None:
        if line == "ready":
            os.kill(pid, signum)

    return on_line


# --- exit codes ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "exit_code", "signal_name", "state"),
    [
        ("pass", 0, None, "succeeded"),
        ("import sys; sys.exit(3)", 3, None, "failed"),
        ("import os; os._exit(7)", 7, None, "failed"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", -11, "SIGSEGV", "failed"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -9, "SIGKILL", "failed"),
    ],
)
def test_exit_status_is_reported(
    code: str, exit_code: int, signal_name: str | None, state: str
) -> None:
    result = run([spec(0, code)])
    (worker,) = result.workers
    assert (worker.exit_code, worker.signal_name, worker.state) == (exit_code, signal_name, state)
    assert worker.ended_at is not None and worker.pid > 0
    assert (result.first_failure is worker) == (state == "failed")
    assert result.received_signal is None and result.unkillable == []


def test_success_of_many_workers_and_pids_by_rank() -> None:
    specs = [spec(k, f"import os; os.write(1, b'')  # rank {k}") for k in (2, 0, 1)]
    sup = Supervisor(specs)
    sup.start()
    pids = sup.pids()
    result = sup.wait()
    assert result is not None
    assert [w.local_rank for w in result.workers] == [0, 1, 2]
    assert [w.pid for w in result.workers] == pids and len(set(pids)) == 3
    assert all(w.state == "succeeded" for w in result.workers)
    assert result.first_failure is None
    assert sup.wait() is result and sup.stop() is result


def test_failure_tears_down_the_others() -> None:
    result = run(
        [spec(0, "import time; time.sleep(60)"), spec(1, "import sys; sys.exit(5)")],
        grace_period=5,
    )
    slow, failing = result.workers
    assert failing.state == "failed" and failing.exit_code == 5
    assert slow.state == "terminated" and slow.exit_code == -signal.SIGTERM
    assert result.first_failure == failing


def test_worker_ignoring_sigterm_is_killed_after_grace() -> None:
    ignorer = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    victim = spec(1, "import time; time.sleep(60)")
    sup: Supervisor | None = None

    def on_line(line: str) -> None:
        if line == "ready":
            assert sup is not None
            os.kill(sup.pids()[1], signal.SIGKILL)  # a failure we did not cause

    sup = Supervisor([spec(0, ignorer, stdout=Collect(on_line)), victim], grace_period=0.5)
    sup.start()
    result = sup.wait()
    assert result is not None
    stubborn, failed = result.workers
    assert failed.state == "failed" and failed.signal_name == "SIGKILL"
    assert result.first_failure == failed
    assert stubborn.state == "terminated" and stubborn.exit_code == -signal.SIGKILL
    assert stubborn.ended_at is not None and failed.ended_at is not None
    assert stubborn.ended_at - failed.ended_at >= 0.45  # SIGKILL only after the grace period


def test_first_failure_in_time_not_lowest_rank() -> None:
    # Rank 0 fails second (exit 4 from its SIGTERM handler); rank 1 fails first (killed).
    late = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(4))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    sup: Supervisor | None = None

    def on_line(line: str) -> None:
        if line == "ready":
            assert sup is not None
            os.kill(sup.pids()[1], signal.SIGKILL)

    sup = Supervisor(
        [spec(0, late, stdout=Collect(on_line)), spec(1, "import time; time.sleep(60)")],
        grace_period=5,
    )
    sup.start()
    result = sup.wait()
    assert result is not None
    second, first = result.workers
    assert first.state == "failed" and second.state == "failed" and second.exit_code == 4
    assert first.ended_at is not None and second.ended_at is not None
    assert first.ended_at < second.ended_at
    assert result.first_failure == first


def test_is_failure_marks_a_zero_exit_as_failed() -> None:
    code = "import os; os.write(int(os.environ['NUMARUN_RESULT_FD']), b'raised')"
    seen: list[WorkerExit] = []
    result = run(
        [spec(0, code, want_result=True), spec(1, "import time; time.sleep(60)")],
        is_failure=lambda ended: ended.result == b"raised",
        on_exit=seen.append,
        grace_period=5,
    )
    reported, other = result.workers
    assert reported.exit_code == 0 and reported.state == "failed"
    assert result.first_failure == reported and other.state == "terminated"
    assert sorted(e.local_rank for e in seen) == [0, 1]


# --- process trees -------------------------------------------------------------------------------


def assert_gone(pids: Sequence[int]) -> None:
    assert len(pids) == 4, pids
    survivors = [pid for pid in pids if alive(pid)]
    assert survivors == [], f"still running: {survivors}"
    assert our_zombies() == []


@pytest.mark.parametrize("mode", ["exit", "fail"])
def test_grandchildren_gone_after_run_ends(mode: str) -> None:
    sink = Collect()
    result = run([WorkerSpec(0, 0, ENV, argv=[PY, TREE, mode], stdout=sink)], grace_period=2)
    assert result.workers[0].state == ("succeeded" if mode == "exit" else "failed")
    assert sink.closed == 1
    assert_gone(tree_pids(sink))


def test_grandchildren_gone_after_stop_and_wait_timeout() -> None:
    sink = Collect()
    sup = Supervisor([WorkerSpec(0, 0, ENV, argv=[PY, TREE, "stay"], stdout=sink)])
    sup.start()
    deadline = time.monotonic() + 20
    while len(tree_pids(sink)) < 4 and time.monotonic() < deadline:
        assert sup.wait(timeout=0.05) is None  # still running
    pids = tree_pids(sink)
    assert all(alive(pid) for pid in pids)
    result = sup.stop(grace_period=2)
    assert result.workers[0].state == "terminated"
    assert_gone(pids)


def test_supervisor_sigkilled_leaves_no_survivors() -> None:
    host = subprocess.Popen([PY, HOST, "2"], stdout=subprocess.PIPE, env=ENV)
    assert host.stdout is not None
    lines: list[str] = []
    pending = b""
    deadline = time.monotonic() + 30
    while sum(line[:1] in "WG" for line in lines) < 8 and time.monotonic() < deadline:
        ready, _, _ = select.select([host.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(host.stdout.fileno(), 65536)
        assert chunk, f"host ended early: {lines}"
        pending += chunk
        *new, pending = pending.split(b"\n")
        lines += [line.decode() for line in new]
    pids = [int(line.split()[1]) for line in lines if line[:1] in "WG"]
    assert len(pids) == 8, lines
    pidfds = [os.pidfd_open(pid) for pid in pids]
    try:
        host.kill()
        host.wait()
        end = time.monotonic() + 1.0
        pending_fds = list(pidfds)
        while pending_fds and time.monotonic() < end:
            ready, _, _ = select.select(pending_fds, [], [], max(0.0, end - time.monotonic()))
            pending_fds = [fd for fd in pending_fds if fd not in ready]
        survivors = [pid for pid, fd in zip(pids, pidfds, strict=True) if fd in pending_fds]
        for pid in survivors:
            os.kill(pid, signal.SIGKILL)
        assert survivors == [], "still running 1 s after the supervisor was SIGKILLed"
    finally:
        for fd in pidfds:
            os.close(fd)
        host.stdout.close()


# --- signals -------------------------------------------------------------------------------------


def handlers(signums: Sequence[int]) -> list[object]:
    return [signal.getsignal(s) for s in signums]


def test_sigint_tears_down_and_restores_handlers() -> None:
    watched = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGCHLD]
    before = handlers(watched)
    code = "import time; print('ready', flush=True); time.sleep(60)"
    sink = Collect(kill_later(os.getpid(), signal.SIGINT))
    result = run([spec(0, code, stdout=sink), spec(1, "import time; time.sleep(60)")])
    assert result.received_signal == signal.SIGINT
    assert [w.state for w in result.workers] == ["terminated", "terminated"]
    assert result.first_failure is None
    assert handlers(watched) == before
    previous = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(previous)
    assert previous == -1


def test_forwarded_signal_reaches_workers_and_run_goes_on() -> None:
    code = (
        "import signal\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])\n"
        "print('ready', flush=True)\n"
        "signal.sigwait([signal.SIGUSR1])\n"
        "print('got', flush=True)\n"
    )
    ready: list[str] = []

    def on_line(line: str) -> None:
        if line == "ready":
            ready.append(line)
            if len(ready) == 2:
                os.kill(os.getpid(), signal.SIGUSR1)

    sinks = [Collect(on_line), Collect(on_line)]
    before = signal.getsignal(signal.SIGUSR1)
    result = run([spec(k, code, stdout=sinks[k]) for k in (0, 1)], forward_signals=[signal.SIGUSR1])
    assert [w.state for w in result.workers] == ["succeeded", "succeeded"]
    assert result.received_signal is None
    assert [s.lines() for s in sinks] == [["ready", "got"], ["ready", "got"]]
    assert signal.getsignal(signal.SIGUSR1) == before


def test_teardown_signal_during_start_is_acted_on_not_fatal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = handlers([signal.SIGTERM])
    real_await = Starter._await_started

    def await_exec_then_signal(self: Starter) -> None:
        real_await(self)
        os.kill(os.getpid(), signal.SIGTERM)  # every worker forked, start() not yet returned

    monkeypatch.setattr(Starter, "_await_started", await_exec_then_signal)
    sup = Supervisor([spec(k, "import time; time.sleep(60)") for k in (0, 1)], grace_period=5)
    result = sup.run()
    assert result.received_signal == signal.SIGTERM
    assert [w.state for w in result.workers] == ["terminated", "terminated"]
    assert handlers([signal.SIGTERM]) == before


def test_run_calls_on_started_once_workers_run() -> None:
    seen: list[list[int]] = []
    sup = Supervisor([spec(0, "pass"), spec(1, "pass")])
    result = sup.run(on_started=lambda: seen.append(sup.pids()))
    assert [w.state for w in result.workers] == ["succeeded", "succeeded"]
    assert seen == [[w.pid for w in result.workers]]


def test_an_ignored_teardown_signal_stays_ignored() -> None:
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    try:
        code = "import time; print('ready', flush=True); time.sleep(0.5)"
        sink = Collect(lambda line: os.kill(os.getpid(), signal.SIGHUP))
        result = run([spec(0, code, stdout=sink)])
        assert result.received_signal is None
        assert [w.state for w in result.workers] == ["succeeded"]
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_no_signal_handling_outside_the_main_thread() -> None:
    before = handlers([signal.SIGINT, signal.SIGTERM])
    results: list[RunResult] = []
    thread = threading.Thread(target=lambda: results.append(run([spec(0, "pass")])))
    thread.start()
    thread.join()
    assert results[0].workers[0].state == "succeeded"
    assert handlers([signal.SIGINT, signal.SIGTERM]) == before


# --- binding -------------------------------------------------------------------------------------


def report_cpus(payload_fd: int, result_fd: int) -> int:
    """fork_target: the CPUs this process may run on, read first thing."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("Cpus_allowed_list"))
    os.write(result_fd, line.split()[1].encode())
    return 0


def test_32_exec_workers_bound_per_rank() -> None:
    specs = [spec(k, REPORT_CPUS, want_result=True, cpus=[CPUS[k % len(CPUS)]]) for k in range(32)]
    result = run(specs)
    assert [w.state for w in result.workers] == ["succeeded"] * 32
    assert [w.result.decode() for w in result.workers] == [
        str(CPUS[k % len(CPUS)]) for k in range(32)
    ]
    assert len({w.pid for w in result.workers}) == 32


@pytest.mark.parametrize("start", ["fork", "forkserver"])
def test_forked_workers_bound_per_rank(start: str) -> None:
    specs = [
        WorkerSpec(
            k, k, ENV, start=start, fork_target=report_cpus, want_result=True, cpus=[CPUS[k % 2]]
        )
        for k in range(2 * len(CPUS))
    ]
    result = run(specs)
    assert [w.state for w in result.workers] == ["succeeded"] * len(specs)
    assert [w.result.decode() for w in result.workers] == [
        str(CPUS[k % 2]) for k in range(len(specs))
    ]


def echo_payload(payload_fd: int, result_fd: int) -> int:
    """fork_target: copy the payload to the result pipe; exit 0."""
    while chunk := os.read(payload_fd, 1 << 20):
        os.write(result_fd, chunk)
    return 0


def fail_loudly(payload_fd: int, result_fd: int) -> int:
    raise RuntimeError("boom in the child")


def no_pipes(payload_fd: int, result_fd: int) -> None:
    """fork_target: without payload and want_result both fds are -1; returns None (exit 0)."""
    assert (payload_fd, result_fd) == (-1, -1)


def exit_with(payload_fd: int, result_fd: int) -> int:
    sys.exit(int(os.environ["EXIT_WITH"]))


@pytest.mark.parametrize("start", ["fork", "forkserver"])
def test_fork_targets_exit_status_and_stderr(start: str) -> None:
    err = Collect()
    raised = run([WorkerSpec(0, 0, ENV, start=start, fork_target=fail_loudly, stderr=err)])
    assert raised.workers[0].exit_code == 1 and raised.workers[0].state == "failed"
    assert "RuntimeError: boom in the child" in err.data.decode() and err.closed == 1
    env = {**ENV, "EXIT_WITH": "6"}
    exited = run([WorkerSpec(0, 0, env, start=start, fork_target=exit_with)])
    assert exited.workers[0].exit_code == 6
    succeeded = run([WorkerSpec(0, 0, ENV, start=start, fork_target=no_pipes)])
    assert succeeded.workers[0].exit_code == 0


def test_large_payload_and_result_without_deadlock() -> None:
    size = 100 * 1024 * 1024
    echo = (
        "import os\n"
        "src = int(os.environ['NUMARUN_PAYLOAD_FD']); dst = int(os.environ['NUMARUN_RESULT_FD'])\n"
        "while chunk := os.read(src, 1 << 20):\n"
        "    view = memoryview(chunk)\n"
        "    while view:\n"
        "        view = view[os.write(dst, view):]\n"
    )
    payloads = [bytes([k + 1]) * size for k in range(2)]
    result = run([spec(k, echo, payload=payloads[k], want_result=True) for k in range(2)])
    assert [w.state for w in result.workers] == ["succeeded", "succeeded"]
    assert [w.result == payloads[k] for k, w in enumerate(result.workers)] == [True, True]


def test_fork_payload_and_result() -> None:
    payload = os.urandom(3 * 1024 * 1024)
    result = run(
        [
            WorkerSpec(
                0, 0, ENV, start="fork", fork_target=echo_payload, payload=payload, want_result=True
            )
        ]
    )
    assert result.workers[0].state == "succeeded" and result.workers[0].result == payload


def test_output_is_fed_in_order_and_closed_once() -> None:
    code = "import sys\nfor i in range(100000): print(i)\nprint('to err', file=sys.stderr)\n"
    out, err = Collect(), Collect()
    result = run([spec(0, code, stdout=out, stderr=err)])
    assert result.workers[0].state == "succeeded"
    assert out.lines() == [str(i) for i in range(100000)]
    assert err.lines() == ["to err"] and (out.closed, err.closed) == (1, 1)


# --- resources and the caller's state ------------------------------------------------------------


def count_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.slow
def test_200_runs_leak_no_fds_zombies_or_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    env = {**ENV, "TMPDIR": str(tmp_path)}

    def one_run(k: int) -> RunResult:
        program = "/bin/true" if k % 2 == 0 else "/bin/false"
        worker = WorkerSpec(
            0, 0, env, argv=[program], payload=b"x" * 1000, want_result=True, stdout=Collect()
        )
        return run([worker, WorkerSpec(1, 1, env, argv=["true"], stderr=Collect())])

    one_run(0)
    gc.collect()  # what earlier tests left to the collector closes its fds now, not below
    fds = count_fds()
    for k in range(200):
        result = one_run(k)
        assert result.workers[0].state == ("succeeded" if k % 2 == 0 else "failed")
    # A leak adds fds; fewer is an earlier test's object collected meanwhile, not ours.
    assert count_fds() <= fds
    assert our_zombies() == []
    assert list(tmp_path.iterdir()) == []


def test_callers_state_is_unchanged() -> None:
    watched = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1]
    affinity, environ, before = os.sched_getaffinity(0), dict(os.environ), handlers(watched)
    policy, subreaper = binding.get_mem_policy(), binding.is_child_subreaper()
    run([spec(k, "pass", cpus=[CPUS[k % 2]]) for k in range(2)])
    run([spec(0, "import sys; sys.exit(1)", cpus=[CPUS[0]]), spec(1, "import time; time.sleep(9)")])
    assert os.sched_getaffinity(0) == affinity
    assert dict(os.environ) == environ
    assert handlers(watched) == before
    assert binding.get_mem_policy() == policy
    assert binding.is_child_subreaper() == subreaper


def test_unkillable_worker_is_reported_and_wait_returns() -> None:
    stuck = spec(0, "import time; print('ready', flush=True); time.sleep(60)")
    victim: list[int] = []

    def fake_kill(pid: int, signum: int) -> None:
        if victim and abs(pid) == victim[0]:
            return  # as if the worker were in uninterruptible sleep
        os.kill(pid, signum)

    sup: Supervisor | None = None

    def on_line(line: str) -> None:
        assert sup is not None
        os.kill(sup.pids()[1], signal.SIGKILL)

    sup = Supervisor(
        [
            WorkerSpec(0, 0, ENV, argv=stuck.argv, stdout=Collect(on_line)),
            spec(1, "import time; time.sleep(60)"),
        ],
        grace_period=0.2,
        kill_wait=0.3,
        kill=fake_kill,
    )
    sup.start()
    victim.append(sup.pids()[0])
    try:
        result = sup.wait()
        assert result is not None
        stuck_exit = result.workers[0]
        assert stuck_exit.state == "unkillable" and stuck_exit.exit_code is None
        assert stuck_exit.proc_state in ("S", "R", "D") and stuck_exit.pid == victim[0]
        assert result.unkillable == [stuck_exit]
        assert result.first_failure == result.workers[1]
    finally:
        os.kill(victim[0], signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(victim[0], 0)


def test_fallback_without_pidfd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(proctable, "_pidfds_work", False)
    result = run(
        [spec(0, "import time; time.sleep(60)"), spec(1, "import sys; sys.exit(2)")],
        grace_period=5,
    )
    assert [w.state for w in result.workers] == ["terminated", "failed"]
    results: list[RunResult] = []
    thread = threading.Thread(
        target=lambda: results.append(run([spec(0, "import sys; sys.exit(3)")]))
    )
    thread.start()
    thread.join()
    assert results[0].workers[0].exit_code == 3
    assert our_zombies() == []


# --- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("specs", "error", "words"),
    [
        ([WorkerSpec(0, 0, ENV, argv=["no-such-program-xyz"])], UsageError, "PATH"),
        ([WorkerSpec(0, 0, ENV, argv=["/no/such/file"])], UsageError, "/no/such/file"),
        ([WorkerSpec(0, 0, ENV, argv=[])], UsageError, "argv"),
        ([WorkerSpec(0, 0, ENV, start="spawn", argv=[PY])], UsageError, "start method"),
        ([WorkerSpec(0, 0, ENV, start="fork")], UsageError, "fork_target"),
        ([WorkerSpec(0, 0, ENV, argv=[PY], cpus=[4096])], BindingError, "4096"),
        ([WorkerSpec(0, 0, ENV, argv=[PY], cwd="/no/such/dir")], UsageError, "/no/such/dir"),
    ],
)
def test_bad_spec_starts_nothing(specs: list[WorkerSpec], error: type, words: str) -> None:
    good = WorkerSpec(1, 1, ENV, argv=[PY, "-c", "import time; time.sleep(60)"])
    before = children_of_us()
    sup = Supervisor([good, *specs])
    with pytest.raises(error) as info:
        sup.start()
    assert words in str(info.value) and "\n" not in str(info.value)
    assert children_of_us() <= before


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"grace_period": -1}, "grace_period"),
        ({"forward_signals": [signal.SIGINT]}, "both"),
        ({"teardown_signals": [signal.SIGKILL]}, "cannot be handled"),
    ],
)
def test_bad_supervisor_arguments(kwargs: dict[str, object], words: str) -> None:
    with pytest.raises(UsageError, match=words):
        Supervisor([spec(0, "pass")], **kwargs)
    with pytest.raises(UsageError, match="unique"):
        Supervisor([spec(0, "pass"), spec(0, "pass")])


def test_exec_failure_after_validation_stops_started_workers(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.write_text("#!/no/such/interpreter\n")
    broken.chmod(0o755)
    first = spec(0, "import time; time.sleep(60)")
    sup = Supervisor([first, WorkerSpec(1, 1, ENV, argv=[str(broken)])])
    before = children_of_us()
    with pytest.raises(UsageError, match="cannot start"):
        sup.start()
    assert children_of_us() <= before
    assert our_zombies() == []


def test_binding_failure_in_the_child_stops_started_workers() -> None:
    bad = WorkerSpec(1, 1, ENV, argv=[PY, "-c", "pass"], mem=binding.MemPolicy("bind", (63,)))
    sup = Supervisor([spec(0, "import time; time.sleep(60)"), bad])
    before = children_of_us()
    with pytest.raises(BindingError, match="local rank 1: binding failed in the child"):
        sup.start()
    assert children_of_us() <= before


def test_second_teardown_signal_skips_the_grace_period() -> None:
    code = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )

    def on_line(line: str) -> None:
        if line == "ready":
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)

    sup = Supervisor([spec(0, code, stdout=Collect(on_line))], grace_period=60)
    sup.start()
    result = sup.wait(timeout=20)  # without the escalation this would take the 60 s grace
    if result is None:
        sup.stop(grace_period=0)
    assert result is not None
    assert result.received_signal == signal.SIGTERM
    assert result.workers[0].exit_code == -signal.SIGKILL


def test_a_signal_during_a_failures_teardown_is_the_runs_signal_too(tmp_path: Path) -> None:
    """A worker fails; while the others end, the launcher gets SIGTERM (Slurm's scancel, a
    user's Ctrl-C at a slow teardown). It was taken only as a second request: the run ended
    as the failure alone, and with restarts left the launcher started the next attempt, the
    signal lost. Now the run ends on the signal too, its first failure still named."""
    ready = tmp_path / "holds-on"
    holds_on = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: print('asked', flush=True))\n"
        f"open({str(ready)!r}, 'w').close()\n"
        "time.sleep(60)\n"
    )
    fails = (f"import os, time\nwhile not os.path.exists({str(ready)!r}): time.sleep(0.01)\n"
             "raise SystemExit(3)")  # fmt: skip

    def on_line(line: str) -> None:  # the failure's teardown has begun
        if line == "asked":
            os.kill(os.getpid(), signal.SIGTERM)

    sup = Supervisor([spec(0, fails), spec(1, holds_on, stdout=Collect(on_line))],
                     grace_period=60)  # fmt: skip
    sup.start()
    result = sup.wait(timeout=30)  # the signal not taken: the rest of the 60 s grace period
    if result is None:
        sup.stop(grace_period=0)
    assert result is not None
    assert result.received_signal == signal.SIGTERM
    assert result.first_failure is not None and result.first_failure.exit_code == 3
    assert result.workers[1].exit_code == -signal.SIGKILL  # asked twice: no grace left

# --- the watchdog's process finding --------------------------------------------------------------


def fake_proc(root: Path, processes: dict[int, tuple[int, int, int, str, int, bytes]]) -> None:
    """A /proc tree: pid -> (ppid, pgid, sid, state, real uid, environ)."""
    for pid, (ppid, pgid, sid, state, uid, environ) in processes.items():
        entry = root / str(pid)
        entry.mkdir()
        (entry / "stat").write_text(f"{pid} (p) {state} {ppid} {pgid} {sid} 0 0\n")
        (entry / "status").write_text(f"Name:\tp\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
        (entry / "environ").write_bytes(environ)


def test_run_processes_by_descent_then_held_sessions_and_marker_of_our_uid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(proctable, "_pidfds_work", False)  # fake pids: nothing to pin
    marker = b"NUMARUN_RUN_ID=run-1"
    fake_proc(
        tmp_path,
        {
            1: (0, 1, 1, "S", 0, b""),
            10: (1, 10, 10, "S", 0, b""),  # the supervisor
            11: (10, 11, 10, "S", 0, b""),  # its watchdog
            20: (11, 20, 20, "S", 0, marker + b"\0"),  # a worker
            21: (20, 20, 20, "S", 0, marker + b"\0"),  # its child
            22: (21, 22, 22, "S", 0, b""),  # grandchild, own session, empty environment
            23: (11, 23, 23, "S", 0, b""),  # double-forked daemon adopted by the watchdog
            24: (23, 23, 23, "S", 65534, b""),  # its child, another uid: still the run's
            30: (1, 30, 20, "S", 0, b"B=1\0"),  # reparented to init, in the worker's session
            31: (30, 31, 31, "Z", 0, b""),  # zombie
            40: (1, 40, 40, "S", 0, b"A=1\0" + marker + b"\0"),  # marked, left everything
            41: (1, 41, 41, "S", 65534, marker + b"\0"),  # marked by another user
            42: (1, 42, 42, "S", 0, b"NUMARUN_RUN_ID=run-12\0"),  # another run's marker
            50: (1, 50, 50, "S", 0, b"C=1\0"),  # unrelated
        },
    )
    table = proctable.read_proc_table(str(tmp_path))
    pins: dict[int, int | None] = {}
    # A run of exec/fork workers: the watchdog's descendants, whatever they did.
    found = proctable.find_run_processes(
        table, roots={11: None, 20: None}, pins=pins, proc=str(tmp_path)
    )
    assert set(found) == {21, 22, 23, 24}
    # Forkserver workers are not below the watchdog: held sessions and our uid's marker.
    found = proctable.find_run_processes(
        table,
        roots={20: None},
        pins={},
        sessions={20: None},
        marker=marker,
        uid=0,
        exclude={10},
        proc=str(tmp_path),
    )
    assert set(found) == {21, 22, 30, 40}
    assert proctable.ancestors(22, table) == {21, 20, 11, 10, 1}
    assert not proctable.is_alive(table[31]) and proctable.is_alive(table[40])


def test_a_session_whose_holder_is_gone_is_not_trusted(tmp_path: Path) -> None:
    """A session id is matched only while its worker holds the pid (a pidfd says so)."""
    member = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"], start_new_session=True)
    holder = subprocess.Popen([PY, "-c", "pass"])
    holder_fd = os.pidfd_open(holder.pid)
    try:
        table = proctable.read_proc_table()
        sessions = {member.pid: holder_fd}  # as if 'holder' had been that session's worker
        holder.wait()  # reaped: its pid is free, a session of that number could be anyone's
        pins: dict[int, int | None] = {}
        found = proctable.find_run_processes(table, roots={}, pins=pins, sessions=sessions)
        assert member.pid not in found
        live = os.pidfd_open(member.pid)
        found = proctable.find_run_processes(
            table, roots={}, pins=pins, sessions={member.pid: live}
        )
        assert member.pid in found
        proctable.close_all([live, *pins.values()])
    finally:
        os.close(holder_fd)
        member.kill()
        member.wait()


def test_a_marked_process_in_a_session_whose_holder_is_gone_is_still_found() -> None:
    """A forkserver worker's child that outlives it keeps the worker's session id and the
    run's marker: the dead session proves nothing, the marker still does (it was left running
    after a successful forkserver run, issue 20.7)."""
    marker = b"NUMARUN_RUN_ID=run-session-gone"
    member = subprocess.Popen(
        [PY, "-c", "import time; time.sleep(60)"],
        start_new_session=True,
        env={**os.environ, "NUMARUN_RUN_ID": "run-session-gone"},
    )
    holder = subprocess.Popen([PY, "-c", "pass"])
    holder_fd = os.pidfd_open(holder.pid)
    pins: dict[int, int | None] = {}
    try:
        holder.wait()
        deadline = time.monotonic() + 10
        while not proctable.environ_has(member.pid, marker):  # until its exec is done
            assert time.monotonic() < deadline
            time.sleep(0.01)
        found = proctable.find_run_processes(
            proctable.read_proc_table(),
            roots={},
            pins=pins,
            sessions={member.pid: holder_fd},  # as if 'holder' had been that session's worker
            marker=marker,
            uid=os.getuid(),
        )
        assert member.pid in found
    finally:
        proctable.close_all(list(pins.values()))
        os.close(holder_fd)
        member.kill()
        member.wait()


def sleep_forever(payload_fd: int, result_fd: int) -> int:
    """fork_target: sleep until torn down."""
    time.sleep(60)
    return 0


def test_forkserver_worker_is_torn_down_and_needs_a_picklable_target() -> None:
    result = run(
        [
            WorkerSpec(0, 0, ENV, start="forkserver", fork_target=sleep_forever),
            spec(1, "import sys; sys.exit(9)"),
        ],
        grace_period=5,
    )
    assert [w.state for w in result.workers] == ["terminated", "failed"]
    assert result.workers[0].exit_code == -signal.SIGTERM
    local = WorkerSpec(0, 0, ENV, start="forkserver", fork_target=lambda p, r: 0)
    with pytest.raises(UsageError, match="picklable"):
        Supervisor([local]).start()


def fork_a_new_session_child(payload_fd: int, result_fd: int) -> int:
    """fork_target: a child in its own session (no exec, so no run marker in its environ),
    whose pid goes to stdout; then sleep until torn down."""
    child = os.fork()
    if child == 0:
        os.setsid()
        time.sleep(60)
        os._exit(0)
    print(f"G {child}", flush=True)
    print("ready", flush=True)
    time.sleep(60)
    return 0


def test_fork_worker_descendant_found_by_parent_links() -> None:
    sup: Supervisor | None = None

    def on_line(line: str) -> None:
        if line == "ready":
            assert sup is not None
            os.kill(sup.pids()[1], signal.SIGKILL)

    out = Collect(on_line)
    sup = Supervisor(
        [
            WorkerSpec(0, 0, ENV, start="fork", fork_target=fork_a_new_session_child, stdout=out),
            spec(1, "import time; time.sleep(60)"),
        ],
        grace_period=5,
    )
    sup.start()
    result = sup.wait()
    assert result is not None and result.workers[0].state == "terminated"
    (grandchild,) = [int(line.split()[1]) for line in out.lines() if line.startswith("G ")]
    assert not alive(grandchild)
    assert our_zombies() == []


def test_leaving_a_with_block_tears_down() -> None:
    with pytest.raises(KeyError), Supervisor([spec(0, "import time; time.sleep(60)")]) as sup:
        sup.start()
        (pid,) = sup.pids()
        raise KeyError("caller's own error")
    assert not alive(pid) and our_zombies() == []
    assert sup.stop().workers[0].state == "terminated"
    with pytest.raises(RuntimeError, match="start"):
        Supervisor([spec(0, "pass")]).wait()

"""numarun.spawn / start_processes with real worker processes on this machine.

Worker functions live in tests/programs/spawn_funcs.py (importable as ``workers.spawn_funcs``
because conftest puts tests/ on sys.path, which spawned workers inherit through the payload).
"""

from __future__ import annotations

import functools
import os
import pickle
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import numarun
import numarun.process.supervisor
from numarun import errors
from numarun.errors import (
    BindingError,
    InvalidArgument,
    NumarunError,
    PlanError,
    UsageError,
)
from numarun.machine.cpulist import parse_cpulist
from numarun.machine.topology import read_topology
from numarun.placement.plan import make_plan
from numarun.spawning.api import (
    ProcessException,
    ProcessExitedException,
    ProcessRaisedException,
    SpawnContext,
    start_processes,
)
from programs import spawn_funcs

METHODS = ["spawn", "fork", "forkserver"]
TESTS_DIR = Path(__file__).resolve().parents[1]
WATCHED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1)


def _gone(pid: int) -> bool:
    """True when no process (not even a zombie) has this pid."""
    return not os.path.exists(f"/proc/{pid}")


def _wait_gone(pids: list[int], timeout: float = 30.0) -> list[int]:
    """Pids still present after ``timeout`` (teardown is already done when spawn returns; the
    bounded wait only absorbs the final reaping, by init or a subreaper, which a loaded machine
    may schedule seconds later; it returns as soon as they are gone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [pid for pid in pids if not _gone(pid)]
        if not left:
            return []
        time.sleep(0.01)
    return [pid for pid in pids if not _gone(pid)]


def _children() -> set[int]:
    children: set[int] = set()
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as listing:
            children.update(int(pid) for pid in listing.read().split())
    return children


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _wait_for_files(paths: list[Path], process: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + 30
    while not all(path.exists() for path in paths):
        assert time.monotonic() < deadline, f"{paths} never appeared"
        if process is not None and process.poll() is not None:
            raise AssertionError(f"script ended early: {process.communicate()}")
        time.sleep(0.01)


def _parent_state() -> tuple[object, ...]:
    previous_wakeup = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(previous_wakeup)
    return (
        os.sched_getaffinity(0),
        dict(os.environ),
        [signal.getsignal(signum) for signum in WATCHED_SIGNALS],
        previous_wakeup,
    )


@pytest.fixture
def no_supervisor(monkeypatch: pytest.MonkeyPatch) -> None:
    """Makes any attempt to start workers fail the test."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a Supervisor was created although the input is bad")

    monkeypatch.setattr(numarun.process.supervisor, "Supervisor", refuse)


# --- return values -------------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_return_values_by_local_rank(method: str) -> None:
    values = numarun.spawn(spawn_funcs.echo, args=("a", 2), nprocs=2, start_method=method)
    assert values == [(0, ("a", 2)), (1, ("a", 2))]


def test_fork_runs_closures_and_start_processes_is_the_same_api() -> None:
    offset = 40
    values = start_processes(lambda rank: rank + offset, nprocs=2, start_method="fork")
    assert values == [40, 41]


def test_sys_exit_zero_is_success_with_no_value() -> None:
    assert numarun.spawn(spawn_funcs.exit_zero, nprocs=2, start_method="fork") == [None, "value"]


@pytest.mark.parametrize("method", METHODS)
def test_hundred_megabytes_per_rank_come_back_without_deadlock(method: str) -> None:
    size = 100 * 1024 * 1024
    values = numarun.spawn(spawn_funcs.big_bytes, args=(size,), nprocs=2, start_method=method)
    assert [len(value) for value in values] == [size, size]
    assert [(value[0], value[-1]) for value in values] == [(0, 0), (1, 1)]


def test_spawn_is_the_function_whatever_was_imported_first() -> None:
    import numarun.spawning.api

    assert numarun.spawn is numarun.spawning.api.spawn
    assert numarun.spawn(spawn_funcs.echo, nprocs=1, start_method="fork") == [(0, ())]


def test_import_numarun_does_not_load_the_spawn_module() -> None:
    code = (
        "import numarun, sys; "
        "print('numarun.spawning.api' in sys.modules, callable(numarun.spawn))"
    )
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert output.stdout.split() == ["False", "True"], output.stderr


# --- failures ------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_raised_exception_carries_the_worker_traceback(method: str) -> None:
    with pytest.raises(ProcessRaisedException) as info:
        numarun.spawn(spawn_funcs.raise_value_error, nprocs=2, start_method=method, grace_period=5)
    error = info.value
    assert error.error_index == 0
    assert error.pid == error.error_pid > 0
    assert str(error).startswith("\n\n-- Process 0 terminated with the following error:\n")
    assert "Traceback (most recent call last):" in str(error)
    assert "in raise_value_error" in str(error)
    assert str(error).rstrip().endswith("ValueError: rank 0 was told to fail")
    assert error.failures == []
    assert _wait_gone([error.pid]) == []


@pytest.mark.parametrize(
    ("fn", "args", "code", "signal_name", "message"),
    [
        (spawn_funcs.exit_with, (3,), 3, None, "process 0 terminated with exit code 3"),
        (spawn_funcs.hard_exit, (7,), 7, None, "process 0 terminated with exit code 7"),
        (
            spawn_funcs.kill_self,
            (int(signal.SIGSEGV),),
            -signal.SIGSEGV,
            "SIGSEGV",
            "process 0 terminated with signal SIGSEGV",
        ),
        (
            spawn_funcs.kill_self,
            (int(signal.SIGKILL),),
            -signal.SIGKILL,
            "SIGKILL",
            "process 0 terminated with signal SIGKILL",
        ),
    ],
)
@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_exit_codes_and_signals(
    method: str, fn: object, args: tuple[int], code: int, signal_name: str | None, message: str
) -> None:
    with pytest.raises(ProcessExitedException) as info:
        numarun.spawn(fn, args=args, nprocs=2, start_method=method, grace_period=5)
    error = info.value
    assert (error.error_index, error.exit_code, error.signal_name) == (0, code, signal_name)
    assert str(error) == message


def test_forkserver_worker_exit_code() -> None:
    with pytest.raises(ProcessExitedException) as info:
        numarun.spawn(spawn_funcs.exit_with, args=(3, 1), nprocs=2, start_method="forkserver")
    assert (info.value.error_index, info.value.exit_code) == (1, 3)


def test_worker_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    with pytest.raises(ProcessRaisedException) as info:
        numarun.spawn(
            spawn_funcs.ignore_sigterm_or_fail,
            args=(str(tmp_path),),
            nprocs=2,
            start_method="fork",
            grace_period=0.5,
        )
    assert info.value.error_index == 0
    deaf_pid = int((tmp_path / "ready").read_text())
    assert _wait_gone([deaf_pid]) == []
    assert info.value.failures == []  # killed by our teardown: not a failure of its own


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_grandchildren_die_with_their_workers(method: str, tmp_path: Path) -> None:
    with pytest.raises(ProcessRaisedException):
        numarun.spawn(
            spawn_funcs.grandchildren_then_fail,
            args=(str(tmp_path),),
            nprocs=2,
            start_method=method,
            grace_period=5,
        )
    pids = [
        int(pid)
        for rank in (0, 1)
        for pid in (tmp_path / f"grandchildren{rank}").read_text().split()
    ]
    assert _wait_gone(pids) == []


def test_first_failure_in_time_is_raised_and_later_ones_are_attached(tmp_path: Path) -> None:
    with pytest.raises(ProcessRaisedException) as info:
        numarun.spawn(
            spawn_funcs.fail_one_after_another,
            args=(str(tmp_path),),
            nprocs=2,
            start_method="fork",
            grace_period=20,
        )
    error = info.value
    assert error.error_index == 1
    assert "rank 1 fails first" in str(error)
    assert [f.error_index for f in error.failures] == [0]
    assert isinstance(error.failures[0], ProcessRaisedException)
    assert "rank 0 fails second" in str(error.failures[0])


def test_exceptions_pickle_round_trip() -> None:
    exited = ProcessExitedException(
        "process 1 terminated with signal SIGSEGV", 1, 123, -11, "SIGSEGV"
    )
    raised = ProcessRaisedException("\n\n-- Process 0 terminated with ...", 0, 99)
    raised.failures = [exited]
    copy = pickle.loads(pickle.dumps(raised))
    assert isinstance(copy, ProcessRaisedException)  # (joined with torch's, when loaded)
    assert (str(copy), copy.error_index, copy.pid) == (str(raised), 0, 99)
    inner = copy.failures[0]
    assert isinstance(inner, ProcessExitedException)
    assert (str(inner), inner.error_index, inner.error_pid, inner.exit_code, inner.signal_name) == (
        "process 1 terminated with signal SIGSEGV",
        1,
        123,
        -11,
        "SIGSEGV",
    )
    assert isinstance(inner, ProcessException)


def test_real_failure_pickles_too() -> None:
    with pytest.raises(ProcessExitedException) as info:
        numarun.spawn(spawn_funcs.exit_with, args=(3,), nprocs=1, start_method="fork")
    copy = pickle.loads(pickle.dumps(info.value))
    assert (copy.exit_code, copy.error_index, copy.pid) == (3, 0, info.value.pid)


# --- join=False ----------------------------------------------------------------------------------


def test_context_join_with_timeout_then_values(tmp_path: Path) -> None:
    context = numarun.spawn(
        spawn_funcs.write_pid_then_sleep, args=(str(tmp_path), 1.0), nprocs=2, join=False
    )
    assert isinstance(context, SpawnContext)
    pids = context.pids()
    assert len(set(pids)) == 2
    assert context.join(timeout=0) is False
    assert context.return_values is None
    assert context.join() is True
    assert context.return_values == [None, None]
    assert context.join() is True
    assert sorted(int((tmp_path / f"worker{r}").read_text()) for r in (0, 1)) == sorted(pids)


def test_context_manager_tears_down_running_workers(tmp_path: Path) -> None:
    with numarun.spawn(
        spawn_funcs.write_pid_then_sleep,
        args=(str(tmp_path),),
        nprocs=2,
        join=False,
        start_method="fork",
        grace_period=1,
    ) as context:
        pids = context.pids()
        assert context.join(timeout=0.01) is False
    assert _wait_gone(pids) == []


def test_context_join_after_a_failure_reports_the_others_then_true() -> None:
    # torch's rule: one worker per join() call, the torn-down ones too, then True for good.
    context = numarun.spawn(
        spawn_funcs.exit_with, args=(4,), nprocs=2, join=False, start_method="fork"
    )
    with pytest.raises(ProcessExitedException) as first:
        context.join(grace_period=0.5)
    assert (first.value.error_index, first.value.exit_code) == (0, 4)
    with pytest.raises(ProcessExitedException, match="process 1 terminated with signal") as second:
        context.join()
    assert second.value.error_index == 1
    assert context.join() is True
    assert context.join() is True


# --- binding -------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_explicit_binding_is_in_force_at_the_first_line(method: str) -> None:
    results = numarun.spawn(
        spawn_funcs.first_line_cpus, nprocs=2, start_method=method, binding=[[1], [0]]
    )
    assert [(rank, cpus) for rank, cpus, _ in results] == [(0, "1"), (1, "0")]


@pytest.mark.parametrize("method", METHODS)
def test_cpu_mode_binding_follows_the_plan(method: str) -> None:
    plan = make_plan(read_topology("/"), 2, "cpu")
    expected = [",".join(map(str, rank.cpus)) for rank in plan.ranks]
    results = numarun.spawn(
        spawn_funcs.first_line_cpus, nprocs=2, start_method=method, binding="cpu"
    )
    assert [cpus for _, cpus, _ in results] == expected
    assert expected[0] != expected[1]


def test_a_ready_plan_and_cpu_list_strings_are_accepted() -> None:
    plan = make_plan(read_topology("/"), 2, "explicit", rank_cpus=[[1], [0]])
    by_plan = numarun.spawn(
        spawn_funcs.first_line_cpus, nprocs=2, start_method="fork", binding=plan
    )
    by_text = numarun.spawn(
        spawn_funcs.first_line_cpus, nprocs=2, start_method="fork", binding=["1", "0"]
    )
    assert [cpus for _, cpus, _ in by_plan] == [cpus for _, cpus, _ in by_text] == ["1", "0"]


@pytest.mark.parametrize(("mode", "expected"), [("local", ("local", ())), ("bind", ("bind", (0,)))])
def test_memory_binding_reaches_the_worker(
    mode: str, expected: tuple[str, tuple[int, ...]]
) -> None:
    values = numarun.spawn(
        spawn_funcs.memory_policy, nprocs=2, binding=[[0], [1]], mem_binding=mode
    )
    assert values == [expected, expected]


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_parent_state_is_unchanged_after_success_and_failure(method: str) -> None:
    before = _parent_state()
    numarun.spawn(spawn_funcs.echo, nprocs=2, start_method=method, binding=[[1], [0]])
    assert _parent_state() == before
    with pytest.raises(ProcessRaisedException):
        numarun.spawn(
            spawn_funcs.raise_value_error, nprocs=2, start_method=method, binding=[[1], [0]]
        )
    assert _parent_state() == before


# --- environment ---------------------------------------------------------------------------------


def test_worker_environment_is_the_callers_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 16.6: as under torch.multiprocessing, nothing of torchrun's is added (code that
    tests ``"RANK" in os.environ`` to detect torchrun must not be fooled), and no
    OMP_NUM_THREADS for unbound workers (1 would starve Hogwild-style workers)."""
    for name in spawn_funcs.ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    values = numarun.spawn(spawn_funcs.environment, nprocs=2, env={"SP_EXTRA": "x"})
    expected = dict.fromkeys(spawn_funcs.ENV_NAMES, None)
    assert values == [{**expected, "SP_EXTRA": "x"}] * 2
    assert "SP_EXTRA" not in os.environ


def test_dist_env_gives_what_init_process_group_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in spawn_funcs.ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    values = numarun.spawn(spawn_funcs.environment, nprocs=2, env={"SP_EXTRA": "x"}, dist_env=True)
    ports = {value["MASTER_PORT"] for value in values}
    assert len(ports) == 1
    port = int(str(ports.pop()))
    assert 0 < port < 65536
    for rank, value in enumerate(values):
        assert value == {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": None,
            "SP_EXTRA": "x",
        }


def test_omp_threads_only_with_a_binding_and_never_over_the_users(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    bound = numarun.spawn(
        spawn_funcs.environment, nprocs=2, start_method="fork", binding=[[0], [1]]
    )
    assert [value["OMP_NUM_THREADS"] for value in bound] == ["1", "1"]
    alone = numarun.spawn(spawn_funcs.environment, nprocs=1, start_method="fork", dist_env=True)
    assert alone[0]["OMP_NUM_THREADS"] is None
    chosen = numarun.spawn(
        spawn_funcs.environment,
        nprocs=2,
        start_method="fork",
        binding=[[0], [1]],
        env={"OMP_NUM_THREADS": "7"},
    )
    assert [value["OMP_NUM_THREADS"] for value in chosen] == ["7", "7"]
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    inherited = numarun.spawn(spawn_funcs.environment, start_method="fork", binding=[[0]])
    assert inherited[0]["OMP_NUM_THREADS"] == "3"


def test_master_address_and_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29999")
    inherited = numarun.spawn(spawn_funcs.environment, start_method="fork", dist_env=True)[0]
    assert (inherited["MASTER_ADDR"], inherited["MASTER_PORT"]) == ("10.0.0.1", "29999")
    given = numarun.spawn(
        spawn_funcs.environment,
        start_method="fork",
        dist_env=True,
        master_addr="10.0.0.2",
        master_port=1234,
    )[0]
    assert (given["MASTER_ADDR"], given["MASTER_PORT"]) == ("10.0.0.2", "1234")


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"master_port": 29500}, "master_port=29500 needs dist_env=True"),
        ({"master_addr": "10.0.0.2"}, "master_addr='10.0.0.2' needs dist_env=True"),
        ({"dist_env": "yes"}, "dist_env must be True or False, got 'yes'"),
        ({"dist_env": True, "master_port": 0}, "master_port must be a port number 1-65535"),
        ({"dist_env": True, "master_port": "29500"}, "master_port must be a port number"),
        ({"dist_env": True, "master_addr": ""}, "master_addr must be a non-empty host name"),
    ],
)
def test_dist_env_arguments_are_checked_before_anything_starts(
    kwargs: dict[str, object], words: str
) -> None:
    before = _children()
    with pytest.raises(InvalidArgument, match=re.escape(words)) as info:
        numarun.spawn(spawn_funcs.environment, start_method="fork", **kwargs)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)
    assert _children() == before


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_forked_workers_see_their_environment_in_os_environ(method: str) -> None:
    values = numarun.spawn(
        spawn_funcs.environment, nprocs=2, start_method=method, env={"SP_EXTRA": "y"}, dist_env=True
    )
    assert [(value["RANK"], value["SP_EXTRA"]) for value in values] == [("0", "y"), ("1", "y")]
    assert "SP_EXTRA" not in os.environ


# --- bad input -----------------------------------------------------------------------------------


class _Unpicklable:
    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("this object refuses to be pickled")


@pytest.mark.usefixtures("no_supervisor")
@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"nprocs": 0}, UsageError, "nprocs must be an integer >= 1"),
        ({"nprocs": -1}, UsageError, "nprocs must be an integer >= 1"),
        ({"nprocs": "2"}, UsageError, "nprocs must be an integer >= 1"),
        ({"grace_period": -1}, UsageError, "grace_period must be a number of seconds >= 0"),
        ({"start_method": "thread"}, UsageError, "unknown start_method 'thread'"),
        ({"fn": lambda rank: rank}, UsageError, "cannot be pickled for start_method='spawn'"),
        (
            {"args": (_Unpicklable(),), "start_method": "forkserver"},
            UsageError,
            "cannot be pickled for start_method='forkserver': this object refuses",
        ),
        ({"fn": 42}, UsageError, "fn must be callable"),
        ({"args": "ab"}, UsageError, "args must be a tuple of arguments for fn, got str"),
        ({"env": {"A": 1}}, UsageError, "env must be a mapping of str to str"),
        ({"binding": [[0]], "nprocs": 2}, UsageError, "binding lists CPUs for 1 rank but"),
        ({"binding": [["x"]]}, UsageError, "invalid CPU list"),
        ({"binding": "bogus"}, UsageError, "unknown binding 'bogus': use one of node, socket"),
        ({"binding": "nodes"}, UsageError, "unknown binding 'nodes': did you mean 'node'?"),
        (
            {"binding": "explicit"},
            UsageError,
            "binding='explicit' names no CPUs: pass the CPUs themselves, one list per rank, as "
            "binding (binding=[[0, 1], [2, 3]] or ['0-1', '2-3'])",
        ),
        ({"binding": [[0], [7]], "nprocs": 2}, PlanError, "7"),
        ({"binding": "cpu", "nprocs": 3}, PlanError, ""),
        ({"mem_binding": "bind"}, UsageError, "needs memory nodes from a CPU binding"),
        ({"binding": [[0]], "mem_binding": "sideways"}, UsageError, "sideways"),
    ],
)
def test_bad_input_raises_one_line_before_anything_starts(
    kwargs: dict[str, object], error: type[Exception], words: str
) -> None:
    arguments: dict[str, object] = {"fn": spawn_funcs.echo, "nprocs": 1}
    arguments.update(kwargs)
    fn = arguments.pop("fn")
    with pytest.raises(error) as info:
        numarun.spawn(fn, **arguments)  # type: ignore[arg-type]
    assert words in str(info.value)
    assert "\n" not in str(info.value)
    # One family (issue 32 item 9): every bad argument is a NumarunError, and a ValueError.
    assert isinstance(info.value, NumarunError) and isinstance(info.value, ValueError)


@pytest.mark.usefixtures("no_supervisor")
def test_every_error_of_the_api_is_a_value_error() -> None:
    for name in ("NumarunError", "UsageError", "InvalidArgument", "PlanError", "BindingError",
                 "TopologyError"):  # fmt: skip
        assert issubclass(getattr(errors, name), ValueError), name
        assert issubclass(getattr(errors, name), NumarunError), name
    with pytest.raises(ValueError, match="did you mean 'none'"):
        numarun.spawn(spawn_funcs.echo, nprocs=1, binding="nones")


@pytest.mark.parametrize("mem_binding", [None, "none", "local"])
def test_binding_none_is_unbound(mem_binding: str | None) -> None:
    # As mem_binding="none" and a plan's mode "none": the workers inherit this process's CPUs.
    from numarun.machine.cpulist import format_cpulist

    values = numarun.spawn(
        spawn_funcs.first_line_cpus, nprocs=2, binding="none", mem_binding=mem_binding
    )
    mine = format_cpulist(sorted(os.sched_getaffinity(0)))
    assert [(rank, cpus) for rank, cpus, _pid in values] == [(0, mine), (1, mine)]
    policies = numarun.spawn(
        spawn_funcs.memory_policy, nprocs=1, binding="none", mem_binding=mem_binding
    )
    assert policies[0][0] == ("local" if mem_binding == "local" else "default")


@pytest.mark.usefixtures("no_supervisor")
def test_plan_with_the_wrong_number_of_ranks_is_refused() -> None:
    plan = make_plan(read_topology("/"), 2, "cpu")
    with pytest.raises(UsageError, match="the plan has 2 ranks but nprocs is 1"):
        numarun.spawn(spawn_funcs.echo, nprocs=1, binding=plan)


@pytest.mark.usefixtures("no_supervisor")
def test_cpus_outside_our_affinity_are_refused() -> None:
    plan = make_plan(read_topology("/"), 2, "explicit", rank_cpus=[[0], [1]])
    original = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {0})
    try:
        with pytest.raises((BindingError, PlanError)):
            numarun.spawn(spawn_funcs.echo, nprocs=2, binding=plan)
    finally:
        os.sched_setaffinity(0, original)


def test_binding_fallback_warns_and_runs_unbound() -> None:
    with pytest.warns(RuntimeWarning, match="disabled"):
        values = numarun.spawn(
            spawn_funcs.first_line_cpus,
            nprocs=3,
            start_method="fork",
            binding="cpu",
            binding_fallback=True,
        )
    allowed = tuple(sorted(os.sched_getaffinity(0)))
    assert [parse_cpulist(cpus) for _, cpus, _ in values] == [allowed] * 3


# --- signals -------------------------------------------------------------------------------------


def _script(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "job.py"
    script.write_text(
        f"import sys\nsys.path.insert(0, {str(TESTS_DIR)!r})\n" + textwrap.dedent(body)
    )
    return script


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_ctrl_c_tears_down_and_raises_keyboard_interrupt(method: str, tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        f"""
        import numarun
        from programs import spawn_funcs
        if __name__ == "__main__":
            try:
                numarun.spawn(spawn_funcs.write_pid_then_sleep, args=({str(tmp_path)!r},),
                              nprocs=2, start_method={method!r}, grace_period=5)
            except KeyboardInterrupt:
                print("KeyboardInterrupt", flush=True)
                sys.exit(42)
        """,
    )
    job = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE)
    pid_files = [tmp_path / "worker0", tmp_path / "worker1"]
    _wait_for_files(pid_files, job)
    job.send_signal(signal.SIGINT)
    output, _ = job.communicate(timeout=30)
    assert (job.returncode, output) == (42, b"KeyboardInterrupt\n")
    assert _wait_gone([int(path.read_text()) for path in pid_files]) == []


def test_sigterm_tears_down_then_ends_the_parent_by_sigterm(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        f"""
        import numarun
        from programs import spawn_funcs
        if __name__ == "__main__":
            numarun.spawn(spawn_funcs.write_pid_then_sleep, args=({str(tmp_path)!r},), nprocs=2)
        """,
    )
    job = subprocess.Popen([sys.executable, str(script)])
    pid_files = [tmp_path / "worker0", tmp_path / "worker1"]
    _wait_for_files(pid_files, job)
    job.terminate()
    assert job.wait(timeout=30) == -signal.SIGTERM
    assert _wait_gone([int(path.read_text()) for path in pid_files]) == []


def test_sigterm_runs_the_callers_own_handler_after_teardown(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        f"""
        import signal
        import numarun
        from programs import spawn_funcs
        def on_term(signum, frame):
            raise SystemExit(5)
        if __name__ == "__main__":
            signal.signal(signal.SIGTERM, on_term)
            numarun.spawn(spawn_funcs.write_pid_then_sleep, args=({str(tmp_path)!r},), nprocs=2,
                          start_method="fork")
        """,
    )
    job = subprocess.Popen([sys.executable, str(script)])
    pid_files = [tmp_path / "worker0", tmp_path / "worker1"]
    _wait_for_files(pid_files, job)
    job.terminate()
    assert job.wait(timeout=30) == 5
    assert _wait_gone([int(path.read_text()) for path in pid_files]) == []


def test_sigterm_between_start_and_join_still_tears_down(tmp_path: Path) -> None:
    # The signal lands after the workers started and before spawn joins them (forced here by
    # sending it from the step in between): it must be noted, acted on by the join, and only
    # then reach the caller's handler. It used to reach the handler at once; its SystemExit
    # then left the non-daemon workers running and the exiting interpreter waited for them.
    # The relayed SIGTERM alone must end the workers (their handler, the caller's, copied by
    # fork): neither the grace period's SIGKILL nor the end of their sleep comes before the
    # deadline, which only a lost signal reaches (a signal taken by numarun's helper thread
    # in a rank asleep was), never load.
    script = _script(
        tmp_path,
        f"""
        import os, signal
        import numarun
        from numarun.spawning import api as spawning
        from programs import spawn_funcs
        def on_term(signum, frame):
            raise SystemExit(5)
        made = spawning.ProcessContext.__init__
        def made_then_signalled(self, *args, **kwargs):
            made(self, *args, **kwargs)
            os.kill(os.getpid(), signal.SIGTERM)
        spawning.ProcessContext.__init__ = made_then_signalled
        if __name__ == "__main__":
            signal.signal(signal.SIGTERM, on_term)
            numarun.spawn(spawn_funcs.write_pid_then_sleep, args=({str(tmp_path)!r}, 600),
                          nprocs=2, start_method="fork", grace_period=600)
        """,
    )
    job = subprocess.Popen([sys.executable, str(script)])
    try:
        try:
            code = job.wait(timeout=120)
        except subprocess.TimeoutExpired:
            running = [path.read_text() for path in sorted(tmp_path.glob("worker*"))]
            pytest.fail(f"the job did not end in 120 s; workers that wrote their pid: {running}")
        assert code == 5
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    pids = [int(path.read_text()) for path in tmp_path.glob("worker*")]
    assert _wait_gone(pids) == []


# --- scripts with __main__ -----------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_user_script_with_main_guard_and_fn_defined_in_it(method: str, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            f"""
            from dataclasses import dataclass
            import numarun

            @dataclass
            class Point:
                rank: int
                base: int

            def work(rank, base):
                return Point(rank, base)

            if __name__ == "__main__":
                print(numarun.spawn(work, args=(10,), nprocs=2, start_method={method!r}))
            """
        )
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[Point(rank=0, base=10), Point(rank=1, base=10)]\n"


def test_user_script_without_main_guard_fails_clearly(tmp_path: Path) -> None:
    script = tmp_path / "unguarded.py"
    script.write_text(
        textwrap.dedent(
            """
            import numarun

            def work(rank):
                return rank

            try:
                numarun.spawn(work, nprocs=1)
            except numarun.ProcessRaisedException as error:
                print(error)
            """
        )
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert 'put the call under if __name__ == "__main__":' in done.stdout


# --- leaks ---------------------------------------------------------------------------------------


def _leak_free_runs(
    method: str, runs: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(temp))
    monkeypatch.setenv("TMPDIR", str(temp))
    numarun.spawn(spawn_funcs.echo, nprocs=2, start_method=method)  # warm up (e.g. the forkserver)
    fds, children = _open_fds(), _children()
    threads = threading.active_count()
    for run in range(runs):
        assert numarun.spawn(spawn_funcs.echo, args=(run,), nprocs=2, start_method=method) == [
            (0, (run,)),
            (1, (run,)),
        ]
    if runs > 1:
        with pytest.raises(ProcessRaisedException):
            numarun.spawn(spawn_funcs.raise_value_error, nprocs=2, start_method=method)
    assert _open_fds() == fds
    assert _children() == children
    assert threading.active_count() == threads
    assert list(temp.iterdir()) == []


@pytest.mark.slow
def test_two_hundred_fork_runs_leak_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _leak_free_runs("fork", 200, tmp_path, monkeypatch)


@pytest.mark.slow
def test_twenty_spawn_runs_leak_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _leak_free_runs("spawn", 20, tmp_path, monkeypatch)


# --- more API behaviour --------------------------------------------------------------------------


@pytest.mark.parametrize(("spawn_grace", "join_grace", "cleaned"), [(0, 2, True), (30, 0, False)])
def test_join_grace_period_overrides_the_one_given_to_spawn(
    tmp_path: Path, spawn_grace: float, join_grace: float, cleaned: bool
) -> None:
    """join's grace period (as torch's: waited before SIGTERM too) also replaces spawn's
    time between SIGTERM and SIGKILL: rank 1 needs 0.3 s after SIGTERM to clean up."""
    context = numarun.spawn(
        spawn_funcs.slow_sigterm_cleanup,
        args=(str(tmp_path),),
        nprocs=2,
        join=False,
        start_method="fork",
        grace_period=spawn_grace,
    )
    with pytest.raises(ProcessRaisedException):
        context.join(grace_period=join_grace)
    assert (tmp_path / "cleaned").exists() is cleaned


def test_unpicklable_return_value_is_reported_as_raised() -> None:
    with pytest.raises(ProcessRaisedException) as info:
        numarun.spawn(spawn_funcs.return_unpicklable, nprocs=1, start_method="fork")
    assert "while pickling the return value of fn" in str(info.value)


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_spawn_from_another_thread(method: str) -> None:
    outcome: list[object] = []
    thread = threading.Thread(
        target=lambda: outcome.append(
            numarun.spawn(spawn_funcs.echo, args=(5,), nprocs=2, start_method=method)
        )
    )
    thread.start()
    thread.join(60)
    assert outcome == [[(0, (5,)), (1, (5,))]]


def test_memory_binding_falls_back_with_the_cpu_binding() -> None:
    with pytest.warns(RuntimeWarning) as record:
        values = numarun.spawn(
            spawn_funcs.memory_policy,
            nprocs=3,
            start_method="fork",
            binding="cpu",
            mem_binding="bind",
            binding_fallback=True,
        )
    assert values == [("default", ())] * 3
    messages = [str(warning.message) for warning in record]
    assert any("NUMA binding (cpu) disabled" in message for message in messages)
    assert any("mem_binding='bind' dropped" in message for message in messages)
    assert {warning.filename for warning in record} == {__file__}  # points at the caller


def test_worker_surviving_sigkill_is_reported_and_spawn_still_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_supervisor = numarun.process.supervisor.Supervisor

    def kill_but_never_sigkill(pid: int, signum: int) -> None:
        if signum != signal.SIGKILL:
            os.kill(pid, signum)

    monkeypatch.setattr(
        numarun.process.supervisor,
        "Supervisor",
        functools.partial(real_supervisor, kill=kill_but_never_sigkill, kill_wait=0.3),
    )
    try:
        survived = r"local rank 1 \(pid \d+\) survived SIGKILL"
        with (
            pytest.warns(RuntimeWarning, match=survived),
            pytest.raises(ProcessRaisedException) as info,
        ):
            numarun.spawn(
                spawn_funcs.ignore_sigterm_or_fail,
                args=(str(tmp_path),),
                nprocs=2,
                start_method="fork",
                grace_period=0.2,
            )
        assert info.value.error_index == 0
    finally:
        survivor = int((tmp_path / "ready").read_text())
        try:
            os.kill(survivor, signal.SIGKILL)
            os.waitpid(survivor, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def test_a_signal_ignored_by_the_caller_does_not_tear_down(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        f"""
        import signal
        import numarun
        from programs import spawn_funcs
        if __name__ == "__main__":
            signal.signal(signal.SIGHUP, signal.SIG_IGN)  # what nohup does
            print(numarun.spawn(spawn_funcs.write_pid_then_sleep, args=({str(tmp_path)!r}, 1.0),
                                nprocs=2, start_method="fork"), flush=True)
        """,
    )
    job = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE)
    _wait_for_files([tmp_path / "worker0", tmp_path / "worker1"], job)
    job.send_signal(signal.SIGHUP)
    output, _ = job.communicate(timeout=30)
    assert (job.returncode, output) == (0, b"[None, None]\n")


@pytest.mark.usefixtures("no_supervisor")
def test_a_bad_keywords_traceback_is_the_callers_line_and_spawns_raise() -> None:
    # Python always shows the frame that raises; numarun's is spawn's one re-raise, right
    # under the caller's line, never the planner's depths.
    import traceback

    with pytest.raises(UsageError) as info:
        numarun.spawn(spawn_funcs.echo, nprocs=2, binding="explicit")
    frames = traceback.extract_tb(info.value.__traceback__)
    assert [frame.name for frame in frames] == [
        "test_a_bad_keywords_traceback_is_the_callers_line_and_spawns_raise",
        "spawn",
    ]
    assert frames[1].filename.endswith("numarun/spawning/api.py")

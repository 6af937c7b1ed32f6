"""numarun.spawn / start_processes as a drop-in for torch.multiprocessing's (torch 2.13).

The specification is PyTorch's own ``test/test_multiprocessing_spawn.py``: every behaviour it
checks is checked here for numarun, in this project's words, under every start method (torch's
``ParallelForkServerShouldWorkTest`` is the forkserver case with ``TORCH_MP_PARALLEL_START=1``).
Where torch runs cheaply (``fork``), the same case runs through torch side by side. Then the
argument types multiprocessing passes, the child's multiprocessing state, Lightning's launcher,
exit without joining, and one regression test per item of the companion issue (11.1 to 11.6).
Worker functions live in tests/programs/spawn_dropin_funcs.py.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import unittest
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as torch_mp

import numarun
from numarun.errors import InvalidArgument, UsageError
from numarun.spawning.api import ProcessExitedException, ProcessRaisedException
from programs import spawn_dropin_funcs

TORCH_SPAWN = sys.modules["torch.multiprocessing.spawn"]  # the module (torch_mp.spawn: a function)

METHODS = ["spawn", "fork", "forkserver"]
TESTS_DIR = Path(__file__).resolve().parents[1]
SRC_DIR = Path(numarun.__file__).resolve().parent.parent
PREFIXES = {"spawn": "SpawnProcess", "fork": "ForkProcess", "forkserver": "ForkServerProcess"}
TORCH_LOGGER = "torch.multiprocessing.spawn"


def _gone(pid: int, timeout: float = 60.0) -> bool:
    """True once no process (not even a zombie) has this pid."""
    deadline = time.monotonic() + timeout
    while os.path.exists(f"/proc/{pid}"):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _dead(pid: int, timeout: float = 60.0) -> bool:
    """True once the process has ended (gone, or a zombie waiting for its reaper)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] in "ZX":
                    return True
        except OSError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)


def _run_script(tmp_path: Path, body: str, *args: str, timeout: float = 60) -> str:
    """Runs ``body`` as a script that can import tests/programs; returns its stdout."""
    script = tmp_path / "job.py"
    script.write_text(
        f"import sys\nsys.path.insert(0, {str(TESTS_DIR)!r})\n" + textwrap.dedent(body)
    )
    done = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


# --- torch's own spawn tests, for numarun --------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_success_and_a_context_that_stays_joined(method: str) -> None:
    assert (
        numarun.start_processes(spawn_dropin_funcs.nothing, nprocs=2, start_method=method)
        == [None] * 2
    )
    context = numarun.start_processes(
        spawn_dropin_funcs.nothing, nprocs=2, join=False, start_method=method
    )
    context.join(timeout=None)
    context.join(timeout=None)
    assert context.join(timeout=None) is True


@pytest.mark.parametrize("method", METHODS)
def test_the_first_argument_is_the_process_index(method: str) -> None:
    queue = multiprocessing.get_context(method).SimpleQueue()
    numarun.start_processes(
        spawn_dropin_funcs.put_rank, args=(queue,), nprocs=2, start_method=method
    )
    assert sorted([queue.get(), queue.get()]) == [0, 1]


@pytest.mark.parametrize("method", METHODS)
def test_the_raising_process_is_named_and_its_error_ends_the_message(method: str) -> None:
    for failing in (0, 1):
        with pytest.raises(ProcessRaisedException) as info:
            numarun.start_processes(
                spawn_dropin_funcs.raise_on, args=(failing,), nprocs=2, start_method=method
            )
        pattern = f"\nValueError: legitimate exception from process {failing}$"
        assert re.search(pattern, str(info.value)), str(info.value)
        assert info.value.error_index == failing


@pytest.mark.parametrize("method", METHODS)
def test_every_process_raising(method: str) -> None:
    with pytest.raises(
        ProcessRaisedException,
        match=r"\nValueError: legitimate exception "
        r"from process (0|1)$",
    ):
        numarun.start_processes(spawn_dropin_funcs.raise_everywhere, nprocs=2, start_method=method)


@pytest.mark.parametrize("method", METHODS)
def test_death_by_signal_is_named(method: str) -> None:
    with pytest.raises(ProcessExitedException, match="process 0 terminated with signal SIGABRT"):
        numarun.start_processes(spawn_dropin_funcs.abort_rank_zero, nprocs=2, start_method=method)


@pytest.mark.parametrize("method", METHODS)
def test_success_first_then_an_exception(method: str) -> None:
    with pytest.raises(ProcessRaisedException, match="ValueError: legitimate exception"):
        numarun.start_processes(
            spawn_dropin_funcs.succeed_then_raise, args=(123,), nprocs=2, start_method=method
        )


def test_messages_match_torch_word_for_word() -> None:
    """The same failures through torch and numarun (fork: cheap for torch) give equal text,
    and each is caught by the other's class."""
    cases = [
        (spawn_dropin_funcs.exit_rank_zero, (123, 1.0), "process 0 terminated with exit code 123"),
        (spawn_dropin_funcs.abort_rank_zero, (), "process 0 terminated with signal SIGABRT"),
    ]
    for fn, args, message in cases:
        texts = []
        for start in (torch_mp.start_processes, numarun.start_processes):
            with pytest.raises(torch_mp.ProcessExitedException) as info:
                start(fn, args=args, nprocs=2, start_method="fork")
            texts.append(str(info.value))
        assert texts == [message, message]
    tails = []
    for start in (torch_mp.start_processes, numarun.start_processes):
        with pytest.raises(torch_mp.ProcessRaisedException) as raised:
            start(spawn_dropin_funcs.raise_on, args=(1,), nprocs=2, start_method="fork")
        text = str(raised.value)
        assert text.startswith("\n\n-- Process 1 terminated with the following error:\n")
        tails.append(text.rstrip().splitlines()[-1])
    assert tails == ["ValueError: legitimate exception from process 1"] * 2


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def _torch_spawn_log() -> Iterator[list[logging.LogRecord]]:
    """The warnings logged on ``torch.multiprocessing.spawn`` while the block runs, each once.

    The handler sits on that logger alone: pytest's capture and torch's own handler sit on
    ancestors, and whether records reach them (``propagate``, handlers copied onto loggers)
    depends on torch's and pytest's versions, which this must not."""
    logger = logging.getLogger(TORCH_LOGGER)
    handler = _Records()
    level = logger.level
    logger.setLevel(logging.WARNING)
    logger.addHandler(handler)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("grace_period", [None, 20])
def test_join_grace_period_as_torch(method: str, grace_period: float | None) -> None:
    """Issue 11.3. Rank 0 exits 123. Without a grace period rank 1, which would end on its own
    after 60 s, is terminated at once, with torch's warning on torch's logger; with 20 s, rank 1
    ends on its own after 4 s (exit code 0) and nothing is logged. No process is left either
    way. (Rank 1 once slept 4 s in both: where rank 0's start-up took 4 s longer than rank 1's,
    under load, rank 1 ended first and nothing was left to terminate.)"""
    context = numarun.start_processes(
        spawn_dropin_funcs.exit_rank_zero,
        args=(123, 60.0 if grace_period is None else 4.0),
        nprocs=2,
        join=False,
        start_method=method,
    )
    pid1 = context.processes[1].pid
    started = time.monotonic()
    with (
        _torch_spawn_log() as records,
        pytest.raises(ProcessExitedException, match="process 0 terminated with exit code 123"),
    ):
        while not context.join(grace_period=grace_period):
            pass
    warnings = [record.getMessage() for record in records]
    if grace_period is None:
        assert warnings == [f"Terminating process {pid1} via signal SIGTERM"]
        assert context.processes[1].exitcode == -signal.SIGTERM
        assert time.monotonic() - started < 45  # not the 60 s rank 1 takes on its own
    else:
        assert warnings == []
        assert context.processes[1].exitcode == 0
    assert not any(process.is_alive() for process in context.processes)
    assert _gone(pid1)


def test_join_grace_period_side_by_side_with_torch() -> None:
    """The same run through torch and numarun: rank 1's exit code and the warnings on torch's
    logger, each seen exactly once (issue 19.1: a capture that saw torch's twice)."""
    outcomes = []
    for start in (torch_mp.start_processes, numarun.start_processes):
        for grace_period in (None, 20):
            context = start(
                spawn_dropin_funcs.exit_rank_zero,
                args=(5, 1.0),
                nprocs=2,
                join=False,
                start_method="fork",
            )
            with _torch_spawn_log() as records, pytest.raises(torch_mp.ProcessExitedException):
                while not context.join(grace_period=grace_period):
                    pass
            pid = str(context.processes[1].pid)
            messages = [record.getMessage().replace(pid, "PID") for record in records]
            outcomes.append((context.processes[1].exitcode, messages))
    assert outcomes[:2] == outcomes[2:], outcomes
    assert outcomes[2:] == [
        (-signal.SIGTERM, ["Terminating process PID via signal SIGTERM"]),
        (0, []),
    ]


@pytest.mark.parametrize("method", METHODS)
def test_the_teardown_warning_is_seen_by_assert_logs_on_torchs_logger(method: str) -> None:
    """Issue 16.8: torch's users listen on its logger (``assertLogs``, ``logging.config``
    filters); numarun's warning must reach them there, under every start method."""
    context = numarun.start_processes(
        spawn_dropin_funcs.exit_rank_zero,
        args=(123, 30.0),
        nprocs=2,
        join=False,
        start_method=method,
    )
    pid1 = context.processes[1].pid
    case = unittest.TestCase()
    with (
        case.assertLogs(TORCH_LOGGER, level="WARNING") as logs,
        pytest.raises(ProcessExitedException, match="exit code 123"),
    ):
        while not context.join():
            pass
    assert [record.name for record in logs.records] == [TORCH_LOGGER]
    assert logs.records[0].getMessage() == f"Terminating process {pid1} via signal SIGTERM"


@pytest.mark.parametrize("method", METHODS)
def test_workers_of_a_killed_worker_die_with_it(method: str) -> None:
    """torch's _test_nested: a worker starts workers of its own (join=False), then kills
    itself; its workers must be gone well before they would have ended (300 s).

    Each step waits on its condition, so that load cannot break it: the nested workers'
    start-up (the worker kills itself only once both said they run), the worker's death, then
    the nested workers' deaths, within 60 s of it (on an idle machine, milliseconds)."""
    here, there = multiprocessing.get_context(method).Pipe()
    context = numarun.start_processes(
        spawn_dropin_funcs.start_nested_then_die,
        args=(there, method, 300.0),
        nprocs=1,
        join=False,
        start_method=method,
    )
    nested: list[int] = []
    try:
        assert here.poll(180), "the worker never said its workers run"
        message = here.recv()
        assert isinstance(message, list), message
        nested = message
        worker = context.processes[0]
        assert multiprocessing.connection.wait([worker.sentinel], timeout=60), "never died"
        assert [pid for pid in nested if not _dead(pid, timeout=60)] == []
        with pytest.raises(ProcessExitedException, match="signal SIGTERM"):
            context.join()
    finally:
        for pid in nested:
            if not _dead(pid, timeout=0):  # a survivor (the test failed): not left for 300 s
                os.kill(pid, signal.SIGKILL)
        # Orphans adopted by this process while it was a subreaper, which the supervisor
        # cannot prove its own (they left the worker's session and carry the nested run's
        # marker): the supervisor's documented limit. Reaped here so the test leaves none.
        for pid in nested:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def test_a_fork_workers_fds_survive_inherited_worker_handles() -> None:
    """A fork worker inherits the caller's earlier contexts, and with them their workers'
    handles, whose finalizer closes the sentinel (a pidfd) when the garbage collector collects
    the handle. The worker's start closed those fds, and the worker's own files may take their
    numbers: the finalizer, run in the worker, must leave them open. (It closed a nested run's
    queue pipe under a feeder thread, "Bad file descriptor": the nested workers never said
    they run, in test_workers_of_a_killed_worker_die_with_it under load.)"""
    earlier = numarun.start_processes(
        spawn_dropin_funcs.nothing, nprocs=2, join=False, start_method="fork"
    )
    while not earlier.join():
        pass
    sentinels = [process.sentinel for process in earlier.processes]
    here, there = multiprocessing.get_context("fork").Pipe()
    numarun.spawn(
        spawn_dropin_funcs.release_inherited_sentinels,
        args=(earlier, there),
        nprocs=1,
        start_method="fork",
    )
    assert here.recv() == [True, True]
    assert all(os.fstat(fd) for fd in sentinels)  # the caller's own stay open until released


def test_spawn_with_a_missing_argument_raises_process_raised() -> None:
    with pytest.raises(ProcessRaisedException, match="missing 1 required positional argument"):
        numarun.spawn(spawn_dropin_funcs.succeed_then_raise, args=(), nprocs=1)


def test_a_worker_killed_from_outside_raises_process_exited() -> None:
    context = numarun.spawn(spawn_dropin_funcs.sleep_forever, args=(), nprocs=1, join=False)
    for pid in context.pids():
        os.kill(pid, signal.SIGTERM)
    with pytest.raises(ProcessExitedException) as info:
        context.join()
    assert (info.value.exit_code, info.value.signal_name) == (-signal.SIGTERM, "SIGTERM")


def test_exit_code_twelve() -> None:
    with pytest.raises(ProcessExitedException) as info:
        numarun.spawn(spawn_dropin_funcs.exit_twelve, args=(), nprocs=1)
    assert info.value.exit_code == 12


def test_errors_pickle_like_torch_errors() -> None:
    for error in (
        numarun.ProcessRaisedException("Oh no!", 1, 1),
        numarun.ProcessExitedException("Oh no!", 1, 1, 1),
    ):
        copy = pickle.loads(pickle.dumps(error))
        assert (str(copy), copy.error_index, copy.error_pid) == ("Oh no!", 1, 1)
        assert isinstance(copy, type(error))


@pytest.mark.parametrize("parallel", ["0", "1"])
def test_torchs_parallel_start_switch_changes_nothing(
    parallel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 16.8: ``0`` (torch: one forkserver worker after another, torch's perf test
    asserts the serial time) and ``1`` (torch: a thread pool) are both ignored: numarun's
    workers are always started back to back and awaited together (README's table)."""
    monkeypatch.setenv("TORCH_MP_PARALLEL_START", parallel)
    queue = multiprocessing.get_context("forkserver").SimpleQueue()
    numarun.start_processes(
        spawn_dropin_funcs.put_rank, args=(queue,), nprocs=2, start_method="forkserver"
    )
    assert sorted([queue.get(), queue.get()]) == [0, 1]


# --- exceptions as torch's -----------------------------------------------------------------------


def test_torchs_except_clauses_catch_numaruns_exceptions() -> None:
    with pytest.raises(torch_mp.ProcessRaisedException) as raised:
        numarun.spawn(spawn_dropin_funcs.raise_on, args=(0,), nprocs=1, start_method="fork")
    with pytest.raises(torch_mp.ProcessExitedException) as exited:
        numarun.spawn(spawn_dropin_funcs.exit_twelve, nprocs=1, start_method="fork")
    for error in (raised.value, exited.value):
        assert isinstance(error, TORCH_SPAWN.ProcessException)
        assert isinstance(error, numarun.ProcessException)
        assert error.msg == str(error) and error.pid == error.error_pid > 0
    assert (exited.value.exit_code, exited.value.signal_name) == (12, None)
    try:
        numarun.spawn(spawn_dropin_funcs.raise_on, args=(0,), nprocs=1, start_method="fork")
    except TORCH_SPAWN.ProcessException as caught:  # what except really checks
        assert caught.error_index == 0
    copy = pickle.loads(pickle.dumps(raised.value))
    assert isinstance(copy, torch_mp.ProcessRaisedException)
    assert isinstance(copy, numarun.ProcessRaisedException)
    assert type(copy).__name__ == "ProcessRaisedException"


def test_without_torch_loaded_the_exceptions_stand_alone(tmp_path: Path) -> None:
    output = _run_script(
        tmp_path,
        """
        import pickle
        import numarun
        from programs import spawn_dropin_funcs
        if __name__ == "__main__":
            try:
                numarun.spawn(spawn_dropin_funcs.raise_on, args=(0,), nprocs=1, start_method="fork")
            except numarun.ProcessRaisedException as error:
                copy = pickle.loads(pickle.dumps(error))
                print(type(error).__mro__[1].__name__, type(copy).__name__,
                      "torch" in sys.modules)
        """,
    )
    assert output.split() == ["ProcessException", "ProcessRaisedException", "False"]


def test_bad_arguments_are_value_errors_as_in_torch() -> None:
    with pytest.raises(ValueError, match="cannot find context for 'thread'"):
        torch_mp.start_processes(spawn_dropin_funcs.nothing, start_method="thread")
    for kwargs, words in (
        ({"start_method": "thread"}, "unknown start_method 'thread'"),
        ({"nprocs": 0}, "nprocs must be an integer >= 1"),
    ):
        with pytest.raises(ValueError, match=words) as info:
            numarun.start_processes(spawn_dropin_funcs.nothing, **kwargs)  # type: ignore[arg-type]
        assert isinstance(info.value, (UsageError, InvalidArgument))
        assert "\n" not in str(info.value)


def test_start_method_none_is_the_platform_default() -> None:
    """Issue 11.4."""
    context = numarun.start_processes(
        spawn_dropin_funcs.nothing, nprocs=1, join=False, start_method=None
    )
    assert context.join() is True
    default = multiprocessing.get_start_method()
    assert context.processes[0].name.startswith(PREFIXES[default] + "-")


# --- arguments and results -----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_every_argument_type_side_by_side_with_torch(method: str) -> None:
    """SimpleQueue, Queue, Event, Lock, Pipe, Manager().dict() and a shared CPU tensor, each
    used by the workers and checked by the caller, through torch and through numarun."""
    context = multiprocessing.get_context(method)
    seen = {}
    with context.Manager() as manager:
        for name, start in (("torch", torch_mp.start_processes), ("numarun", numarun.spawn)):
            simple, queue, event, lock = (
                context.SimpleQueue(),
                context.Queue(),
                context.Event(),
                context.Lock(),
            )
            here, there = context.Pipe()
            shared = manager.dict()
            tensor = torch.zeros(2).share_memory_()
            start(
                spawn_dropin_funcs.use_everything,
                args=(simple, queue, event, lock, there, shared, tensor),
                nprocs=2,
                start_method=method,
            )
            seen[name] = (
                sorted([simple.get(), simple.get()]),
                sorted([queue.get(timeout=10), queue.get(timeout=10)]),
                event.is_set(),
                here.recv(),
                dict(sorted(shared.items())),
                tensor.tolist(),
            )
    assert (
        seen["numarun"]
        == seen["torch"]
        == (
            [("simple", 0), ("simple", 1)],
            [("queue", 0), ("queue", 1)],
            True,
            "through the pipe",
            {0: 0, 1: 10},
            [1.0, 1.0],
        )
    )


@pytest.mark.parametrize("method", METHODS)
def test_results_bring_their_fds_with_them(method: str) -> None:
    """Return values pickle as arguments do: a tensor created in the worker, the caller's
    shared tensor (changed in place: one storage), and a pipe end made in the worker."""
    tensor = torch.zeros(2).share_memory_()
    values = numarun.spawn(
        spawn_dropin_funcs.shared_results, args=(tensor,), nprocs=2, start_method=method
    )
    assert tensor.tolist() == [2.0, 2.0]
    for rank, (made, returned, connection) in enumerate(values):
        assert made.tolist() == [float(rank)] * 3
        returned[0] = 7.0
        assert tensor[0] == 7.0  # the same shared storage
        assert connection.recv() == f"rank {rank} over a returned pipe"
        connection.close()


@pytest.mark.parametrize("method", METHODS)
def test_the_childs_multiprocessing_state_is_multiprocessings(method: str, tmp_path: Path) -> None:
    """Name, authkey (Manager proxies connect with it), parent_process(), daemon flag,
    sys.argv of a script run with arguments, the forced start method and stdin, compared with
    a plain multiprocessing.Process of the same method, from a script."""
    output = _run_script(
        tmp_path,
        f"""
        import json, multiprocessing, os
        import numarun
        from programs import spawn_dropin_funcs
        if __name__ == "__main__":
            context = multiprocessing.get_context({method!r})
            queue = context.Queue()
            anchor = context.Process(target=spawn_dropin_funcs.multiprocessing_state_into,
                                     args=(queue,), daemon=True)
            anchor.start()
            theirs = queue.get(timeout=60)
            anchor.join()
            ours = numarun.spawn(spawn_dropin_funcs.multiprocessing_state, nprocs=1, daemon=True,
                                 start_method={method!r})[0]
            me = dict(pid=os.getpid(), authkey=bytes(multiprocessing.current_process().authkey))
            print(json.dumps([theirs, ours, me], default=lambda b: b.hex()))
        """,
        "--lr",
        "3e-4",
    )
    import json

    theirs, ours, me = json.loads(output)
    assert ours == theirs
    assert ours["name_prefix"] == PREFIXES[method]
    assert (ours["parent_pid"], ours["parent_alive"], ours["authkey"]) == (
        me["pid"],
        True,
        me["authkey"],
    )
    assert ours["argv"][1:] == ["--lr", "3e-4"] and ours["argv"][0].endswith("job.py")
    assert (ours["daemon"], ours["start_method"]) == (True, method)


@pytest.mark.parametrize("method", METHODS)
def test_binding_is_in_force_at_the_first_line_with_a_queue_argument(method: str) -> None:
    queue = multiprocessing.get_context(method).SimpleQueue()
    numarun.spawn(
        spawn_dropin_funcs.cpus_first,
        args=(queue,),
        nprocs=2,
        start_method=method,
        binding=[[1], [0]],
    )
    assert sorted([queue.get(), queue.get()]) == [(0, "1"), (1, "0")]


def test_unpicklable_arguments_are_refused_before_anything_starts() -> None:
    fork_lock = multiprocessing.get_context("fork").Lock()
    with pytest.raises(ValueError, match="A SemLock created in a fork context") as info:
        numarun.spawn(
            spawn_dropin_funcs.put_rank, args=(fork_lock,), nprocs=1, start_method="spawn"
        )
    assert "\n" not in str(info.value)


# --- the ProcessContext --------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_processes_as_multiprocessing_processes(method: str, tmp_path: Path) -> None:
    context = numarun.start_processes(
        spawn_dropin_funcs.write_after,
        args=(str(tmp_path), 0.5),
        nprocs=2,
        join=False,
        start_method=method,
    )
    processes = context.processes
    assert all(isinstance(p, multiprocessing.process.BaseProcess) for p in processes)
    assert [p.pid for p in processes] == context.pids()
    assert [p.name.split("-")[0] for p in processes] == [PREFIXES[method]] * 2
    assert context.sentinels == {p.sentinel: rank for rank, p in enumerate(processes)}
    assert context.error_files == [None, None]
    assert all(p.is_alive() and p.exitcode is None for p in processes)
    assert set(processes) <= set(multiprocessing.active_children())
    ready = multiprocessing.connection.wait([processes[0].sentinel], timeout=30)
    assert ready == [processes[0].sentinel]
    processes[1].join(timeout=30)
    assert [p.exitcode for p in processes] == [0, 0]
    assert not any(p.is_alive() for p in processes)
    assert context.join() is True
    assert context.sentinels == {}
    assert not set(processes) & set(multiprocessing.active_children())


def test_one_process_joins_while_the_other_runs(tmp_path: Path) -> None:
    context = numarun.start_processes(
        spawn_dropin_funcs.write_after, args=(str(tmp_path), 0.0), nprocs=1, join=False
    )
    slow = numarun.start_processes(spawn_dropin_funcs.sleep_forever, nprocs=1, join=False)
    try:
        context.processes[0].join(timeout=30)
        assert context.processes[0].exitcode == 0
        assert slow.processes[0].is_alive()
        slow.processes[0].join(timeout=0.2)
        assert slow.processes[0].exitcode is None
        slow.processes[0].terminate()
        slow.processes[0].join(timeout=30)
        assert slow.processes[0].exitcode == -signal.SIGTERM
        with pytest.raises(ProcessExitedException, match="signal SIGTERM"):
            slow.join()
    finally:
        slow.stop(grace_period=0)
        context.join()


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_lightning_style_launcher(method: str) -> None:
    launcher = spawn_dropin_funcs.Launcher(numarun.start_processes, method, 2)
    assert launcher.launch(spawn_dropin_funcs.train, 7) == {"steps": 7, "local_rank": "0"}
    assert len(launcher.procs) == 2 and not any(p.is_alive() for p in launcher.procs)
    assert launcher.kill(signal.SIGTERM) == []
    anchor = spawn_dropin_funcs.Launcher(torch_mp.start_processes, "fork", 2)
    assert anchor.launch(spawn_dropin_funcs.train, 7) == {"steps": 7, "local_rank": "0"}


@pytest.mark.parametrize("method", METHODS)
def test_workers_run_before_join(method: str) -> None:
    """Issue 11.1: the caller waits on a queue before it joins."""
    queue = multiprocessing.get_context(method).Queue()
    context = numarun.start_processes(
        spawn_dropin_funcs.put_rank, args=(queue,), nprocs=2, join=False, start_method=method
    )
    try:
        assert sorted([queue.get(timeout=30), queue.get(timeout=30)]) == [0, 1]
    finally:
        context.stop(grace_period=0)


UNJOINED = """
import os, sys, time
import numarun
from programs import spawn_dropin_funcs
if __name__ == "__main__":
    method, daemon, directory = sys.argv[1], sys.argv[2] == "daemon", sys.argv[3]
    context = numarun.start_processes(spawn_dropin_funcs.write_after, args=(directory, 1.0),
                                      nprocs=2, join=False, daemon=daemon, start_method=method)
    while not all(os.path.exists(os.path.join(directory, f"pid{r}")) for r in (0, 1)):
        time.sleep(0.01)
"""


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("daemon", ["daemon", "non-daemon"])
def test_a_caller_that_never_joins(method: str, daemon: str, tmp_path: Path) -> None:
    """As multiprocessing at exit: non-daemon workers finish their work (the exit waits for
    them; 11.1: an unjoined forkserver context does not hang), daemon ones are stopped. Both
    leave no process behind."""
    directory = tmp_path / "out"
    directory.mkdir()
    _run_script(tmp_path, UNJOINED, method, daemon, str(directory))
    pids = [int((directory / f"pid{rank}").read_text()) for rank in (0, 1)]
    assert all(_gone(pid) for pid in pids)
    done = sorted(path.name for path in directory.glob("done*"))
    assert done == ([] if daemon == "daemon" else ["done0", "done1"])


@pytest.mark.parametrize("method", METHODS)
def test_workers_never_outlive_a_killed_caller(method: str, tmp_path: Path) -> None:
    """Non-daemon workers of a caller that is SIGKILLed without joining die with it."""
    directory = tmp_path / "out"
    directory.mkdir()
    script = tmp_path / "job.py"
    script.write_text(
        f"import sys, time\nsys.path.insert(0, {str(TESTS_DIR)!r})\n"
        + UNJOINED
        + "    time.sleep(60)  # killed while its workers run (they would end after 1 s)\n"
    )
    job = subprocess.Popen([sys.executable, str(script), method, "non-daemon", str(directory)])
    try:
        deadline = time.monotonic() + 60
        while not all((directory / f"pid{rank}").exists() for rank in (0, 1)):
            assert job.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        pids = [int((directory / f"pid{rank}").read_text()) for rank in (0, 1)]
        job.kill()
        assert all(_dead(pid) for pid in pids)
    finally:
        job.kill()
        job.wait()
    assert list(directory.glob("done*")) == []


@pytest.mark.parametrize("method", METHODS)
def test_the_last_queue_put_arrives(method: str) -> None:
    """Issue 11.2: a worker's queue feeder thread is flushed by multiprocessing's exit handler
    before the worker exits."""
    queue = multiprocessing.get_context(method).Queue()
    numarun.spawn(spawn_dropin_funcs.many_puts, args=(queue, 500), nprocs=2, start_method=method)
    items = [queue.get(timeout=10) for _ in range(1000)]
    assert sorted(items) == sorted((rank, index) for rank in (0, 1) for index in range(500))


def test_a_fork_worker_can_fork_workers_of_its_own() -> None:
    """Issue 11.5: the fd registry inherited from the caller is emptied in a fork worker, so
    its own fork workers keep the pipes it opened since."""
    values = numarun.spawn(spawn_dropin_funcs.fork_a_grandchild, nprocs=2, start_method="fork")
    assert values == [b"from the grandchild"] * 2


def test_run_path_wins_over_no_python_and_module_as_in_torchrun() -> None:
    """Issue 11.6: torchrun's config_from_args runs the script with runpy when --run-path is
    given, whatever --no-python or -m say; numarun the same; -m with --no-python alone is
    still refused by both."""
    from torch.distributed import run as torchrun

    from numarun.cmdline.config import parse_args

    for flags in (
        ["--run-path", "--no-python"],
        ["--run-path", "-m"],
        ["--run-path", "-m", "--no-python"],
    ):
        _, command, command_args = torchrun.config_from_args(
            torchrun.parse_args([*flags, "train.py", "x"])
        )
        assert command is torchrun.run_script_path and command_args[0] == "train.py"
        config = parse_args([*flags, "train.py", "x"])
        assert (config.entrypoint_kind, config.entrypoint, list(config.args)) == (
            "script",
            "train.py",
            ["x"],
        )
    with pytest.raises(ValueError, match="--no-python"):
        torchrun.config_from_args(torchrun.parse_args(["-m", "--no-python", "train.py"]))
    with pytest.raises(UsageError, match="cannot be combined"):
        parse_args(["-m", "--no-python", "train.py"])


# --- the last differences from torch's spawn (issue 16, items 6 to 8; issue 20, item 7) ----------

DIST_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.mark.parametrize("method", METHODS)
def test_worker_environment_side_by_side_with_torch(
    method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 16.6: by default a worker's environment is torch's (the caller's, unchanged), but
    for numarun's teardown marker; no RANK (code detecting torchrun by it), no
    OMP_NUM_THREADS."""
    for name in (*DIST_NAMES, "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    seen = {}
    for name, start, start_method in (
        ("torch", torch_mp.start_processes, "fork"),
        ("numarun", numarun.start_processes, method),
    ):
        queue = multiprocessing.get_context(start_method).SimpleQueue()
        start(
            spawn_dropin_funcs.put_environment, args=(queue,), nprocs=2, start_method=start_method
        )
        seen[name] = dict(queue.get() for _ in range(2))
    callers = dict(os.environ)
    assert seen["torch"] == {0: callers, 1: callers}
    for env in seen["numarun"].values():
        assert env.pop("NUMARUN_RUN_ID")
    assert seen["numarun"] == seen["torch"]


CTRL_C_JOB = """
from programs import spawn_dropin_funcs
if __name__ == "__main__":
    launcher, method, directory = sys.argv[1:4]
    if launcher == "torch":
        from torch.multiprocessing import start_processes
    else:
        from numarun import start_processes
    try:
        start_processes(spawn_dropin_funcs.checkpoint_on_interrupt, args=(directory,), nprocs=2,
                        start_method=method)
    except KeyboardInterrupt:
        print("KeyboardInterrupt", flush=True)
        sys.exit(130)
    print("returned", flush=True)
"""


@pytest.mark.parametrize(
    ("launcher", "method"),
    [("torch", "fork"), ("numarun", "fork"), ("numarun", "spawn"), ("numarun", "forkserver")],
)
def test_ctrl_c_reaches_every_workers_except_keyboard_interrupt(
    launcher: str, method: str, tmp_path: Path
) -> None:
    """Issue 16.7: a terminal's Ctrl-C (SIGINT to the caller's process group) while joining.
    torch's workers share that group and get it; numarun's, in sessions of their own, get it
    relayed: each runs its ``except KeyboardInterrupt`` (a checkpoint), the caller gets
    KeyboardInterrupt, and no worker is left."""
    script = tmp_path / "job.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(TESTS_DIR)!r})\n" + CTRL_C_JOB)
    job = subprocess.Popen(
        [sys.executable, str(script), launcher, method, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group, as a shell's foreground job
    )
    try:
        ready = [tmp_path / f"ready-{rank}" for rank in (0, 1)]
        deadline = time.monotonic() + 60
        while not all(path.exists() for path in ready):
            if job.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the workers never got ready: {job.communicate(timeout=5)}")
            time.sleep(0.02)
        pids = [int(path.read_text()) for path in ready]
        os.killpg(job.pid, signal.SIGINT)
        output, errors = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate()
    assert (job.returncode, output) == (130, b"KeyboardInterrupt\n"), errors.decode()
    assert sorted(path.name for path in tmp_path.glob("checkpoint-*")) == [
        "checkpoint-0",
        "checkpoint-1",
    ]
    assert all(_gone(pid) for pid in pids)


def test_nprocs_zero_side_by_side_with_torch() -> None:
    """Issue 16.8, a difference kept and listed in the README's table: torch starts nothing
    and returns; numarun refuses (``nprocs=torch.cuda.device_count()`` on a machine without a
    GPU must not train nothing in silence)."""
    assert (
        torch_mp.start_processes(spawn_dropin_funcs.nothing, nprocs=0, start_method="fork") is None
    )
    context = torch_mp.start_processes(spawn_dropin_funcs.nothing, nprocs=0, join=False)
    assert (context.processes, context.join()) == ([], True)
    for join in (True, False):
        with pytest.raises(InvalidArgument, match="nprocs must be an integer >= 1, got 0"):
            numarun.start_processes(
                spawn_dropin_funcs.nothing, nprocs=0, join=join, start_method="fork"
            )


def _joins_after_a_failure(
    start: Callable[..., Any],
) -> list[tuple[str, int | None, int | None]]:
    """(outcome, error_index, exit_code) of four ``join()`` calls after rank 1 raised while
    ranks 0 and 2 slept: what each later call reports."""
    context = start(
        spawn_dropin_funcs.raise_on, args=(1,), nprocs=3, join=False, start_method="fork"
    )
    seen: list[tuple[str, int | None, int | None]] = []
    for _ in range(4):
        try:
            seen.append(("True" if context.join(grace_period=0.2) else "False", None, None))
        except (torch_mp.ProcessRaisedException, torch_mp.ProcessExitedException) as error:
            # torch's classes catch numarun's too (numarun's derive from them once loaded)
            code = getattr(error, "exit_code", None)
            seen.append((type(error).__name__, error.error_index, code))
    return seen


def test_later_joins_after_a_failure_side_by_side_with_torch() -> None:
    """As torch: the first join() raises the failure, each later one the next worker that did
    not end with 0 (the torn-down ones: exit -15), one per call, then True."""
    theirs = _joins_after_a_failure(torch_mp.start_processes)
    ours = _joins_after_a_failure(numarun.start_processes)
    expected = [
        ("ProcessRaisedException", 1, None),
        ("ProcessExitedException", 0, -15),
        ("ProcessExitedException", 2, -15),
        ("True", None, None),
    ]
    assert ours == expected
    # torch reports the torn-down ones in the order its sentinels are ready when each later
    # join() looks: on a loaded machine rank 2 may be reaped before rank 0 (seen at load 40).
    assert [theirs[0], *sorted(theirs[1:3]), *theirs[3:]] == expected, theirs


def test_keyboard_interrupt_inside_a_worker_side_by_side_with_torch() -> None:
    """Issue 16.8, a difference kept and listed in the README's table: a KeyboardInterrupt
    that leaves ``fn`` is a clean exit for torch (exit code 0, nothing raised), a failure for
    numarun (a worker that stopped early must not look successful)."""
    context = torch_mp.start_processes(
        spawn_dropin_funcs.raise_keyboard_interrupt, nprocs=1, join=False, start_method="fork"
    )
    while not context.join():
        pass
    assert context.processes[0].exitcode == 0
    with pytest.raises(ProcessRaisedException, match="\nKeyboardInterrupt\n") as info:
        numarun.start_processes(
            spawn_dropin_funcs.raise_keyboard_interrupt, nprocs=1, start_method="fork"
        )
    assert info.value.error_index == 0


@pytest.mark.parametrize("method", METHODS)
def test_exitcode_and_is_alive_never_wait_for_the_teardown(method: str, tmp_path: Path) -> None:
    """Issue 20.7: the worker ended (exit code 0) and left a child that ignores SIGTERM; the
    teardown of that child takes the grace period (60 s here). ``exitcode``, ``is_alive()``
    and ``join(timeout=1)`` answer without waiting for it (they used to take 65 s); the run
    still ends, and the child with it, when the context is stopped."""
    pid_file = tmp_path / "leftover"
    context = numarun.start_processes(
        spawn_dropin_funcs.leave_a_sigterm_ignoring_child,
        args=(str(pid_file),),
        nprocs=1,
        join=False,
        start_method=method,
        grace_period=60,
    )
    leftover = None
    try:
        worker = context.processes[0]
        # Waiting on the sentinel alone steps nothing of numarun's.
        assert multiprocessing.connection.wait([worker.sentinel], timeout=60)
        leftover = int(pid_file.read_text())
        started = time.monotonic()
        assert worker.is_alive() is False
        assert worker.exitcode == 0
        worker.join(timeout=1)
        assert time.monotonic() - started < 20
        assert not _gone(leftover, timeout=0)  # ignoring SIGTERM, inside its grace period
    finally:
        context.stop(grace_period=0)
    # Ended: under forkserver its parent died first and init reaps it, in its own time.
    assert _dead(leftover)


# --- numarun found only through the caller's sys.path (issue 10, item 13) -------------------------


@pytest.mark.parametrize("isolated", [False, True])
def test_numarun_found_only_through_the_callers_sys_path(isolated: bool, tmp_path: Path) -> None:
    """A copy of numarun that only the caller's sys.path finds: the workers run that copy.
    ``isolated``: the caller runs with ``-S`` (no site-packages, so no installed numarun), which
    its workers inherit as multiprocessing passes interpreter flags."""
    vendored = tmp_path / "vendored"
    shutil.copytree(SRC_DIR / "numarun", vendored / "numarun")
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {str(vendored)!r})
            sys.path.insert(1, {str(TESTS_DIR)!r})
            import numarun
            from programs import spawn_dropin_funcs
            if __name__ == "__main__":
                print(numarun.__file__)
                print(numarun.spawn(spawn_dropin_funcs.numarun_location, nprocs=2)[1])
            """
        )
    )
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    flags = ["-S"] if isolated else []
    done = subprocess.run(
        [sys.executable, *flags, str(script)], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    caller, worker = done.stdout.split()
    assert caller == worker == str(vendored / "numarun" / "__init__.py")

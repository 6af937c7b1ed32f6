"""Worker functions for tests/spawning/test_api_torch_dropin.py (module level, so every start
method can pickle them). Free of pytest, numarun and torch imports at module level, so a spawned
worker loads it quickly; the functions that need torch or numarun import them themselves."""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import random
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any


def nothing(local_rank: int) -> None:
    pass


def put_rank(local_rank: int, queue: Any) -> None:
    queue.put(local_rank)


def raise_on(local_rank: int, failing_rank: int) -> None:
    if local_rank == failing_rank:
        raise ValueError(f"legitimate exception from process {local_rank}")
    time.sleep(1.0)


def raise_everywhere(local_rank: int) -> None:
    time.sleep(random.random() / 10)
    raise ValueError(f"legitimate exception from process {local_rank}")


def abort_rank_zero(local_rank: int) -> None:
    if local_rank == 0:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        faulthandler.disable()
        os.kill(os.getpid(), signal.SIGABRT)
    time.sleep(1.0)


def exit_rank_zero(local_rank: int, code: int, others_sleep: float) -> None:
    if local_rank == 0:
        sys.exit(code)
    time.sleep(others_sleep)


def succeed_then_raise(local_rank: int, unused: object) -> None:
    if local_rank == 0:
        return
    time.sleep(0.1)
    raise ValueError("legitimate exception")


def sleep_forever(local_rank: int) -> None:
    while True:
        time.sleep(1)


def exit_twelve(local_rank: int) -> None:
    sys.exit(12)


def nested_child(local_rank: int, ready: Any, seconds: float) -> None:
    ready.put(local_rank)
    time.sleep(seconds)


def start_nested_then_die(local_rank: int, pids: Any, method: str, seconds: float) -> None:
    """Starts 2 workers of its own that sleep ``seconds``, waits until both run, sends their
    pids (``pids``: a Connection, which sends before it returns, unlike a Queue's feeder
    thread), then kills itself. Sends the error instead when they never said they run."""
    import numarun

    ready = multiprocessing.get_context(method).Queue()
    context = numarun.start_processes(
        nested_child, args=(ready, seconds), nprocs=2, join=False, start_method=method
    )
    try:
        for _ in range(2):
            ready.get(timeout=60)
    except BaseException as error:
        pids.send(f"the nested workers {context.pids()} never said they run: {error!r}")
        raise
    pids.send(context.pids())
    os.kill(os.getpid(), signal.SIGTERM)


def release_inherited_sentinels(local_rank: int, earlier: Any, answers: Any) -> None:
    """In a fork worker forked while the caller held ``earlier`` (a ProcessContext whose run
    ended): each number of ``earlier``'s sentinels, closed at this worker's start, is given a
    file of this worker's own if free (as the worker's next open would take it); then the
    finalizers of the inherited worker handles run, as the garbage collector runs them here
    when it collects them. Sends whether each of those numbers is still open."""
    numbers = [process._popen.sentinel for process in earlier.processes]
    null = os.open(os.devnull, os.O_RDONLY)
    for number in numbers:
        try:
            os.fstat(number)
        except OSError:
            os.dup2(null, number)
    for process in earlier.processes:
        process._popen._release()  # the weakref.finalize the collector would call
    still_open = []
    for number in numbers:
        try:
            os.fstat(number)
        except OSError:
            still_open.append(False)
        else:
            still_open.append(True)
    answers.send(still_open)


def use_everything(
    local_rank: int,
    simple: Any,
    queue: Any,
    event: Any,
    lock: Any,
    connection: Any,
    shared: Any,
    tensor: Any,
) -> int:
    """Touches each kind of argument multiprocessing can pass; the caller checks each."""
    with lock:
        simple.put(("simple", local_rank))
    queue.put(("queue", local_rank))
    shared[local_rank] = local_rank * 10
    tensor[local_rank] += 1
    if local_rank == 0:
        connection.send("through the pipe")
        event.set()
    return local_rank


def multiprocessing_state(local_rank: int) -> dict[str, Any]:
    current = multiprocessing.current_process()
    parent = multiprocessing.parent_process()
    return {
        "name_prefix": current.name.split("-")[0],
        "authkey": bytes(current.authkey),
        "parent_pid": None if parent is None else parent.pid,
        "parent_alive": None if parent is None else parent.is_alive(),
        "daemon": current.daemon,
        "argv": list(sys.argv),
        "start_method": multiprocessing.get_start_method(),
        "stdin": os.readlink("/proc/self/fd/0"),
    }


def multiprocessing_state_into(queue: Any) -> None:
    """The same, from a plain multiprocessing.Process (the anchor)."""
    queue.put(multiprocessing_state(0))


def cpus_first(local_rank: int, queue: Any) -> None:
    """Reads its allowed CPUs as its very first statement, then uses its queue argument."""
    with open("/proc/self/status") as status:
        cpus = next(line for line in status if line.startswith("Cpus_allowed_list:"))
    queue.put((local_rank, cpus.split(":", 1)[1].strip()))


def write_after(local_rank: int, directory: str, seconds: float) -> None:
    """Writes its pid at once and ``done<rank>`` after ``seconds``, each whole: written to a
    temporary name and renamed, since a caller may act (and end this worker) the moment the
    name exists."""
    _write_whole(Path(directory) / f"pid{local_rank}", str(os.getpid()))
    time.sleep(seconds)
    _write_whole(Path(directory) / f"done{local_rank}", str(os.getpid()))


def _write_whole(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def many_puts(local_rank: int, queue: Any, count: int) -> None:
    """Puts ``count`` small items and returns at once: the queue's feeder thread still holds
    most of them, so they arrive only if multiprocessing's exit handler flushes it."""
    for index in range(count):
        queue.put((local_rank, index))


def write_to_fd(local_rank: int, fd: int) -> None:
    os.write(fd, b"from the grandchild")


def fork_a_grandchild(local_rank: int) -> bytes:
    """A fork worker that opens a pipe and has a fork worker of its own write to it."""
    import numarun

    read_end, write_end = os.pipe()
    try:
        numarun.spawn(write_to_fd, args=(write_end,), nprocs=1, start_method="fork")
        return os.read(read_end, 100)
    finally:
        os.close(read_end)
        os.close(write_end)


def shared_results(local_rank: int, tensor: Any) -> tuple[Any, Any, Any]:
    """Returns a new tensor, the shared tensor it was given (changed in place), and one end of
    a fresh pipe whose other end it has written to: fds that travel back with the result."""
    import torch

    tensor.add_(1)
    here, there = multiprocessing.Pipe()
    here.send(f"rank {local_rank} over a returned pipe")
    return torch.full((3,), float(local_rank)), tensor, there


def numarun_location(local_rank: int) -> str:
    import numarun

    return numarun.__file__


class Launcher:
    """Launches like PyTorch Lightning's ``_MultiProcessingLauncher``: ``start_processes``
    with ``join=False`` and a bound method as ``fn``, the processes kept for ``kill``, a
    ``SimpleQueue`` for rank 0's result, joined in a loop. ``start_processes`` is the API
    under test (torch's or numarun's)."""

    def __init__(self, start_processes: Any, start_method: str, nprocs: int) -> None:
        self._start_processes = start_processes
        self._start_method = start_method
        self._nprocs = nprocs
        self.procs: list[Any] = []

    def launch(self, function: Any, *args: Any) -> Any:
        context = multiprocessing.get_context(self._start_method)
        return_queue = context.SimpleQueue()
        process_context = self._start_processes(
            self._wrapping_function,
            args=[function, args, return_queue],
            nprocs=self._nprocs,
            start_method=self._start_method,
            join=False,
        )
        self.procs = process_context.processes
        while not process_context.join():
            pass
        return return_queue.get()

    def _wrapping_function(
        self, process_idx: int, function: Any, args: Any, return_queue: Any
    ) -> None:
        os.environ["LOCAL_RANK"] = str(process_idx)
        results = function(*args)
        if process_idx == 0:
            return_queue.put(results)

    def kill(self, signum: int) -> list[int]:
        killed = []
        for proc in self.procs:
            if proc.is_alive() and proc.pid is not None:
                os.kill(proc.pid, signum)
                killed.append(proc.pid)
        return killed

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["procs"] = []  # started processes do not pickle
        return state


def train(steps: int) -> dict[str, Any]:
    return {"steps": steps, "local_rank": os.environ["LOCAL_RANK"]}


# --- issue 16 (6-8) and issue 20 (7) -------------------------------------------------------------


def put_environment(local_rank: int, queue: Any) -> None:
    queue.put((local_rank, dict(os.environ)))


def _touch(path: Path, text: str | None = None) -> None:
    """Creates ``path`` at once, whole (holding ``text``, default this process's pid)."""
    partial = path.with_name(f".{path.name}.partial")  # hidden from the tests' globs
    partial.write_text(str(os.getpid()) if text is None else text)
    partial.rename(path)


def checkpoint_on_interrupt(local_rank: int, directory: str) -> None:
    """Training-loop shape of checkpoint-on-interrupt code: ``ready-N`` once inside the loop,
    ``checkpoint-N`` from its ``except KeyboardInterrupt``; then the worker ends cleanly."""
    folder = Path(directory)
    try:
        _touch(folder / f"ready-{local_rank}")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(0.05)
    except KeyboardInterrupt:
        _touch(folder / f"checkpoint-{local_rank}")


def raise_keyboard_interrupt(local_rank: int) -> None:
    raise KeyboardInterrupt


def leave_a_sigterm_ignoring_child(local_rank: int, pid_file: str) -> None:
    """Starts a child that ignores SIGTERM and outlives this worker, writes its pid to
    ``pid_file`` once the child ignores SIGTERM, and returns (exit code 0)."""
    import subprocess

    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ready', flush=True)\n"
            "time.sleep(300)\n",
        ],
        stdout=subprocess.PIPE,
    )
    assert child.stdout is not None
    child.stdout.readline()
    _touch(Path(pid_file), str(child.pid))
    _left_running.append(child)  # no "still running" ResourceWarning when fn returns


_left_running: list[Any] = []

"""``numarun.spawn`` / ``numarun.start_processes``: ``fn(local_rank, *args)`` in N bound workers.

The API follows ``torch.multiprocessing.spawn`` (same arguments, same exception classes and
messages) with three differences: ``join=True`` returns the list of return values; every
worker is bound to its CPUs and memory policy before it runs anything (``binding=``,
``mem_binding=``); and workers are supervised by :class:`numarun.supervisor.Supervisor`, which
tears down each worker's whole process tree on the first failure and on SIGINT/SIGTERM/SIGHUP.

How a worker starts, per ``start_method``:

* ``"spawn"`` (default): a fresh ``python -c`` interpreter, bound at birth, reads
  ``pickle((fn, args))`` from a pipe. When the pickle refers to the parent's ``__main__``,
  :mod:`multiprocessing`'s preparation data travels along and the worker imports the parent's
  main script as ``__mp_main__`` first, exactly like ``multiprocessing`` does, so a script
  guarded by ``if __name__ == "__main__":`` works.
* ``"fork"``: a forked copy of this process, bound, calls ``fn`` directly (closures and
  lambdas work; nothing is pickled on the way in).
* ``"forkserver"``: :mod:`multiprocessing`'s fork server forks the worker; the binding is
  applied in that child and only then is ``(fn, args)`` unpickled.

Return values always come back pickled through a pipe (no temporary files), of any size.
"""

from __future__ import annotations

import functools
import os
import pickle
import signal
import sys
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from numarun import _worker, workerenv
from numarun.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Callable

    from numarun.binding import MemPolicy
    from numarun.plan import Plan
    from numarun.supervisor import RunResult, Supervisor, WorkerExit
    from numarun.topology import Topology

__all__ = [
    "START_METHODS",
    "ProcessException",
    "ProcessExitedException",
    "ProcessRaisedException",
    "SpawnContext",
    "spawn",
    "start_processes",
]

START_METHODS = ("spawn", "fork", "forkserver")
WORKER_CODE = "from numarun._worker import main; main()"


class ProcessException(Exception):
    """A worker failed. ``error_index`` is its local rank, ``pid`` (alias ``error_pid``) its pid.

    The exception raised is the first failure in time; ``failures`` holds the exceptions of the
    other workers that failed on their own (not those numarun terminated), in order of death.
    Instances pickle with all attributes.
    """

    def __init__(self, msg: str, error_index: int, error_pid: int) -> None:
        super().__init__(msg)
        self.msg = msg
        self.error_index = error_index
        self.error_pid = error_pid
        self.failures: list[ProcessException] = []

    @property
    def pid(self) -> int:
        return self.error_pid

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.msg, self.error_index, self.error_pid), self.__dict__


class ProcessRaisedException(ProcessException):
    """``fn`` raised in a worker; the message ends with the worker's formatted traceback."""


class ProcessExitedException(ProcessException):
    """A worker exited with a non-zero status or was killed by a signal.

    ``exit_code`` follows :class:`subprocess.Popen`: ``n`` for ``exit(n)``, ``-N`` when killed
    by signal ``N``; ``signal_name`` is then e.g. ``"SIGSEGV"``, else ``None``.
    """

    def __init__(
        self,
        msg: str,
        error_index: int,
        error_pid: int,
        exit_code: int,
        signal_name: str | None = None,
    ) -> None:
        super().__init__(msg, error_index, error_pid)
        self.exit_code = exit_code
        self.signal_name = signal_name

    def __reduce__(self) -> tuple[Any, ...]:
        args = (self.msg, self.error_index, self.error_pid, self.exit_code, self.signal_name)
        return type(self), args, self.__dict__


class SpawnContext:
    """Running workers, returned by ``spawn(..., join=False)``.

    Use :meth:`join` until it returns True, or as a context manager: leaving the ``with`` block
    tears down workers still running (SIGTERM to each worker's tree, SIGKILL after the grace
    period) without raising for them. Keep it referenced until then: a context dropped
    unjoined leaves its workers running until this process exits (they die with it).
    The thread that called ``spawn`` must outlive the workers: the kernel's parent-death signal
    (SIGKILL) fires when the thread that created a worker exits.
    """

    def __init__(self, supervisor: Supervisor, nprocs: int) -> None:
        self._supervisor = supervisor
        self._nprocs = nprocs
        self._values: list[Any] | None = None
        self._error: BaseException | None = None
        self._finished = False

    def pids(self) -> list[int]:
        """The workers' pids, by local rank."""
        return self._supervisor.pids()

    @property
    def return_values(self) -> list[Any] | None:
        """``fn``'s return values by local rank once :meth:`join` returned True, else None."""
        return self._values

    def join(self, timeout: float | None = None, grace_period: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (None: until the end) for the workers.

        Returns True when every worker finished successfully (then :attr:`return_values` is
        set; later calls return True at once), False when the timeout passed first (workers keep
        running). On the first failure the others are torn down (SIGTERM, then SIGKILL after
        ``grace_period``, default: the one given to ``spawn``) and :class:`ProcessRaisedException`
        or :class:`ProcessExitedException` is raised; later calls raise it again. A SIGINT
        received while waiting tears the workers down and raises :class:`KeyboardInterrupt`;
        SIGTERM or SIGHUP tear down, then are re-delivered to this process with its previous
        disposition, and if that returns, :class:`SystemExit` with ``128 + signal`` is raised.
        """
        if self._error is not None:
            raise self._error
        if self._finished:
            return True
        if grace_period is not None:
            _check_grace_period(grace_period)
            self._supervisor.grace_period = grace_period
        try:
            result = self._supervisor.wait(timeout)
        except BaseException:
            self._finish_after_error()
            raise
        if result is None:
            return False
        self._finished = True
        try:
            self._values = _return_values(result, self._nprocs)
        except ProcessException as exc:
            self._error = exc
            raise
        return True

    def stop(self, grace_period: float | None = None) -> None:
        """Tear down workers still running now (SIGTERM, SIGKILL after ``grace_period``).

        Nothing is raised for the workers; afterwards :meth:`join` returns True and
        :attr:`return_values` stays None. Does nothing once :meth:`join` has finished.
        """
        if not self._finished:
            self._finished = True
            self._supervisor.stop(grace_period)

    def _finish_after_error(self) -> None:
        self._finished = True
        self._supervisor.stop()

    def __enter__(self) -> SpawnContext:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def spawn(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    nprocs: int = 1,
    join: bool = True,
    daemon: bool = False,
    start_method: str = "spawn",
    *,
    binding: str | Plan | Sequence[Sequence[int] | str] | None = None,
    mem_binding: str | None = None,
    grace_period: float = 30.0,
    env: Mapping[str, str] | None = None,
    binding_fallback: bool = False,
    master_addr: str | None = None,
    master_port: int | None = None,
) -> list[Any] | SpawnContext:
    """Run ``fn(local_rank, *args)`` in ``nprocs`` workers; by default wait and return their values.

    Args:
        fn: called as ``fn(local_rank, *args)`` in each worker. Under ``"spawn"`` and
            ``"forkserver"`` it and ``args`` must pickle (a module-level function); under
            ``"fork"`` anything callable works.
        nprocs: number of workers (>= 1); local rank ``i`` is also ``RANK`` ``i``.
        join: True: wait, return ``[fn's value for rank 0, ...]``. False: return a
            :class:`SpawnContext` at once.
        daemon: accepted for compatibility with ``torch.multiprocessing``; it changes nothing,
            because workers never outlive numarun: they are torn down when a worker fails, when
            this process is signalled while joining, and (parent-death signal) when it dies.
        start_method: ``"spawn"``, ``"fork"`` or ``"forkserver"``.
        binding: None (inherit this process's CPUs), a planner mode (``"node"``, ``"socket"``,
            ``"exclusive"``, ``"core-complex"``, ``"cpu"``), a ready :class:`numarun.plan.Plan`
            with one rank per worker, or one CPU set per rank (``[[0, 1], [2, 3]]`` or
            ``["0-1", "2-3"]``).
        mem_binding: None/``"none"``, ``"local"``, ``"preferred"``, ``"bind"`` or
            ``"interleave"`` over each rank's planned memory nodes (all but ``"local"`` need a
            ``binding``).
        grace_period: seconds between SIGTERM and SIGKILL when tearing down (>= 0).
        env: added to (and overriding) ``os.environ`` for the workers; this process's
            environment is never changed.
        binding_fallback: allow the planner and the memory policy check to fall back (no
            binding / weaker policy) instead of raising; each fallback is reported with
            :func:`warnings.warn`.
        master_addr, master_port: ``MASTER_ADDR`` / ``MASTER_PORT`` for the workers; defaults:
            the value in ``env`` or ``os.environ``, else ``127.0.0.1`` and a port that was free
            when checked (bind to port 0, then release: another process may take it meanwhile).

    Each worker's environment is ``os.environ`` + ``env``, then ``RANK``, ``LOCAL_RANK``,
    ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, the plan's variables
    (e.g. ``CUDA_DEVICE_ORDER``), and ``OMP_NUM_THREADS`` unless already set: the rank's bound
    physical cores, or for unbound workers this process's physical cores divided by ``nprocs``
    (at least 1). torchrun forces 1 instead.

    Raises, before any worker starts: :class:`numarun.errors.UsageError` (bad argument,
    unpicklable ``fn``/``args``, a call made while a spawned worker imports the main module),
    :class:`numarun.errors.PlanError` (binding impossible here),
    :class:`numarun.errors.BindingError` (CPUs or memory policy not allowed here).
    After start (join=True): :class:`ProcessRaisedException` when ``fn`` raised in a worker,
    :class:`ProcessExitedException` when a worker exited non-zero or was killed by a signal;
    the first failure in time is raised, every other worker is torn down first. SIGINT while
    waiting: teardown, then :class:`KeyboardInterrupt`. SIGTERM / SIGHUP: teardown, then the
    signal is re-delivered to this process with the disposition it had before (the default
    one ends the process); if that returns, ``SystemExit(128 + signal)`` is raised. Of these
    three, a signal this process ignores when ``spawn`` is called (SIGHUP under ``nohup``)
    stays ignored and tears nothing down. Signals are handled only when joining in the main
    thread; elsewhere they keep their usual effect on this process (the workers, in their own
    sessions, do not receive the terminal's Ctrl-C).
    """
    context = _start(
        fn,
        args,
        nprocs,
        start_method,
        binding=binding,
        mem_binding=mem_binding,
        grace_period=grace_period,
        env=env,
        binding_fallback=binding_fallback,
        master_addr=master_addr,
        master_port=master_port,
    )
    del daemon
    if not join:
        return context
    with context:
        while not context.join():
            pass
    values = context.return_values
    assert values is not None
    return values


start_processes = spawn


# --- starting ------------------------------------------------------------------------------------


def _start(
    fn: Callable[..., Any],
    args: Sequence[Any],
    nprocs: int,
    start_method: str,
    *,
    binding: object,
    mem_binding: str | None,
    grace_period: float,
    env: Mapping[str, str] | None,
    binding_fallback: bool,
    master_addr: str | None,
    master_port: int | None,
) -> SpawnContext:
    """Check everything, plan, build the worker specs and start them; nothing starts on error."""
    _check_arguments(fn, args, nprocs, start_method, grace_period, env)
    args = tuple(args)
    blob = _pickle_call(fn, args, start_method) if start_method != "fork" else None
    prep = _preparation_data(blob, start_method)
    base_env = dict(os.environ)
    base_env.update(env or {})
    placement = _resolve_binding(binding, mem_binding, nprocs, binding_fallback, base_env)
    worker_envs = _worker_envs(base_env, nprocs, placement, master_addr, master_port)
    specs = [
        _worker_spec(i, fn, args, start_method, worker_envs[i], blob, prep, placement)
        for i in range(nprocs)
    ]
    from numarun.stackdumps import for_spawn
    from numarun.supervisor import Supervisor

    specs, stacks = for_spawn(specs, fn)  # `numarun stacks` reaches fn under every start method
    supervisor = Supervisor(
        specs, grace_period=grace_period, on_exit=stacks.on_exit if stacks else None
    )
    try:
        if stacks is not None:
            stacks.attach(supervisor)
            stacks.listen()
        supervisor.start()
    except BaseException:
        if stacks is not None:
            stacks.close()
        raise
    return SpawnContext(supervisor, nprocs)


def _check_arguments(
    fn: object,
    args: object,
    nprocs: object,
    start_method: object,
    grace_period: object,
    env: object,
) -> None:
    worker = sys.modules.get("numarun._worker")
    if worker is not None and getattr(worker, "importing_main", False):
        raise UsageError(
            "numarun.spawn was called while a worker imported the main module; "
            'put the call under if __name__ == "__main__":'
        )
    if not callable(fn):
        raise UsageError(f"fn must be callable, got {type(fn).__name__}")
    if not isinstance(args, (tuple, list)):
        raise UsageError(f"args must be a tuple of arguments for fn, got {type(args).__name__}")
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise UsageError(f"nprocs must be an integer >= 1, got {nprocs!r}")
    if start_method not in START_METHODS:
        raise UsageError(
            f"unknown start_method {start_method!r}; choose one of {', '.join(START_METHODS)}"
        )
    _check_grace_period(grace_period)
    if env is not None and (
        not isinstance(env, Mapping)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    ):
        raise UsageError("env must be a mapping of str to str")


def _check_grace_period(grace_period: object) -> None:
    if (
        isinstance(grace_period, bool)
        or not isinstance(grace_period, (int, float))
        or not grace_period >= 0
    ):
        raise UsageError(f"grace_period must be a number of seconds >= 0, got {grace_period!r}")


def _pickle_call(fn: Callable[..., Any], args: tuple[Any, ...], start_method: str) -> bytes:
    try:
        return pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise UsageError(
            f"fn or args cannot be pickled for start_method={start_method!r}: {reason}; "
            "define fn at module level or use start_method='fork'"
        ) from None


def _preparation_data(blob: bytes | None, start_method: str) -> dict[str, Any] | None:
    """multiprocessing's preparation data when the pickle refers to ``__main__``, else None.

    Only the spawn method needs it (the fork server prepares its children itself). Checking the
    bytes for the module name may give a false positive, which only costs the worker an import.
    """
    if blob is None or start_method != "spawn" or b"__main__" not in blob:
        return None
    import multiprocessing.spawn

    prep = multiprocessing.spawn.get_preparation_data("numarun-worker")
    if "init_main_from_path" not in prep and "init_main_from_name" not in prep:
        raise UsageError(
            "fn or args come from an interactive __main__ that a spawned worker cannot import; "
            "move fn into a module or use start_method='fork'"
        )
    if "authkey" in prep:
        # multiprocessing refuses to pickle its AuthenticationString outside its own spawning.
        prep["authkey"] = bytes(prep["authkey"])
    return prep


@dataclass(frozen=True)
class _Placement:
    """Per-rank CPUs (None: inherit), memory policies, suggested thread counts (None: unbound,
    use the unbound rule), and the plan's environment variables."""

    cpus: list[tuple[int, ...] | None]
    mems: list[MemPolicy | None]
    threads: list[int] | None
    env: tuple[tuple[str, str], ...]


def _resolve_binding(
    binding: object,
    mem_binding: str | None,
    nprocs: int,
    allow_fallback: bool,
    environ: Mapping[str, str],
) -> _Placement:
    """Turn ``binding`` / ``mem_binding`` into checked per-rank CPUs and memory policies."""
    if binding is None:
        return _unbound_placement(mem_binding, nprocs)
    from numarun import binding as binding_module

    plan = _make_plan(binding, nprocs, allow_fallback, environ)
    for message in plan.warnings:
        _warn(message)
    if not plan.bound:
        if mem_binding not in (None, "none", "local"):
            _warn(
                f"mem_binding={mem_binding!r} dropped: the CPU binding fell back to none, so "
                "there are no memory nodes to bind to"
            )
            mem_binding = None
        return _unbound_placement(mem_binding, nprocs, env=plan.env)
    for rank in plan.ranks:
        binding_module.check_cpus(rank.cpus, rank=rank.local_rank)
    policies = [binding_module.mem_policy_for(mem_binding, rank.mems) for rank in plan.ranks]
    policies, messages = binding_module.check_mem_policy(policies, allow_fallback=allow_fallback)
    for message in messages:
        _warn(message)
    return _Placement(
        cpus=[tuple(rank.cpus) for rank in plan.ranks],
        mems=policies,
        threads=[max(1, rank.threads) for rank in plan.ranks],
        env=plan.env,
    )


def _warn(message: str) -> None:
    """``warnings.warn`` pointing at the first caller outside numarun."""
    frame, level = sys._getframe(0), 1
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith("numarun."):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, RuntimeWarning, stacklevel=level)


def _unbound_placement(
    mem_binding: str | None, nprocs: int, env: tuple[tuple[str, str], ...] = ()
) -> _Placement:
    if mem_binding in (None, "none"):
        return _Placement([None] * nprocs, [None] * nprocs, None, env)
    if mem_binding != "local":
        raise UsageError(
            f"mem_binding={mem_binding!r} needs memory nodes from a CPU binding; "
            "pass binding='node' (or another mode), or use mem_binding='local'"
        )
    from numarun import binding as binding_module

    policy = binding_module.mem_policy_for("local", ())
    policies, _ = binding_module.check_mem_policy([policy] * nprocs, allow_fallback=False)
    return _Placement([None] * nprocs, policies, None, env)


def _make_plan(
    binding: object, nprocs: int, allow_fallback: bool, environ: Mapping[str, str]
) -> Plan:
    from numarun.plan import Plan, make_plan

    if isinstance(binding, Plan):
        if len(binding.ranks) != nprocs:
            raise UsageError(
                f"the plan has {len(binding.ranks)} ranks but nprocs is {nprocs}; "
                "make the plan for the same number of workers"
            )
        return binding
    topology = _read_topology(environ)
    if isinstance(binding, str):
        return make_plan(topology, nprocs, binding, allow_unbound=allow_fallback)
    rank_cpus = _explicit_cpus(binding, nprocs)
    return make_plan(
        topology, nprocs, "explicit", rank_cpus=rank_cpus, allow_unbound=allow_fallback
    )


def _explicit_cpus(binding: object, nprocs: int) -> list[tuple[int, ...]]:
    from numarun.cpulist import parse_cpulist

    if not isinstance(binding, Sequence) or isinstance(binding, (bytes, bytearray)):
        raise UsageError(
            "binding must be a mode name, a Plan or one CPU list per rank "
            f"(e.g. [[0], [1]]), got {type(binding).__name__}"
        )
    if len(binding) != nprocs:
        raise UsageError(
            f"binding lists CPUs for {len(binding)} ranks but nprocs is {nprocs}; "
            "give one CPU list per rank"
        )
    rank_cpus = []
    for item in binding:
        if isinstance(item, str):
            rank_cpus.append(parse_cpulist(item))
        elif isinstance(item, Sequence) and all(
            isinstance(cpu, int) and not isinstance(cpu, bool) for cpu in item
        ):
            rank_cpus.append(tuple(sorted(set(item))))
        else:
            raise UsageError(
                f"invalid CPU list {item!r} in binding; use a list of CPU numbers or a "
                "string like '0-3,8'"
            )
    return rank_cpus


def _read_topology(environ: Mapping[str, str]) -> Topology:
    from numarun.topology import read_topology

    return read_topology("/", environ=environ)


# --- worker environment --------------------------------------------------------------------------


def _worker_envs(
    base: dict[str, str],
    nprocs: int,
    placement: _Placement,
    master_addr: str | None,
    master_port: int | None,
) -> list[dict[str, str]]:
    common = dict(base)
    common["WORLD_SIZE"] = str(nprocs)
    common["LOCAL_WORLD_SIZE"] = str(nprocs)
    common["MASTER_ADDR"] = master_addr or base.get("MASTER_ADDR") or "127.0.0.1"
    if master_port is not None:
        common["MASTER_PORT"] = str(master_port)
    elif not base.get("MASTER_PORT"):
        common["MASTER_PORT"] = str(workerenv.free_port())
    common.update(placement.env)
    threads = None
    if "OMP_NUM_THREADS" not in base:
        threads = placement.threads or [workerenv.unbound_threads(nprocs)] * nprocs
    envs = []
    for rank in range(nprocs):
        worker_env = dict(common)
        worker_env["RANK"] = str(rank)
        worker_env["LOCAL_RANK"] = str(rank)
        if threads is not None:
            worker_env["OMP_NUM_THREADS"] = str(threads[rank])
        envs.append(worker_env)
    return envs


# --- worker specs --------------------------------------------------------------------------------


def _worker_spec(
    local_rank: int,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    start_method: str,
    worker_env: dict[str, str],
    blob: bytes | None,
    prep: dict[str, Any] | None,
    placement: _Placement,
) -> Any:
    from numarun.supervisor import WorkerSpec

    common: dict[str, Any] = {
        "local_rank": local_rank,
        "rank": local_rank,
        "env": worker_env,
        "want_result": True,
        "cpus": placement.cpus[local_rank],
        "mem": placement.mems[local_rank],
    }
    if start_method == "fork":
        target = functools.partial(_worker.run_fork_call, fn, args, local_rank)
        return WorkerSpec(start="fork", fork_target=target, **common)
    assert blob is not None
    header = {
        "local_rank": local_rank,
        "sys_path": list(sys.path),
        "prep": prep,
    }
    payload = pickle.dumps(header, protocol=pickle.HIGHEST_PROTOCOL) + blob
    if start_method == "forkserver":
        return WorkerSpec(
            start="forkserver", fork_target=_worker.run_forked, payload=payload, **common
        )
    argv = [sys.executable, "-c", WORKER_CODE]
    return WorkerSpec(start="exec", argv=argv, payload=payload, **common)


# --- results -------------------------------------------------------------------------------------


def _return_values(result: RunResult, nprocs: int) -> list[Any]:
    """The workers' return values, or raise what the run's outcome calls for.

    Workers that survived SIGKILL (uninterruptible sleep) cannot be waited for; each gets a
    RuntimeWarning naming its pid and state before anything is returned or raised.
    """
    for worker in result.unkillable:
        _warn(
            f"local rank {worker.local_rank} (pid {worker.pid}) survived SIGKILL in state "
            f"{worker.proc_state or '?'}; it is still running and numarun stopped waiting for it"
        )
    if result.received_signal is not None:
        _raise_for_signal(result.received_signal)
    failed = [w for w in result.workers if w.state == "failed"]
    if result.first_failure is not None or failed:
        first = result.first_failure or min(failed, key=_death_time)
        others = sorted((w for w in failed if w.local_rank != first.local_rank), key=_death_time)
        error = _failure(first)
        error.failures = [_failure(w) for w in others]
        raise error
    by_rank = sorted(result.workers, key=lambda w: w.local_rank)
    if len(by_rank) != nprocs:
        raise RuntimeError(f"numarun: expected {nprocs} worker results, got {len(by_rank)}")
    return [_value_of(w) for w in by_rank]


def _death_time(worker: WorkerExit) -> float:
    return worker.ended_at if worker.ended_at is not None else float("inf")


def _value_of(worker: WorkerExit) -> Any:
    """``fn``'s return value; None when the worker wrote none (it left by ``SystemExit(0)``)."""
    if not worker.result:
        return None
    try:
        outcome, value = pickle.loads(worker.result)
    except Exception as exc:
        raise ProcessRaisedException(
            f"\n\n-- Process {worker.local_rank} returned a value that cannot be unpickled "
            f"here: {exc!r}\n",
            worker.local_rank,
            worker.pid,
        ) from exc
    return value if outcome == "ok" else None


def _failure(worker: WorkerExit) -> ProcessException:
    """The exception describing one failed worker, in torch.multiprocessing's words."""
    from numarun.supervisor import signal_name

    index = worker.local_rank
    traceback_text = _raised_traceback(worker.result)
    if traceback_text is not None:
        message = f"\n\n-- Process {index} terminated with the following error:\n{traceback_text}"
        return ProcessRaisedException(message, index, worker.pid)
    code = worker.exit_code if worker.exit_code is not None else -signal.SIGKILL
    if code < 0:
        name = worker.signal_name or signal_name(code)
        return ProcessExitedException(
            f"process {index} terminated with signal {name}", index, worker.pid, code, name
        )
    return ProcessExitedException(
        f"process {index} terminated with exit code {code}", index, worker.pid, code
    )


def _raised_traceback(result: bytes) -> str | None:
    if not result:
        return None
    try:
        outcome, text = pickle.loads(result)
    except Exception:
        return None
    return text if outcome == "raised" else None


def _raise_for_signal(signum: int) -> None:
    """Act on the signal that made the supervisor tear down, after the teardown."""
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    # The supervisor has restored our previous disposition: the default one ends us the way
    # the signal meant to; a Python handler runs (and may raise) inside os.kill.
    os.kill(os.getpid(), signum)
    raise SystemExit(128 + signum)

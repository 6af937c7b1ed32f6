"""``numarun [options] train.py args...``: torchrun's command line, bound workers, clear failures.

Three kinds of entry point, as in torchrun: a Python script (``train.py``), a module
(``-m pkg.module``) and a binary (``--no-python ./binary``). Python workers run
``$PYTHON_EXEC or sys.executable -u -c "from numarun.launch.bootstrap import main; main()" ...``
(cheaper than ``-m numarun.launch.bootstrap``, which imports :mod:`runpy` first) so that a worker
without ``@record`` still leaves an error file with its traceback, and its stacks can be taken
(:mod:`numarun.stacks.dumps`). Each worker gets torchrun's environment (RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ... TORCHELASTIC_ERROR_FILE) and meets the others through
``env://``. With the static rendezvous (the default) numarun runs no rendezvous service and
global rank 0's worker hosts the ``TCPStore``; with a PyTorch backend (``--rdzv-backend
c10d``) :mod:`numarun.launch.elastic` joins torch's rendezvous and the launcher hosts the store, as
torchrun's does.

Flow: :func:`parse_args` (argv -> :class:`LaunchConfig`, no effects; defined in
:mod:`numarun.launch.config`, re-exported here) -> :func:`run` (entry point checked, plan
made, memory policy proven; then :class:`_Job`: one attempt after another, each started and
watched by a supervisor, until one succeeds, ``--max-restarts`` is used up, a signal or the
rendezvous ends the job; summary printed, exit code returned). :func:`main` joins the two and
turns :class:`NumarunError` into one line on stderr and its exit status (2 for bad input, 1
for a rendezvous that fails).

Start-up speed matters (``benchmarks/bench_launch.py`` compares it with bare interpreter
starts), so everything beyond argument parsing and the supervisor is imported only on the path
that needs it: the topology is read only when binding (or ``--nproc-per-node gpu|auto``) asks
for it, the log and failure modules only for redirected output or a failed run.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
from collections.abc import Callable, Mapping, Sequence

from numarun.errors import NumarunError, UsageError
from numarun.launch.config import DEFAULT_GRACE_PERIOD as DEFAULT_GRACE_PERIOD
from numarun.launch.config import FORWARD_SIGNALS as FORWARD_SIGNALS
from numarun.launch.config import TEARDOWN_SIGNALS as TEARDOWN_SIGNALS
from numarun.launch.config import LaunchConfig, parse_args
from numarun.launch.nodes import DEFAULT_MULTI_NODE_PORT as DEFAULT_MULTI_NODE_PORT
from numarun.placement import workerenv

TYPE_CHECKING = False
if TYPE_CHECKING:
    from numarun.launch.elastic import ElasticNode
    from numarun.launch.rendezvous import Round
    from numarun.placement.plan import Plan, RankBinding
    from numarun.process.spec import RunResult, WorkerExit, WorkerSpec

# -c, not -m numarun.launch.bootstrap: -m makes every worker import runpy first (see
# numarun.launch.bootstrap).
SCRIPT_BOOTSTRAP = "from numarun.launch.bootstrap import main; main()"


# --- what each worker gets -----------------------------------------------------------------------


def worker_argv(
    config: LaunchConfig, binary_path: str | None = None, local_rank: int | None = None
) -> list[str]:
    """The argv exec'd for a worker (no shell anywhere).

    Scripts: ``PYTHON -u -c BOOTSTRAP -- SCRIPT ARGS``; modules: ``PYTHON -u -c BOOTSTRAP -m
    MODULE ARGS`` (BOOTSTRAP: :data:`SCRIPT_BOOTSTRAP`, which runs :mod:`numarun.launch.bootstrap`);
    binaries: ``BINARY ARGS`` with ``binary_path`` (the
    resolved path, when given) in place of the name. With ``local_rank``, ``${local_rank}`` in
    ARGS becomes that rank (:func:`substitute_local_rank`).
    """
    args = list(config.args)
    if local_rank is not None:
        args = substitute_local_rank(args, local_rank)
    if config.entrypoint_kind == "binary":
        return [binary_path or config.entrypoint, *args]
    head = [config.python_exec, "-u", "-c", SCRIPT_BOOTSTRAP]
    if config.entrypoint_kind == "module":
        return [*head, "-m", config.entrypoint, *args]
    return [*head, "--", config.entrypoint, *args]


# ``$$`` is matched so that ``$${local_rank}`` stays as written, as torchrun's
# string.Template escape; an identifier that only starts with local_rank is another name.
_LOCAL_RANK_MACRO = re.compile(r"\$(?:\$|\{local_rank\}|local_rank(?![A-Za-z0-9_]))")


def substitute_local_rank(args: Sequence[str], local_rank: int) -> list[str]:
    """torchrun's worker-argument macro: ``${local_rank}`` and ``$local_rank`` become the
    local rank. Everything else stays byte for byte, ``$$`` too (torchrun's
    ``string.Template`` turns it into ``$``)."""
    value = str(local_rank)

    def expand(match: re.Match[str]) -> str:
        return match.group(0) if match.group(0) == "$$" else value

    return [_LOCAL_RANK_MACRO.sub(expand, arg) if "$" in arg else arg for arg in args]


def rank_env(
    config: LaunchConfig,
    local_rank: int,
    *,
    base: Mapping[str, str],
    master_port: int | None = None,
    error_file: str,
    binding: RankBinding | None = None,
    plan_env: Sequence[tuple[str, str]] = (),
    unbound_threads: int = 1,
    group: Round | None = None,
    restart_count: int = 0,
) -> dict[str, str]:
    """The variables numarun sets for ``local_rank`` on top of ``base`` (the launcher's env).

    torchrun's set (RANK, LOCAL_RANK, GROUP_RANK, ROLE_RANK, ROLE_NAME, LOCAL_WORLD_SIZE,
    WORLD_SIZE, GROUP_WORLD_SIZE, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_*),
    ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1`` and ``OMP_NUM_THREADS`` only when ``base`` lacks them
    (OMP: the rank's bound physical cores, else ``unbound_threads``), then ``plan_env`` (e.g.
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``), which wins over ``base``. Ranks, sizes and the store's
    address come from ``group``, a round of a torch rendezvous; without it, from the static
    rendezvous (``config`` and ``master_port``; rank 0's worker hosts the store).
    ``restart_count`` is TORCHELASTIC_RESTART_COUNT.
    """
    if group is None:
        rank = role_rank = config.global_rank(local_rank)
        world = role_world = config.world_size
        group_rank, group_size, agent_store = config.node_rank, config.nnodes, False
        master = (config.master_addr, master_port)
    else:
        rank, role_rank, world, role_world = group.workers[local_rank]
        group_rank, group_size = group.group_rank, group.group_world_size
        master = (group.master_addr, group.master_port)
        agent_store = group.use_agent_store
    env = {
        "LOCAL_RANK": str(local_rank),
        "RANK": str(rank),
        "GROUP_RANK": str(group_rank),
        "ROLE_RANK": str(role_rank),
        "ROLE_NAME": config.role,
        "LOCAL_WORLD_SIZE": str(config.nproc_per_node),
        "WORLD_SIZE": str(world),
        "GROUP_WORLD_SIZE": str(group_size),
        "ROLE_WORLD_SIZE": str(role_world),
        "MASTER_ADDR": master[0],
        "MASTER_PORT": str(master[1]),
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(config.max_restarts),
        "TORCHELASTIC_RUN_ID": config.run_id,
        "TORCHELASTIC_USE_AGENT_STORE": str(agent_store),
        "TORCHELASTIC_ERROR_FILE": error_file,
        "TORCHELASTIC_SIGNALS_TO_HANDLE": config.signals_to_handle,
    }
    if "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in base:
        env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
    if "OMP_NUM_THREADS" not in base:
        threads = binding.threads if binding is not None else unbound_threads
        env["OMP_NUM_THREADS"] = str(max(1, threads))
    env.update(plan_env)
    if config.virtual_local_rank:
        env["LOCAL_RANK"] = "0"
        env["CUDA_VISIBLE_DEVICES"] = virtual_device(base, local_rank)
    return env


def virtual_device(base: Mapping[str, str], local_rank: int) -> str:
    """``--virtual-local-rank``: the one device a rank sees, torchrun's way: the parent's
    ``CUDA_VISIBLE_DEVICES`` entry for the local rank, or the local rank itself when unset.
    Raises :class:`UsageError` when the parent's list is too short."""
    visible = base.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return str(local_rank)
    entries = visible.split(",")
    if local_rank >= len(entries):
        raise UsageError(
            f"--virtual-local-rank: local rank {local_rank} has no entry in "
            f"CUDA_VISIBLE_DEVICES={visible!r}; list one device per local rank"
        )
    return entries[local_rank].strip()


# --- exit codes ----------------------------------------------------------------------------------


def exit_code_for(result: RunResult) -> int:
    """The launcher's exit status for a finished run.

    128+N when the launcher itself received signal N (130 for Ctrl-C); else 124 when
    ``--hang-timeout`` stopped the run (``stop_reason`` ``"hang: ..."``, as timeout(1)); else
    the first failing worker's status: its exit code, 128+N when signal N killed it, 1 when it
    is unaccounted for (unkillable); else 1 when the run was stopped through
    ``Supervisor.request_stop`` for another reason (the rendezvous); else 0.
    """
    if result.received_signal:
        return 128 + int(result.received_signal)
    if result.stop_reason is not None and result.stop_reason.startswith("hang: "):
        return 124  # numarun.stacks.dumps.HANG_EXIT_CODE
    failure = result.first_failure
    if failure is None:
        return 1 if result.stop_reason else 0
    if failure.exit_code is None:
        return 1
    if failure.exit_code < 0:
        return 128 - failure.exit_code
    return failure.exit_code or 1


# --- running -------------------------------------------------------------------------------------


def main(argv: Sequence[str], *, epilog: str | None = None) -> int:
    """Parse ``argv`` (without the program name), launch, and return the exit status.

    Bad input prints ``numarun: error: <one line>`` on stderr and returns 2 with nothing
    started; ``--help`` prints the help (``epilog`` after the options) and ``--version`` the
    version, and return 0.
    """
    try:
        config = parse_args(argv, epilog=epilog)
        return run(config)
    except NumarunError as error:
        print(f"numarun: error: {error}", file=sys.stderr)
        return error.exit_code
    except SystemExit as stop:  # --help
        return stop.code if isinstance(stop.code, int) else 0


def run(config: LaunchConfig, environ: Mapping[str, str] | None = None) -> int:
    """Check the entry point, plan, start every worker, wait, report; return the exit status.

    Before anything starts: the script must be a file, the module findable (without importing
    it), the binary executable; the plan and each memory policy must be applicable (or fall back
    with ``--binding-fallback``). Any of these raises a :class:`NumarunError` subclass. With
    ``--dry-run`` prints the plan, and per rank the argv and the environment added, and
    returns 0. Otherwise returns :func:`exit_code_for` the run (0, the first failing worker's
    status, 128+N for a worker killed by signal N, 128+N when the launcher got teardown signal
    N, also while the workers were still starting); a non-zero run ends with the failure
    summary as the last thing on stderr. ``environ`` (default ``os.environ``) is the base of
    every worker's environment.

    Side effect on the calling process: ``gc.freeze()`` just before the workers start; the
    launcher's start-up objects are never collected afterwards.
    """
    base = dict(os.environ if environ is None else environ)
    for warning in config.warnings:
        print(f"numarun: warning: {warning}", file=sys.stderr)
    binary_path = check_entrypoint(config, base)
    if config.virtual_local_rank:
        virtual_device(base, config.nproc_per_node - 1)  # too few devices: refused before start
    plan = _make_plan(config)
    if plan is not None:
        for warning in plan.warnings:
            print(f"numarun: warning: {warning}", file=sys.stderr)
    if config.elastic:
        port = 0  # the rendezvous names the store
    else:
        port = config.master_port if config.master_port is not None else workerenv.free_port()
    if config.dry_run:
        print(_dry_run_text(config, plan, base, port, binary_path), end="")
        return 0
    return _launch(config, plan, base, port, binary_path)


def check_entrypoint(config: LaunchConfig, env: Mapping[str, str]) -> str | None:
    """Raise :class:`UsageError` unless the entry point can start; return a binary's path.

    A script must be an existing file (or a directory with ``__main__.py``). A module must be
    findable from the current directory and ``sys.path`` without importing it (parents are
    located through their ``submodule_search_locations``); a package needs a ``__main__``
    submodule. The module check is skipped when ``PYTHON_EXEC`` names another interpreter (its
    path may differ). A binary is looked up on ``PATH`` when it has no ``/`` and must be an
    executable file.
    """
    if config.entrypoint_kind == "script":
        path = config.entrypoint
        if os.path.isdir(path):
            if not os.path.isfile(os.path.join(path, "__main__.py")):
                raise UsageError(f"training script {path!r} is a directory without __main__.py")
        elif not os.path.isfile(path):
            raise UsageError(f"training script {path!r} not found")
        return None
    if config.entrypoint_kind == "module":
        if config.python_exec == sys.executable:
            _check_module(config.entrypoint)
        return None
    return _resolve_binary(config.entrypoint, env)


def _check_module(name: str) -> None:
    import importlib.machinery
    import importlib.util

    parts = name.split(".")
    if not all(part.isidentifier() for part in parts):
        raise UsageError(f"-m {name!r} is not a valid module name")
    spec = importlib.machinery.PathFinder.find_spec(parts[0], [os.getcwd(), *sys.path])
    if spec is None:
        spec = importlib.util.find_spec(parts[0])  # built-in and frozen modules
    for depth in range(1, len(parts) + 1):
        if spec is None:
            raise UsageError(
                f"module {'.'.join(parts[:depth])!r} not found (from {os.getcwd()} and sys.path)"
            )
        if depth == len(parts):
            break
        locations = spec.submodule_search_locations
        if locations is None:
            raise UsageError(
                f"module {name!r} not found: {'.'.join(parts[:depth])!r} is not a package"
            )
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: depth + 1]), locations)
    if spec is not None and spec.submodule_search_locations is not None:
        main_spec = importlib.machinery.PathFinder.find_spec(
            f"{name}.__main__", spec.submodule_search_locations
        )
        if main_spec is None:
            raise UsageError(
                f"-m {name}: {name!r} is a package without __main__; name a module inside it"
            )


def _resolve_binary(binary: str, env: Mapping[str, str]) -> str:
    import shutil

    if "/" in binary:
        if not os.path.isfile(binary):
            raise UsageError(f"--no-python binary {binary!r} not found")
        if not os.access(binary, os.X_OK):
            raise UsageError(f"--no-python binary {binary!r} is not executable (chmod +x it)")
        return binary
    found = shutil.which(binary, path=env.get("PATH", os.defpath))
    if found is None:
        raise UsageError(f"--no-python binary {binary!r} not found on PATH")
    return found


def _make_plan(config: LaunchConfig) -> Plan | None:
    if config.numa_binding is None:
        return None
    from numarun.machine.topology import read_topology
    from numarun.placement.plan import make_plan

    topology = read_topology(config.sysfs_root, cpus_allowed=config.cpus_allowed)
    return make_plan(
        topology,
        config.nproc_per_node,
        config.numa_binding,
        rank_cpus=config.rank_cpus,
        allow_unbound=config.binding_fallback,
    )


def _bound(plan: Plan | None, local_rank: int) -> RankBinding | None:
    if plan is None or not plan.bound:
        return None
    return plan.ranks[local_rank]


def _unbound_threads(config: LaunchConfig, base: Mapping[str, str]) -> int:
    if "OMP_NUM_THREADS" in base:
        return 1  # not used: the user's value is kept
    return workerenv.unbound_threads(config.nproc_per_node)


def _error_file(attempt_dir: str, local_rank: int) -> str:
    return os.path.join(attempt_dir, str(local_rank), "error.json")


def _dry_run_text(
    config: LaunchConfig,
    plan: Plan | None,
    base: Mapping[str, str],
    port: int,
    binary_path: str | None,
) -> str:
    import shlex

    lines: list[str] = []
    if plan is not None:
        from numarun.placement.plan import format_plan_table

        lines.append(format_plan_table(plan))
        lines.append("")
    attempt_dir = os.path.join(config.log_dir or "<temporary dir>", config.run_id, "attempt_0")
    threads = _unbound_threads(config, base)
    from_rendezvous: tuple[str, ...] = ()
    if config.elastic:
        from_rendezvous = _RENDEZVOUS_VARIABLES
        lines.append(
            f"rendezvous: {config.rdzv_backend} at {config.rdzv_endpoint or '(default endpoint)'}"
            f", run id {config.run_id}, {config.min_nodes}:{config.max_nodes} nodes; "
            f"{', '.join(from_rendezvous)} come from its rounds"
        )
    for local_rank in range(config.nproc_per_node):
        env = rank_env(
            config,
            local_rank,
            base=base,
            master_port=port,
            error_file=_error_file(attempt_dir, local_rank),
            binding=_bound(plan, local_rank),
            plan_env=plan.env if plan is not None else (),
            unbound_threads=threads,
        )
        binding = _bound(plan, local_rank)
        where = "unbound" if binding is None else f"cpus {_cpus_text(binding.cpus)}"
        rank = f"rank {config.global_rank(local_rank)}"
        if config.elastic:
            rank = "rank from the rendezvous"
        lines.append(f"local rank {local_rank} ({rank}, {where}):")
        lines.append(f"  argv: {shlex.join(worker_argv(config, binary_path, local_rank))}")
        for key in sorted(env):
            if base.get(key) != env[key] and key not in from_rendezvous:
                lines.append(f"  env:  {key}={shlex.quote(env[key])}")
    return "\n".join(lines) + "\n"


# What a torch rendezvous decides per round (the dry run cannot know it).
_RENDEZVOUS_VARIABLES = (
    "RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_USE_AGENT_STORE",
)


def _cpus_text(cpus: Sequence[int]) -> str:
    from numarun.machine.cpulist import format_cpulist

    return format_cpulist(cpus)


def _launch(
    config: LaunchConfig,
    plan: Plan | None,
    base: Mapping[str, str],
    port: int,
    binary_path: str | None,
) -> int:
    import shutil

    mem_policies = _mem_policies(config, plan)
    outputs = _output_levels(config)
    temporary = config.log_dir is None
    holds = _temp_dir_holds(config, outputs) if temporary else LOGS
    log_base = config.log_dir if config.log_dir is not None else _temp_log_dir()
    job: _Job | None = None
    code = 2
    try:
        first_dir = _make_attempt_dir(log_base, config, fresh=temporary)
        job = _Job(
            config,
            plan,
            base,
            binary_path,
            mem_policies,
            outputs,
            # The summary names the directory when it stays (it stays after a failure
            # whenever it holds log files).
            log_base if holds != ERRORS else None,
            announce=(lambda: _announce(log_base, holds)) if temporary else None,
            # Killed (SIGKILL), numarun cannot clean up: its watchdog removes a temporary dir
            # that held nothing but error files; log files stay (the start said where).
            remove_if_killed=log_base if holds == ERRORS else None,
        )
        code = job.run(first_dir, port)
        return code
    finally:
        nothing_ran = job is None or not job.started
        if temporary and (holds == ERRORS or nothing_ran or (holds == COPIES and code == 0)):
            shutil.rmtree(log_base, ignore_errors=True)


class _Interrupted(BaseException):
    """A teardown signal arrived between attempts (see :class:`_SignalGuard`)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_interrupted(signum: int, frame: object) -> None:
    raise _Interrupted(signum)


class _SignalGuard:
    """While no supervisor runs (a rendezvous, the exit barrier, the gap between attempts),
    a teardown signal ends the launch at once: its handler raises :class:`_Interrupted` in
    the main thread, wherever it waits (:func:`numarun.launch.elastic.run_blocking` keeps torch's
    blocking calls off that thread). The supervisor's own handling replaces this while workers
    run. A signal the caller ignores stays ignored when it is in ``keep_ignored`` (SIGHUP under
    ``nohup``). Main thread only; elsewhere it does nothing. Restores the previous handlers."""

    def __init__(self, signals: Sequence[int], keep_ignored: Sequence[int] = (signal.SIGHUP,)):
        self._signals = tuple(signals)
        self._keep_ignored = tuple(keep_ignored)
        self._previous: dict[int, object] = {}

    def __enter__(self) -> _SignalGuard:
        import threading

        if threading.current_thread() is not threading.main_thread():
            return self
        for signum in self._signals:
            previous = signal.getsignal(signum)
            if previous is None or (previous == signal.SIG_IGN and signum in self._keep_ignored):
                continue
            self._previous[signum] = previous
            signal.signal(signum, _raise_interrupted)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)  # type: ignore[arg-type]
        self._previous.clear()


class _Attempt:
    """One attempt's end: its directory name (``attempt_<restart count>``, ``.N`` after the
    N-th re-forming of the group at the same count), result, and its line in the report."""

    def __init__(
        self, name: str, directory: str, result: RunResult, lost: list[str], stacks: object
    ) -> None:
        self.name = name
        self.directory = directory
        self.result = result
        self.lost = lost
        self.stacks = stacks  # numarun.stacks.dumps.JobStacks (closed) or None
        self.line = ""


class _Job:
    """The attempts of one launch: one loop (:meth:`run`) over :meth:`run_attempt`.

    torchrun's semantics: a failed attempt (a worker failed, or the supervisor was stopped
    for any reason but this node's rendezvous) is followed by another, with
    TORCHELASTIC_RESTART_COUNT one higher, while ``--max-restarts`` allows; a node joining
    (or leaving) the rendezvous re-forms the group without using a restart; a teardown signal
    ends the job. Every attempt keeps its own directory; the end report lists each attempt's
    root cause.
    """

    def __init__(
        self,
        config: LaunchConfig,
        plan: Plan | None,
        base: Mapping[str, str],
        binary_path: str | None,
        mem_policies: list,
        outputs: tuple[dict[int, int], dict[int, int], set[int]],
        shown_log_dir: str | None,
        *,
        announce: Callable[[], None] | None = None,
        remove_if_killed: str | None = None,
    ) -> None:
        self.config = config
        self.plan = plan
        self.base = base
        self.binary_path = binary_path
        self.mem_policies = mem_policies
        self.outputs = outputs
        self.shown_log_dir = shown_log_dir
        self.announce = announce  # once the first attempt's files are set up
        self.remove_if_killed = remove_if_killed
        self.started = False  # once workers ran: the log directory may hold their output
        self.attempts: list[_Attempt] = []
        self.node: ElasticNode | None = None
        self.waiting_for = "between attempts"  # what a signal interrupts, for its line

    def run(self, first_dir: str, port: int) -> int:
        """Run attempts until one succeeds, fails with no restart left, or a signal or the
        rendezvous ends the job; print the report; return the exit status."""
        config = self.config
        if not config.elastic and not config.max_restarts:
            # One attempt, as numarun has always run it: no guard, nothing imported.
            return self.report(self.run_attempt(None, port, "attempt_0", first_dir, 0))
        try:
            with _SignalGuard(config.teardown_signals):
                return self._loop(first_dir, port)
        except _Interrupted as stop:
            sys.stderr.write(
                f"numarun: stopped on {_signal_text(stop.signum)} while {self.waiting_for}; "
                "no worker was running\n"
            )
            return 128 + stop.signum

    def _loop(self, first_dir: str, port: int) -> int:
        config = self.config
        if config.elastic:
            from numarun.launch.elastic import ElasticNode, NotAdmitted

            self.node = ElasticNode(config)
            self.waiting_for = f"waiting for the {self.node.where}"
            self.node.connect()
        restart_count = 0
        reforms = 0
        directory = first_dir
        group: Round | None = None  # the static rendezvous: config and port
        while True:
            name = f"attempt_{restart_count}" + (f".{reforms}" if reforms else "")
            if self.attempts:
                directory = _next_attempt_dir(first_dir, name, config.nproc_per_node)
            if self.node is not None:
                try:
                    group = self.node.next_round()
                except NotAdmitted as done:
                    sys.stderr.write(str(done) + "\n")
                    return 0
            attempt = self.run_attempt(group, port, name, directory, restart_count)
            result = attempt.result
            change = self.node.change if self.node is not None else None
            ours = change is not None and result.stop_reason == change.reason
            if result.received_signal:
                if self.node is not None:
                    self._announce(f"stopped on {_signal_text(result.received_signal)}")
                return self.report(attempt)
            if ours and change is not None and change.kind == "rejoin":
                attempt.line = f"{name}: stopped: {change.message} (no restart used)"
                sys.stderr.write(f"numarun: {attempt.line}\n")
                reforms += 1
                continue
            if ours and change is not None:
                attempt.line = f"{name}: stopped: {change.message}"
                sys.stderr.write(f"numarun: {change.message}; this node stops\n")
                return 1
            if exit_code_for(result) == 0:
                if self.node is not None:
                    self.waiting_for = f"waiting for the other nodes to finish ({self.node.where})"
                    warning = self.node.finish(succeeded=True)
                    if warning:
                        sys.stderr.write(f"numarun: warning: {warning}\n")
                return self.report(attempt)
            self._describe_failure(attempt)
            if self.node is not None and result.first_failure is None:
                self._announce(f"stopped: {result.stop_reason}")
            if restart_count >= config.max_restarts:
                if self.node is not None:
                    self.node.finish(succeeded=False)
                return self.report(attempt)
            restart_count += 1
            reforms = 0
            sys.stderr.write(
                f"numarun: {attempt.line}; restarting (restart {restart_count} of "
                f"{config.max_restarts})\n"
            )
            if self.node is None and config.master_port is None:
                port = workerenv.free_port()  # the old store's port may still be held

    def _announce(self, message: str) -> None:
        assert self.node is not None
        from numarun.launch.elastic import run_blocking

        node = self.node
        # Best effort, bounded: a store that stopped answering must not hold the exit.
        with contextlib.suppress(TimeoutError):
            run_blocking(lambda: node.announce(message), limit=5.0)

    def run_attempt(
        self, group: Round | None, port: int, name: str, directory: str, restart_count: int
    ) -> _Attempt:
        """Start this node's workers for ``group`` (a round of a torch rendezvous; None: the
        static rendezvous with the store on ``port``) with their files under ``directory``,
        wait for the supervisor's end, return the attempt. Raises :class:`UsageError` (one
        line, nothing started) when the workers' files cannot be set up (out of fds, say)."""
        import gc

        from numarun.process.spec import WorkerSpec
        from numarun.process.supervisor import Supervisor

        config, plan, base = self.config, self.plan, self.base
        duplicates: tuple = (None, None)
        stacks = None
        specs: list[WorkerSpec] = []
        try:
            try:
                duplicates = _line_filters(config, directory)
                threads = _unbound_threads(config, base)
                envs = [
                    {
                        **base,
                        **rank_env(
                            config,
                            local_rank,
                            base=base,
                            error_file=_error_file(directory, local_rank),
                            binding=_bound(plan, local_rank),
                            plan_env=plan.env if plan is not None else (),
                            unbound_threads=threads,
                            master_port=port,
                            group=group,
                            restart_count=restart_count,
                        ),
                    }
                    for local_rank in range(config.nproc_per_node)
                ]
                # This attempt's ranks (under a torch rendezvous they come from the round).
                ranks = [(local_rank, int(env["RANK"])) for local_rank, env in enumerate(envs)]
                stacks = _job_stacks(config, ranks)
                for local_rank, env in enumerate(envs):
                    binding = _bound(plan, local_rank)
                    if stacks is not None:
                        env.update(stacks.worker_env(local_rank))
                    rank = int(env["RANK"])
                    stdout, stderr = _sinks(
                        config, self.outputs, local_rank, directory, base, duplicates, rank=rank
                    )
                    if stacks is not None:
                        stacks.count_output((stdout, stderr))
                    specs.append(
                        WorkerSpec(
                            local_rank=local_rank,
                            rank=rank,
                            env=env,
                            argv=worker_argv(config, self.binary_path, local_rank),
                            cpus=binding.cpus if binding is not None else None,
                            mem=self.mem_policies[local_rank],
                            stdout=stdout,
                            stderr=stderr,
                        )
                    )
            except OSError as error:  # out of fds, an unwritable log file: nothing started
                _close_sinks(specs)
                raise _setup_error(error, config) from None
            if self.announce is not None:
                self.announce()
                self.announce = None
            supervisor = Supervisor(
                specs,
                grace_period=config.grace_period,
                teardown_signals=config.teardown_signals,
                forward_signals=config.forward_signals,
                # torchrun's semantics: the workers get the signal numarun got (Ctrl-C:
                # SIGINT, so `except KeyboardInterrupt` runs); only a nohup'd SIGHUP stays
                # ignored, so a background job (started with SIGINT and SIGQUIT ignored)
                # still stops on kill -INT.
                relay_signal=True,
                keep_ignored=(signal.SIGHUP,),
                on_failure=self._on_failure_callbacks(stacks),
                on_exit=stacks.on_exit if stacks is not None else None,
                remove_if_killed=self.remove_if_killed,
            )
            if self.node is not None:
                self.node.watch(supervisor)
            if stacks is not None:
                stacks.attach(supervisor)  # stacks on demand, at a failure, and --hang-timeout
            # Everything allocated so far lives until exit; freezing it keeps the collector
            # from walking it again, which on a slow machine costs 10+ ms at interpreter exit.
            gc.freeze()
            try:
                result = supervisor.run(on_started=lambda: _on_started(stacks))
            except NumarunError:
                raise  # a worker could not start: one line
            except BaseException:
                self.started = True
                raise
            finally:
                _close_sinks(specs)  # closed already when the run ended; not when start failed
            self.started = True
        finally:
            if stacks is not None:
                stacks.close()  # what the summary needs stays in memory
            for line_filter in duplicates:
                if line_filter is not None:
                    line_filter.close()
        attempt = _Attempt(name, directory, result, _lost_logs(specs), stacks)
        self.attempts.append(attempt)
        return attempt

    def _on_failure_callbacks(self, stacks: object) -> Callable[[WorkerExit], None] | None:
        """What runs at a local worker's failure, before the others are stopped: the notice
        to the other nodes first (it is quick), then the other ranks' stacks (at most ~1 s)."""
        calls = []
        if self.node is not None:
            calls.append(self.node.on_worker_failure)
        if stacks is not None:
            calls.append(stacks.on_failure)  # type: ignore[attr-defined]
        if not calls:
            return None

        def on_failure(ended: WorkerExit) -> None:
            for call in calls:
                call(ended)

        return on_failure

    def _describe_failure(self, attempt: _Attempt) -> None:
        """Set ``attempt.line``: its root cause in one line (rank, exit or signal, error)."""
        from numarun.launch import failures

        reports = _rank_reports(self.config, attempt.result, attempt.directory, self.outputs)
        stopped = attempt.result.stop_reason
        attempt.line = failures.attempt_line(attempt.name, reports, stopped_by=stopped)

    def report(self, last: _Attempt) -> int:
        """The end of the job: the failure summary of the last attempt (naming every earlier
        attempt's root cause) when it failed, else a short note of the earlier attempts' root
        causes, if any; returns the exit status."""
        code = exit_code_for(last.result)
        lost = [line for attempt in self.attempts for line in attempt.lost]
        earlier = [attempt.line for attempt in self.attempts[:-1] if attempt.line]
        if code != 0:
            sys.stdout.flush()
            summary = _summary(
                self.config,
                last.result,
                last.directory,
                self.outputs,
                self.shown_log_dir,
                lost,
                earlier=earlier,
                stacks=last.stacks,
            )
            sys.stderr.write(summary + "\n")
            sys.stderr.flush()
            return code
        if earlier or lost:
            from numarun.launch import failures

            if earlier:
                sys.stderr.write(failures.format_attempts(earlier) + "\n")
            if lost:
                sys.stderr.write(failures.format_lost_logs(lost) + "\n")
        return code


def _next_attempt_dir(first_dir: str, name: str, nproc: int) -> str:
    """``<run dir>/<name>/<local_rank>/`` beside the first attempt's; never reused."""
    directory = os.path.join(os.path.dirname(first_dir), name)
    for local_rank in range(nproc):
        os.makedirs(os.path.join(directory, str(local_rank)))
    return directory


# What numarun's temporary log directory (no --log-dir) holds, which decides what becomes of it.
ERRORS = "errors"  # only the workers' error files: removed at the end (also if numarun is killed)
COPIES = "copies"  # log files whose every line was shown on the console: kept only on failure
LOGS = "logs"  # output that is nowhere else (--redirects, filters, hidden ranks): kept


def _temp_dir_holds(
    config: LaunchConfig, outputs: tuple[dict[int, int], dict[int, int], set[int]]
) -> str:
    """:data:`ERRORS`, :data:`COPIES` or :data:`LOGS` for a run without ``--log-dir``."""
    redirects, tee, shown = outputs
    if config.duplicate_stdout_filters or config.duplicate_stderr_filters:
        return LOGS
    only_in_files = any(
        redirects[rank] & ~tee[rank] or (tee[rank] and rank not in shown) for rank in tee
    )
    if only_in_files:
        return LOGS
    return COPIES if any(tee.values()) else ERRORS


def _close_sinks(specs: Sequence[WorkerSpec]) -> None:
    """Close the log files of sinks the supervisor never ran (closing twice is harmless)."""
    for spec in specs:
        for sink in (spec.stdout, spec.stderr):
            if sink is not None:
                sink.close()


def _setup_error(error: OSError, config: LaunchConfig) -> UsageError:
    """One line for an OSError while the workers' files were set up (nothing started)."""
    import errno

    if error.errno in (errno.EMFILE, errno.ENFILE):
        return UsageError(
            f"out of file descriptors ({error.strerror}) setting up "
            f"{config.nproc_per_node} workers' output: the limit is {_fd_limit()} "
            "(ulimit -n); raise it, or run fewer ranks or with less --tee/--redirects"
        )
    where = f" {error.filename}" if error.filename else ""
    return UsageError(f"cannot set up the workers' output{where}: {error.strerror or error}")


def _fd_limit() -> str:
    try:
        import resource

        return str(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    except (ImportError, OSError, ValueError):
        return "unknown"


def _line_filters(config: LaunchConfig, attempt_dir: str) -> tuple:
    """``--duplicate-std{out,err}-filters``: one shared filtered_std{out,err}.log each."""
    if not (config.duplicate_stdout_filters or config.duplicate_stderr_filters):
        return None, None
    from numarun.process.sinks import LineFilter

    return tuple(
        LineFilter(os.path.join(attempt_dir, name), needles) if needles else None
        for name, needles in (
            ("filtered_stdout.log", config.duplicate_stdout_filters),
            ("filtered_stderr.log", config.duplicate_stderr_filters),
        )
    )


def _job_stacks(config: LaunchConfig, ranks: Sequence[tuple[int, int]]):  # -> JobStacks | None
    """One attempt's stack dumps and ``numarun stacks`` socket (:mod:`numarun.stacks.dumps`)
    for its ``(local rank, global rank)`` pairs.

    Where they cannot be set up (the per-user runtime directory is refused), the job runs
    without them after one warning line; with ``--hang-timeout`` that is an error instead."""
    from numarun.stacks.dumps import JobStacks

    entrypoint = " ".join([config.entrypoint, *config.args])
    try:
        return JobStacks(
            ranks,
            python=config.entrypoint_kind != "binary",
            describe={"run_id": config.run_id, "host": os.uname().nodename,
                      "entrypoint": entrypoint[:200]},
            hang_timeout=config.hang_timeout,
        )  # fmt: skip
    except (NumarunError, OSError) as error:
        if config.hang_timeout is not None:
            raise UsageError(f"--hang-timeout needs numarun's stack dumps: {error}") from None
        print(f"numarun: warning: `numarun stacks` will not reach this job: {error}",
              file=sys.stderr)  # fmt: skip
        return None


def _on_started(stacks) -> None:  # stacks: numarun.stacks.dumps.JobStacks | None
    if stacks is not None:
        stacks.listen()
    _prefetch_failure_report()


def _prefetch_failure_report(delay: float = 0.25) -> None:
    """Import the failure summary's modules in the background once the workers are under way.

    Importing :mod:`numarun.launch.failures` (json, traceback, ...) costs 10-20 ms, which would
    otherwise sit between a worker's failure and the launcher's exit. The delay keeps the
    import off the CPUs while the workers start; a failure before it just imports in line.
    """
    import threading

    timer = threading.Timer(delay, _import_failures)
    timer.daemon = True
    timer.start()


def _import_failures() -> None:
    # The stacks taken at a failure are parsed with numarun.stacks.parse.
    import numarun.launch.failures
    import numarun.stacks.parse  # noqa: F401


def _temp_log_dir() -> str:
    """A fresh private directory ``$TMPDIR/numarun_XXXXXXXXXXXX`` (mode 0700).

    Made by hand rather than with :func:`tempfile.mkdtemp`: :mod:`tempfile` and
    :mod:`numarun.process.sinks` cost a few milliseconds to import on every launch's start-up path.
    ``$TMPDIR`` owned by another user (not root) is refused: its owner could swap our
    directory for a symbolic link between the checks and the writes.
    """
    base = os.environ.get("TMPDIR") or "/tmp"
    try:
        owner = os.stat(base).st_uid
    except OSError as error:
        raise UsageError(
            f"cannot create a temporary log directory in {base}: {error.strerror}; give --log-dir"
        ) from None
    if owner not in (0, os.geteuid()):
        raise UsageError(
            f"TMPDIR {base!r} belongs to another user (uid {owner}); numarun writes only into "
            "directories of yours or root's: set TMPDIR or give --log-dir"
        )
    for _ in range(100):
        path = os.path.join(base, f"numarun_{os.urandom(6).hex()}")
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        except OSError as error:
            raise UsageError(
                f"cannot create a temporary log directory in {base}: {error.strerror}; "
                "give --log-dir"
            ) from None
        return path
    raise UsageError(f"cannot create a temporary log directory in {base}; give --log-dir")


def _announce(log_base: str, holds: str) -> None:
    """One line on stderr where the temporary directory holds log files, and whether it stays."""
    if holds == LOGS:
        print(f"numarun: worker logs go to {log_base}", file=sys.stderr)
    elif holds == COPIES:
        print(
            f"numarun: worker logs go to {log_base} (removed if the run succeeds; "
            "--log-dir keeps them)",
            file=sys.stderr,
        )


def _make_attempt_dir(log_base: str, config: LaunchConfig, *, fresh: bool) -> str:
    """``log_base/<run_id>/attempt_0/<local_rank>/`` for every rank; returns the attempt dir.

    A ``fresh`` base (our own new temporary directory) cannot hold stale files, so the
    directories are made directly; otherwise :func:`numarun.launch.logdir.make_log_dirs` claims
    them, taking ``<run_id>_<random>/`` when ``<run_id>/`` already exists (it never deletes), so
    an old ``error.json`` of the same run id is never read as ours.
    """
    if fresh:
        attempt_dir = os.path.join(log_base, config.run_id, "attempt_0")
        for local_rank in range(config.nproc_per_node):
            os.makedirs(os.path.join(attempt_dir, str(local_rank)))
        return attempt_dir
    from numarun.launch.logdir import make_log_dirs

    return str(make_log_dirs(log_base, config.run_id, config.nproc_per_node))


def _mem_policies(config: LaunchConfig, plan: Plan | None) -> list:
    """Each rank's memory policy, proven applicable here; CPUs checked against our affinity."""
    if plan is None or not plan.bound:
        return [None] * config.nproc_per_node
    from numarun.placement import binding

    for rank in plan.ranks:
        binding.check_cpus(rank.cpus, rank=rank.local_rank)
    policies = [binding.mem_policy_for(config.mem_binding, rank.mems) for rank in plan.ranks]
    applied, warnings = binding.check_mem_policy(policies, allow_fallback=config.binding_fallback)
    for warning in warnings:
        print(f"numarun: warning: {warning}", file=sys.stderr)
    return applied


def _output_levels(config: LaunchConfig) -> tuple[dict[int, int], dict[int, int], set[int]]:
    """(redirects, tee, shown local ranks); the logs module is imported only when needed."""
    n = config.nproc_per_node
    if config.redirects == "0" and config.tee == "0" and not config.local_ranks_filter:
        return dict.fromkeys(range(n), 0), dict.fromkeys(range(n), 0), set(range(n))
    from numarun.launch import output

    return (
        output.parse_std_spec(config.redirects, n, flag="--redirects"),
        output.parse_std_spec(config.tee, n, flag="--tee"),
        output.parse_ranks_filter(config.local_ranks_filter, n),
    )


def _sinks(
    config: LaunchConfig,
    outputs: tuple[dict[int, int], dict[int, int], set[int]],
    local_rank: int,
    attempt_dir: str,
    base: Mapping[str, str],
    duplicates: tuple = (None, None),
    *,
    rank: int | None = None,
) -> tuple[object, object]:
    """Where ``local_rank``'s output goes; ``rank`` is its global rank (default: static)."""
    redirects, tee, shown = outputs
    if not redirects[local_rank] and not tee[local_rank] and local_rank in shown:
        return None, None  # the worker writes straight to our stdout/stderr
    from pathlib import Path

    from numarun.launch import output

    if rank is None:
        rank = config.global_rank(local_rank)
    prefix = output.make_prefix(rank, local_rank, role_name=config.role, environ=base)
    return output.sinks_for(
        local_rank,
        rank,
        redirects[local_rank],
        tee[local_rank],
        Path(attempt_dir) / str(local_rank),
        local_rank in shown,
        prefix=prefix,
        duplicates=duplicates,
    )


def _lost_logs(specs: Sequence[WorkerSpec]) -> list[str]:
    """One line per log file that lost bytes for good (a full disk): rank, file, how many."""
    if not any(spec.stdout or spec.stderr for spec in specs):
        return []
    from numarun.process import sinks

    lines = []
    for spec in specs:
        for sink in (spec.stdout, spec.stderr):
            loss = sinks.log_loss(sink)
            if loss is not None:
                path, count, reason = loss
                lines.append(
                    f"rank {spec.rank} (local_rank {spec.local_rank}) {path.name}: "
                    f"{count:,} bytes lost ({reason}): {path}"
                )
    return lines


def _rank_reports(
    config: LaunchConfig,
    result: RunResult,
    attempt_dir: str,
    outputs: tuple[dict[int, int], dict[int, int], set[int]],
) -> list:
    """Each worker's end with its error file and (redirected) log directory."""
    from pathlib import Path

    from numarun.launch import failures

    redirects, tee, _ = outputs
    reports = []
    for worker in result.workers:
        to_files = redirects[worker.local_rank] or tee[worker.local_rank]
        reports.append(
            failures.rank_report(
                worker,
                error_file=_error_file(attempt_dir, worker.local_rank),
                log_dir=Path(attempt_dir) / str(worker.local_rank) if to_files else None,
            )
        )
    return reports


def _summary(
    config: LaunchConfig,
    result: RunResult,
    attempt_dir: str,
    outputs: tuple[dict[int, int], dict[int, int], set[int]],
    log_dir: str | None,
    lost_logs: Sequence[str] = (),
    *,
    earlier: Sequence[str] = (),
    stacks: object = None,
) -> str:
    from numarun.launch import failures

    reports = _rank_reports(config, result, attempt_dir, outputs)
    entrypoint = " ".join([config.entrypoint, *config.args])
    if len(entrypoint) > 200:
        entrypoint = entrypoint[:197] + "..."
    return failures.format_summary(
        reports,
        entrypoint=entrypoint,
        host=os.uname().nodename,
        log_dir=log_dir,
        lost_logs=lost_logs,
        stopped_by=_signal_text(result.received_signal) or result.stop_reason,
        earlier_attempts=earlier,
        **(stacks.summary_fields(attempt_dir if log_dir else None) if stacks is not None else {}),  # type: ignore[attr-defined]
    )


def _signal_text(signum: int | None) -> str | None:
    if signum is None:
        return None
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"

"""What each worker of a launch gets: its argv, environment, CPUs, memory policy and output.

- :func:`worker_argv`: the argv exec'd (no shell): Python entry points through
  :data:`SCRIPT_BOOTSTRAP` (:mod:`numarun.worker.bootstrap`), binaries as they are, with
  torchrun's ``${local_rank}`` macro substituted (:func:`substitute_local_rank`).
- :func:`rank_setups`: what every local rank gets in one attempt (:class:`RankSetup`: argv,
  whole environment, CPUs, memory policy), computed once in this one place, which the cold
  start, the standbys (``--preload``) and the dry run all read.
- :func:`rank_env`: torchrun's variables for one local rank, from the static rendezvous or from
  a round of a torch one; :func:`virtual_device` for ``--virtual-local-rank``.
- :func:`rank_binding`, :func:`unbound_threads`, :func:`mem_policies`: a rank's CPUs in the
  plan, the ``OMP_NUM_THREADS`` of an unbound rank, each rank's memory policy proven applicable.
- :func:`output_levels`, :func:`worker_sinks`, :func:`line_filters`, :func:`close_sinks`: where
  each rank's stdout and stderr go; :func:`setup_error`: one line when that cannot be set up.
- :class:`MainCode`: the entry script compiled once by the launcher for all its workers.

Starts nothing. The output modules (:mod:`numarun.launch.output`, :mod:`numarun.process.sinks`)
are imported only for output that is redirected, tee'd or filtered, the binding module only for
a bound plan.
"""

from __future__ import annotations

import os
import stat
import sys

from numarun.errors import UsageError
from numarun.machine.model import Value
from numarun.placement import workerenv

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from numarun.cmdline.config import LaunchConfig
    from numarun.files.safedir import Directory
    from numarun.placement.plan import Plan, RankBinding
    from numarun.process.spec import WorkerSpec
    from numarun.rendezvous.round import Round


# -c, not -m numarun.worker.bootstrap: -m makes every worker import runpy first (see
# numarun.worker.bootstrap).
SCRIPT_BOOTSTRAP = "from numarun.worker.bootstrap import main; main()"


def worker_argv(
    config: LaunchConfig, binary_path: str | None = None, local_rank: int | None = None
) -> list[str]:
    """The argv exec'd for a worker (no shell anywhere).

    Scripts: ``PYTHON -u -c BOOTSTRAP -- SCRIPT ARGS``; modules: ``PYTHON -u -c BOOTSTRAP -m
    MODULE ARGS`` (BOOTSTRAP: :data:`SCRIPT_BOOTSTRAP`, which runs :mod:`numarun.worker.bootstrap`);
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
_LOCAL_RANK_MACRO = r"\$(?:\$|\{local_rank\}|local_rank(?![A-Za-z0-9_]))"


def substitute_local_rank(args: Sequence[str], local_rank: int) -> list[str]:
    """torchrun's worker-argument macro: ``${local_rank}`` and ``$local_rank`` become the
    local rank. Everything else stays byte for byte, ``$$`` too (torchrun's
    ``string.Template`` turns it into ``$``)."""
    if not any("$" in arg for arg in args):
        return list(args)  # without importing re, on every launch's start-up path
    import re

    value = str(local_rank)

    def expand(match: re.Match[str]) -> str:
        return match.group(0) if match.group(0) == "$$" else value

    return [re.sub(_LOCAL_RANK_MACRO, expand, arg) if "$" in arg else arg for arg in args]


ROUND_VARIABLES = (
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
"""The worker variables of :func:`rank_env` that a torch rendezvous decides for each round."""


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


class RankSetup(Value):
    """What one local rank gets in an attempt: its ``argv`` (exec'd as is), its whole ``env``
    (the launcher's and torchrun's variables), its ``cpus`` (None: unbound) and memory policy
    ``mem``, its global ``rank``. Output sinks are not here: a cold worker gets its files, a
    standby sinks that wait for them, the dry run none."""

    _fields = ("local_rank", "rank", "argv", "env", "cpus", "mem")
    __slots__ = _fields
    local_rank: int
    rank: int
    argv: list[str]
    env: dict[str, str]
    cpus: Sequence[int] | None
    mem: object

    def __init__(self, local_rank: int, rank: int, argv: list[str], env: dict[str, str],
                 cpus: Sequence[int] | None, mem: object) -> None:  # fmt: skip
        for name, value in zip(self._fields, (local_rank, rank, argv, env, cpus, mem),
                               strict=True):  # fmt: skip
            object.__setattr__(self, name, value)


def rank_setups(
    config: LaunchConfig,
    plan: Plan | None,
    base: Mapping[str, str],
    binary_path: str | None,
    *,
    attempt_dir: str | None,
    port: int,
    group: Round | None = None,
    restart_count: int = 0,
    mem_policies: Sequence[object] | None = None,
) -> list[RankSetup]:
    """Every local rank's :class:`RankSetup` for one attempt: ``base`` and :func:`rank_env`
    (its error file in ``attempt_dir``, none when None: a standby learns it at the hand-over;
    its CPUs in ``plan``; ranks from ``group`` or the static rendezvous on ``port``), the argv of
    :func:`worker_argv`, the memory policy of ``mem_policies`` (None: none)."""
    from numarun.files.logdir import error_file

    threads = unbound_omp_threads(config, base)
    plan_env = plan.env if plan is not None else ()
    setups = []
    for local_rank in range(config.nproc_per_node):
        binding = rank_binding(plan, local_rank)
        env = {
            **base,
            **rank_env(
                config,
                local_rank,
                base=base,
                error_file=error_file(attempt_dir, local_rank) if attempt_dir else "",
                binding=binding,
                plan_env=plan_env,
                unbound_threads=threads,
                master_port=port,
                group=group,
                restart_count=restart_count,
            ),
        }
        setups.append(RankSetup(
            local_rank, int(env["RANK"]), worker_argv(config, binary_path, local_rank), env,
            binding.cpus if binding is not None else None,
            mem_policies[local_rank] if mem_policies is not None else None,
        ))  # fmt: skip
    return setups


def rank_binding(plan: Plan | None, local_rank: int) -> RankBinding | None:
    """``local_rank``'s CPUs and memory nodes in ``plan``; None when the plan binds nothing."""
    if plan is None or not plan.bound:
        return None
    return plan.ranks[local_rank]


def unbound_omp_threads(config: LaunchConfig, base: Mapping[str, str]) -> int:
    """``OMP_NUM_THREADS`` for a rank without CPUs of its own (see :func:`rank_env`)."""
    if "OMP_NUM_THREADS" in base:
        return 1  # not used: the user's value is kept
    return workerenv.unbound_threads(config.nproc_per_node)


def mem_policies(config: LaunchConfig, plan: Plan | None) -> list:
    """Each rank's memory policy, proven applicable here; CPUs checked against our affinity."""
    if plan is None or not plan.bound:
        return [None] * config.nproc_per_node
    from numarun.placement import binding

    for rank in plan.ranks:
        binding.check_cpus(rank.cpus, rank=rank.local_rank)
    policies = [binding.mem_policy_for(config.mem_binding, rank.mems) for rank in plan.ranks]
    applied, warnings = binding.check_mem_policy(policies, allow_fallback=config.binding_fallback)
    for warning in warnings if not config.quiet else ():
        print(f"numarun: warning: {warning}", file=sys.stderr)
    return applied


def output_levels(config: LaunchConfig) -> tuple[dict[int, int], dict[int, int], set[int]]:
    """(redirects, tee, shown local ranks); the output module is imported only when needed."""
    n = config.nproc_per_node
    if config.redirects == "0" and config.tee == "0" and not config.local_ranks_filter:
        return dict.fromkeys(range(n), 0), dict.fromkeys(range(n), 0), set(range(n))
    from numarun.cmdline import stdspec

    return (
        stdspec.parse_std_spec(config.redirects, n, flag="--redirects"),
        stdspec.parse_std_spec(config.tee, n, flag="--tee"),
        stdspec.parse_ranks_filter(config.local_ranks_filter, n),
    )


def worker_sinks(
    config: LaunchConfig,
    outputs: tuple[dict[int, int], dict[int, int], set[int]],
    local_rank: int,
    attempt_dir: Directory,
    base: Mapping[str, str],
    duplicates: tuple = (None, None),
    *,
    rank: int | None = None,
) -> tuple[object, object]:
    """Where ``local_rank``'s output goes; ``rank`` is its global rank (default: static). Its
    files are made in ``attempt_dir/<local_rank>/`` (made here when missing), relative to the
    descriptors."""
    redirects, tee, shown = outputs
    if not has_log_files(outputs, local_rank):
        return None, None  # the worker writes straight to our stdout/stderr
    from numarun.launch import output

    if rank is None:
        rank = config.global_rank(local_rank)
    prefix = output.make_prefix(
        rank, local_rank, role_name=config.role,
        template=config.log_line_prefix_template, environ=base,
    )  # fmt: skip
    try:
        rank_dir = attempt_dir.make(str(local_rank))
    except FileExistsError:
        rank_dir = attempt_dir.open(str(local_rank))
    with rank_dir:
        return output.sinks_for(
            local_rank,
            rank,
            redirects[local_rank],
            tee[local_rank],
            rank_dir,
            local_rank in shown,
            prefix=prefix,
            duplicates=duplicates,
        )


def has_log_files(
    outputs: tuple[dict[int, int], dict[int, int], set[int]], local_rank: int
) -> bool:
    """Whether ``local_rank``'s output goes to files (:func:`worker_sinks` makes its directory
    then), rather than straight to the launcher's stdout/stderr."""
    redirects, tee, shown = outputs
    return bool(redirects[local_rank] or tee[local_rank] or local_rank not in shown)


def line_filters(config: LaunchConfig, attempt_dir: Directory) -> tuple:
    """``--duplicate-std{out,err}-filters``: one shared filtered_std{out,err}.log each, made in
    ``attempt_dir`` relative to its descriptor."""
    if not (config.duplicate_stdout_filters or config.duplicate_stderr_filters):
        return None, None
    from numarun.process.sinks import LineFilter

    made: list[LineFilter | None] = []
    try:
        for name, needles in (
            ("filtered_stdout.log", config.duplicate_stdout_filters),
            ("filtered_stderr.log", config.duplicate_stderr_filters),
        ):
            made.append(
                LineFilter(
                    os.path.join(attempt_dir.path, name), needles, fd=attempt_dir.create(name)
                )
                if needles
                else None
            )
    except BaseException:
        for line_filter in made:
            if line_filter is not None:
                line_filter.close()
        raise
    return made[0], made[1]


def close_sinks(specs: Sequence[WorkerSpec]) -> None:
    """Close the log files of sinks the supervisor never ran (closing twice is harmless)."""
    for spec in specs:
        for sink in (spec.stdout, spec.stderr):
            if sink is not None:
                sink.close()


def setup_error(error: OSError, config: LaunchConfig) -> UsageError:
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


MAIN_CODE_FD_ENV = "NUMARUN_MAIN_CODE_FD"  # numarun.worker.bootstrap's, not imported here
_MAIN_CODE_SOURCE_LIMIT = 16 * 1024 * 1024  # bytes: a larger script is compiled by each worker


class MainCode:
    """The entry script compiled once, here, for every worker of an attempt: without it each
    worker's bootstrap compiles the script itself, and its first ``compile()`` of the process
    also builds the ``ast`` module's ~120 types, a quarter of a bare interpreter's start, paid
    by every rank while all of them start at once.

    :meth:`open` makes an empty anonymous file (``memfd_create``) that each worker inherits
    (:meth:`worker_env`: its fd in ``pass_fds``, its number in ``NUMARUN_MAIN_CODE_FD``). As the
    watchdog forks them (the supervisor's ``on_forked``), :meth:`write` compiles the script as
    their bootstrap would (its absolute path as the file name, ``dont_inherit``, the
    optimization level of the workers' ``PYTHONOPTIMIZE``), well before their interpreters
    have started, and writes the code object (marshal)
    behind the header :func:`numarun.worker.bootstrap.main_code_key` describes it by, the
    header last. A worker's bootstrap uses it only when it finds it whole and made for what it
    would compile itself (the same bytecode, optimization level, limits, and the source it has
    just read from the script), and else compiles the script itself: a worker that gets there
    first, a script changed meanwhile, a compile that warns (the workers say it, as ``python``
    would), a failed write. Each worker closes its fd before the script runs.

    Only for a script run by this interpreter (``PYTHON_EXEC`` unset or the same), without
    ``--preload`` (a standby's fds are set at its birth); never raises: without it the workers
    compile as before."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @classmethod
    def open(cls, config: LaunchConfig) -> MainCode | None:
        """A new, empty one for ``config``'s workers; None where it does not apply."""
        if (
            config.entrypoint_kind != "script"
            or config.preload
            or config.python_exec != sys.executable
            or not hasattr(os, "memfd_create")
        ):
            return None
        try:
            return cls(os.memfd_create("numarun-main-code", os.MFD_CLOEXEC))
        except OSError:
            return None

    def worker_env(self) -> dict[str, str]:
        return {MAIN_CODE_FD_ENV: str(self.fd)}

    def write(self, script: str, env: Mapping[str, str]) -> bool:
        """Compile ``script`` for workers that run with ``env`` and write it; whether it was
        written. Never raises (the workers then compile the script themselves)."""
        try:
            return self._write(script, env)
        except Exception:
            return False

    def _write(self, script: str, env: Mapping[str, str]) -> bool:
        import marshal
        import warnings

        from numarun.worker.bootstrap import main_code_key

        level = _optimize_level(env.get("PYTHONOPTIMIZE", ""))
        if level is None or self.fd < 0:
            return False
        # Non-blocking, and a regular file only: a path swapped for a FIFO meanwhile must not
        # hold the launcher (the workers read it as python would).
        with open(os.open(script, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as file:
            info = os.fstat(file.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_size > _MAIN_CODE_SOURCE_LIMIT:
                return False
            source = file.read(_MAIN_CODE_SOURCE_LIMIT + 1)
        if len(source) > _MAIN_CODE_SOURCE_LIMIT:
            return False
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            code = compile(source, os.path.abspath(script), "exec", dont_inherit=True,
                           optimize=level)  # fmt: skip
        if said:
            return False  # SyntaxWarning and the like: each worker's python says them
        body = marshal.dumps(code)
        header = main_code_key(source, level) + len(body).to_bytes(8, "little")
        if os.pwrite(self.fd, body, len(header)) != len(body):
            return False
        return os.pwrite(self.fd, header, 0) == len(header)

    def close(self) -> None:
        """Close the launcher's fd (the workers have their own); idempotent."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


def _optimize_level(text: str) -> int | None:
    """The ``-O`` level ``PYTHONOPTIMIZE=text`` gives a worker (``sys.flags.optimize``): 0 when
    empty, the number when it is one, else 1; None for a level ``compile()`` has no name for."""
    if not text:
        return 0
    try:
        level = int(text)
    except ValueError:
        return 1
    return level if level in (0, 1, 2) else None


"""One launch's log directories, from the first attempt's to the end: :class:`RunDirs`.

The layout, the names and the rules for a temporary directory are :mod:`numarun.files.logdir`'s
(its docstring states them); this room applies them once per launch: the base reached (a fresh
temporary directory, or ``--log-dir`` under :mod:`numarun.files.safedir`'s rules), the run
directory claimed with ``attempt_0/`` (:func:`~numarun.files.logdir.make_run`), renamed after a
torch rendezvous's first round over several nodes, each later attempt's directory
(:func:`~numarun.files.logdir.make_attempt`), what the start line and the summary say of them,
and at the end whether a temporary directory goes.
"""

from __future__ import annotations

import os

from numarun.files import logdir

TYPE_CHECKING = False
if TYPE_CHECKING:
    from numarun.cmdline.config import LaunchConfig
    from numarun.files.safedir import Directory


class RunDirs:
    """The log directories of one launch. :meth:`open` once (the run directory and the first
    attempt's, raising :class:`numarun.errors.UsageError` in one line when they cannot be
    made), then :meth:`after_first_round` under a torch rendezvous over several nodes,
    :meth:`next_attempt` per later attempt, and :meth:`close` at the end, whatever happened."""

    def __init__(
        self, config: LaunchConfig, outputs: tuple[dict[int, int], dict[int, int], set[int]]
    ) -> None:
        self.config = config
        self.temporary = config.log_dir is None
        filtered = bool(config.duplicate_stdout_filters or config.duplicate_stderr_filters)
        self.holds = (
            logdir.temp_dir_holds(outputs, filtered=filtered) if self.temporary else logdir.LOGS
        )
        # Several nodes may share --log-dir: each names its run directory by node rank and
        # host (under a torch rendezvous the rank comes with the first round: renamed then).
        nodes = config.max_nodes if config.elastic else config.nnodes
        self.host = logdir.host_label() if nodes > 1 and not self.temporary else None
        self.base: Directory | None = None
        self.run: Directory | None = None
        self.first: Directory | None = None  # attempt_0, handed to the first attempt

    @property
    def renamed_after_round(self) -> bool:
        """Whether the run directory takes its name from the first round (:meth:`open`)."""
        return self.host is not None and self.config.elastic

    def open(self) -> None:
        """Reach the base (refused, one line, nothing made, when another user could redirect
        the writes), claim the run directory and make ``attempt_0/`` in it."""
        config = self.config
        self.base = (
            logdir.temp_log_dir() if self.temporary else logdir.open_log_dir(config.log_dir or "")
        )
        name = None
        if self.host is not None:
            name = (
                f"{config.run_id}_{self.host}_joining_{os.urandom(3).hex()}"
                if config.elastic
                else logdir.node_run_name(config.run_id, config.node_rank, self.host)
            )
        self.run, self.first = logdir.make_run(
            self.base, config.run_id, config.nproc_per_node, fresh=self.temporary,
            announce=not config.quiet, name=name, rank_dirs=False,
        )  # fmt: skip
        if not self.renamed_after_round:
            self.base.close()

    def after_first_round(self, group_rank: int) -> None:
        """Under a torch rendezvous over several nodes: the run directory takes its name from
        this node's rank in the first round, before any worker starts."""
        assert self.base is not None and self.run is not None and self.first is not None
        logdir.name_after_round(self.base, self.run, self.first, self.config.run_id,
                                group_rank, str(self.host))  # fmt: skip
        self.base.close()

    def next_attempt(self, name: str) -> Directory:
        """``<run dir>/<name>/``, open (:func:`numarun.files.logdir.make_attempt`)."""
        assert self.run is not None
        return logdir.make_attempt(self.run, name, self.config.nproc_per_node, rank_dirs=False)

    def logs_note(self) -> str:
        """Where the logs are, for the start line."""
        assert self.base is not None and self.run is not None
        if self.temporary:
            return logdir.log_dir_note(self.base.path, self.holds)
        if self.host is not None:
            return f"logs in {logdir.node_logs_note(self.run.path, self.config.run_id)}"
        return logdir.log_dir_note(self.run.path, self.holds)

    def shown_log_dir(self) -> str | None:
        """What the summary names when the directory stays (it stays after a failure whenever
        it holds log files); over several nodes, this node's and the rule."""
        assert self.base is not None and self.run is not None
        if self.host is not None:
            return logdir.node_logs_note(self.run.path, self.config.run_id)
        return self.base.path if self.holds != logdir.ERRORS else None

    def remove_if_killed(self) -> str | None:
        """Killed (SIGKILL), numarun cannot clean up: its watchdog removes a temporary
        directory that held nothing but error files; log files stay (the start said where)."""
        assert self.base is not None
        return self.base.path if self.holds == logdir.ERRORS else None

    def close(self, code: int, *, workers_ran: bool) -> None:
        """Close every descriptor; remove a temporary directory unless it keeps what is
        nowhere else: log files after a failure, or output shown nowhere."""
        for directory in (self.base, self.run):
            if directory is not None:
                directory.close()
        if self.base is None or not self.temporary:
            return
        holds = self.holds
        if holds == logdir.ERRORS or not workers_ran or (holds == logdir.COPIES and code == 0):
            from numarun.files.safedir import remove_tree

            remove_tree(self.base.path)

"""The ``numarun`` command: a torchrun-compatible launch of scripts, modules and binaries.

    argv -> cmdline.config.LaunchConfig -> machine + placement (the plan) -> attempts.Job's
         attempts -> process.Supervisor per attempt -> failure summary and exit status

The job and its attempts (restarts, re-formed groups, ``--preload``'s standbys), what each rank
gets (argv, environment, binding, output), the start line and the end's summary. Each room and
what it holds: DESIGN.md, the ``launch/`` table (the one list kept). The static path never
imports torch: ``numarun.rendezvous`` loads only for a torch backend.

May import: ``numarun.jobwide``, ``numarun.rendezvous``, ``numarun.files``, ``numarun.cmdline``,
``numarun.stacks``, ``numarun.process``, ``numarun.placement``, ``numarun.machine``,
``numarun.worker``, ``numarun.errors`` and this package. Not ``numarun.spawning``.
"""

"""The ``numarun`` command: a torchrun-compatible launch of scripts, modules and binaries.

    argv -> config.LaunchConfig -> machine + placement (the plan) -> attempts.Job's attempts
         -> process.Supervisor per attempt -> failure summary and exit status

Each room and what it holds: DESIGN.md, the ``launch/`` table (the one list kept). The static
path never imports torch: ``torchrdzv`` and its rooms load only for a torch backend.

May import: ``numarun.stacks``, ``numarun.process``, ``numarun.placement``, ``numarun.machine``,
``numarun.errors`` and this package. Not ``numarun.spawning``.
"""

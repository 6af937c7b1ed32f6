"""The command line and the configuration: from argv and the environment to a checked
:class:`numarun.cmdline.config.LaunchConfig`, with nothing started.

- ``options``: torchrun's option table, the parser, ``PET_*`` defaults, argv's split, flag
  values, "did you mean".
- ``config``: ``LaunchConfig``, ``parse_args(argv)``.
- ``nodes``: node facts (``--nnodes``, node rank, master address and port, the rendezvous
  backend, ``--rdzv-conf``).
- ``clusterenv``: node facts from Slurm / Open MPI environments.
- ``stdspec``: ``--redirects`` / ``--tee`` / ``--local-ranks-filter`` values read and checked.

May import: ``numarun.stacks`` (what the hang watch's sampling can judge),
``numarun.process`` (the bound on a worker count), ``numarun.placement`` (the binding modes),
``numarun.machine``, the base and this package.
"""

"""The ``numarun`` command: a torchrun-compatible launch of scripts, modules and binaries.

    argv -> config.LaunchConfig -> machine + placement (the plan) -> job.Job's attempts
         -> process.Supervisor per attempt -> failure report and exit status

- ``config``: torchrun-compatible argv -> ``LaunchConfig`` (``parse_args``; the value checks:
  workers per node, binding, output specs, signals, grace period); starts nothing.
- ``options``: the command line itself: the option table in both spellings, ``PET_*``
  defaults, the argparse parser, argv split at the entry point, flag values.
- ``nodes``: the node facts (flags, or Slurm / Open MPI), the store's endpoint, the rendezvous
  backend and ``--rdzv-conf``, checked without importing torch.
- ``launcher``: ``main`` and ``run``: the entry point checked, the plan made, the dry run, the
  log directory set up and the job run.
- ``workers``: what each worker gets: its argv, torchrun's environment, CPUs, memory policy,
  output sinks.
- ``job``: one launch's attempts (restarts, re-forming for a torch rendezvous, the signal guard
  between attempts), each started and watched by a supervisor.
- ``report``: the exit status of a run and the glue to the failure summary.
- ``logdir``: the log directory: torchrun's layout, numarun's temporary one and what becomes of
  it, attempt directories.
- ``output``: ``--redirects``/``--tee``/``--local-ranks-filter`` and the sinks each rank gets;
  imported only for output that is redirected, tee'd or filtered.
- ``rendezvous``: node facts from Slurm / Open MPI; what a round of a torch rendezvous gives.
- ``elastic``: this node in a torch rendezvous (c10d, etcd) through torch's own handler;
  imported only for a torch backend, so the static path never imports torch.
- ``storewatch``: the one thread that makes every store call while workers run (failure
  notices, whole-job stacks, the job-wide hang verdict), reporting through a pipe to the loop.
- ``torchcompat``: torch's names the rendezvous path uses that torch does not promise, each
  checked before use.
- ``errorfile``: torchrun's error-file JSON, read and written (a failing worker's bootstrap
  imports only this).
- ``failures``: the end-of-run summary; off the start-up path (imported in the background once
  the workers are under way).
- ``warm``: ``--preload``: the standbys kept for the next attempt, taken or discarded, and the
  hand-over; ``preload``: inside a standby (the imports, the wait, the hand-over).
- ``bootstrap``: what runs first inside a Python worker (stack dumps armed, the error file
  written for a worker without ``@record``), then the user's script or module.

May import: ``numarun.stacks``, ``numarun.process``, ``numarun.placement``, ``numarun.machine``,
``numarun.errors`` and this package. Not ``numarun.spawning``.
"""

"""The ``numarun`` command: a torchrun-compatible launch of scripts, modules and binaries.

    argv -> config.LaunchConfig -> machine + placement (the plan) -> the job's attempts
         -> process.Supervisor per attempt -> failure report and exit status

- ``config``: torchrun-compatible argv -> ``LaunchConfig`` (flags, ``PET_*`` defaults, node
  facts, the rendezvous backend); starts nothing.
- ``launcher``: runs a ``LaunchConfig``: each rank's argv and environment, log sinks, one job
  of attempts (restarts, re-forming), exit codes.
- ``rendezvous``: node facts from Slurm / Open MPI; what a round of a torch rendezvous gives.
- ``elastic``: this node in a torch rendezvous (c10d, etcd) through torch's own handler;
  imported only for a torch backend, so the static path never imports torch.
- ``failures``: torchrun's error-file JSON and the end-of-run summary.
- ``bootstrap``: what runs first inside a Python worker (stack dumps armed, the error file
  written for a worker without ``@record``), then the user's script or module.

May import: ``numarun.stacks``, ``numarun.process``, ``numarun.placement``, ``numarun.machine``,
``numarun.errors`` and this package. Not ``numarun.spawning``.
"""

"""``numarun check``: a launch whose workers prove their binding and measure what it is worth.

The check is a real launch: :mod:`numarun.check.command` turns the binding flags into a
:class:`numarun.cmdline.config.LaunchConfig` whose entry point is the built-in probe, plans with the
launcher's own :func:`numarun.launch.launcher.make_plan`, and runs the job through
:func:`numarun.launch.launcher.run` (supervisor, birth-time binding, everything a job gets).

- ``probe``: what runs inside each rank: its CPUs read by its first statement, the memory
  policy in force, where its pages land, the GPU it sees, then the bandwidth phases in step with
  the other ranks; its result is a JSON file. Imports ``os`` before reading its CPUs, the rest
  afterwards.
- ``memory``: inside a rank: anonymous buffers placed with ``mbind(2)``, page locations from
  ``move_pages(2)`` (or ``/proc/self/numa_maps``), copy bandwidth with one thread per core.
- ``gpu``: inside a rank: the GPU it sees (NVML, or torch when CUDA is there) and pinned
  host-to-device / device-to-host bandwidth from a host buffer on a chosen node (torch + CUDA
  only; torch is imported only when the GPU part is asked for and installed).
- ``command``: the launcher's side: the config, the plan, the probe's instructions, the run,
  the results collected.
- ``verdict``: pure: each rank's verdict, the JSON document (versioned schema) and the text
  table whose last line is the verdict.

May import: ``numarun.launch``, ``numarun.stacks``, ``numarun.process``,
``numarun.placement``, ``numarun.machine`` and the base. Nothing imports this wing but
``numarun.cli``.
"""

"""Where each rank goes: its CPUs, its memory policy, and the facts its environment is built from.

- ``plan``: pure planning. ``make_plan(topology, nprocs, mode)`` gives one ``RankBinding`` per
  rank (modes ``node``, ``socket``, ``exclusive``, ``core-complex`` with PyTorch's semantics,
  ``cpu``, explicit lists); ``format_plan_table`` and ``plan_to_json`` show it to a person and
  a program.
- ``explain``: why each rank got its CPUs, in words (``numarun plan --explain``).
- ``defaults``: what ``numarun plan`` and ``numarun check`` choose for the machine when not told.
- ``plansvg``: the plan drawn on the machine's picture, ranks coloured (``numarun plan --svg``).
- ``binding``: the only code in numarun that calls ``sched_setaffinity``, ``set_mempolicy`` and
  ``prctl``; applied in a freshly forked child, before it runs a single instruction of its own.
- ``workerenv``: the facts a worker's environment is built from (a free port, the allowed
  physical cores, ``OMP_NUM_THREADS`` for an unbound rank).

May import: ``numarun.machine``, ``numarun.errors`` and this package.
"""

"""``numarun.spawn``: Python callables as workers, a drop-in for ``torch.multiprocessing.spawn``.

(The package is not called ``spawn``: importing a submodule binds it as an attribute of its
parent package, and ``numarun.spawn`` must stay the function.)

- ``api``: ``spawn`` / ``start_processes`` (torch's arguments and more): the checks, then one
  run started and, with ``join=True``, waited for. The wing's public face.
- ``ranks``: where each rank goes (``binding=``, ``mem_binding=`` through the planner) and its
  environment.
- ``startmethod``: one ``WorkerSpec`` per rank by start method, pickled as multiprocessing
  pickles (spawn, forkserver) or held (fork).
- ``context``: ``ProcessContext`` (alias ``SpawnContext``): joining, stopping, and the run's end
  as return values or torch's exception.
- ``exceptions``: the exception classes, joined with torch's when ``torch.multiprocessing`` is
  loaded, and warnings pointing at the caller's line.
- ``workerrun``: the caller's side of a run (``WorkerRun``): results read from the supervisor's
  loop, one ``WorkerPopen`` per process object, so that ``multiprocessing``'s own machinery works.
- ``childmain``: what runs first inside a worker: multiprocessing's own bootstrap of the callable.

May import: ``numarun.stacks``, ``numarun.process``, ``numarun.placement``, ``numarun.machine``,
``numarun.errors`` and this package. Not ``numarun.launch``.
"""

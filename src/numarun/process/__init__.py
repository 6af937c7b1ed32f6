"""How workers live and die: start them bound at birth, watch them without polling, tear down.

One implementation for every kind of worker (an exec'd command, a forked or forkserver callable).

- ``spec``: what a caller describes and gets back (``WorkerSpec``, ``OutputSink``,
  ``WorkerExit``, ``RunResult``); every other module of the wing and every caller uses these.
- ``supervisor``: ``Supervisor``, the facade that composes the parts below, and the run's
  phases; its docstring states the exact semantics (start, watch, signals, teardown, ownership).
- ``loop``: the event loop (a selector, timers, callers' readers, signal wake-ups).
- ``signals``: the signal scope (handlers in the main thread while a run is watched).
- ``starting``: checking specs, forking the watchdog and the workers, delivering payloads.
- ``streams``: the workers' pipes in the loop (output to sinks, results, payloads, consoles).
- ``teardown``: finding the run's processes, pinning them, signalling, escalating, sweeping.
- ``record``: the supervisor's record of each started worker, which the parts above share.
- ``forkexec``: what runs in a worker between fork and its own code (or exec), and the fd
  registry.
- ``watchdog``, ``proctable``: the watchdog process (subreaper, the workers' parent) with the
  supervisor's end of its pipes, and what it and the teardown read of ``/proc`` (pidfds, parent
  links, ownership).
- ``console``, ``sinks``: where output goes (files, ``--tee`` with line framing and prefixes,
  nowhere; the non-blocking console in front of the launcher's stdout/stderr).
- ``standby``: a supervisor whose workers start ahead of their run and are handed it later
  (the launcher's ``--preload`` standbys), and the sink that holds their output until then.
- ``capacity``: how many workers this machine can start, the one bound the launcher and
  ``numarun.spawn`` check a worker count against.

May import: ``numarun.placement``, ``numarun.machine``, ``numarun.errors`` and this package.
"""

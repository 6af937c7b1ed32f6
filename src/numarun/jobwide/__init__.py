"""The whole-job view over the rendezvous store: every node's stacks in one merged answer, the
hang verdict over every node, where a failed node's ranks were. A diagnostic: it plugs into
``numarun.rendezvous.torchrdzv.ElasticNode`` as its ``diagnostics`` and never decides a node's
outcome (what fails in it is one line).

- ``notices``: ``JobNotices``, the view as the node calls it (events, notices, results in the
  loop, the exit barrier's hang watch) and as the launcher does (``attach``, ``hang_job``,
  ``on_worker_failure``).
- ``protocol``: what the store thread does at each event: digests collected and merged, the
  still count and the verdict, the frames claimed and read. docs/protocol.md states the keys.
- ``results``: ``Ask``, ``Merged``, ``Hang``: what the thread reports to the loop.

Built on ``numarun.rendezvous`` (the store thread, the events) and ``numarun.stacks`` (digests,
merge). May import: ``numarun.rendezvous``, ``numarun.cmdline``, ``numarun.stacks``,
``numarun.process``, ``numarun.placement``, ``numarun.machine``, ``numarun.worker``, the base and
this package.
"""

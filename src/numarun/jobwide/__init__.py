"""The whole-job view over the rendezvous store: every node's stacks in one merged answer, the
hang verdict over every node, where a failed node's ranks were. A diagnostic: it plugs into
``numarun.rendezvous.torchrdzv.ElasticNode`` as its ``diagnostics`` and never decides a node's
outcome (what fails in it is one line); only a hang verdict that every node's own fresh evidence
supports stops a job (124).

- ``notices``: ``JobNotices``, the view as the node calls it (events, notices, results in the
  loop, the exit barrier's hang watch) and as the launcher does (``attach``, ``hang_job``,
  ``on_worker_failure``).
- ``protocol``: what the store thread does at each event, and the round's state: a whole-job
  ``numarun stacks`` (digests collected and merged by the asking node), the frames claimed and
  read, failure notices. docs/protocol.md states the keys.
- ``hangverdict``: the hang verdict: each node's still/moving/done marks, the count, the judge,
  the window in which a node whose ranks move denies a verdict, a judge that died taken over.
- ``results``: ``Ask``, ``Merged``, ``Hang``: what the thread reports to the loop.

Built on ``numarun.rendezvous`` (the store thread, the events) and ``numarun.stacks`` (digests,
merge). May import: ``numarun.rendezvous``, ``numarun.cmdline``, ``numarun.stacks``,
``numarun.process``, ``numarun.placement``, ``numarun.machine``, ``numarun.worker``, the base and
this package.
"""

"""This node in PyTorch's rendezvous (c10d, etcd, plugins) through torch's own handler, and the
rendezvous's own health: rounds, the store thread, heartbeats, the exit barrier.

Imported only when ``--rdzv-backend`` names a torch backend (the static path never loads it, nor
torch). Only this wing decides that a node stops for the rendezvous (torch's rules: a node
waiting to join, a closed rendezvous, a store that is gone, a silent neighbour); the whole-job
view (``numarun.jobwide``) plugs into it and never decides.

- ``torchrdzv``: ``ElasticNode`` (joining, rounds, the watch, notices, the end).
- ``torchcompat``: torch's names that torch does not promise, checked before use.
- ``round``: ``Round``, ``WorkerPlace``: what a round gives this node's workers.
- ``storeops``: ``Conn``, numarun's own connection per round; ``Forged``; ``run_blocking``.
- ``diagstore``: the whole-job view's store of its own per round (``--diagnostics-store own``).
- ``storewatch``: ``StoreWatch``, the ``numarun-store`` thread; ``WatchedRound``.
- ``events``: the round's numbered events on the store (``post_event``, the counter checked).
- ``storeresults``: ``Change``, ``Lost``, ``Notice``: what the thread reports to the loop.
- ``liveness``: ``Heartbeats``.
- ``exitbarrier``: ``ExitBarrier``.
- ``waiting``: ``Waiting``: what a node waiting in the rendezvous says (lines, status).

docs/protocol.md lists every store key numarun uses. May import: ``numarun.cmdline``,
``numarun.stacks``, ``numarun.process``, ``numarun.placement``, ``numarun.machine``,
``numarun.worker``, the base and this package; never ``numarun.jobwide`` or ``numarun.launch``.
"""

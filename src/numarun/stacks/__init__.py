"""Stack dumps: where every rank of a job is, on request, at a failure, and when it hangs.

    rank: worker.dumphandler's helper thread --request FIFO--> <runtime>/<job>.d/rank<N>{,.fr}
    launcher: jobstacks.JobStacks -> RankDumps.ask() / take()  -> parse.RankStacks -> groups
                                  -> flightreport.FlightReport -> flight, flightverdict
    `numarun stacks` --(0600 Unix socket, SO_PEERCRED)--> channel.JobServer (supervisor loop)

- ``parse``: faulthandler text -> ``RankStacks`` / ``Thread`` / ``Frame``; grouping identical
  stacks, the odd ones out (likely culprits), text and JSON. Pure.
- ``dumps``: the launcher's side: ``RankDumps`` (ask and take every rank's dump).
- ``rankhelper``: each rank's helper thread seen from the launcher: its files, requests and
  answers, when to signal instead.
- ``flight``: torch's flight-recorder dumps read (untrusted) into per-group frontiers, and a
  node's compact summary of them. Pure.
- ``flightverdict``: the frontiers merged into the verdict in torch's analyzer's terms. Pure.
- ``flightreport``: what the summary and ``numarun stacks`` say of the recorders, and the dumps
  kept for torch's analyzer.
- ``hang``: ``HangWatch`` (the hang verdict, this node's or with the launcher the whole job's).
- ``jobstacks``: ``JobStacks`` (all of it wired into one supervisor), ``for_spawn``.
- ``digest``: one node's stacks as posted for the other nodes of a job (a digest of classes,
  each class's frames), and read back as untrusted data. Pure.
- ``merge``: every node's digest merged into the job's classes, the call-path tree, the merged
  result as one bounded document and back, one screen at 8,192 ranks. Pure.
- ``channel``: the per-user runtime directory, ``JobServer`` (serving ``numarun stacks`` from
  the supervisor's loop, never blocking it) and the client side of ``numarun stacks``.
- ``pending``: the status record of a launcher waiting in its rendezvous (no socket yet), and
  the client's checked read of it.

May import: ``numarun.process``, ``numarun.placement``, ``numarun.machine``, ``numarun.worker``,
``numarun.errors`` and this package.
"""

"""Every name of numarun's that the whole-job simulation uses, imported in this one place.

``benchmarks/jobwide_standins.py``, ``benchmarks/bench_jobwide_scale.py`` and
``benchmarks/jobwide_costs.py`` take numarun's classes and keys from here only, so that when the
modules move (``launch/jobwide.py`` -> ``jobwide/protocol.py``, ``launch/storewatch.py`` ->
``rendezvous/storewatch.py`` with its ``Round`` renamed ``WatchedRound``, ``launch/jobnotices.py``
-> ``jobwide/notices.py``, ``stacks/remote.py`` -> ``stacks/digest.py``, ``stacks/dumphandler.py``
-> ``worker/dumphandler.py``, ``launch/config.py`` -> ``cmdline/config.py``, ...) the simulation
follows by changing the lines below, nothing else.
"""

from __future__ import annotations

from numarun.launch import jobwide as protocol  # noqa: F401
from numarun.launch import storewatch
from numarun.launch.config import parse_args  # noqa: F401
from numarun.launch.round import Round as NodeRound  # noqa: F401
from numarun.launch.round import WorkerPlace  # noqa: F401
from numarun.launch.storeops import Conn  # noqa: F401
from numarun.launch.storeresults import Result  # noqa: F401
from numarun.launch.storewatch import (  # noqa: F401
    ALIVE_KEY,
    CLAIM_KEY,
    COMPLETE_KEY,
    EVENT_KEY,
    EVENTS_KEY,
    FRAMES_KEY,
    NODES_KEY,
    STILL_NODES_KEY,
    STILLS_KEY,
)
from numarun.launch.torchrdzv import ElasticNode  # noqa: F401
from numarun.process.loop import Loop  # noqa: F401
from numarun.process.spec import WorkerExit  # noqa: F401
from numarun.stacks.dumphandler import STACKS_FILE_ENV  # noqa: F401
from numarun.stacks.dumps import PENDING, RankDumps, Raw, _structurally_complete  # noqa: F401
from numarun.stacks.hang import HangWatch  # noqa: F401
from numarun.stacks.jobstacks import JobStacks  # noqa: F401
from numarun.stacks.merge import VIEW_LIMIT, encode_view, merge, read_view  # noqa: F401
from numarun.stacks.parse import rank_stacks  # noqa: F401
from numarun.stacks.remote import Classes, node_digest  # noqa: F401

# The store thread's round of one node (``WatchedRound`` on main after the move).
WatchedRound = storewatch.Round

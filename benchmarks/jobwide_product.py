"""Every name of numarun's that the whole-job simulation uses, imported in this one place.

``benchmarks/jobwide_standins.py``, ``benchmarks/bench_jobwide_scale.py`` and
``benchmarks/jobwide_costs.py`` take numarun's classes and keys from here only, so that when
modules move the simulation follows by changing the lines below, nothing else.
"""

from __future__ import annotations

from numarun.cmdline.config import parse_args  # noqa: F401
from numarun.jobwide import protocol  # noqa: F401
from numarun.jobwide.hangverdict import STILL_NODES_KEY, STILLS_KEY  # noqa: F401
from numarun.jobwide.notices import JobNotices  # noqa: F401
from numarun.jobwide.protocol import CLAIM_KEY, COMPLETE_KEY, FRAMES_KEY  # noqa: F401
from numarun.process.loop import Loop  # noqa: F401
from numarun.process.spec import WorkerExit  # noqa: F401
from numarun.rendezvous import diagstore  # noqa: F401
from numarun.rendezvous.events import EVENT_KEY, EVENTS_KEY  # noqa: F401
from numarun.rendezvous.round import Round as NodeRound  # noqa: F401
from numarun.rendezvous.round import WorkerPlace  # noqa: F401
from numarun.rendezvous.storeops import Conn  # noqa: F401
from numarun.rendezvous.storeresults import REJOIN, Result  # noqa: F401
from numarun.rendezvous.storewatch import ALIVE_KEY, NODES_KEY, WatchedRound  # noqa: F401
from numarun.rendezvous.torchrdzv import ElasticNode  # noqa: F401
from numarun.stacks.digest import Classes, node_digest  # noqa: F401
from numarun.stacks.dumps import PENDING, RankDumps, Raw, _structurally_complete  # noqa: F401
from numarun.stacks.hang import HangWatch  # noqa: F401
from numarun.stacks.jobstacks import JobStacks  # noqa: F401
from numarun.stacks.merge import VIEW_LIMIT, encode_view, merge, read_view  # noqa: F401
from numarun.stacks.parse import rank_stacks  # noqa: F401
from numarun.worker.dumphandler import STACKS_FILE_ENV  # noqa: F401

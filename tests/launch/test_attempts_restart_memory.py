"""A job restarted many times does not grow: what the launcher keeps of past attempts is bounded.

Each restart used to keep the whole attempt (its result, its stacks, the workers' environments)
and freeze the supervisor's reference cycles for good (``gc.freeze()`` before every attempt):
about 10 KiB per restart, never levelling off. The launcher runs in a child process here, with
``tracemalloc`` and one cheap worker (``false``) restarted many times; the figure for real runs
is ``benchmarks/bench_restart_memory.py``'s.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest

RESTARTS = 150

MEASURE = r"""
import gc, json, sys, tracemalloc
from numarun.launch import attempts as job
from numarun.launch.launcher import main

sizes = []
run_attempt = job.Job.run_attempt

def measured(self, *args, **kwargs):
    attempt = run_attempt(self, *args, **kwargs)
    gc.collect()
    sizes.append(tracemalloc.get_traced_memory()[0])
    return attempt

job.Job.run_attempt = measured
tracemalloc.start()
code = main(["--nproc-per-node", "1", "--max-restarts", sys.argv[1], "--no-python", "false"])
print(json.dumps({"code": code, "sizes": sizes}))
"""


@pytest.mark.slow
def test_memory_levels_off_over_many_restarts_and_the_summary_stays_a_screenful() -> None:
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(RESTARTS)],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    assert measured["code"] == 1  # `false` fails every attempt: the last one's status
    sizes = measured["sizes"]
    assert len(sizes) == RESTARTS + 1
    # Past the first attempts (imports, first-time caches), what is held must stay flat: the
    # old code grew by ~10 KiB per restart, ~1 MiB over these 100; allow 1 KiB per restart.
    early = statistics.median(sizes[40:50])
    late = statistics.median(sizes[-10:])
    assert late - early < 100 * 1024, f"grew by {(late - early) / 1024:.0f} KiB: {sizes[::10]}"
    # The report names the first and the last attempts and counts those between.
    summary = done.stderr[done.stderr.rindex("Earlier attempts:") :]
    listed = [line for line in summary.splitlines() if line.startswith("  attempt_")]
    assert len(listed) == 10, summary
    assert listed[0].startswith("  attempt_0:") and listed[-1].startswith(
        f"  attempt_{RESTARTS - 1}:"
    )
    assert f"... {RESTARTS - 10} more earlier attempts not listed here" in summary

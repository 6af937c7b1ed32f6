"""``benchmarks/bench_jobwide_scale.py`` at a tiny size: every round and fault runs to an answer,
the keys it reports are there, and the figures that are facts at any size hold (every node had
every event; a fault is resolved or named). Its timings are the benchmark's, never asserted
here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_jobwide_scale.py"


@pytest.mark.slow
def test_the_simulation_runs_every_round_and_fault_at_four_nodes(tmp_path: Path) -> None:
    latencies = tmp_path / "costs.json"
    latencies.write_text(json.dumps({"dump": {"latencies_s": [0.002, 0.003]}}))
    command = [sys.executable, str(BENCH), "--nodes", "4", "--json", "--interval", "0.5",
               "--hang-timeout", "3", "--keep-alive", "1", "--idle", "1", "--limit", "60",
               "--per-process", "2", "--no-view-8192", "--dump-latencies", str(latencies)]
    env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "FATAL"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout)
    for key in ("stacks_s", "verdict_s", "notice_s", "bytes_per_node_per_event",
                "requests_per_node_per_event", "max_loop_blocked_s", "merger_cpu_s",
                "cpu_s_per_node_per_event", "faults", "cascade", "round_start_s"):
        assert key in results, key
    assert results["processes"] == 3  # node 0 alone, then two of two and one
    events = results["events"]
    # The stacks: the asking node alone has the merged result (no other node reads it).
    assert [events[name]["reached"] for name in ("stacks", "verdict", "notice")] == [1, 4, 3]
    for name in ("stacks", "verdict", "notice"):
        event = events[name]
        assert results[f"{name}_s"] is not None, (name, event.get("why"),
                                                  results["stop_reasons"])
    assert results["torch_bytes_per_node_s"] > results["torch_state_bytes"] / 5  # syncs ran
    assert results["cascade"]["reached"] == 4  # the round over for every node
    assert results["cascade"]["notices_read_per_node"]["max"] <= 1  # the first, no later one
    assert set(results["faults"]) == {"merger_dies", "asker_dies", "claim_dies", "poster_dies"}
    for name, fault in results["faults"].items():
        assert fault["died"]["node"] in range(4), (name, fault)
        assert fault["s"] is not None or fault["why"], (name, fault)
    # A dead asker is named by its neighbour's heartbeat watch (3 keep-alives); a dead judge is
    # taken over (the hang declared by another node), or named so.
    outcomes = results["faults"]
    assert any("stopped answering" in reason for reason in outcomes["asker_dies"]["outcomes"])
    # The asking node hosted the view's store (own): its death closed it, so its neighbour's
    # notice reached nobody (a notice's line names its sender: "node 3 (host): node 0 ...");
    # the others stopped on the word on the rendezvous store, or torch's wait list.
    assert outcomes["asker_dies"]["s"] is not None, outcomes["asker_dies"]
    for reason in outcomes["asker_dies"]["outcomes"]:
        assert re.match(r"rendezvous: (node 0 stopped answering|\d+ node\(s\) waiting to join)",
                        reason), reason  # fmt: skip
    assert any("stopped answering" in reason or reason.startswith("hang: ")
               for reason in outcomes["merger_dies"]["outcomes"])  # fmt: skip

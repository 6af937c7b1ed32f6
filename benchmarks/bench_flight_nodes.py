"""What the flight recorder adds to the whole-job view at scale: a node's digest with its flight
summary (8 ranks per node), and the merging node's CPU for 1,024 nodes' digests, beside the
same digests without it (the stacks alone), in one run.

    python benchmarks/bench_flight_nodes.py [--nodes 1024] [--ranks 8] [--rounds 3]

Each node's 8 ranks answer with a dump in torch's JSON form, as the rank's helper sends it
for gloo: the default group with its members filled (every rank of the job: the largest
``pg_config`` there is), 2,000-entry rings cut to what the summary keeps (its last 6
collectives), every rank in step at ``all_reduce`` #120 but global rank ``nodes * ranks - 1``,
which skipped #118. Measured: the digest's bytes with and without the ``flight`` field; one
node's CPU to build it (the dumps read and folded); the merging node's CPU to read every
digest back (:func:`numarun.stacks.digest.read_digest`, as the judge does) and merge them
(:func:`numarun.stacks.merge.merge`, whose flight part reads every summary and merges every
rank), with and without the flight field (medians of ``--rounds``); the merged view's bytes.

Prints a markdown table and the load average before and after (the machine is shared:
compare the ratio, not the times).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from numarun.stacks.digest import Classes, Raw, node_digest, read_digest
from numarun.stacks.merge import encode_view, merge
from numarun.stacks.rankhelper import FlightAnswer

STACK = ('Thread 0x00007f0000000001 (most recent call first):\n'
         '  File "/job/train.py", line 41 in main\n')  # fmt: skip


def rank_dump(rank: int, world: int, members: str) -> bytes:
    """One rank's dump in torch's JSON form (what the summary keeps of it: 6 entries)."""
    top = 119 if rank == world - 1 else 120
    entries = []
    for seq in range(top - 5, top + 1):
        size = 2048 if seq == top else 1024
        entries.append({
            "record_id": seq, "pg_id": 0, "process_group": ["0", "default_pg"],
            "collective_seq_id": seq, "p2p_seq_id": 0, "profiling_name": "gloo:all_reduce",
            "input_sizes": [[size]], "input_dtypes": ["BFloat16"], "output_sizes": [[size]],
            "output_dtypes": ["BFloat16"], "state": "scheduled", "retired": seq != top,
        })  # fmt: skip
    return json.dumps({"version": "2.10", "entries": entries, "pg_status": {},
                       "pg_config": {"0": {"name": "0", "desc": "default_pg",
                                           "ranks": members}}}).encode()  # fmt: skip


def digests(nodes: int, ranks: int, flight: bool) -> tuple[list[bytes], float]:
    """Every node's digest post, and one node's CPU seconds to build its own (the median)."""
    world = nodes * ranks
    members = "[" + ", ".join(map(str, range(world))) + "]"
    posts, spent = [], []
    for node in range(nodes):
        dumps = []
        for local in range(ranks):
            rank = node * ranks + local
            answer = FlightAnswer(rank, local, "ok", rank_dump(rank, world, members)) if flight \
                else None  # fmt: skip
            dumps.append(Raw(rank, local, 1000 + rank, STACK, None, answer))
        started = time.process_time()
        digest, _ = node_digest(dumps, node=node, host=f"gpu{node:04d}", pid=1, state="still",
                                known=Classes())  # fmt: skip
        posts.append(digest.encode())
        spent.append(time.process_time() - started)
    return posts, statistics.median(spent)


def merge_cpu(posts: list[bytes], nodes: int, world: int) -> tuple[float, object]:
    started = time.process_time()
    read = [read_digest(post, below=world) for post in posts]
    view = merge(read, kind="hang", by="node 0 (gpu0000)", size=nodes, world=world)
    return time.process_time() - started, view


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1024)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    before = os.getloadavg()[0]
    world = args.nodes * args.ranks
    with_flight, build = digests(args.nodes, args.ranks, True)
    without, build_plain = digests(args.nodes, args.ranks, False)
    times: dict[bool, list[float]] = {True: [], False: []}
    views = {}
    for _ in range(args.rounds):  # interleaved
        for flight, posts in ((True, with_flight), (False, without)):
            spent, views[flight] = merge_cpu(posts, args.nodes, world)
            times[flight].append(spent)
    view = views[True]
    assert view.flight is not None and view.flight.culprits == [world - 1], view.flight.lines
    on, off = statistics.median(times[True]), statistics.median(times[False])
    print(f"## flight recorder over {args.nodes:,} nodes x {args.ranks} ranks "
          f"({len(os.sched_getaffinity(0))} CPUs, load {before:.1f} before)\n")  # fmt: skip
    print("| | with the flight summary | stacks alone | ratio |")
    print("|---|---|---|---|")
    print(f"| one node's digest (bytes) | {len(with_flight[1]):,} | {len(without[1]):,} | "
          f"{len(with_flight[1]) / len(without[1]):.2f}x |")
    print(f"| one node's CPU to build it | {build * 1e3:.2f} ms | {build_plain * 1e3:.2f} ms | "
          f"{build / build_plain:.1f}x |")
    print(f"| merging node: {args.nodes:,} digests read and merged (CPU, median of "
          f"{args.rounds}) | {on:.2f} s | {off:.2f} s | {on / off:.2f}x |")
    print(f"| the merged view (bytes) | {len(encode_view(view)):,} | "
          f"{len(encode_view(views[False])):,} | |")
    print(f"\nverdict: {view.flight.lines[0][:160]}...")
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

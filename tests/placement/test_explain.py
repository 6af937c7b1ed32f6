"""numarun.placement.explain: ``numarun plan --explain`` says why each rank got its CPUs; a CPU
mode on a GPU machine warns about ranks far from their GPU."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

import sysfs_fixtures
from numarun.cli import main

shape_root = sysfs_fixtures.shape_root


def test_plan_explain_says_why_each_rank_got_its_cpus(
    shape_root: Callable[[str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(shape_root("dgx_h100"))
    assert main(["plan", "--sysfs-root", root, "--numa-binding", "exclusive", "--explain"]) == 0
    lines = capsys.readouterr().out.splitlines()
    why = lines.index(next(line for line in lines if line.startswith("why (exclusive: ")))
    assert lines[why + 1] == (
        "  rank 0: GPU 0 (0000:18:00.0) on NUMA node 0; 14 cores (28 CPUs) on node 0: its share "
        "of node 0's 56 allowed cores, split among GPUs 0-3; shares no CPU, memory node 0 with "
        "ranks 1-3"
    )
    assert lines[why + 5].startswith("  rank 4: GPU 4 (0000:9a:00.0) on NUMA node 1; ")
    assert main(["plan", "--sysfs-root", root, "--numa-binding", "node", "--explain"]) == 0
    node = capsys.readouterr().out
    assert "rank 2: GPU 2 (0000:3a:00.0) on NUMA node 0; 56 cores (112 CPUs) on node 0: its " \
           "GPU's node; shares CPUs with ranks 0-1,3, memory node 0 with ranks 0-1,3" in node
    argv = ["plan", "--sysfs-root", root, "--numa-binding", "node", "--json", "--explain"]
    assert main(argv) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["version"] == 1
    assert document["rule"].startswith("node: each rank gets every allowed CPU of its GPU's")
    assert document["ranks"][5]["why"].startswith("GPU 5 (0000:ab:00.0) on NUMA node 1; ")


def test_cpu_mode_on_a_gpu_machine_warns_about_ranks_far_from_their_gpu(
    shape_root: Callable[[str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(shape_root("dgx_h100"))
    argv = ["plan", "--sysfs-root", root, "--numa-binding", "cpu", "--nproc-per-node", "16"]
    assert main([*argv, "--explain"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert (
        "warning: --numa-binding cpu splits the cores without regard to GPUs: ranks 4-7 run on "
        "another NUMA node than the GPU of the same index (rank 4: GPU 4 on node 1, CPUs on "
        "node 0); for GPU jobs use --numa-binding node, socket, exclusive or core-complex"
    ) in lines
    (rank4,) = [line for line in lines if line.startswith("  rank 4: ")]
    assert rank4.startswith(
        "  rank 4: GPU 4 (0000:9a:00.0) on NUMA node 1; 7 cores (14 CPUs) on node 0: its GPU is "
        "on node 1, another node (cpu mode)"
    )
    assert main(["plan", "--sysfs-root", root, "--numa-binding", "cpu", "--nproc-per-node", "8"]) \
        == 0  # fmt: skip
    assert "warning:" not in capsys.readouterr().out  # 8 ranks: each on its GPU's node

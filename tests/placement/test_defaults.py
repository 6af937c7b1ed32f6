"""numarun.placement.defaults: ``numarun plan`` without flags plans for this machine (and saved
machines) and says what it chose. Why each rank got its CPUs is ``test_explain.py``'s."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import sysfs_fixtures
from newcomer_runs import numarun
from numarun.cli import main
from numarun.machine.cpulist import format_cpulist
from numarun.machine.topology import read_topology

shape_root = sysfs_fixtures.shape_root


# --- items 7 and 8: numarun plan without flags, and why ------------------------------------------


def test_plan_without_flags_plans_for_this_machine_and_says_what_it_chose(
    tmp_path: Path,
) -> None:
    topo = read_topology("/")
    nodes = [n for n in topo.nodes if set(n.cpus) & set(topo.allowed_cpus)]
    done = numarun("plan", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    if topo.gpus:  # pragma: no cover - the test machines have none
        assert lines[0].startswith("numarun plan: planned with --nproc-per-node")
        return
    assert lines[0] == (
        f"numarun plan: planned with --nproc-per-node {len(nodes)} --numa-binding cpu for "
        "this machine (no visible GPUs, one rank per NUMA node with allowed CPUs)"
    )
    assert lines[1] == "numa-binding: cpu (bound)"
    rows = [line.split() for line in lines[3:] if line[:1].isdigit()]
    assert [row[0] for row in rows] == [str(rank) for rank in range(len(nodes))]
    if len(rows) == 1:
        assert rows[0][3] == format_cpulist(topo.allowed_cpus)
    alone = numarun("plan", "--numa-binding", "cpu", cwd=tmp_path)  # asked for --nproc-per-node
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout.startswith(
        f"numarun plan: planned with --nproc-per-node {len(nodes)} for this machine"
    )


@pytest.mark.parametrize(
    ("shape", "note"),
    [
        ("dgx_h100", "--nproc-per-node 8 --numa-binding exclusive for this machine "
                     "(8 visible GPUs, one rank per GPU)"),
        ("crowded_node", "--nproc-per-node 4 --numa-binding node for this machine (4 visible "
                         "GPUs, a node with more GPUs than cores, one rank per GPU)"),
        ("no_gpus", "--nproc-per-node 2 --numa-binding cpu for this machine (no visible GPUs, "
                    "one rank per NUMA node with allowed CPUs)"),
    ],
)  # fmt: skip
def test_plan_without_flags_on_saved_machines(
    shape_root: Callable[[str], Path], capsys: pytest.CaptureFixture[str], shape: str, note: str
) -> None:
    assert main(["plan", "--sysfs-root", str(shape_root(shape))]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"numarun plan: planned with {note}"
    # Given flags, nothing is chosen and nothing is said (a GPU mode always had one rank
    # per GPU).
    h100 = str(shape_root("dgx_h100"))
    assert main(["plan", "--sysfs-root", h100, "--numa-binding", "node"]) == 0
    assert capsys.readouterr().out.startswith("numa-binding: node (bound)\n")

"""The planner: expected CPU sets worked out by hand from each fake machine's numbering.

Each shape's numbering is spelled out in its docstring in ``sysfs_fixtures``; the expected
sets below are literal kernel ranges derived from it, not computed by the code under test.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numarun.errors import PlanError, UsageError
from numarun.machine.cpulist import format_cpulist, parse_cpulist
from numarun.machine.model import Topology
from numarun.machine.topology import read_topology
from numarun.placement.plan import (
    GPU_MODES,
    MODES,
    Plan,
    RankBinding,
    format_plan_table,
    make_plan,
    plan_to_json,
)
from sysfs_fixtures import SHAPES, FakeMachine, write_sysfs

Reader = Callable[..., Topology]


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Shape name -> its fake sysfs root, written once per module."""
    written: dict[str, Path] = {}

    def root(shape: str) -> Path:
        if shape not in written:
            written[shape] = write_sysfs(SHAPES[shape](), tmp_path_factory.mktemp(shape))
        return written[shape]

    return root


@pytest.fixture(scope="module")
def topo(roots: Callable[[str], Path]) -> Reader:
    """``topo(shape, allowed=None)``: the shape read through read_topology, all online CPUs
    allowed unless ``allowed`` (a CPU list) restricts them. Cached per module."""
    cache: dict[tuple[str, str | None], Topology] = {}

    def read(shape: str, allowed: str | None = None) -> Topology:
        key = (shape, allowed)
        if key not in cache:
            cache[key] = read_topology(str(roots(shape)), cpus_allowed=allowed, environ={})
        return cache[key]

    return read


def cpus(text: str) -> tuple[int, ...]:
    return parse_cpulist(text)


def summary(plan: Plan) -> list[tuple[str, int | None, str]]:
    """(cpus, numa_node, mems) per rank, as kernel ranges, for comparison with literals."""
    return [
        (format_cpulist(rank.cpus), rank.numa_node, format_cpulist(rank.mems))
        for rank in plan.ranks
    ]


H100_N0, H100_N1 = "0-55,112-167", "56-111,168-223"

# (shape, mode, nprocs, [(cpus, numa_node, mems) per rank]) worked out by hand.
HAND_CHECKED = [
    ("dgx_h100", "node", 8, [(H100_N0, 0, "0")] * 4 + [(H100_N1, 1, "1")] * 4),
    ("dgx_h100", "socket", 8, [(H100_N0, 0, "0")] * 4 + [(H100_N1, 1, "1")] * 4),
    (
        "dgx_h100",
        "exclusive",
        8,
        [
            ("0-13,112-125", 0, "0"),
            ("14-27,126-139", 0, "0"),
            ("28-41,140-153", 0, "0"),
            ("42-55,154-167", 0, "0"),
            ("56-69,168-181", 1, "1"),
            ("70-83,182-195", 1, "1"),
            ("84-97,196-209", 1, "1"),
            ("98-111,210-223", 1, "1"),
        ],
    ),
    # One L3 per package: every GPU of a node takes that node's only complex.
    ("dgx_h100", "core-complex", 8, [(H100_N0, 0, "0")] * 4 + [(H100_N1, 1, "1")] * 4),
    # A100 GPUs sit on nodes 3,3,1,1,7,7,5,5; node n = cores 16n..16n+15, siblings +128.
    (
        "dgx_a100",
        "node",
        8,
        [
            ("48-63,176-191", 3, "3"),
            ("48-63,176-191", 3, "3"),
            ("16-31,144-159", 1, "1"),
            ("16-31,144-159", 1, "1"),
            ("112-127,240-255", 7, "7"),
            ("112-127,240-255", 7, "7"),
            ("80-95,208-223", 5, "5"),
            ("80-95,208-223", 5, "5"),
        ],
    ),
    (
        "dgx_a100",
        "socket",
        8,
        [("0-63,128-191", 3, "0-3")] * 2
        + [("0-63,128-191", 1, "0-3")] * 2
        + [("64-127,192-255", 7, "4-7")] * 2
        + [("64-127,192-255", 5, "4-7")] * 2,
    ),
    (
        "dgx_a100",
        "exclusive",
        8,
        [
            ("48-55,176-183", 3, "3"),
            ("56-63,184-191", 3, "3"),
            ("16-23,144-151", 1, "1"),
            ("24-31,152-159", 1, "1"),
            ("112-119,240-247", 7, "7"),
            ("120-127,248-255", 7, "7"),
            ("80-87,208-215", 5, "5"),
            ("88-95,216-223", 5, "5"),
        ],
    ),
    (
        "dgx_a100",
        "core-complex",
        8,
        [
            ("48-51,176-179", 3, "3"),
            ("52-55,180-183", 3, "3"),
            ("16-19,144-147", 1, "1"),
            ("20-23,148-151", 1, "1"),
            ("112-115,240-243", 7, "7"),
            ("116-119,244-247", 7, "7"),
            ("80-83,208-211", 5, "5"),
            ("84-87,212-215", 5, "5"),
        ],
    ),
    # Grace Hopper: node 1 is memory only, nodes 2-8 possible but empty; nothing crashes.
    ("grace_hopper", "node", 1, [("0-71", 0, "0")]),
    ("grace_hopper", "socket", 1, [("0-71", 0, "0")]),
    ("grace_hopper", "exclusive", 1, [("0-71", 0, "0")]),
    ("grace_hopper", "core-complex", 1, [("0-71", 0, "0")]),
    ("grace_hopper_x2", "socket", 2, [("0-71", 0, "0"), ("72-143", 1, "1")]),
    ("grace_hopper_x2", "exclusive", 2, [("0-71", 0, "0"), ("72-143", 1, "1")]),
    # Cloud VM: GPUs 0 and 1 resolve to nodes 0 and 1 through local_cpulist; 2 and 3 do not.
    (
        "cloud_vm_unknown_numa",
        "node",
        4,
        [("0-7,16-23", 0, "0"), ("8-15,24-31", 1, "1"), ("0-31", None, ""), ("0-31", None, "")],
    ),
    (
        "cloud_vm_unknown_numa",
        "socket",
        4,
        [("0-7,16-23", 0, "0"), ("8-15,24-31", 1, "1"), ("0-31", None, ""), ("0-31", None, "")],
    ),
    # Unknown-node GPUs 2 and 3 split all allowed cores (node by node) between them.
    (
        "cloud_vm_unknown_numa",
        "exclusive",
        4,
        [
            ("0-7,16-23", 0, "0"),
            ("8-15,24-31", 1, "1"),
            ("0-7,16-23", None, ""),
            ("8-15,24-31", None, ""),
        ],
    ),
    (
        "cloud_vm_unknown_numa",
        "core-complex",
        4,
        [
            ("0-7,16-23", 0, "0"),
            ("8-15,24-31", 1, "1"),
            ("0-7,16-23", None, ""),
            ("8-15,24-31", None, ""),
        ],
    ),
    ("smt_off", "node", 4, [("0-15", 0, "0")] * 2 + [("16-31", 1, "1")] * 2),
    (
        "smt_off",
        "exclusive",
        4,
        [("0-7", 0, "0"), ("8-15", 0, "0"), ("16-23", 1, "1"), ("24-31", 1, "1")],
    ),
    # Interleaved: node 0 core c = (2c, 2c+32). Exclusive follows physical cores, not numbers.
    (
        "interleaved",
        "exclusive",
        4,
        [
            ("0,2,4,6,8,10,12,14,32,34,36,38,40,42,44,46", 0, "0"),
            ("16,18,20,22,24,26,28,30,48,50,52,54,56,58,60,62", 0, "0"),
            ("1,3,5,7,9,11,13,15,33,35,37,39,41,43,45,47", 1, "1"),
            ("17,19,21,23,25,27,29,31,49,51,53,55,57,59,61,63", 1, "1"),
        ],
    ),
    (
        "interleaved",
        "node",
        4,
        [("0-62:2", 0, "0")] * 2 + [("1-63:2", 1, "1")] * 2,
    ),
    # CPUs 3 and 20 offline: node 0 has 15 cores 0-2,4-15 -> 8/7; node 1 16-19,21-31 -> 8/7.
    (
        "offline_cpus",
        "exclusive",
        4,
        [("0-2,4-8", 0, "0"), ("9-15", 0, "0"), ("16-19,21-24", 1, "1"), ("25-31", 1, "1")],
    ),
    ("offline_cpus", "node", 4, [("0-2,4-15", 0, "0")] * 2 + [("16-19,21-31", 1, "1")] * 2),
    # 10 cores, 3 GPUs on node 0: 4/3/3, the lowest GPU takes the extra core.
    (
        "uneven_cores",
        "exclusive",
        4,
        [
            ("0-3,20-23", 0, "0"),
            ("4-6,24-26", 0, "0"),
            ("7-9,27-29", 0, "0"),
            ("10-19,30-39", 1, "1"),
        ],
    ),
    ("crowded_node", "node", 4, [("0-1", 0, "0")] * 4),
    ("one_node_small", "node", 1, [("0-1", 0, "0")]),
    ("one_node_small", "exclusive", 1, [("0-1", 0, "0")]),
]


@pytest.mark.parametrize(
    ("shape", "mode", "nprocs", "expected"),
    [pytest.param(*case, id=f"{case[0]}-{case[1]}") for case in HAND_CHECKED],
)
def test_gpu_modes_hand_checked(
    topo: Reader, shape: str, mode: str, nprocs: int, expected: list
) -> None:
    plan = make_plan(topo(shape), nprocs, mode)
    assert plan.bound and plan.mode == mode
    assert summary(plan) == [(format_cpulist(cpus(c)), n, m) for c, n, m in expected]
    assert [rank.gpu for rank in plan.ranks] == list(range(nprocs))
    assert [rank.local_rank for rank in plan.ranks] == list(range(nprocs))


def test_threads_count_physical_cores(topo: Reader) -> None:
    assert [r.threads for r in make_plan(topo("dgx_h100"), 8, "exclusive").ranks] == [14] * 8
    assert [r.threads for r in make_plan(topo("dgx_h100"), 2, "node").ranks] == [56, 56]
    assert [r.threads for r in make_plan(topo("smt_off"), 4, "exclusive").ranks] == [8] * 4
    uneven = make_plan(topo("uneven_cores"), 4, "exclusive")
    assert [r.threads for r in uneven.ranks] == [4, 3, 3, 10]


def test_pci_addresses_follow_the_gpu(topo: Reader) -> None:
    plan = make_plan(topo("dgx_h100"), 8, "node")
    assert plan.ranks[0].pci_address == "0000:18:00.0"
    assert plan.ranks[7].pci_address == "0000:db:00.0"


def test_fewer_ranks_than_gpus_still_split_by_all_gpus_of_the_node(topo: Reader) -> None:
    # PyTorch divides a node's cores among all its visible GPUs, used or not.
    plan = make_plan(topo("dgx_h100"), 2, "exclusive")
    assert summary(plan) == [("0-13,112-125", 0, "0"), ("14-27,126-139", 0, "0")]


def test_visible_gpus_decide_the_node(roots: Callable[[str], Path]) -> None:
    # CUDA_VISIBLE_DEVICES=4,5: local rank 0 drives physical GPU 4 on node 1, not GPU 0
    # (dask-cuda #671, TensorRT-LLM #12985). Exclusive splits node 1 between the 2 visible GPUs.
    t = read_topology(str(roots("dgx_h100")), environ={"CUDA_VISIBLE_DEVICES": "4,5"})
    assert summary(make_plan(t, 2, "node")) == [(H100_N1, 1, "1")] * 2
    assert summary(make_plan(t, 2, "exclusive")) == [
        ("56-83,168-195", 1, "1"),
        ("84-111,196-223", 1, "1"),
    ]
    assert make_plan(t, 2, "node").ranks[0].pci_address == "0000:9a:00.0"


def test_unknown_node_gpus_warn_and_never_claim_a_node(topo: Reader) -> None:
    plan = make_plan(topo("cloud_vm_unknown_numa"), 4, "node")
    unknown = [w for w in plan.warnings if "NUMA node unknown" in w]
    assert len(unknown) == 1
    assert "GPU 2 (0000:00:06.0)" in unknown[0] and "GPU 3 (0000:00:07.0)" in unknown[0]
    assert "GPU 0" not in unknown[0]
    known_only = make_plan(topo("cloud_vm_unknown_numa"), 2, "node")
    assert not [w for w in known_only.warnings if "NUMA node unknown" in w]


# --- allowed CPU sets (cgroups, taskset) ------------------------------------------------------

H100_HALF = "0-27,56-83,112-139,168-195"


def test_cgroup_restricted_node_and_socket(topo: Reader) -> None:
    t = topo("dgx_h100", H100_HALF)
    for mode in ("node", "socket"):
        plan = make_plan(t, 8, mode)
        assert summary(plan) == [("0-27,112-139", 0, "0")] * 4 + [("56-83,168-195", 1, "1")] * 4


def test_cgroup_restricted_exclusive_splits_only_allowed_cores(topo: Reader) -> None:
    plan = make_plan(topo("dgx_h100", H100_HALF), 8, "exclusive")
    assert summary(plan) == [
        ("0-6,112-118", 0, "0"),
        ("7-13,119-125", 0, "0"),
        ("14-20,126-132", 0, "0"),
        ("21-27,133-139", 0, "0"),
        ("56-62,168-174", 1, "1"),
        ("63-69,175-181", 1, "1"),
        ("70-76,182-188", 1, "1"),
        ("77-83,189-195", 1, "1"),
    ]


def test_only_smt_siblings_allowed_still_counts_physical_cores(topo: Reader) -> None:
    plan = make_plan(topo("dgx_h100", "112-223"), 8, "exclusive")
    assert summary(plan)[0] == ("112-125", 0, "0")
    assert summary(plan)[7] == ("210-223", 1, "1")
    assert plan.ranks[0].threads == 14


def test_exclusive_orders_cores_by_lowest_allowed_cpu(topo: Reader) -> None:
    # CPU 0 excluded but its sibling 112 allowed: that core sorts by 112, after core 55.
    plan = make_plan(topo("dgx_h100", "1-55,112-167"), 4, "exclusive")
    assert summary(plan) == [
        ("1-14,113-126", 0, "0"),
        ("15-28,127-140", 0, "0"),
        ("29-42,141-154", 0, "0"),
        ("43-55,112,155-167", 0, "0"),
    ]


def test_core_complex_with_partial_groups_prefers_fuller_groups(topo: Reader) -> None:
    # Node 3 of the A100: groups 48-51 | 52-55 | 56-59 | 60-63 (+128). Allow one CPU of the
    # first group, two of the second and all of the other two.
    t = topo("dgx_a100", "48,52-53,56-63,184-191,0-47,64-127,128-175,192-255")
    plan = make_plan(t, 2, "core-complex")
    assert summary(plan) == [("56-59,184-187", 3, "3"), ("60-63,188-191", 3, "3")]


def test_socket_mode_skips_nodes_without_allowed_cpus(topo: Reader) -> None:
    # Allowed: only node 1 and node 3 of package 0. GPU 2 (node 1) gets both, mems 1 and 3.
    plan = make_plan(topo("dgx_a100", "16-31,48-63,144-159,176-191"), 4, "socket")
    assert summary(plan)[2] == ("16-31,48-63,144-159,176-191", 1, "1,3")


# --- refusals ---------------------------------------------------------------------------------


def one_line(error: Exception) -> str:
    text = str(error)
    assert text and "\n" not in text
    return text


def test_unknown_mode_lists_valid_modes(topo: Reader) -> None:
    with pytest.raises(UsageError) as caught:
        make_plan(topo("dgx_h100"), 8, "numa")
    text = one_line(caught.value)
    assert "'numa'" in text
    assert all(mode in text for mode in MODES)


@pytest.mark.parametrize("nprocs", [0, -1])
def test_nprocs_below_one_is_usage_error(topo: Reader, nprocs: int) -> None:
    with pytest.raises(UsageError):
        make_plan(topo("dgx_h100"), nprocs, "node")


def test_more_ranks_than_gpus(topo: Reader) -> None:
    with pytest.raises(PlanError) as caught:
        make_plan(topo("smt_off"), 6, "node")
    assert one_line(caught.value) == (
        "6 ranks but 4 visible GPUs: use --nproc-per-node <= 4, --numa-binding cpu, "
        "or check CUDA_VISIBLE_DEVICES"
    )


@pytest.mark.parametrize("mode", GPU_MODES)
def test_gpu_modes_refuse_without_gpus(topo: Reader, mode: str) -> None:
    with pytest.raises(PlanError) as caught:
        make_plan(topo("no_gpus"), 1, mode)
    assert "no visible GPUs" in one_line(caught.value)


def test_crowded_node_refuses_exclusive(topo: Reader) -> None:
    with pytest.raises(PlanError) as caught:
        make_plan(topo("crowded_node"), 4, "exclusive")
    text = one_line(caught.value)
    assert "NUMA node 0" in text and "2 allowed physical cores" in text and "4 GPUs" in text


@pytest.mark.parametrize("mode", ["node", "exclusive", "core-complex"])
def test_gpu_node_excluded_by_cgroup_refuses(topo: Reader, mode: str) -> None:
    t = topo("dgx_h100", H100_N0)
    assert len(make_plan(t, 4, mode).ranks) == 4  # ranks on node 0 are fine
    with pytest.raises(PlanError) as caught:
        make_plan(t, 8, mode)
    text = one_line(caught.value)
    assert "GPU 4 (0000:9a:00.0)" in text and "NUMA node 1" in text


def test_socket_with_no_allowed_cpu_on_the_package_refuses(topo: Reader) -> None:
    with pytest.raises(PlanError) as caught:
        make_plan(topo("dgx_h100", H100_N0), 8, "socket")
    assert "package 1" in one_line(caught.value)


@pytest.mark.parametrize("mode", [*GPU_MODES, "cpu"])
def test_empty_allowed_set_refuses(topo: Reader, mode: str) -> None:
    empty = topo("dgx_h100").replace(allowed_cpus=())
    with pytest.raises(PlanError) as caught:
        make_plan(empty, 2, mode)
    assert "no allowed CPUs" in one_line(caught.value)


# --- allow_unbound ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "allowed", "nprocs", "mode", "reason"),
    [
        ("crowded_node", None, 4, "exclusive", "2 allowed physical cores"),
        ("no_gpus", None, 2, "node", "no visible GPUs"),
        ("dgx_h100", H100_N0, 8, "node", "NUMA node 1"),
        ("smt_off", None, 6, "socket", "6 ranks but 4 visible GPUs"),
        ("no_gpus", None, 17, "cpu", "16 allowed physical cores"),
    ],
)
def test_allow_unbound_falls_back_with_the_reason(
    topo: Reader, shape: str, allowed: str | None, nprocs: int, mode: str, reason: str
) -> None:
    t = topo(shape, allowed)
    with pytest.raises(PlanError):
        make_plan(t, nprocs, mode)
    plan = make_plan(t, nprocs, mode, allow_unbound=True)
    assert not plan.bound and plan.mode == mode
    assert len(plan.ranks) == nprocs
    for i, rank in enumerate(plan.ranks):
        assert rank.cpus == t.allowed_cpus and rank.mems == () and rank.numa_node is None
        assert rank.gpu == (i if i < len(t.gpus) else None)
    assert reason in plan.warnings[-1] and "disabled" in plan.warnings[-1]


def test_allow_unbound_never_swallows_usage_errors(topo: Reader) -> None:
    t = topo("dgx_h100")
    with pytest.raises(UsageError):
        make_plan(t, 8, "bogus", allow_unbound=True)
    with pytest.raises(UsageError):
        make_plan(t, 0, "node", allow_unbound=True)
    with pytest.raises(UsageError):
        make_plan(t, 2, "explicit", rank_cpus=[[0]], allow_unbound=True)


def test_no_mode_is_an_unbound_plan(topo: Reader) -> None:
    t = topo("smt_off")
    plan = make_plan(t, 6, None)
    assert not plan.bound and plan.mode == "none"
    assert [rank.gpu for rank in plan.ranks] == [0, 1, 2, 3, None, None]
    assert all(rank.cpus == cpus("0-31") and rank.mems == () for rank in plan.ranks)
    assert plan.warnings == t.warnings


def test_env_and_warnings_come_from_the_topology(topo: Reader) -> None:
    t = topo("dgx_h100").replace(
        gpu_env=(("CUDA_VISIBLE_DEVICES", "0,1"),),
        warnings=("from the reader",),
    )
    plan = make_plan(t, 2, "node")
    assert plan.env == (("CUDA_VISIBLE_DEVICES", "0,1"),)
    assert plan.warnings == ("from the reader",)
    unknown = topo("cloud_vm_unknown_numa").replace(warnings=("first",))
    warned = make_plan(unknown, 4, "node")
    assert warned.warnings[0] == "first" and "NUMA node unknown" in warned.warnings[1]


# --- cpu mode ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "nprocs", "expected"),
    [
        pytest.param(
            "no_gpus",
            4,
            [
                ("0-3,16-19", 0, "0"),
                ("4-7,20-23", 0, "0"),
                ("8-11,24-27", 1, "1"),
                ("12-15,28-31", 1, "1"),
            ],
            id="4-ranks-2-nodes-aligned",
        ),
        pytest.param(
            "no_gpus",
            3,
            [("0-5,16-21", 0, "0"), ("6-10,22-26", None, "0-1"), ("11-15,27-31", 1, "1")],
            id="3-ranks-one-unavoidable-straddle",
        ),
        pytest.param(
            # 2 cores on node 0, 8 on node 1: 3/3/2/2 would straddle; 2/3/3/2 does not.
            "crowded_node",
            4,
            [("0-1", 0, "0"), ("2-4", 1, "1"), ("5-7", 1, "1"), ("8-9", 1, "1")],
            id="extra-cores-move-to-avoid-a-straddle",
        ),
        pytest.param("interleaved", 2, [("0-62:2", 0, "0"), ("1-63:2", 1, "1")], id="interleaved"),
        pytest.param(
            "offline_cpus", 2, [("0-2,4-15", 0, "0"), ("16-19,21-31", 1, "1")], id="offline"
        ),
        pytest.param("grace_hopper", 3, [("0-23", 0, "0"), ("24-47", 0, "0"), ("48-71", 0, "0")]),
    ],
)
def test_cpu_mode_hand_checked(topo: Reader, shape: str, nprocs: int, expected: list) -> None:
    plan = make_plan(topo(shape), nprocs, "cpu")
    assert plan.bound and plan.mode == "cpu"
    assert summary(plan) == [(format_cpulist(cpus(c)), n, m) for c, n, m in expected]


def test_cpu_mode_gpus_for_ranks_that_have_one(topo: Reader) -> None:
    plan = make_plan(topo("dgx_h100"), 16, "cpu")
    assert [rank.gpu for rank in plan.ranks] == [*range(8), *[None] * 8]
    assert plan.ranks[0].pci_address == "0000:18:00.0" and plan.ranks[8].pci_address is None
    assert summary(plan)[0] == ("0-6,112-118", 0, "0")
    assert summary(plan)[15] == ("105-111,217-223", 1, "1")
    assert [rank.gpu for rank in make_plan(topo("no_gpus"), 2, "cpu").ranks] == [None, None]


def test_cpu_mode_more_ranks_than_cores_refuses(topo: Reader) -> None:
    with pytest.raises(PlanError) as caught:
        make_plan(topo("no_gpus"), 17, "cpu")
    assert "17 ranks but only 16 allowed physical cores" in one_line(caught.value)
    assert len(make_plan(topo("no_gpus"), 16, "cpu").ranks) == 16


# --- explicit ---------------------------------------------------------------------------------


def test_explicit_lists_derive_nodes(topo: Reader) -> None:
    plan = make_plan(topo("no_gpus"), 3, "explicit", rank_cpus=[[16, 0], [8, 9], [7, 10]])
    assert summary(plan) == [("0,16", 0, "0"), ("8-9", 1, "1"), ("7,10", None, "0-1")]
    assert [rank.threads for rank in plan.ranks] == [1, 2, 2]
    assert [rank.gpu for rank in plan.ranks] == [None, None, None]
    assert not plan.warnings


def test_explicit_with_gpus_and_shared_cpus_warns(topo: Reader) -> None:
    plan = make_plan(topo("smt_off"), 2, "explicit", rank_cpus=[[0, 1], [1, 2]])
    assert [rank.gpu for rank in plan.ranks] == [0, 1]
    assert any("ranks 0 and 1 share CPUs 1" in warning for warning in plan.warnings)


@pytest.mark.parametrize(
    ("rank_cpus", "nprocs", "error", "words"),
    [
        ([[0], [1]], 3, UsageError, "2 times for 3 ranks"),
        ([[0], []], 2, UsageError, "rank 1 is empty"),
        ([[0], [-1]], 2, UsageError, "rank 1"),
        ([[0], [1, 99, 100]], 2, PlanError, "rank 1: CPUs 99-100 are offline"),
        ([[3]], 1, PlanError, "rank 0: CPU 3 is offline"),
    ],
)
def test_explicit_errors_name_the_rank(
    topo: Reader, rank_cpus: list, nprocs: int, error: type, words: str
) -> None:
    # offline_cpus: CPU 3 is offline.
    with pytest.raises(error) as caught:
        make_plan(topo("offline_cpus"), nprocs, "explicit", rank_cpus=rank_cpus)
    assert words in one_line(caught.value)


def test_explicit_rejects_cpus_outside_the_allowed_set(topo: Reader) -> None:
    with pytest.raises(PlanError) as caught:
        make_plan(topo("dgx_h100", H100_N0), 1, "explicit", rank_cpus=[[0, 56]])
    assert "rank 0: CPU 56 is offline or not allowed" in one_line(caught.value)


def test_rank_cpus_only_with_explicit(topo: Reader) -> None:
    with pytest.raises(UsageError) as caught:
        make_plan(topo("no_gpus"), 1, "cpu", rank_cpus=[[0]])
    assert "explicit" in one_line(caught.value)
    with pytest.raises(UsageError):
        make_plan(topo("no_gpus"), 1, None, rank_cpus=[[0]])
    with pytest.raises(UsageError):
        make_plan(topo("no_gpus"), 1, "explicit")


# --- JSON and table ---------------------------------------------------------------------------


def test_json_contract(topo: Reader) -> None:
    t = topo("dgx_h100").replace(gpu_env=(("CUDA_VISIBLE_DEVICES", "0,1"),))
    data = plan_to_json(make_plan(t, 8, "exclusive"), t)
    assert json.loads(json.dumps(data)) == data
    assert list(data) == ["version", "mode", "bound", "ranks", "env", "warnings"]
    assert data["version"] == 1  # as the topology's JSON: a program can check the shape
    assert data["mode"] == "exclusive" and data["bound"] is True
    assert data["env"] == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert data["warnings"] == list(t.warnings)
    assert data["ranks"][0] == {
        "local_rank": 0,
        "gpu": 0,
        "numa_node": 0,
        "cpus": [*range(14), *range(112, 126)],
        "mems": [0],
        "threads": 14,
        "pci_address": "0000:18:00.0",
    }
    assert [rank["local_rank"] for rank in data["ranks"]] == list(range(8))


def test_json_sorts_ranks_and_cpus_and_fills_pci_from_topology(topo: Reader) -> None:
    t = topo("dgx_h100")
    hand_made = Plan(
        mode="explicit",
        ranks=(
            RankBinding(1, 1, None, (5, 3), (1, 0), 2),
            RankBinding(0, None, 0, (0,), (0,), 1),
        ),
    )
    data = plan_to_json(hand_made, t)
    assert [rank["local_rank"] for rank in data["ranks"]] == [0, 1]
    assert data["ranks"][1]["cpus"] == [3, 5] and data["ranks"][1]["mems"] == [0, 1]
    assert data["ranks"][1]["pci_address"] == "0000:2a:00.0"
    assert data["ranks"][0]["gpu"] is None and data["ranks"][0]["pci_address"] is None
    assert plan_to_json(hand_made)["ranks"][1]["pci_address"] is None


def test_table_is_aligned_with_ranges_and_warnings(topo: Reader) -> None:
    t = topo("cloud_vm_unknown_numa")
    lines = format_plan_table(make_plan(t, 4, "exclusive"), t).splitlines()
    assert lines[0] == "numa-binding: exclusive (bound)"
    header, rows = lines[1], lines[2:6]
    assert header.split() == ["rank", "gpu", "node", "cpus", "mems", "threads"]
    for column in ("gpu", "node", "cpus", "mems", "threads"):
        start = header.index(column)
        for row in rows:
            assert row[start - 2 : start] == "  " and row[start] != " "
    assert rows[0].split() == ["0", "0", "(0000:00:04.0)", "0", "0-7,16-23", "0", "8"]
    assert rows[3].split() == ["3", "3", "(0000:00:07.0)", "-", "8-15,24-31", "-", "8"]
    tail = lines[6:]
    assert [line for line in tail if not line.startswith("warning: ")] == [
        f"env: {key}={value}" for key, value in t.gpu_env
    ]
    assert any(line.startswith("warning: NUMA node unknown for GPU 2") for line in tail)


def test_table_marks_unbound_and_absent_gpus(topo: Reader) -> None:
    t = topo("no_gpus")
    text = format_plan_table(make_plan(t, 2, "node", allow_unbound=True), t)
    lines = text.splitlines()
    assert lines[0] == "numa-binding: node (NOT bound)"
    assert lines[2].split() == ["0", "-", "-", "0-31", "-", "16"]
    assert lines[-1].startswith("warning: NUMA binding (node) disabled")


# --- same CPUs as torch.numa.binding ----------------------------------------------------------


@pytest.fixture
def torch_on_fake_sysfs(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., set[int]]]:
    """``torch_cpus(root, machine, allowed, mode, gpu_index)``: what PyTorch 2.13's
    ``torch.numa.binding`` binds to, with its sysfs reads redirected under ``root``."""
    import torch.numa.binding as reference

    real_open, real_listdir = open, os.listdir

    def under(root: Path, path: object) -> object:
        text = os.fspath(path)  # type: ignore[arg-type]
        return f"{root}{text}" if text.startswith("/sys/") else path

    def torch_cpus(
        root: Path, machine: FakeMachine, allowed: set[int], mode: str, gpu_index: int
    ) -> set[int]:
        monkeypatch.setattr(
            reference, "open", lambda p, *a, **k: real_open(under(root, p), *a, **k), raising=False
        )
        monkeypatch.setattr(reference.os, "listdir", lambda p: real_listdir(under(root, p)))
        monkeypatch.setattr(reference, "_get_allowed_cpu_indices_for_current_thread", allowed.copy)
        monkeypatch.setattr(reference, "_get_gpu_count", lambda: len(machine.gpus))
        monkeypatch.setattr(
            reference,
            "_get_numa_node_index_for_gpu_index",
            lambda *, gpu_index: max(machine.gpus[gpu_index].numa_node, 0),
        )
        options = reference.NumaOptions(affinity_mode=reference.AffinityMode(mode))
        return reference._get_logical_cpus_to_bind_to(gpu_index=gpu_index, numa_options=options)

    yield torch_cpus


SAME_AS_TORCH = [
    ("dgx_h100", None),
    ("dgx_h100", H100_HALF),
    ("dgx_a100", None),
    ("dgx_a100", "0-50,60-127,128-178,188-255"),
    ("grace_hopper", None),
    ("grace_hopper_x2", None),
    ("smt_off", None),
    ("interleaved", None),
    ("interleaved", "0-20,32-63"),
    ("offline_cpus", None),
    ("uneven_cores", None),
    ("one_node_small", None),
]


@pytest.mark.parametrize(("shape", "allowed"), SAME_AS_TORCH)
def test_same_cpus_as_torch_numa_binding(
    topo: Reader,
    roots: Callable[[str], Path],
    torch_on_fake_sysfs: Callable[..., set[int]],
    shape: str,
    allowed: str | None,
) -> None:
    machine = SHAPES[shape]()
    t = topo(shape, allowed)
    # PyTorch's socket mode crashes on Grace Hopper (see the next test).
    modes = [mode for mode in GPU_MODES if mode != "socket" or "grace" not in shape]
    for mode in modes:
        plan = make_plan(t, len(t.gpus), mode)
        for rank in plan.ranks:
            expected = torch_on_fake_sysfs(
                roots(shape), machine, set(t.allowed_cpus), mode, rank.local_rank
            )
            assert set(rank.cpus) == expected, (mode, rank.local_rank)


@pytest.mark.parametrize("shape", ["grace_hopper", "grace_hopper_x2"])
def test_socket_survives_where_torch_crashes(
    topo: Reader,
    roots: Callable[[str], Path],
    torch_on_fake_sysfs: Callable[..., set[int]],
    shape: str,
) -> None:
    machine = SHAPES[shape]()
    t = topo(shape)
    with pytest.raises((ValueError, RuntimeError)):  # min() of a CPU-less node, or no cpulist
        torch_on_fake_sysfs(roots(shape), machine, set(t.allowed_cpus), "socket", 0)
    assert make_plan(t, len(t.gpus), "socket").ranks[0].cpus == cpus("0-71")


# --- properties -------------------------------------------------------------------------------

PROPERTY_SHAPES = ["dgx_a100", "interleaved", "offline_cpus", "uneven_cores", "no_gpus"]


@st.composite
def restricted(draw: st.DrawFn, topo: Reader) -> tuple[Topology, int]:
    """A shape with a random non-empty allowed subset, and a rank count of 1..8."""
    t = topo(draw(st.sampled_from(PROPERTY_SHAPES)))
    online = list(t.online_cpus)
    allowed = draw(st.sets(st.sampled_from(online), min_size=1, max_size=len(online)))
    return t.replace(allowed_cpus=tuple(sorted(allowed))), draw(st.integers(1, 8))


def check_disjoint_within_allowed(plan: Plan, t: Topology) -> None:
    seen: set[int] = set()
    for rank in plan.ranks:
        assert rank.cpus, rank
        assert set(rank.cpus) <= set(t.allowed_cpus)
        assert not seen & set(rank.cpus), rank
        seen |= set(rank.cpus)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_exclusive_and_cpu_modes_give_disjoint_allowed_cpus(topo: Reader, data: st.DataObject):
    t, nprocs = data.draw(restricted(topo))
    try:
        plan = make_plan(t, min(nprocs, len(t.gpus)) or 1, "exclusive")
    except PlanError:
        pass  # refusing is allowed (no GPUs, a node without allowed cores); wrong output is not
    else:
        check_disjoint_within_allowed(plan, t)
    core_of = {cpu.id: cpu.core for cpu in t.cpus}
    cores = {core_of[cpu] for cpu in t.allowed_cpus}
    if nprocs > len(cores):
        with pytest.raises(PlanError):
            make_plan(t, nprocs, "cpu")
        return
    plan = make_plan(t, nprocs, "cpu")
    check_disjoint_within_allowed(plan, t)
    assert set().union(*(rank.cpus for rank in plan.ranks)) == set(t.allowed_cpus)
    sizes = sorted(rank.threads for rank in plan.ranks)
    assert sizes[-1] - sizes[0] <= 1 and sum(sizes) == len(cores)


# --- issue 24 item 17: values without dataclasses --------------------------------------------


def test_the_machine_and_the_plan_are_immutable_values(topo: Reader) -> None:
    import copy
    import pickle

    t = topo("dgx_h100")
    plan = make_plan(t, 8, "exclusive")
    rank = plan.ranks[0]
    # Equal by class and fields, hashed alike, named fields in the repr: a frozen dataclass's.
    again = make_plan(t, 8, "exclusive")
    assert again == plan and hash(again) == hash(plan) and again is not plan
    assert rank.replace(threads=rank.threads + 1) != rank
    assert repr(rank).startswith(f"RankBinding(local_rank=0, gpu=0, numa_node={rank.numa_node}, ")
    for value, field in ((t, "root"), (plan, "mode"), (rank, "cpus"), (t.cpus[0], "id")):
        with pytest.raises(AttributeError, match="is immutable"):
            setattr(value, field, None)
        with pytest.raises(AttributeError, match="is immutable"):
            delattr(value, field)
        assert pickle.loads(pickle.dumps(value)) == value
        assert copy.deepcopy(value) == value
    moved = t.replace(root="/elsewhere")
    assert moved.root == "/elsewhere" and moved.cpus is t.cpus and t.root != "/elsewhere"
    with pytest.raises(TypeError, match="no field 'colour'"):
        rank.replace(colour="red")
    assert plan.as_dict()["ranks"] is plan.ranks


def test_planning_imports_neither_dataclasses_nor_tarfile(roots: Callable[[str], Path]) -> None:
    # Every command paid for them: creating 11 frozen dataclasses (and importing dataclasses,
    # inspect, typing) and tarfile for `numarun snapshot`, 12-16 ms over `plan --help`.
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "numarun", "plan", "--sysfs-root",
         str(roots("dgx_h100")), "--nproc-per-node", "8", "--numa-binding", "exclusive"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    bare = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "pass"], capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    # What the interpreter imports before numarun runs (a site-packages .pth may import
    # certifi, hence pathlib and typing) is not numarun's to answer for.
    at_start = _imported(bare.stderr)
    imported = _imported(done.stderr) - at_start
    assert "numarun.placement.plan" in imported
    assert imported & {"dataclasses", "inspect", "typing", "tarfile", "pathlib", "gzip"} == set()


def _imported(importtime: str) -> set[str]:
    return {
        line.split("|")[2].strip()
        for line in importtime.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }

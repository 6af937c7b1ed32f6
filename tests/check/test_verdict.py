"""numarun.check.verdict: each rank's verdict from its probe's results as a multi-node GPU
machine would give them, the JSON document and its versioned schema."""

from __future__ import annotations

import json
from typing import Any

from check_runs import TWO_CPUS, run_json
from numarun.check import verdict as report

# --- the report: verdicts and the JSON schema ----------------------------------------------------


def planned_rank(local_rank: int, home: int, gpu: int | None = None) -> dict[str, Any]:
    return {
        "local_rank": local_rank,
        "rank": local_rank,
        "cpus": [local_rank],
        "mems": [home],
        "policy": {"mode": "bind", "nodes": [home]},
        "home": home,
        "local_nodes": [home],
        "gpu": gpu,
        "pci_address": None if gpu is None else f"0000:{gpu:02x}:00.0",
    }


def probe_result(
    local_rank: int, home: int, far: int, *, pages_on: int | None = None, gpu: bool = False
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "local_rank": local_rank,
        "rank": local_rank,
        "pid": 100 + local_rank,
        "cpus": [local_rank],
        "cpus_at_end": [local_rank],
        "mem_policy": {"mode": "bind", "nodes": [home]},
        "mems_allowed": [0, 1],
        "pages": {
            "method": "move_pages",
            "nodes": {str(home if pages_on is None else pages_on): 9},
        },
        "home": home,
        "gpu": None,
        "memory_gbs": {"local": {"node": home, "gbs": 38.0}, "far": {"node": far, "gbs": 20.0}},
        "h2d_gbs": {},
        "d2h_gbs": {},
        "threads": 4,
        "not_measured": [],
        "late_phases": [],
    }
    if gpu:
        result["gpu"] = {"index": local_rank, "pci_address": f"0000:{local_rank:02x}:00.0",
                         "nvml_cpus": [0, 1, 2, 3]}  # fmt: skip
        result["h2d_gbs"] = {"planned": {"node": home, "gbs": 56.0},
                             "far": {"node": far, "gbs": 20.0}}  # fmt: skip
        result["d2h_gbs"] = {"planned": {"node": home, "gbs": 50.0}}
    return result


def two_node_document(results: list[dict[str, Any] | None]) -> dict[str, Any]:
    planned = [planned_rank(0, 0, 0), planned_rank(1, 1, 1)]
    phases = ["memory-local", "memory-far", "h2d-planned", "h2d-far", "d2h-planned", "d2h-far"]
    settings = {"nproc_per_node": 2, "numa_binding": "node", "mem_binding": "bind",
                "plan_bound": True, "seconds": 6.0, "buffer_mib": 256, "buffer_lowered": False,
                "dry_run": False}  # fmt: skip
    machine = {"numa_nodes": [0, 1], "cpu_memory_nodes": [0, 1], "gpus": 2, "torch": True}
    return report.build_document(
        settings, machine, planned, results, phases, {0: 1, 1: 0}, launch_code=0
    )


def test_a_two_node_gpu_machine_gives_the_issue_s_verdict() -> None:
    document = two_node_document([probe_result(0, 0, 1, gpu=True), probe_result(1, 1, 0, gpu=True)])
    assert document["exit_code"] == 0
    assert document["verdict"] == (
        "bound as planned: 2/2 ranks; memory local: 2/2; "
        "local/remote bandwidth 1.9x (76.0/40.0 GB/s); H2D planned/far 2.8x; "
        "D2H 100.0 GB/s, far not measured"
    )
    assert document["summary"]["h2d_gbs"] == {"planned": 112.0, "far": 40.0}
    assert [entry["gpu_as_planned"] for entry in document["ranks"]] == [True, True]
    assert [entry["gpu_local_by_nvml"] for entry in document["ranks"]] == [True, True]
    text = report.format_text(document)
    assert text.splitlines()[-1] == document["verdict"]
    assert "56.0/20.0" in text  # H2D planned/far of rank 0, side by side


def test_pages_on_another_node_are_not_local_and_do_not_decide_the_exit() -> None:
    document = two_node_document([probe_result(0, 0, 1, pages_on=1), probe_result(1, 1, 0)])
    assert [entry["memory_local"] for entry in document["ranks"]] == [False, True]
    assert document["exit_code"] == 0
    assert document["verdict"].startswith("bound as planned: 2/2 ranks; memory local: 1/2;")


def test_a_gpu_other_than_the_planned_one_is_reported() -> None:
    seen = probe_result(0, 0, 1, gpu=True)
    seen["gpu"]["pci_address"] = "0000:9a:00.0"
    seen["gpu"]["nvml_cpus"] = [56, 57]
    document = two_node_document([seen, None])
    first, second = document["ranks"]
    assert first["gpu_as_planned"] is False and first["gpu_local_by_nvml"] is False
    assert second["bound_as_planned"] is False and document["exit_code"] == 1
    assert "(sees another)" in report.format_text(document)


RANK_KEYS = {
    "local_rank", "rank", "pid", "planned", "actual", "cpus_as_planned", "policy_as_planned",
    "bound_as_planned", "memory_local", "gpu_as_planned", "gpu_local_by_nvml", "memory_gbs",
    "h2d_gbs", "d2h_gbs", "not_measured", "late_phases",
}  # fmt: skip


DOCUMENT_KEYS = {
    "schema", "exit_code", "dry_run", "settings", "machine", "phases", "far_of", "ranks",
    "summary", "not_measured", "verdict",
}  # fmt: skip


SUMMARY_KEYS = {
    "ranks", "bound_as_planned", "memory_local", "memory_local_unknown", "memory_gbs",
    "local_remote_ratio", "h2d_gbs", "h2d_planned_far_ratio", "d2h_gbs",
    "d2h_planned_far_ratio", "launch_exit_code",
}  # fmt: skip


PLANNED_KEYS = {
    "local_rank", "rank", "cpus", "mems", "policy", "home", "local_nodes", "gpu", "pci_address",
}  # fmt: skip


ACTUAL_KEYS = {
    "cpus", "cpus_at_end", "policy", "mems_allowed", "pages", "memory_nodes", "home", "gpu",
    "threads",
}  # fmt: skip


def check_schema(document: dict[str, Any]) -> None:
    assert document["schema"] == "numarun-check/1"
    assert set(document) == DOCUMENT_KEYS
    assert set(document["summary"]) == SUMMARY_KEYS
    for entry in document["ranks"]:
        assert set(entry) == RANK_KEYS
        assert set(entry["planned"]) == PLANNED_KEYS
        if entry["actual"] is not None:
            assert set(entry["actual"]) == ACTUAL_KEYS
        for key in ("memory_gbs", "h2d_gbs", "d2h_gbs"):
            for figure in entry[key].values():
                assert set(figure) == {"node", "gbs"} and figure["gbs"] > 0
    json.dumps(document)  # plain JSON types only


def test_the_json_schema_is_versioned_and_stable() -> None:
    check_schema(two_node_document([probe_result(0, 0, 1, gpu=True), None]))


@TWO_CPUS
def test_the_json_of_a_real_run_follows_the_schema() -> None:
    code, document, stderr = run_json("--numa-binding", "cpu", "--nproc-per-node", "2")
    assert code == 0, stderr
    check_schema(document)
    assert document["ranks"][1]["pid"] != document["ranks"][0]["pid"]


def test_a_failed_probe_job_fails_the_check_even_when_every_rank_was_bound() -> None:
    results = [probe_result(0, 0, 1), probe_result(1, 1, 0)]
    document = two_node_document(results)
    assert document["exit_code"] == 0
    planned = [entry["planned"] for entry in document["ranks"]]
    failed = report.build_document(
        document["settings"], document["machine"], planned, results, document["phases"],
        {0: 1, 1: 0}, launch_code=1,
    )  # fmt: skip
    assert failed["summary"]["bound_as_planned"] == 2 and failed["exit_code"] == 1
    assert failed["verdict"].endswith("; the probes' job failed (exit status 1)")


def test_the_header_says_a_list_of_nodes_and_a_count_of_gpus_in_words() -> None:
    document = two_node_document([probe_result(0, 0, 1, gpu=True), probe_result(1, 1, 0, gpu=True)])
    head = report.format_text(document).splitlines()[0]
    assert head.endswith("; NUMA nodes with CPUs and memory: nodes 0-1; 2 GPUs"), head
    assert head.startswith("numarun check: 2 ranks, ")
    document["settings"]["nproc_per_node"] = 1
    document["machine"].update(cpu_memory_nodes=[0], gpus=0)
    head = report.format_text(document).splitlines()[0]
    assert head.startswith("numarun check: 1 rank, ")
    assert head.endswith("; NUMA nodes with CPUs and memory: node 0; no GPUs"), head

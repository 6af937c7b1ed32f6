"""``numarun check``'s judgement: each rank's verdict, the JSON document and the text table. Pure.

A rank is *bound as planned* when the CPUs its probe read in its first statement are exactly
the planned ones and the memory policy in force is the planned one (the launcher's own when the
plan sets none); a rank without a result is not. Its memory is *local* when every page it
touched landed on its memory nodes (on its CPUs' nodes when it has none); unknown (None) when
the page locations could not be read. The exit status is 0 when every rank is bound as planned and
the probes' job succeeded, 1 otherwise; memory locality and bandwidth are reported, never judged.

The JSON document (``schema``: :data:`SCHEMA`; a field is added without changing it, a field
removed or changing meaning changes it) is::

    {"schema": "numarun-check/1", "exit_code": 0 | 1, "dry_run": bool,
     "settings": {nproc_per_node, numa_binding, mem_binding, plan_bound, seconds, buffer_mib,
                  buffer_lowered, dry_run},
     "machine": {numa_nodes, cpu_memory_nodes, gpus, torch},
     "phases": [...], "far_of": {"<node>": <node> | null},
     "ranks": [{local_rank, rank, pid,
                planned: {cpus, mems, policy: {mode, nodes}, home, local_nodes, gpu,
                          pci_address},
                actual: {cpus, cpus_at_end, policy, mems_allowed, pages: {method, nodes} |
                         {error}, memory_nodes, home, gpu, threads} | null,
                cpus_as_planned, policy_as_planned, bound_as_planned, memory_local,
                gpu_as_planned, gpu_local_by_nvml,
                memory_gbs: {local: {node, gbs}, far: {node, gbs}}, h2d_gbs, d2h_gbs,
                not_measured: [...], late_phases: [...]}],
     "summary": {ranks, bound_as_planned, memory_local, memory_gbs: {local, far},
                 local_remote_ratio, h2d_gbs: {planned, far}, h2d_planned_far_ratio,
                 d2h_gbs: {...}, d2h_planned_far_ratio, launch_exit_code},
     "not_measured": ["<what>: <why> (ranks ...)"],
     "verdict": "bound as planned: 2/2 ranks; memory local: 2/2; ..."}

Bandwidths are GB/s (10^9 bytes per second) of all ranks measuring at once: each rank's own
figure, and their sums in the summary; the ratios divide the sums over the ranks that measured
both sides.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from numarun.machine.cpulist import format_cpulist

SCHEMA = "numarun-check/1"


def rank_verdict(planned: Mapping[str, Any], actual: Mapping[str, Any] | None) -> dict[str, Any]:
    """One rank's entry of the document: ``planned`` against its probe's result (None: none
    came back)."""
    entry: dict[str, Any] = {
        "local_rank": planned["local_rank"],
        "rank": planned["rank"],
        "pid": None,
        "planned": dict(planned),
        "actual": None,
        "cpus_as_planned": False,
        "policy_as_planned": False,
        "bound_as_planned": False,
        "memory_local": None,
        "gpu_as_planned": None,
        "gpu_local_by_nvml": None,
        "memory_gbs": {},
        "h2d_gbs": {},
        "d2h_gbs": {},
        "not_measured": [],
        "late_phases": [],
    }
    if actual is None:
        entry["not_measured"].append("everything: the rank's probe left no result")
        return entry
    entry["pid"] = actual.get("pid")
    entry["actual"] = {
        "cpus": actual["cpus"],
        "cpus_at_end": actual.get("cpus_at_end"),
        "policy": actual.get("mem_policy"),
        "mems_allowed": actual.get("mems_allowed"),
        "pages": actual.get("pages"),
        "memory_nodes": _nodes_with_pages(actual.get("pages")),
        "home": actual.get("home"),
        "gpu": actual.get("gpu"),
        "threads": actual.get("threads"),
    }
    entry["cpus_as_planned"] = sorted(actual["cpus"]) == sorted(planned["cpus"])
    entry["policy_as_planned"] = _same_policy(planned["policy"], actual.get("mem_policy"))
    entry["bound_as_planned"] = entry["cpus_as_planned"] and entry["policy_as_planned"]
    entry["memory_local"] = _memory_local(planned["local_nodes"], actual.get("pages"))
    gpu = actual.get("gpu")
    if gpu is not None:
        seen = gpu.get("pci_address") or (gpu.get("cuda") or {}).get("pci_address")
        if seen and planned.get("pci_address"):
            entry["gpu_as_planned"] = seen == planned["pci_address"]
        if gpu.get("nvml_cpus"):
            entry["gpu_local_by_nvml"] = set(actual["cpus"]) <= set(gpu["nvml_cpus"])
    for key in ("memory_gbs", "h2d_gbs", "d2h_gbs"):
        entry[key] = dict(actual.get(key) or {})
    entry["not_measured"] = list(actual.get("not_measured") or [])
    entry["late_phases"] = list(actual.get("late_phases") or [])
    return entry


def _same_policy(planned: Mapping[str, Any] | None, actual: Mapping[str, Any] | None) -> bool:
    if not planned or not actual or "mode" not in planned or "mode" not in actual:
        return False
    return planned["mode"] == actual["mode"] and sorted(planned["nodes"]) == sorted(actual["nodes"])


def _nodes_with_pages(pages: Mapping[str, Any] | None) -> list[int] | None:
    """The nodes the rank's touched pages landed on; None when unknown."""
    if not pages or "nodes" not in pages:
        return None
    return sorted(int(node) for node, count in pages["nodes"].items() if int(node) >= 0 and count)


def _memory_local(local_nodes: Sequence[int], pages: Mapping[str, Any] | None) -> bool | None:
    placed = _nodes_with_pages(pages)
    if not placed:
        return None
    return set(placed) <= set(local_nodes)


def build_document(
    settings: Mapping[str, Any],
    machine: Mapping[str, Any],
    planned: Sequence[Mapping[str, Any]],
    results: Sequence[Mapping[str, Any] | None] | None,
    phases: Sequence[str],
    far_of: Mapping[int, int | None],
    *,
    launch_code: int | None = None,
) -> dict[str, Any]:
    """The whole report (see the module docstring). ``results`` is None for a dry run (nothing
    started: no verdicts, ``exit_code`` 0); otherwise one probe result (or None) per rank.
    ``launch_code`` is the launcher's exit status for the probes' job."""
    dry_run = results is None
    ranks = [rank_verdict(plan, None if dry_run else results[i]) for i, plan in enumerate(planned)]
    if dry_run:
        for entry in ranks:
            entry["not_measured"] = []
            entry["bound_as_planned"] = entry["cpus_as_planned"] = None
            entry["policy_as_planned"] = None
    summary = _summary(ranks, launch_code)
    document = {
        "schema": SCHEMA,
        "exit_code": 0,
        "dry_run": dry_run,
        "settings": dict(settings),
        "machine": dict(machine),
        "phases": list(phases),
        "far_of": {str(node): far for node, far in far_of.items()},
        "ranks": ranks,
        "summary": summary,
        "not_measured": [] if dry_run else _not_measured(ranks, machine, phases),
        "verdict": "",
    }
    if dry_run:
        document["verdict"] = f"dry run: {len(ranks)} ranks planned, nothing started"
        return document
    failed = launch_code not in (None, 0)
    document["exit_code"] = 0 if summary["bound_as_planned"] == len(ranks) and not failed else 1
    document["verdict"] = verdict_line(summary, document["not_measured"])
    return document


def _total(ranks: Sequence[Mapping[str, Any]], key: str, where: str) -> float | None:
    values = [r[key][where]["gbs"] for r in ranks if where in r[key]]
    return round(sum(values), 3) if values else None


def _ratio(ranks: Sequence[Mapping[str, Any]], key: str, near: str, far: str) -> float | None:
    both = [r[key] for r in ranks if near in r[key] and far in r[key]]
    top = sum(m[near]["gbs"] for m in both)
    bottom = sum(m[far]["gbs"] for m in both)
    return round(top / bottom, 3) if both and bottom > 0 else None


def _summary(ranks: Sequence[Mapping[str, Any]], launch_code: int | None) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "ranks": len(ranks),
        "bound_as_planned": sum(1 for r in ranks if r["bound_as_planned"]),
        "memory_local": sum(1 for r in ranks if r["memory_local"]),
        "memory_local_unknown": sum(1 for r in ranks if r["memory_local"] is None),
        "memory_gbs": {w: _total(ranks, "memory_gbs", w) for w in ("local", "far")},
        "local_remote_ratio": _ratio(ranks, "memory_gbs", "local", "far"),
        "launch_exit_code": launch_code,
    }
    for kind in ("h2d", "d2h"):
        key = f"{kind}_gbs"
        summary[key] = {w: _total(ranks, key, w) for w in ("planned", "far")}
        summary[f"{kind}_planned_far_ratio"] = _ratio(ranks, key, "planned", "far")
    return summary


def _not_measured(
    ranks: Sequence[Mapping[str, Any]], machine: Mapping[str, Any], phases: Sequence[str]
) -> list[str]:
    """Each reason something was not measured, once, naming the ranks it concerns; plus what
    no phase was planned for."""
    where: dict[str, list[int]] = {}
    for entry in ranks:
        for reason in entry["not_measured"]:
            where.setdefault(reason, []).append(entry["local_rank"])
        for phase in entry["late_phases"]:
            reason = f"{phase}: not concurrent (another rank was late to start it)"
            where.setdefault(reason, []).append(entry["local_rank"])
    lines = [f"{reason} (local ranks {format_cpulist(ids)})" for reason, ids in where.items()]
    if "memory-far" not in phases:
        lines.append("remote memory bandwidth: one NUMA node with CPUs and memory")
    if not any(p.startswith("h2d") for p in phases):
        if not machine.get("gpus"):
            lines.append("H2D/D2H bandwidth: no GPU visible")
        elif not any(r["planned"]["gpu"] is not None for r in ranks):
            lines.append("H2D/D2H bandwidth: no rank has a GPU")
        elif not machine.get("torch"):
            lines.append("H2D/D2H bandwidth: torch is not installed")
    return lines


def _why(not_measured: Sequence[str], what: str) -> str:
    for line in not_measured:
        if line.startswith(what):
            reason = line.partition(": ")[2]
            return reason.rpartition(" (local ranks")[0] or reason
    return "no rank measured it"


def _gbs(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def verdict_line(summary: Mapping[str, Any], not_measured: Sequence[str]) -> str:
    """The last line of the text form, e.g. ``bound as planned: 8/8 ranks; memory local: 8/8;
    local/remote bandwidth 1.9x (412.0/216.8 GB/s); H2D planned/far 2.8x``."""
    n = summary["ranks"]
    parts = [f"bound as planned: {summary['bound_as_planned']}/{n} ranks"]
    local = f"memory local: {summary['memory_local']}/{n}"
    if summary["memory_local_unknown"]:
        local += f" ({summary['memory_local_unknown']} unknown)"
    parts.append(local)
    memory = summary["memory_gbs"]
    if summary["local_remote_ratio"] is not None:
        parts.append(
            f"local/remote bandwidth {summary['local_remote_ratio']:.1f}x "
            f"({_gbs(memory['local'])}/{_gbs(memory['far'])} GB/s)"
        )
    elif memory["local"] is not None:
        why = _why(not_measured, "remote memory bandwidth")
        parts.append(f"local bandwidth {_gbs(memory['local'])} GB/s, remote not measured ({why})")
    else:
        parts.append("memory bandwidth not measured")
    for kind in ("h2d", "d2h"):
        ratio = summary[f"{kind}_planned_far_ratio"]
        label = kind.upper()
        if ratio is not None:
            parts.append(f"{label} planned/far {ratio:.1f}x")
        elif summary[f"{kind}_gbs"]["planned"] is not None:
            parts.append(
                f"{label} {_gbs(summary[f'{kind}_gbs']['planned'])} GB/s, far not measured"
            )
        elif kind == "h2d":
            parts.append(f"H2D/D2H not measured ({_why(not_measured, 'H2D/D2H bandwidth')})")
    if summary["launch_exit_code"]:
        parts.append(f"the probes' job failed (exit status {summary['launch_exit_code']})")
    return "; ".join(parts)


def format_text(document: Mapping[str, Any]) -> str:
    """The report for a person: a header, one row per rank, what was not measured, and the
    verdict as the last line. No trailing newline."""
    settings = document["settings"]
    machine = document["machine"]
    ranks = settings["nproc_per_node"]
    nodes = machine["cpu_memory_nodes"]
    gpus = machine["gpus"]
    lines = [
        f"numarun check: {ranks} rank{'s' if ranks != 1 else ''}, "
        f"--numa-binding {settings['numa_binding'] or 'none'}"
        + ("" if settings["plan_bound"] else " (unbound)")
        + f", --mem-binding {settings['mem_binding']}; "
        + (f"NUMA nodes with CPUs and memory: node{'s' if len(nodes) != 1 else ''} "
           f"{format_cpulist(nodes)}" if nodes else "no NUMA node with CPUs and memory")
        + f"; {gpus or 'no'} GPU{'s' if gpus != 1 else ''}"
    ]  # fmt: skip
    if not document["dry_run"]:
        buffer = f"{settings['buffer_mib']} MiB" + (
            " (lowered to fit memory)" if settings["buffer_lowered"] else ""
        )
        lines.append(
            f"measured {settings['seconds']:g} s, all ranks at once; copy buffers {buffer}"
        )
    gpus = any(r["planned"]["gpu"] is not None for r in document["ranks"])
    lines.append("")
    lines.extend(_plan_table(document) if document["dry_run"] else _table(document, gpus))
    if document["dry_run"]:
        lines.append("")
        lines.append(f"would measure, all ranks at once: {', '.join(document['phases'])}")
    if document["not_measured"]:
        lines.append("")
        lines.extend(f"not measured: {line}" for line in document["not_measured"])
    changed = [
        r["local_rank"]
        for r in document["ranks"]
        if r["actual"] and r["actual"]["cpus_at_end"] not in (None, r["actual"]["cpus"])
    ]
    if changed:
        lines.append(
            f"note: the CPUs of local ranks {format_cpulist(changed)} changed while the probe "
            "ran (something in the rank rebinds it: torch, OpenMP or a library)"
        )
    lines.append(document["verdict"])
    return "\n".join(lines)


def _table(document: Mapping[str, Any], gpus: bool) -> list[str]:
    far = "memory-far" in document["phases"]
    header = ["rank", "planned cpus", "actual cpus", "bound", "policy", "pages on", "local"]
    header += ["mem GB/s", *(["far GB/s"] if far else [])]
    if gpus:
        header += ["gpu", "H2D GB/s", "D2H GB/s"]
    rows = [header]
    for r in document["ranks"]:
        actual = r["actual"] or {}
        row = [
            str(r["local_rank"]),
            format_cpulist(r["planned"]["cpus"]) or "-",
            format_cpulist(actual["cpus"]) if actual else "-",
            _yes(r["bound_as_planned"]),
            _policy(actual.get("policy") if actual else r["planned"]["policy"]),
            _pages(actual.get("pages")),
            _yes(r["memory_local"]),
            _gbs(r["memory_gbs"].get("local", {}).get("gbs")),
        ]
        if far:
            row.append(_gbs(r["memory_gbs"].get("far", {}).get("gbs")))
        if gpus:
            row += [
                _gpu(r),
                _pair(r["h2d_gbs"]),
                _pair(r["d2h_gbs"]),
            ]
        rows.append(row)
    return _aligned(rows)


def _plan_table(document: Mapping[str, Any]) -> list[str]:
    """The dry run's rows: what each rank would be checked against, where it would measure."""
    far_of = document["far_of"]
    rows = [["rank", "gpu", "cpus", "mems", "policy", "home node", "far node"]]
    for r in document["ranks"]:
        planned = r["planned"]
        home = planned["home"]
        far = far_of.get(str(home)) if home is not None else None
        rows.append(
            [
                str(r["local_rank"]),
                _gpu(r),
                format_cpulist(planned["cpus"]) or "-",
                format_cpulist(planned["mems"]) or "-",
                _policy(planned["policy"]),
                "-" if home is None else str(home),
                "-" if far is None else str(far),
            ]
        )
    return _aligned(rows)


def _aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]


def _yes(value: bool | None) -> str:
    return "-" if value is None else "yes" if value else "NO"


def _policy(policy: Mapping[str, Any] | None) -> str:
    if not policy or "mode" not in policy:
        return "?"
    nodes = format_cpulist(policy["nodes"])
    return f"{policy['mode']}:{nodes}" if nodes else policy["mode"]


def _pages(pages: Mapping[str, Any] | None) -> str:
    if not pages or "nodes" not in pages:
        return "-"
    counts = {int(node): count for node, count in pages["nodes"].items() if int(node) >= 0}
    total = sum(counts.values())
    if not total:
        return "?"
    return ",".join(f"{node}:{100 * count // total}%" for node, count in sorted(counts.items()))


def _gpu(entry: Mapping[str, Any]) -> str:
    planned = entry["planned"]
    if planned["gpu"] is None:
        return "-"
    text = f"{planned['gpu']}"
    if planned.get("pci_address"):
        text += f" {planned['pci_address']}"
    if entry["gpu_as_planned"] is False:
        text += " (sees another)"
    return text


def _pair(values: Mapping[str, Any]) -> str:
    near = values.get("planned", {}).get("gbs")
    far = values.get("far", {}).get("gbs")
    if near is None and far is None:
        return "-"
    return f"{_gbs(near)}/{_gbs(far)}"

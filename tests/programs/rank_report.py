"""Test worker: report where and how it runs as one JSON line, first thing.

Prints {"rank", "local_rank", "cpus" (Cpus_allowed_list from /proc/self/status), "argv",
"env": the launcher-set variables, "mem": [mode, nodes] of the memory policy when
NUMARUN_TEST_MEMPOLICY is set} on stdout; with NUMARUN_TEST_REPORT_DIR set, also writes it
to <dir>/<RANK>.json (so tests can read it when output goes elsewhere).
"""

import json
import os
import sys

KEYS = (
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "OMP_NUM_THREADS",
)


def allowed_cpus() -> str:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Cpus_allowed_list:"):
                return line.split(":", 1)[1].strip()
    return ""


def mem_policy() -> list:
    if not os.environ.get("NUMARUN_TEST_MEMPOLICY"):
        return []
    from numarun.placement.binding import get_mem_policy

    mode, nodes = get_mem_policy()
    return [mode, list(nodes)]


report = {
    "mem": mem_policy(),
    "rank": int(os.environ["RANK"]),
    "local_rank": int(os.environ["LOCAL_RANK"]),
    "cpus": allowed_cpus(),
    "argv": sys.argv[1:],
    "env": {key: os.environ.get(key) for key in KEYS},
}
line = json.dumps(report)
# One write per line: print() under -u writes the text and the newline separately, and two
# ranks sharing the launcher's stdout could then merge their lines.
os.write(1, (line + "\n").encode())
out_dir = os.environ.get("NUMARUN_TEST_REPORT_DIR")
if out_dir:
    with open(os.path.join(out_dir, f"{report['rank']}.json"), "w") as out:
        out.write(line)

"""Record the flight-recorder fixtures of this folder from real gloo jobs (torch 2.13, one node):

    python tests/data/flight/record.py

Each case of ``tests/programs/flight_cases.py`` runs under numarun with ``--hang-timeout`` and
``--log-dir``; the dumps numarun keeps (``attempt_0/flight_recorder/comm_lib_trace_rank_<rank>``,
torch's pickle as each rank's helper sent it) are copied to ``<case>/``.

``skip-json/`` holds the JSON form (``_dump_fr_trace_json(True, False)``) of the ``skip`` case,
taken inside each rank by a thread four seconds into the hang, under torchrun (no numarun).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROGRAM = HERE.parents[1] / "programs" / "flight_cases.py"
CASES = {"skip": 4, "type": 3, "subgroup": 3, "raise": 3, "ddp": 2}
if sys.argv[1:]:
    CASES = {case: CASES[case] for case in sys.argv[1:]}


def main() -> int:
    for case, ranks in CASES.items():
        with tempfile.TemporaryDirectory() as logs:
            done = subprocess.run(
                [sys.executable, "-m", "numarun", "--nproc-per-node", str(ranks),
                 "--hang-timeout", "4", "--log-dir", logs, str(PROGRAM), "--case", case],
                check=False, capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            found = sorted(Path(logs).glob("*/attempt_0/flight_recorder"))
            if not found:
                print(f"{case}: no dumps kept\n{done.stderr[-3000:]}", file=sys.stderr)
                return 1
            target = HERE / case
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(found[0], target)
            print(case, sorted(path.name for path in target.iterdir()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Test worker: report what torchrun-compatible flags changed, then print lines to filter.

Prints one JSON line {"rank", "local_rank", "cuda" (CUDA_VISIBLE_DEVICES or null),
"master_addr", "argv"} on stdout, then "keep,this <rank>", "drop <rank>" and "other <rank>" on
stdout and "err keep <rank>" on stderr.
"""

import json
import os
import sys

report = {
    "rank": int(os.environ["RANK"]),
    "local_rank": os.environ["LOCAL_RANK"],
    "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "master_addr": os.environ["MASTER_ADDR"],
    "argv": sys.argv[1:],
}
rank = report["rank"]
os.write(1, (json.dumps(report) + "\n").encode())
os.write(1, f"keep,this {rank}\ndrop {rank}\nother {rank}\n".encode())
os.write(2, f"err keep {rank}\n".encode())

"""``--preload`` and CUDA on a GPU machine: no standby initialises CUDA; one that did is refused.

    python3 benchmarks/check_preload_cuda.py

With this checkout's numarun (``src/`` first on the path, installed or not) and the
interpreter's torch (with CUDA), three checks, each one line, ``ok`` or ``FAILED``:

1. :func:`numarun.worker.preload.cuda_initialised` in one process: False after ``import torch``
   and after ``torch.cuda.is_available()``; True after ``torch.cuda.init()`` and after a tensor
   on the GPU;
2. ``numarun --preload torch``: the worker's first line finds torch imported and CUDA not
   initialised, then it uses the GPU itself (the standby held no context);
3. ``numarun --preload <a module that calls torch.cuda.init()>``: one warning line saying so,
   and the worker runs cold (torch not imported at its first line) and uses the GPU.

Exit status 1 when a check failed (or no GPU is visible to torch).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get(
    "PYTHONPATH")]))}  # fmt: skip

IN_PROCESS = """\
import torch
from numarun.worker.preload import cuda_initialised
seen = [cuda_initialised()]
torch.cuda.is_available()
seen.append(cuda_initialised())
torch.cuda.init()
seen.append(cuda_initialised())
torch.zeros(1, device="cuda")
seen.append(cuda_initialised())
print(seen)
"""
WORKER = """\
import os, sys
loaded = "torch" in sys.modules
first = (loaded, loaded and sys.modules["torch"].cuda.is_initialized())
import torch
value = torch.ones(2, device="cuda").sum().item()
print("worker", os.environ["RANK"], first, value, flush=True)
"""
INIT_MODULE = "import torch\ntorch.cuda.init()\n"


def main() -> int:
    failed = 0

    def report(name: str, ok: bool, detail: str) -> None:
        nonlocal failed
        failed += not ok
        print(f"{'ok' if ok else 'FAILED'}: {name}: {detail}", flush=True)

    done = subprocess.run([sys.executable, "-c", IN_PROCESS], env=ENV, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    report("cuda_initialised() after import / is_available / init / a tensor",
           done.stdout.strip() == "[False, False, True, True]",
           done.stdout.strip() or done.stderr[-500:])  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "worker.py").write_text(WORKER)
        (folder / "initcuda.py").write_text(INIT_MODULE)
        env = {**ENV, "PYTHONPATH": f"{ENV['PYTHONPATH']}{os.pathsep}{folder}"}
        for name, module, first, warned in (
            ("--preload torch: warm, CUDA left to the worker", "torch", "(True, False)", False),
            ("--preload a module that initialises CUDA: refused, cold", "initcuda",
             "(False, False)", True),
        ):  # fmt: skip
            done = subprocess.run(
                [sys.executable, "-m", "numarun", "--nproc-per-node", "1", "--preload", module,
                 str(folder / "worker.py")],
                env=env, capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            warning = "initialised CUDA" in done.stderr
            ok = (
                done.returncode == 0
                and done.stdout.strip() == f"worker 0 {first} 2.0"
                and warning == warned
            )
            lines = [line for line in done.stderr.splitlines() if line.startswith("numarun")]
            report(name, ok, f"{done.stdout.strip()!r}; " + " | ".join(lines)[-600:])
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

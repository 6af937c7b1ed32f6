"""Write the example machines of README (``--sysfs-root /tmp/dgx-a100``) as snapshots.

    python3 examples/make_sysfs_examples.py [OUT_DIR]      # default: examples/sysfs

Each ``<name>.tar.gz`` is what ``numarun snapshot`` would save on that machine: the sysfs files
numarun reads, built from the fake machines of ``tests/sysfs_fixtures.py`` (needs pytest, as
the tests do). The output is byte-identical from run to run (fixed timestamps), so the
tracked archives change only when a machine does. Replay one with::

    mkdir -p /tmp/dgx-a100 && tar -xzf examples/sysfs/dgx-a100.tar.gz -C /tmp/dgx-a100
    numarun topo --sysfs-root /tmp/dgx-a100
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent / "src"))

import sysfs_fixtures  # noqa: E402
from numarun.machine.snapshot import snapshot  # noqa: E402

# Every entry's and the gzip header's timestamp: 2026-01-01T00:00:00Z, so that regenerating
# an unchanged machine rewrites the same bytes.
MTIME = 1767225600

# archive name -> the machine function in tests/sysfs_fixtures.py
EXAMPLES = {
    "dgx-a100": "dgx_a100",
    "dgx-h100": "dgx_h100",
    "grace-hopper": "grace_hopper",
    "amd-instinct": "amd_instinct",
}


def main(argv: list[str]) -> int:
    out_dir = Path(argv[0]) if argv else HERE / "sysfs"
    out_dir.mkdir(parents=True, exist_ok=True)
    # On tmpfs where there is one: a DGX tree is thousands of small files.
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(dir=shm) as scratch:
        for name, shape in EXAMPLES.items():
            machine = getattr(sysfs_fixtures, shape)()
            root = sysfs_fixtures.write_sysfs(machine, Path(scratch) / name)
            count = snapshot(root, out_dir / f"{name}.tar.gz", mtime=MTIME)
            print(f"wrote {out_dir / name}.tar.gz ({count} files)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

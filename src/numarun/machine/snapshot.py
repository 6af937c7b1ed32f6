"""``numarun snapshot``: the sysfs files :func:`numarun.machine.topology.read_topology` reads,
saved as a ``.tar.gz`` that ``--sysfs-root`` replays (a bug report's machine, the examples'
trees). Its own module so that ``tarfile`` and ``gzip`` load only for a snapshot, never on
the path every command takes."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
import time

from numarun.machine.topology import files_read

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path




def snapshot(
    root: str | Path, out_path: str | Path | io.BufferedIOBase, *, mtime: int | None = None
) -> int:
    """Write ``out_path`` (.tar.gz; or a binary file, closed at the end) holding exactly the
    sysfs files :func:`read_topology` reads.

    Paths in the archive are relative to ``root`` (``sys/devices/system/cpu/online``...), and
    every directory the reader lists is recorded with its entries, so ``read_topology`` of the
    extracted directory gives the same machine (with every online CPU allowed, as for any
    non-``/`` root). NVML is not consulted and visibility variables are ignored. Returns the
    number of files written. Raises :class:`TopologyError` when ``root`` is not a sysfs root.

    Every entry and the gzip header carry ``mtime`` (default: now), owner 0 and sorted paths,
    so the same tree and ``mtime`` give the same bytes (tracked example archives stay
    unchanged when regenerated).
    """
    dirs, files = files_read(root)
    entries: dict[str, bytes | None] = {}  # path -> file contents, None for a directory
    for rel, names in dirs.items():
        if names is None:
            continue
        _add_parents(entries, rel)
        entries[rel] = None
        for name in names:
            entries.setdefault(f"{rel}/{name}", None)
    for rel, text in files.items():
        if text is not None:
            _add_parents(entries, rel)
            entries[rel] = text.encode("ascii", errors="replace")
    stamp = int(time.time()) if mtime is None else mtime
    count = 0
    with (
        open(out_path, "wb") if isinstance(out_path, str | os.PathLike) else out_path as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=stamp) as packed,
        tarfile.open(fileobj=packed, mode="w", format=tarfile.PAX_FORMAT) as archive,
    ):
        for rel in sorted(entries):
            data = entries[rel]
            info = tarfile.TarInfo(rel)
            info.mtime = stamp
            if data is None:
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                archive.addfile(info)
            else:
                info.size = len(data)
                info.mode = 0o444
                archive.addfile(info, io.BytesIO(data))
                count += 1
    return count


def _add_parents(entries: dict[str, bytes | None], rel: str) -> None:
    parts = rel.split("/")
    for i in range(1, len(parts)):
        entries.setdefault("/".join(parts[:i]), None)

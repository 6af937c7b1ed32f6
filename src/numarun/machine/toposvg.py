"""The machine as a picture: nested boxes in SVG (``numarun topo --svg FILE``).

Packages side by side (stacked when that would be too wide), each holding its NUMA nodes (with
their memory), each node its L3 complexes, each complex its cores, each core its SMT threads
(one small box per logical CPU, labelled with its id); the node's GPUs and NICs sit under its
complexes with their PCI addresses. Memory-only nodes, offline nodes and devices whose node is
unknown follow the packages. A CPU this process may not use is hatched.

:func:`topology_svg` takes optional colours per CPU and per GPU and a legend, which is how
:mod:`numarun.placement.plansvg` shows a plan's ranks on the same drawing; this module knows
nothing of ranks. Pure: text in, text out, standard library only. Every name from sysfs is
XML-escaped (a tree may come from anyone).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from numarun.machine.cpulist import format_cpulist
from numarun.machine.model import Core, Gpu, Nic, NumaNode, Topology
from numarun.machine.topology import printable

PU_W, PU_H = 26, 16  # one logical CPU
GAP, PAD, HEAD = 2, 6, 18  # between boxes, inside a box, a box's title line
DEVICE_W, DEVICE_H = 156, 32
MAX_ROW = 1200  # wider than this, packages are stacked and boxes wrap
CHAR_W = 7.6  # a bold title character at 12 px, for sizing boxes to their titles

_FILL = {
    "machine": "#ffffff",
    "package": "#eef1f6",
    "node": "#fdf6e3",
    "memory": "#f3eefb",
    "l3": "#e8f1e4",
    "core": "#ffffff",
    "gpu": "#dfe9f7",
    "nic": "#eeeeee",
    "cpu": "#fafafa",
}


class _Box:
    """A drawn box: its size and its SVG elements in its own coordinates (0, 0 top left)."""

    def __init__(self, width: float, height: float, parts: list[str]) -> None:
        self.width = width
        self.height = height
        self.parts = parts

    def at(self, x: float, y: float) -> str:
        return f'<g transform="translate({x:g},{y:g})">' + "".join(self.parts) + "</g>"


def topology_svg(
    topo: Topology,
    *,
    title: str | None = None,
    cpu_colours: Mapping[int, str] | None = None,
    cpu_notes: Mapping[int, str] | None = None,
    gpu_colours: Mapping[str, str] | None = None,
    legend: Sequence[tuple[str, str]] = (),
) -> str:
    """``topo`` as an SVG document (a complete file's text, ending in a newline).

    ``cpu_colours`` (CPU id -> CSS colour) fills those CPUs' boxes, ``cpu_notes`` (CPU id ->
    text) adds to their tooltips, ``gpu_colours`` (PCI address -> colour) fills those GPUs'
    boxes, and ``legend`` (colour, text) pairs are drawn as swatches under the machine. Every
    box has a tooltip (``<title>``) with its details. Sizes grow with the machine (about
    1000 x 500 px for 2 packages of 112 CPUs and 8 GPUs); any browser shows it.
    """
    drawer = _Drawer(topo, cpu_colours or {}, cpu_notes or {}, gpu_colours or {})
    offline = [node.id for node in topo.nodes if not node.online]
    notes = []
    if offline:
        notes.append(f"possible but offline NUMA nodes (no CPUs, no memory): "
                     f"{format_cpulist(offline)}")  # fmt: skip
    if drawer.allowed != set(topo.online_cpus):
        notes.append(f"hatched: CPUs this process may not use (allowed: "
                     f"{format_cpulist(topo.allowed_cpus)})")  # fmt: skip
    heading = title or _summary(topo)
    body = _pack(drawer.sections(), "machine", heading, head=None, pad=0, columns=1, border=False)
    return _document(heading, body, notes, _legend(legend))


class _Drawer:
    """The boxes of one machine, from a CPU up to a package, with the caller's colours."""

    def __init__(
        self,
        topo: Topology,
        cpu_colours: Mapping[int, str],
        cpu_notes: Mapping[int, str],
        gpu_colours: Mapping[str, str],
    ) -> None:
        self.topo = topo
        self.colours = cpu_colours
        self.notes = cpu_notes
        self.gpu_fill = gpu_colours
        self.visible = {gpu.pci_address: gpu.index for gpu in topo.gpus}
        self.allowed = set(topo.allowed_cpus)
        self.nodes = {node.id: node for node in topo.nodes}
        self.cache_of = {group.id: group for group in topo.caches}

    def sections(self) -> list[_Box]:
        """The packages, then the memory-only nodes and the devices of no known node."""
        topo = self.topo
        top = [self.package_box(p.id, p.nodes) for p in topo.packages]
        side_by_side = sum(box.width for box in top) + GAP * len(top) <= MAX_ROW
        packages = _pack(top, "machine", "packages", head=None, pad=0,
                         columns=len(top) if side_by_side else 1, border=False)  # fmt: skip
        sections = [packages]
        memory_only = [node for node in topo.nodes if node.online and not node.cpus]
        if memory_only:
            boxes = [self.node_box(node) for node in memory_only]
            sections.append(_pack(boxes, "memory", "memory-only NUMA nodes",
                                  head="Memory-only NUMA nodes (no CPUs)", wrap=True))  # fmt: skip
        homeless = self.devices(None)
        if homeless:
            sections.append(_pack(homeless, "package", "devices whose NUMA node is unknown",
                                  head="NUMA node unknown (local to every allowed CPU)",
                                  wrap=True))  # fmt: skip
        return sections

    def cpu_box(self, cpu: int, core: Core) -> _Box:
        allowed = cpu in self.allowed
        fill = self.colours.get(cpu, _FILL["cpu"] if allowed else "url(#not-allowed)")
        tip = f"CPU {cpu}, core {core.id}, L3 {core.cache}, node {_maybe(core.node)}"
        if not allowed:
            tip += ", not allowed for this process"
        if cpu in self.notes:
            tip += f"; {self.notes[cpu]}"
        parts = [
            _rect(0, 0, PU_W, PU_H, fill, tip, stroke="#777", radius=2),
            _text(PU_W / 2, PU_H - 4, str(cpu), size=9, anchor="middle", mono=True),
        ]
        return _Box(PU_W, PU_H, parts)

    def core_box(self, core: Core) -> _Box:
        cpus = [self.cpu_box(cpu, core) for cpu in core.cpus]
        return _pack(cpus, "core", f"core {core.id}: CPUs {format_cpulist(core.cpus)}",
                     head=None, pad=2, columns=len(cpus))  # fmt: skip

    def l3_box(self, cache: int, cores: list[Core]) -> _Box:
        group = self.cache_of.get(cache)
        level = f"L{group.level}" if group is not None and group.level else "complex"
        size = _size(group.size_bytes) if group is not None else ""
        label = f"{level} {size}".strip()
        columns = min(len(cores), 8 if len(cores) > 16 else 4)
        cpus = sorted(cpu for core in cores for cpu in core.cpus)
        tip = f"{label}: {len(cores)} cores, CPUs {format_cpulist(cpus)}"
        boxes = [self.core_box(core) for core in cores]
        return _pack(boxes, "l3", tip, head=label, columns=columns)

    def gpu_box(self, gpu: Gpu) -> _Box:
        index = self.visible.get(gpu.pci_address)
        name = f"GPU {index}" if index is not None else "GPU (hidden)"
        fill = self.gpu_fill.get(gpu.pci_address, _FILL["gpu"])
        tip = f"{name}: {gpu.vendor} {gpu.name or ''} PCI {gpu.pci_address}, PCI index " \
              f"{gpu.pci_index}, NUMA node {_maybe(gpu.numa_node)}"  # fmt: skip
        return _device_box(f"{name} {gpu.vendor}", gpu.pci_address, fill, tip)

    def devices(self, node: int | None) -> list[_Box]:
        topo = self.topo
        boxes = [self.gpu_box(gpu) for gpu in topo.all_gpus if gpu.numa_node == node]
        return boxes + [_nic_box(nic) for nic in topo.nics if nic.numa_node == node]

    def node_box(self, node: NumaNode) -> _Box:
        cores = [core for core in self.topo.cores if core.node == node.id]
        by_cache: dict[int, list[Core]] = {}
        for core in cores:
            by_cache.setdefault(core.cache, []).append(core)
        inner = [self.l3_box(cache, members) for cache, members in sorted(by_cache.items())]
        inner += self.devices(node.id)
        kind = "node" if node.cpus else "memory"
        head = f"NUMA node {node.id}: {_memory(node.memory_bytes)}"
        if node.cpus:
            head += f", {len(cores)} cores, CPUs {format_cpulist(node.cpus)}"
        tip = head + (f", package {node.package}" if node.package is not None else "")
        return _pack(inner, kind, tip, head=head, wrap=True)

    def package_box(self, package_id: int, node_ids: Sequence[int]) -> _Box:
        boxes = [self.node_box(self.nodes[n]) for n in node_ids]
        count = sum(len(self.nodes[n].cpus) for n in node_ids)
        head = f"Package {package_id}: {count} CPUs"
        return _pack(boxes, "package", head, head=head, columns=1)


def _device_box(text: str, address: str, fill: str, tip: str) -> _Box:
    parts = [
        _rect(0, 0, DEVICE_W, DEVICE_H, fill, tip, stroke="#557", radius=3),
        _text(6, 13, _clip(text, 22), size=11, bold=True),
        _text(6, 26, address, size=10, mono=True),
    ]
    return _Box(DEVICE_W, DEVICE_H, parts)


def _nic_box(nic: Nic) -> _Box:
    names = " ".join(nic.names) or "(no interface)"
    tip = f"NIC {names}: {nic.kind}, PCI {nic.pci_address}, NUMA node {_maybe(nic.numa_node)}"
    return _device_box(f"NIC {names}", nic.pci_address, _FILL["nic"], tip)


def _document(heading: str, body: _Box, notes: Sequence[str], legend_box: _Box | None) -> str:
    """The SVG file: ``heading``, the machine's ``body``, ``notes`` lines, the legend."""
    lines_width = max([CHAR_W * 1.3 * len(heading)] + [CHAR_W * len(line) for line in notes])
    width = max(body.width, legend_box.width if legend_box else 0, lines_width) + 2 * 12
    y = 12 + 24
    parts = [_text(12, 24, heading, size=15, bold=True), body.at(12, y)]
    y += body.height + 8
    for line in notes:
        parts.append(_text(12, y + 12, line, size=12))
        y += 18
    if legend_box is not None:
        parts.append(legend_box.at(12, y + 4))
        y += legend_box.height + 8
    height = y + 12
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:g}" height="{height:g}" '
        f'viewBox="0 0 {width:g} {height:g}" font-family="DejaVu Sans, Arial, sans-serif">\n'
        "<defs><pattern id=\"not-allowed\" width=\"6\" height=\"6\" "
        "patternUnits=\"userSpaceOnUse\" patternTransform=\"rotate(45)\">"
        '<rect width="6" height="6" fill="#dddddd"/>'
        '<line x1="0" y1="0" x2="0" y2="6" stroke="#aaaaaa" stroke-width="3"/></pattern></defs>\n'
        f'<rect width="100%" height="100%" fill="{_FILL["machine"]}"/>\n'
        + "\n".join(parts)
        + "\n</svg>\n"
    )


def _pack(
    boxes: Sequence[_Box],
    kind: str,
    tip: str,
    *,
    head: str | None,
    columns: int | None = None,
    wrap: bool = False,
    pad: float = PAD,
    border: bool = True,
) -> _Box:
    """``boxes`` in a grid of ``columns`` (or, with ``wrap``, rows filled up to
    :data:`MAX_ROW`), inside a box of ``kind``'s colour with ``head`` as its title."""
    top = pad + (HEAD if head else 0)
    positions: list[tuple[float, float]] = []
    x = y = 0.0
    row_height = 0.0
    width = 0.0
    for i, box in enumerate(boxes):
        new_row = (
            (columns is not None and i and i % columns == 0)
            or (wrap and x and x + box.width > MAX_ROW)
        )
        if new_row:
            x, y = 0.0, y + row_height + GAP * 2
            row_height = 0.0
        positions.append((x, y))
        x += box.width + GAP * 2
        row_height = max(row_height, box.height)
        width = max(width, x - GAP * 2)
    inner_height = y + row_height
    title_width = CHAR_W * len(head) if head else 0
    outer_w = max(width, title_width) + 2 * pad
    outer_h = top + inner_height + pad
    parts = []
    if border:
        parts.append(_rect(0, 0, outer_w, outer_h, _FILL[kind], tip, stroke="#888", radius=4))
    if head:
        parts.append(_text(pad, pad + 11, head, size=12, bold=kind in ("package", "node")))
    parts += [box.at(pad + bx, top + by) for box, (bx, by) in zip(boxes, positions, strict=True)]
    return _Box(outer_w, outer_h, parts)


def _legend(items: Sequence[tuple[str, str]]) -> _Box | None:
    if not items:
        return None
    longest = max(len(text) for _, text in items)
    cell = 22 + CHAR_W * longest + 18
    columns = max(1, int(MAX_ROW // cell))
    parts = [_text(0, 12, "Legend", size=12, bold=True)]
    for i, (colour, text) in enumerate(items):
        x = (i % columns) * cell
        y = 20 + (i // columns) * 20
        parts.append(_rect(x, y, 16, 14, colour, text, stroke="#555", radius=2))
        parts.append(_text(x + 22, y + 11, text, size=12))
    rows = (len(items) + columns - 1) // columns
    return _Box(min(len(items), columns) * cell, 20 + rows * 20, parts)


def _summary(topo: Topology) -> str:
    gpus = f", {len(topo.gpus)} GPU{'s' if len(topo.gpus) != 1 else ''}" if topo.gpus else ""
    return (
        f"{len(topo.packages)} package{'s' if len(topo.packages) != 1 else ''}, "
        f"{len(topo.nodes)} NUMA node{'s' if len(topo.nodes) != 1 else ''}, "
        f"{len(topo.online_cpus)} CPUs on {len(topo.cores)} cores{gpus}"
    )


def _rect(
    x: float, y: float, w: float, h: float, fill: str, tip: str, *, stroke: str, radius: float
) -> str:
    return (
        f'<rect x="{x:g}" y="{y:g}" width="{w:g}" height="{h:g}" rx="{radius:g}" '
        f'fill="{_escape(fill)}" stroke="{stroke}"><title>{_escape(tip)}</title></rect>'
    )


def _text(
    x: float,
    y: float,
    text: str,
    *,
    size: int,
    bold: bool = False,
    anchor: str = "start",
    mono: bool = False,
) -> str:
    weight = ' font-weight="bold"' if bold else ""
    family = ' font-family="DejaVu Sans Mono, monospace"' if mono else ""
    return (
        f'<text x="{x:g}" y="{y:g}" font-size="{size}" text-anchor="{anchor}"{weight}{family}>'
        f"{_escape(text)}</text>"
    )


def _escape(text: str) -> str:
    """``text`` as XML character data or an attribute value: markup characters as entities,
    and every character that is not printable (control characters, which XML 1.0 cannot hold
    at all, lone surrogates from undecodable file names) as a visible escape
    (:func:`numarun.machine.topology.printable`), so a name from a hostile tree still gives a
    well-formed file."""
    return (
        printable(text)
        .replace("&", "&amp;")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace('"', "&quot;")
    )


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _maybe(value: int | None) -> str:
    return "unknown" if value is None else str(value)


def _memory(size: int) -> str:
    return f"{size / (1 << 30):.1f} GiB" if size else "no memory"


def _size(size: int | None) -> str:
    if not size:
        return ""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift:
            return f"{size / (1 << shift):g} {unit}"
    return f"{size} B"

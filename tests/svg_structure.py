"""Reading numarun's SVG pictures as a structure: boxes nested in boxes, each with its tooltip,
for the tests of the machine's picture and of a plan's."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

SVG = "{http://www.w3.org/2000/svg}"
def svg_tree(text: str) -> tuple[ET.Element, dict[ET.Element, ET.Element]]:
    root = ET.fromstring(text)
    parents = {child: parent for parent in root.iter() for child in parent}
    return root, parents


def tooltip(rect: ET.Element) -> str:
    title = rect.find(f"{SVG}title")
    return "" if title is None else title.text or ""


def boxes_around(rect: ET.Element, parents: dict[ET.Element, ET.Element]) -> list[str]:
    """The tooltips of the boxes enclosing ``rect``, innermost first: each box is a group
    whose first element is its rectangle."""
    found = []
    node = parents.get(rect)
    while node is not None:
        if node.tag == f"{SVG}g":
            first = next(iter(node), None)
            if first is not None and first.tag == f"{SVG}rect" and first is not rect:
                found.append(tooltip(first))
        node = parents.get(node)
    return found


def cpu_rects(root: ET.Element) -> dict[int, ET.Element]:
    rects = {}
    for rect in root.iter(f"{SVG}rect"):
        match = re.match(r"CPU (\d+), ", tooltip(rect))
        if match:
            rects[int(match[1])] = rect
    return rects

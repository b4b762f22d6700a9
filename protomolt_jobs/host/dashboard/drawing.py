"""The job page's drawing of a workflow: an inline SVG rendered on the server.

Built from get-job's ``graph`` document through :mod:`protomolt_jobs.host.job_graph` (its
layered layout): steps flow left to right, one column per layer. Each step is a ``<g
class="node state-<state>" data-step=... data-state=...>`` box with its name, its state and
its attempts, duration and loop iterations; a ``<title>`` (the browser's hover text) holds the
whole name, the state, the skip or failure reason and the condition. The step in flight also
has the class ``in-flight``. Each edge is a ``<g class="edge edge-<kind>" data-kind=...
data-from=... data-to=...>`` path, coloured and dashed by its kind, with an arrow, a label
for every kind but ``success`` and a ``<title>``; a long edge bends through the slots the
layout gave it, a loop arcs back under the steps.

The SVG is built with :mod:`xml.etree.ElementTree`, which escapes every text and attribute, so
a step named ``<b>`` is drawn as the text ``<b>``; characters XML cannot hold (controls) are
shown as U+FFFD. Nothing is fetched and nothing runs in the browser.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

from markupsafe import Markup

from protomolt_jobs.host.job_graph import (
    EDGE_KINDS,
    STATES,
    Graph,
    Layout,
    Slot,
    Step,
    edge_kind,
    format_ms,
    layout,
    read_graph,
)

__all__ = ["install", "svg"]

#: A step's box, in SVG pixels.
NODE_W, NODE_H = 176, 58
#: Between two columns (layers) and between two boxes of a column.
GAP_X, GAP_Y = 120, 22
#: The height a long edge's dummy slot takes in its column.
DUMMY_H = 12
MARGIN = 16
#: Below the steps for every loop arc.
LOOP_ROOM = 18
#: Characters of a name, a label, a reason shown in the box or on the edge (the rest: hover).
NAME_CHARS, LABEL_CHARS = 22, 16
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _clean(text: str) -> str:
    """``text`` with the characters XML cannot hold replaced."""
    return _NOT_XML.sub("\ufffd", text)


def _cut(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: chars - 1] + "\u2026"


def _sub(parent: ET.Element, tag: str, text: str = "", **attrs: Any) -> ET.Element:
    element = ET.SubElement(
        parent,
        tag,
        {k.rstrip("_").replace("_", "-"): str(v) for k, v in attrs.items() if v != ""},
    )
    if text:
        element.text = _clean(text)
    return element


def _facts(step: Step) -> str:
    """The box's third line: attempts, duration, loop iterations."""
    parts = []
    if step.attempts is not None:
        parts.append(f"{step.attempts} attempt{'s' if step.attempts != 1 else ''}")
    if step.duration_ms is not None:
        parts.append(format_ms(step.duration_ms))
    if step.iterations:
        parts.append(f"{step.iterations} iterations")
    return " \u00b7 ".join(parts)


def _hover(step: Step) -> str:
    lines = [step.name, f"state: {step.state}"]
    if step.reason:
        lines.append(f"reason: {step.reason}")
    if step.decision:
        lines.append(f"decided: {step.decision}")
    if step.when:
        lines.append(f"when: {step.when}")
    if step.completion:
        lines.append(f"completion: {step.completion}")
    if step.compensation:
        lines.append("a compensation step: runs only to undo")
    facts = _facts(step)
    if facts:
        lines.append(facts)
    return "\n".join(lines)


def _positions(
    plan: Layout, pad_x: float
) -> tuple[dict[Slot, tuple[float, float, float]], float, float]:
    """Each slot's ``(x, y, height)`` (its box's top left) and the drawing's width and height
    (the steps only: loops add their room below); ``pad_x`` more on the left and the right
    (the loops' outer gutters)."""
    heights = [
        sum(DUMMY_H if s.dummy else NODE_H for s in layer) + GAP_Y * max(len(layer) - 1, 0)
        for layer in plan.layers
    ]
    tallest = max(heights, default=0)
    boxes: dict[Slot, tuple[float, float, float]] = {}
    for r, layer in enumerate(plan.layers):
        x = MARGIN + pad_x + r * (NODE_W + GAP_X)
        y = MARGIN + (tallest - heights[r]) / 2
        for slot in layer:
            h = DUMMY_H if slot.dummy else NODE_H
            boxes[slot] = (x, y, h)
            y += h + GAP_Y
    width = (MARGIN + pad_x) * 2 + len(plan.layers) * NODE_W + GAP_X * max(len(plan.layers) - 1, 0)
    return boxes, width, MARGIN * 2 + tallest


def _forward_path(route: list[Slot], boxes: dict[Slot, tuple[float, float, float]]) -> str:
    """A smooth path from the source box's right side through the dummies to the target
    box's left side."""
    points: list[tuple[float, float, float]] = []  # (x in, x out, y)
    for slot in route:
        x, y, h = boxes[slot]
        points.append((x, x + NODE_W, y + h / 2))
    _, x0, y0 = points[0]
    d = [f"M{x0:.1f},{y0:.1f}"]
    for k in range(1, len(points)):
        x_in, x_out, y = points[k]
        _, px, py = points[k - 1]
        mid = (px + x_in) / 2
        d.append(f"C{mid:.1f},{py:.1f} {mid:.1f},{y:.1f} {x_in:.1f},{y:.1f}")
        if k < len(points) - 1:  # a dummy: run straight across its column
            d.append(f"L{x_out:.1f},{y:.1f}")
    return " ".join(d)


def _label_point(route: list[Slot], boxes: dict[Slot, tuple[float, float, float]]) -> tuple:
    """Where a forward edge's label sits: halfway along its first gap."""
    x0, y0, h0 = boxes[route[0]]
    x1, y1, h1 = boxes[route[1]]
    return (x0 + NODE_W + x1) / 2, (y0 + h0 / 2 + y1 + h1 / 2) / 2


def svg(doc: Any) -> Markup:
    """The SVG drawing of get-job's ``graph`` document ``doc``; empty when ``doc`` is not one
    or has no step.

    :returns: markup to place in the page as it is (every text in it is escaped).
    """
    graph = read_graph(doc)
    if graph is None or not graph.steps:
        return Markup("")
    return Markup(ET.tostring(_drawing(graph), encoding="unicode"))


def _drawing(graph: Graph) -> ET.Element:
    plan = layout(graph)
    loops = sorted(plan.back)
    boxes, width, height = _positions(plan, GAP_X / 2 if loops else 0)
    placed: list[tuple[float, float, float, float]] = []  # the labels' boxes so far
    total_h = height + LOOP_ROOM * len(loops) + (8 if loops else 0)
    root = ET.Element(
        "svg",
        {
            "xmlns": "http://www.w3.org/2000/svg",
            "class": f"workflow-graph graph-{graph.kind}",
            "id": "graph-svg",
            "width": f"{width:.0f}",
            "height": f"{total_h:.0f}",
            "viewBox": f"0 0 {width:.0f} {total_h:.0f}",
            "role": "img",
            "font-family": "system-ui, sans-serif",
            "font-size": "12",
        },
    )
    _sub(root, "title", f"the steps of this {graph.kind} workflow and the edges between them")
    defs = _sub(root, "defs")
    kinds = {e.kind for e in graph.edges}
    for name in list(EDGE_KINDS) + sorted(kinds - set(EDGE_KINDS)):
        kind = edge_kind(name)
        marker = _sub(
            defs,
            "marker",
            id=f"arrow-{_css(name)}",
            viewBox="0 0 10 10",
            refX="9",
            refY="5",
            markerWidth="7",
            markerHeight="7",
            orient="auto-start-reverse",
        )
        _sub(marker, "path", d="M0,0 L10,5 L0,10 z", fill=kind.colour)
    edges = _sub(root, "g", class_="edges")
    for i, edge in enumerate(graph.edges):
        kind = edge_kind(edge.kind)
        group = _sub(
            edges,
            "g",
            class_=f"edge edge-{_css(edge.kind)}",
            data_kind=edge.kind,
            data_from=edge.source,
            data_to=edge.target,
        )
        words = f"{edge.source} {kind.arrow} {edge.target}: {edge.kind}"
        _sub(group, "title", words + (f" ({edge.label})" if edge.label else ""))
        if i in plan.back:
            d, (lx, ly) = _loop_path(edge, boxes, height, loops.index(i))
        else:
            route = plan.routes[i]
            d, (lx, ly) = _forward_path(route, boxes), _label_point(route, boxes)
        attrs = {"d": d, "fill": "none", "stroke": kind.colour, "stroke_width": "1.6"}
        if i in plan.back:
            attrs["stroke_linejoin"] = "round"
        if kind.dash:
            attrs["stroke_dasharray"] = kind.dash
        attrs["marker_end"] = f"url(#arrow-{_css(edge.kind)})"
        _sub(group, "path", **attrs)
        label = _edge_label(edge.kind, edge.label)
        if label:
            text_w = 6.4 * len(label) + 8
            ly = _free_y(placed, lx, ly, text_w)
            _sub(
                group,
                "rect",
                class_="edge-label-bg",
                x=f"{lx - text_w / 2:.1f}",
                y=f"{ly - 9:.1f}",
                width=f"{text_w:.1f}",
                height="16",
                rx="3",
                fill="#ffffff",
                fill_opacity="0.9",
            )
            _sub(
                group,
                "text",
                label,
                class_="edge-label",
                x=f"{lx:.1f}",
                y=f"{ly + 3:.1f}",
                text_anchor="middle",
                font_size="11",
                fill=kind.colour,
            )
    nodes = _sub(root, "g", class_="nodes")
    for step in graph.steps:
        x, y, _ = boxes[Slot(step.name)]
        style = STATES[step.state]
        classes = f"node state-{step.state}" + (" in-flight" if step.state == "running" else "")
        group = _sub(nodes, "g", class_=classes, data_step=step.name, data_state=step.state)
        _sub(group, "title", _hover(step))
        _sub(
            group,
            "rect",
            x=f"{x:.1f}",
            y=f"{y:.1f}",
            width=str(NODE_W),
            height=str(NODE_H),
            rx="7",
            fill=style.fill,
            stroke=style.stroke,
            stroke_width="2.5" if step.state == "running" else "1.5",
            stroke_dasharray="4 3" if step.compensation else "",
        )
        _sub(
            group,
            "text",
            _cut(step.name, NAME_CHARS),
            class_="node-name",
            x=f"{x + 10:.1f}",
            y=f"{y + 18:.1f}",
            font_weight="600",
        )
        status = {"running": "in flight", "waiting": "parked"}.get(step.state, step.state)
        if step.decision:
            status += f": {step.decision}"
        elif step.when and step.state in ("not-reached", "running"):
            status += " (conditional)"
        _sub(
            group,
            "text",
            _cut(status, NAME_CHARS + 4),
            class_="node-state",
            x=f"{x + 10:.1f}",
            y=f"{y + 34:.1f}",
            fill=style.stroke,
        )
        facts = _facts(step)
        if facts:
            _sub(
                group,
                "text",
                _cut(facts, NAME_CHARS + 6),
                class_="node-facts",
                x=f"{x + 10:.1f}",
                y=f"{y + 50:.1f}",
                font_size="11",
                fill="#475569",
            )
        if step.state == "running":
            _sub(
                group,
                "circle",
                class_="flight-dot",
                cx=f"{x + NODE_W - 12:.1f}",
                cy=f"{y + 12:.1f}",
                r="5",
                fill=style.stroke,
            )
    return root


def _loop_path(
    edge: Any, boxes: dict[Slot, tuple[float, float, float]], height: float, nth: int
) -> tuple[str, tuple[float, float]]:
    """A back edge, through the gutters only: out of its source's right side, down the gutter
    after the source's column, along under every step, up the gutter before the target's
    column and into the target's left side."""
    sx, sy, sh = boxes[Slot(edge.source)]
    tx, ty, th = boxes[Slot(edge.target)]
    x0, y0 = sx + NODE_W, sy + sh / 2
    x1, y1 = tx, ty + th / 2
    out_x = x0 + GAP_X / 2 - 8 * nth
    in_x = x1 - GAP_X / 2 + 8 * nth
    floor = height - MARGIN / 2 + LOOP_ROOM * (nth + 1)
    d = (
        f"M{x0:.1f},{y0:.1f} L{out_x:.1f},{y0:.1f} L{out_x:.1f},{floor:.1f} "
        f"L{in_x:.1f},{floor:.1f} L{in_x:.1f},{y1:.1f} L{x1:.1f},{y1:.1f}"
    )
    return d, ((out_x + in_x) / 2, floor)


def _free_y(placed: list[tuple[float, float, float, float]], x: float, y: float, w: float) -> float:
    """A height near ``y`` where a label ``w`` wide centred on ``x`` overlaps no label placed
    before (tried 18 px down, then up, further each time); records the label's box."""
    for k in range(12):
        dy = 18 * ((k + 1) // 2) * (1 if k % 2 else -1) if k else 0
        box = (x - w / 2, y + dy - 9, x + w / 2, y + dy + 7)
        if not any(
            box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3] for b in placed
        ):
            placed.append(box)
            return y + dy
    placed.append((x - w / 2, y - 9, x + w / 2, y + 7))
    return y


def _edge_label(kind: str, label: str) -> str:
    """The words on an edge: none for ``success``; the condition, the decision, the loop's
    bound after their kind."""
    if kind == "success" and not label:
        return ""
    text = f"{kind}: {label}" if label else kind
    if kind == "condition" and label:
        text = f"if {label}"
    return _cut(text, LABEL_CHARS)


def _css(name: str) -> str:
    """``name`` as a class or id fragment (letters, digits, ``-``)."""
    return re.sub(r"[^a-z0-9-]", "-", name.lower())


def _legend() -> dict[str, Any]:
    """The states and edge kinds with their colours and words, for the page's legend."""
    return {
        "states": [
            {"name": n, "fill": s.fill, "stroke": s.stroke, "meaning": s.meaning}
            for n, s in STATES.items()
        ],
        "edges": [
            {"name": k.name, "colour": k.colour, "dash": k.dash, "meaning": k.meaning}
            for k in EDGE_KINDS.values()
        ],
    }


def install(env: Any) -> None:
    """Give a Jinja2 environment the drawing: the filters ``graph_svg`` (get-job's ``graph``
    -> the SVG markup), ``graph_ms`` (milliseconds -> ``1.2 s``) and the global
    ``graph_legend`` (the states and edge kinds with their colours)."""
    env.filters["graph_svg"] = svg
    env.filters["graph_ms"] = lambda ms: format_ms(ms if isinstance(ms, int) else None)
    env.globals["graph_legend"] = _legend

"""A job's step graph as the host draws it: the vocabulary (step states, edge kinds) and the
layered layout both drawings share (the dashboard's SVG, ``protomolt-jobs jobs show``'s text).

The input is the ``graph`` document of ``get-job {"graph": true}`` (docs/verbs.md; built by the
jobs role): ``{"kind", "steps": [{"name", "state", ...}], "edges": [{"from", "to", "kind",
"label"?}]}``. It arrives as JSON, so :func:`read_graph` takes what it can and drops what is
malformed (never raises).

Layout (:func:`layout`), a small Sugiyama pass:

1. **Layers**: the longest path from a step without forward dependencies. Every edge is
   forward but those of a kind drawn against the flow (``loop``) and those that would close a
   cycle (found by a depth-first walk in definition order); a compensation edge is forward,
   so a compensation step sits after the step it undoes.
2. **Dummies**: a forward edge that spans more than one layer gets a dummy slot in each layer
   it crosses, so it is routed around the steps between, never through them.
3. **Order**: definition order first, then barycenter sweeps (down, then up, four times):
   each slot moves to the mean position of its neighbours in the layer before (after); the
   order with the fewest crossings between adjacent layers is kept (up to
   :data:`SWEEP_LIMIT` segments; a larger graph keeps definition order).

Adding an edge kind is one entry in :data:`EDGE_KINDS` (the role names it; an unknown kind
is drawn like ``success`` under its own name).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "EDGE_KINDS",
    "STATES",
    "SWEEP_LIMIT",
    "Edge",
    "EdgeKind",
    "Graph",
    "Layout",
    "Slot",
    "StateStyle",
    "Step",
    "edge_kind",
    "format_ms",
    "layout",
    "read_graph",
]


@dataclass(frozen=True, slots=True)
class EdgeKind:
    """How one kind of edge is drawn.

    :ivar name: the kind as the role names it.
    :ivar meaning: the legend's words.
    :ivar colour: the SVG stroke (and arrow) colour.
    :ivar dash: the SVG ``stroke-dasharray`` ("" solid).
    :ivar arrow: the text drawing's arrow.
    :ivar back: drawn against the flow (not a dependency: no layer is computed from it).
    """

    name: str
    meaning: str
    colour: str
    dash: str
    arrow: str
    back: bool = False


#: Every edge kind, in legend order: one entry per kind.
EDGE_KINDS: dict[str, EdgeKind] = {
    k.name: k
    for k in (
        EdgeKind("success", "runs after it succeeded", "#64748b", "", "->"),
        EdgeKind("failure", "runs after it failed", "#dc2626", "6 3", "-!>"),
        EdgeKind("done", "runs after it ended, whatever the end", "#7c3aed", "", "-*>"),
        EdgeKind("condition", "runs after it succeeded, if its condition holds", "#0891b2",
                 "2 3", "-?>"),
        EdgeKind("decision", "runs on this decision of the approval step", "#d97706", "",
                 "-d>"),
        EdgeKind("compensation", "undoes it when the run fails", "#be185d", "4 2 1 2", "~>"),
        EdgeKind("loop", "runs again from here (bounded loop)", "#2563eb", "8 3", "<~",
                 back=True),
    )
}  # fmt: skip


def edge_kind(name: str) -> EdgeKind:
    """The kind called ``name``; an unknown one is drawn like ``success`` under its name."""
    known = EDGE_KINDS.get(name)
    if known is not None:
        return known
    base = EDGE_KINDS["success"]
    return EdgeKind(name, name, base.colour, base.dash, base.arrow)


@dataclass(frozen=True, slots=True)
class StateStyle:
    """How a step in one state is drawn: the SVG fill and stroke, the legend's words."""

    fill: str
    stroke: str
    meaning: str


#: Every step state, in legend order.
STATES: dict[str, StateStyle] = {
    "succeeded": StateStyle("#dcfce7", "#16a34a", "succeeded"),
    "failed": StateStyle("#fee2e2", "#dc2626", "failed"),
    "skipped": StateStyle("#f1f5f9", "#64748b", "skipped (hover for the reason)"),
    "compensated": StateStyle("#fce7f3", "#be185d", "succeeded, then undone"),
    "running": StateStyle("#e0f2fe", "#0284c7", "in flight"),
    "waiting": StateStyle("#fef9c3", "#ca8a04", "parked: waits for an answer or a vote"),
    "not-reached": StateStyle("#ffffff", "#94a3b8", "not reached"),
}


@dataclass(frozen=True, slots=True)
class Step:
    """One step as drawn (fields of the role's document; absent ones are None or "")."""

    name: str
    state: str
    attempts: int | None = None
    duration_ms: int | None = None
    iterations: int | None = None
    reason: str = ""
    when: str = ""
    completion: str = ""
    decision: str = ""
    compensation: bool = False


@dataclass(frozen=True, slots=True)
class Edge:
    """One edge: ``source`` -> ``target`` of ``kind`` (a loop edge points back to ``target``)."""

    source: str
    target: str
    kind: str
    label: str = ""


@dataclass(frozen=True, slots=True)
class Graph:
    """A job's drawing document, read: ``kind`` is ``graph``, ``sequential`` or ``unknown``."""

    kind: str
    steps: tuple[Step, ...]
    edges: tuple[Edge, ...]

    def step(self, name: str) -> Step | None:
        """The step called ``name``, or None."""
        for s in self.steps:
            if s.name == name:
                return s
        return None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_graph(doc: Any) -> Graph | None:
    """The drawing document ``doc`` (get-job's ``graph``), or None when it is not one.

    Steps without a name, repeated names, edges whose ends are not steps and values of the
    wrong type are left out; an unknown state reads as ``not-reached``.
    """
    if not isinstance(doc, dict) or not isinstance(doc.get("steps"), list):
        return None
    steps: list[Step] = []
    names: set[str] = set()
    for s in doc["steps"]:
        if not isinstance(s, dict) or not _text(s.get("name")) or s["name"] in names:
            continue
        names.add(s["name"])
        state = _text(s.get("state"))
        steps.append(
            Step(
                name=s["name"],
                state=state if state in STATES else "not-reached",
                attempts=_count(s.get("attempts")),
                duration_ms=_count(s.get("durationMs")),
                iterations=_count(s.get("iterations")),
                reason=_text(s.get("reason")),
                when=_text(s.get("when")),
                completion=_text(s.get("completion")),
                decision=_text(s.get("decision")),
                compensation=s.get("compensation") is True,
            )
        )
    edges = []
    raw_edges = doc.get("edges")
    for e in raw_edges if isinstance(raw_edges, list) else []:
        if not isinstance(e, dict):
            continue
        source, target, kind = _text(e.get("from")), _text(e.get("to")), _text(e.get("kind"))
        if source in names and target in names and kind:
            edges.append(Edge(source, target, kind, _text(e.get("label"))))
    kind = _text(doc.get("kind")) or "unknown"
    return Graph(kind=kind, steps=tuple(steps), edges=tuple(edges))


def format_ms(ms: int | None) -> str:
    """A duration for people: ``850 ms``, ``1.2 s``, ``2 min 5 s``, ``3 h 4 min``; "" for None."""
    if ms is None:
        return ""
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    seconds = ms // 1000
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


@dataclass(frozen=True, slots=True)
class Slot:
    """A place in a layer: a step (``step`` is its name) or the dummy of a long edge in the
    layer ``layer`` it crosses (``edge`` is the edge's index in :attr:`Graph.edges`)."""

    step: str = ""
    edge: int = -1
    layer: int = -1

    @property
    def dummy(self) -> bool:
        """True for a long edge's slot."""
        return not self.step


@dataclass
class Layout:
    """The layered layout of a :class:`Graph`.

    :ivar layers: the slots of each layer, in drawing order (layer 0 first).
    :ivar where: slot -> ``(layer, position)``.
    :ivar routes: edge index -> the slots it passes, source first, target last (forward
        edges only).
    :ivar back: indexes of the edges drawn against the flow (loops, cycle-closing edges).
    """

    layers: list[list[Slot]]
    where: dict[Slot, tuple[int, int]] = field(default_factory=dict)
    routes: dict[int, list[Slot]] = field(default_factory=dict)
    back: set[int] = field(default_factory=set)

    def layer_of(self, step: str) -> int:
        """The layer of ``step``."""
        return self.where[Slot(step)][0]


#: Barycenter sweeps (each one down and one up).
_SWEEPS = 4
#: Segments between layers above which the order stays the definition's: counting crossings
#: is quadratic in them, and a drawing that large is read by its tables anyway.
SWEEP_LIMIT = 1500


def layout(graph: Graph) -> Layout:
    """The layered layout of ``graph`` (the module docstring says how).

    :returns: a :class:`Layout` in which every step has exactly one slot and no two slots
        share a ``(layer, position)``.
    """
    names = [s.name for s in graph.steps]
    index = {n: i for i, n in enumerate(names)}
    back = _back_edges(graph, index)
    forward = [(i, e) for i, e in enumerate(graph.edges) if i not in back]
    rank = _longest_path(names, forward)
    count = max(rank.values(), default=-1) + 1
    layers: list[list[Slot]] = [[] for _ in range(count)]
    for n in names:
        layers[rank[n]].append(Slot(n))
    routes: dict[int, list[Slot]] = {}
    # the segments between layer r and r + 1, as (upper slot, lower slot)
    pairs: list[list[tuple[Slot, Slot]]] = [[] for _ in range(max(count - 1, 0))]
    for i, e in forward:
        route = [Slot(e.source)]
        for r in range(rank[e.source] + 1, rank[e.target]):
            dummy = Slot(edge=i, layer=r)
            layers[r].append(dummy)
            route.append(dummy)
        route.append(Slot(e.target))
        for k in range(len(route) - 1):
            pairs[rank[e.source] + k].append((route[k], route[k + 1]))
        routes[i] = route
    order = _order(layers, pairs, routes, index)
    where = {slot: (r, p) for r, layer in enumerate(order) for p, slot in enumerate(layer)}
    return Layout(layers=order, where=where, routes=routes, back=back)


def _back_edges(graph: Graph, index: dict[str, int]) -> set[int]:
    """Edges drawn against the flow: those of a ``back`` kind, self loops, and those that
    close a cycle in a depth-first walk in definition order."""
    back = {i for i, e in enumerate(graph.edges) if edge_kind(e.kind).back or e.source == e.target}
    out: dict[str, list[tuple[int, str]]] = {n: [] for n in index}
    for i, e in enumerate(graph.edges):
        if i not in back:
            out[e.source].append((i, e.target))
    colour: dict[str, int] = {}  # 1 on the stack, 2 done
    for root in index:
        if root in colour:
            continue
        colour[root] = 1
        stack: list[tuple[str, int]] = [(root, 0)]
        while stack:
            node, k = stack[-1]
            if k < len(out[node]):
                stack[-1] = (node, k + 1)
                i, nxt = out[node][k]
                state = colour.get(nxt, 0)
                if state == 1:
                    back.add(i)
                elif state == 0:
                    colour[nxt] = 1
                    stack.append((nxt, 0))
            else:
                colour[node] = 2
                stack.pop()
    return back


def _longest_path(names: list[str], forward: list[tuple[int, Edge]]) -> dict[str, int]:
    """Each step's layer: 0 without a forward dependency, else one more than the highest
    dependency (Kahn's order over the acyclic forward edges)."""
    incoming = {n: 0 for n in names}
    out: dict[str, list[str]] = {n: [] for n in names}
    for _, e in forward:
        incoming[e.target] += 1
        out[e.source].append(e.target)
    rank = {n: 0 for n in names}
    ready = [n for n in names if incoming[n] == 0]
    while ready:
        node = ready.pop(0)
        for nxt in out[node]:
            rank[nxt] = max(rank[nxt], rank[node] + 1)
            incoming[nxt] -= 1
            if incoming[nxt] == 0:
                ready.append(nxt)
    return rank


def _order(
    layers: list[list[Slot]],
    pairs: list[list[tuple[Slot, Slot]]],
    routes: dict[int, list[Slot]],
    index: dict[str, int],
) -> list[list[Slot]]:
    """Definition order, then barycenter sweeps; the order with the fewest crossings."""
    current = [sorted(layer, key=lambda s: _initial(s, routes, index)) for layer in layers]
    if sum(len(gap) for gap in pairs) > SWEEP_LIMIT:
        return current
    best = [list(layer) for layer in current]
    best_cross = _crossings(best, pairs)
    for _ in range(_SWEEPS):
        if best_cross == 0:
            break
        for r in range(1, len(current)):
            current[r] = _by_barycenter(current[r], current[r - 1], pairs[r - 1], upper=True)
        for r in range(len(current) - 2, -1, -1):
            current[r] = _by_barycenter(current[r], current[r + 1], pairs[r], upper=False)
        cross = _crossings(current, pairs)
        if cross < best_cross:
            best, best_cross = [list(layer) for layer in current], cross
    return best


def _initial(slot: Slot, routes: dict[int, list[Slot]], index: dict[str, int]) -> float:
    """A slot's place before the sweeps: its step's definition index; a dummy's is its
    edge's source's (just after it)."""
    if not slot.dummy:
        return float(index[slot.step])
    return index[routes[slot.edge][0].step] + 0.5


def _by_barycenter(
    layer: list[Slot], fixed: list[Slot], pairs: list[tuple[Slot, Slot]], *, upper: bool
) -> list[Slot]:
    """``layer`` sorted by the mean position of each slot's neighbours in ``fixed`` (a slot
    without one keeps its position); ties keep the current order."""
    pos = {s: p for p, s in enumerate(fixed)}
    neighbours: dict[Slot, list[int]] = {s: [] for s in layer}
    for a, b in pairs:
        mine, other = (b, a) if upper else (a, b)
        if mine in neighbours and other in pos:
            neighbours[mine].append(pos[other])
    keyed = []
    for p, s in enumerate(layer):
        near = neighbours[s]
        keyed.append((sum(near) / len(near) if near else float(p), p, s))
    return [s for _, _, s in sorted(keyed, key=lambda k: (k[0], k[1]))]


def _crossings(order: list[list[Slot]], pairs: list[list[tuple[Slot, Slot]]]) -> int:
    """Pairs of segments between adjacent layers that cross."""
    total = 0
    for r, gap in enumerate(pairs):
        top = {s: p for p, s in enumerate(order[r])}
        bottom = {s: p for p, s in enumerate(order[r + 1])}
        segs = [(top[a], bottom[b]) for a, b in gap]
        for i in range(len(segs)):
            for j in range(i + 1, len(segs)):
                (a1, b1), (a2, b2) = segs[i], segs[j]
                if (a1 - a2) * (b1 - b2) < 0:
                    total += 1
    return total

"""``protomolt-jobs jobs show``: a job's workflow drawn as text for a terminal.

The same layered layout as the dashboard's SVG (:mod:`protomolt_jobs.host.job_graph`), read
top to bottom: each layer, then its steps with state, attempts, duration and loop iterations;
then the edges by kind (``a -!> b  failure``); then every step's reason (a skip's, a
failure's), wrapped. Every line fits ``width`` columns (a long name or edge is cut with an
ellipsis; reasons wrap). Stored text (names, reasons, conditions) is printed as it is, never
read as rich markup: each line is a :class:`rich.text.Text`.
"""

from __future__ import annotations

import textwrap
from typing import Any

from rich.text import Text

from protomolt_jobs.host.job_graph import Graph, Step, edge_kind, format_ms, layout

__all__ = ["layers_json", "lines", "show_json"]

#: rich styles per state (a terminal's colours).
_STYLES = {
    "succeeded": "green",
    "failed": "bold red",
    "skipped": "bright_black",
    "compensated": "magenta",
    "running": "bold cyan",
    "waiting": "yellow",
    "not-reached": "",
}
#: The widest a name column grows (a longer name is cut).
_NAME_CAP = 30


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "\u2026"


def _one_line(text: str) -> str:
    """Stored text on one line (its line breaks and tabs as spaces)."""
    return " ".join(text.split())


def layers_json(graph: Graph) -> list[list[str]]:
    """The step names of each layer, in drawing order (``--json``'s ``layers``)."""
    return [[s.step for s in layer if not s.dummy] for layer in layout(graph).layers]


def lines(graph: Graph, header: str, width: int) -> list[Text]:
    """The text drawing of ``graph`` under ``header``, each line at most ``width`` columns.

    :param graph: the job's drawing document, read.
    :param header: the first line (the job's short id, workflow, status).
    :param width: the terminal's columns (at least 40 is used).
    """
    width = max(width, 40)
    out = [Text(_cut(" ".join(header.splitlines()), width), style="bold")]
    layers = layers_json(graph)
    names = [s.name for s in graph.steps]
    name_w = min(_NAME_CAP, max((len(_one_line(n)) for n in names), default=4), width - 34)
    by_name = {s.name: s for s in graph.steps}
    for r, layer in enumerate(layers):
        out.append(Text(f"layer {r + 1}", style="bold"))
        for name in layer:
            out.append(_step_line(by_name[name], name_w, width))
    if graph.edges:
        out.append(Text("edges", style="bold"))
        ends = [
            f"{_one_line(e.source)} {edge_kind(e.kind).arrow} {_one_line(e.target)}"
            for e in graph.edges
        ]
        ends_w = min(max(len(x) for x in ends), width // 2)
        for e, between in zip(graph.edges, ends, strict=True):
            words = _one_line(e.kind + (f": {e.label}" if e.label else ""))
            out.append(Text(_cut(f"  {_cut(between, ends_w):<{ends_w}}  {words}", width)))
    noted = [s for s in graph.steps if s.reason]
    if noted:
        out.append(Text("reasons", style="bold"))
        for s in noted:
            para = _one_line(f"{s.name} ({s.state}): {s.reason}")
            for k, piece in enumerate(
                textwrap.wrap(para, width - 2, subsequent_indent="    ", break_on_hyphens=False)
            ):
                out.append(Text("  " + piece, style="" if k else _STYLES.get(s.state, "")))
    return out


def _step_line(step: Step, name_w: int, width: int) -> Text:
    """``  name  state  2 attempts  1.2 s  3 iterations`` (``*`` marks the step in flight)."""
    state = {"running": "in flight", "waiting": "parked"}.get(step.state, step.state)
    facts: list[str] = []
    if step.attempts is not None:
        facts.append(f"{step.attempts} att")
    if step.duration_ms is not None:
        facts.append(format_ms(step.duration_ms))
    if step.iterations:
        facts.append(f"{step.iterations} iter")
    if step.decision:
        facts.append(f"decided {_one_line(step.decision)}")
    if step.when:
        facts.append(f"if {_one_line(step.when)}")
    mark = "*" if step.state == "running" else " "
    line = Text(f" {mark}")
    line.append(f"{_cut(_one_line(step.name), name_w):<{name_w}}  ")
    line.append(f"{state:<11}", style=_STYLES.get(step.state, ""))
    rest = "  ".join(facts)
    if rest:
        line.append("  " + rest)
    line.truncate(width, overflow="ellipsis")
    return line


def show_json(answer: dict[str, Any], graph: Graph) -> dict[str, Any]:
    """``jobs show --json``: the job's summary fields, get-job's ``graph`` whole, and the
    layers of the drawing."""
    job = answer.get("job", {}) if isinstance(answer.get("job"), dict) else {}
    keep = ("jobId", "workflowName", "status", "attempt", "outstandingStep", "error")
    body: dict[str, Any] = {k: job[k] for k in keep if k in job}
    body["graph"] = job.get("graph")
    body["layers"] = layers_json(graph)
    if "report" in job:
        body["report"] = job["report"]
    return body

"""The drawing of a job's workflow (issue 31 item 1): the layered layout
(``host/job_graph.py``), the SVG (``host/dashboard/drawing.py``) and the text of ``jobs show``
(``host/graph_text.py``), on drawing documents written by hand."""

from __future__ import annotations

import io
import itertools
import re
import xml.etree.ElementTree as ET

import pytest
from rich.console import Console

from protomolt_jobs.host.dashboard.drawing import NODE_H, NODE_W, svg
from protomolt_jobs.host.graph_text import layers_json, lines
from protomolt_jobs.host.job_graph import (
    EDGE_KINDS,
    STATES,
    SWEEP_LIMIT,
    edge_kind,
    format_ms,
    layout,
    read_graph,
)

SVG = "{http://www.w3.org/2000/svg}"


def doc(steps, edges, kind="graph"):
    return {
        "kind": kind,
        "steps": [s if isinstance(s, dict) else {"name": s, "state": "succeeded"} for s in steps],
        "edges": [
            {"from": a, "to": b, "kind": k, **({"label": l} if l else {})} for a, b, k, l in edges
        ],
    }


def e(a, b, kind="success", label=""):
    return (a, b, kind, label)


#: Every state and every edge kind in one graph: a fork, a join, a failure handler, a
#: condition, an approval decision, a compensation, a loop back and a long edge.
EVERYTHING = doc(
    [
        {"name": "reserve", "state": "compensated", "attempts": 1, "durationMs": 120},
        {"name": "left", "state": "succeeded", "attempts": 2, "durationMs": 1500},
        {"name": "right", "state": "failed", "reason": "GRPC: FAILED_PRECONDITION [effect, fix]"},
        {"name": "<b>join</b>", "state": "skipped", "reason": "upstream right failed"},
        {"name": "notify", "state": "running", "when": "input.text != ''"},
        {"name": "review", "state": "waiting", "completion": "approval"},
        {"name": "publish", "state": "not-reached"},
        {"name": "release", "state": "succeeded", "compensation": True},
    ],
    [
        e("reserve", "left"),
        e("reserve", "right"),
        e("left", "<b>join</b>"),
        e("right", "<b>join</b>"),
        e("right", "notify", "condition", "input.text != ''"),
        e("reserve", "review", "failure"),
        e("review", "publish", "decision", "accept"),
        e("reserve", "release", "compensation"),
        e("<b>join</b>", "reserve", "loop", "max 3"),
        e("reserve", "publish", "done"),
    ],
)


def _layers(d) -> list[list[str]]:
    return layers_json(read_graph(d))


def test_layers_are_the_longest_path_from_the_forward_dependencies():
    diamond = doc("abcd", [e("a", "b"), e("a", "c"), e("b", "d"), e("c", "d"), e("a", "d", "done")])
    layers = _layers(diamond)
    assert layers[0] == ["a"] and sorted(layers[1]) == ["b", "c"] and layers[2] == ["d"]
    plan = layout(read_graph(diamond))
    # the long edge a -> d crosses layer 1 through a dummy slot, not through b or c
    (long,) = [i for i, r in plan.routes.items() if len(r) == 3]
    assert plan.routes[long][1].dummy and plan.routes[long][1].layer == 1


def test_a_compensation_step_sits_after_the_step_it_undoes_and_a_loop_changes_no_layer():
    graph = read_graph(EVERYTHING)
    plan = layout(graph)
    assert plan.layer_of("release") == plan.layer_of("reserve") + 1
    assert plan.layer_of("reserve") == 0 and plan.layer_of("<b>join</b>") == 2
    loops = [i for i, edge in enumerate(graph.edges) if edge.kind == "loop"]
    assert set(loops) == plan.back and all(i not in plan.routes for i in loops)


def test_a_cycle_in_a_bad_document_is_broken_not_looped_on():
    plan = layout(read_graph(doc("abc", [e("a", "b"), e("b", "c"), e("c", "a"), e("c", "c")])))
    assert [[s.step for s in layer] for layer in plan.layers] == [["a"], ["b"], ["c"]]
    assert plan.back == {2, 3}


def test_a_sequential_workflow_is_a_chain():
    chain = doc("abcde", [e(x, y) for x, y in itertools.pairwise("abcde")], kind="sequential")
    assert _layers(chain) == [["a"], ["b"], ["c"], ["d"], ["e"]]


def test_the_barycenter_pass_undoes_a_crossing_of_definition_order():
    crossed = doc(["a1", "a2", "b1", "b2"], [e("a1", "b2"), e("a2", "b1")])
    assert _layers(crossed) == [["a1", "a2"], ["b2", "b1"]]


def test_every_step_has_one_slot_and_no_two_slots_share_a_place():
    plan = layout(read_graph(EVERYTHING))
    places = list(plan.where.values())
    assert len(places) == len(set(places))
    steps = [s for layer in plan.layers for s in layer if not s.dummy]
    assert sorted(s.step for s in steps) == sorted(s["name"] for s in EVERYTHING["steps"])


def test_a_malformed_document_is_read_as_far_as_it_goes():
    assert read_graph(None) is None and read_graph({"steps": "x"}) is None
    graph = read_graph(
        {
            "steps": [{"name": "a", "state": "exploded", "attempts": True}, {"name": 3}, "x"],
            "edges": [{"from": "a", "to": "ghost", "kind": "success"}, 7],
        }
    )
    assert [(s.name, s.state, s.attempts) for s in graph.steps] == [("a", "not-reached", None)]
    assert graph.edges == () and graph.kind == "unknown"


def test_adding_an_edge_kind_is_one_entry_and_an_unknown_one_still_draws():
    assert set(EDGE_KINDS) >= {
        "success",
        "failure",
        "condition",
        "compensation",
        "decision",
        "loop",
    }
    assert EDGE_KINDS["loop"].back and not EDGE_KINDS["compensation"].back
    assert edge_kind("retry").name == "retry" and not edge_kind("retry").back


def test_durations_for_people():
    assert [format_ms(v) for v in (None, 850, 1234, 125_000, 3_840_000)] == [
        "",
        "850 ms",
        "1.2 s",
        "2 min 5 s",
        "1 h 4 min",
    ]


def _parse(d) -> ET.Element:
    return ET.fromstring(str(svg(d)))


def test_the_svg_has_each_node_with_its_state_and_each_edge_with_its_kind():
    root = _parse(EVERYTHING)
    nodes = {
        g.get("data-step"): g for g in root.iter(f"{SVG}g") if "node" in g.get("class", "").split()
    }
    assert {n: g.get("data-state") for n, g in nodes.items()} == {
        s["name"]: s["state"] for s in EVERYTHING["steps"]
    }
    for g in nodes.values():
        assert f"state-{g.get('data-state')}" in g.get("class").split()
    assert "in-flight" in nodes["notify"].get("class").split()
    edges = [
        (g.get("data-from"), g.get("data-to"), g.get("data-kind"))
        for g in root.iter(f"{SVG}g")
        if "edge" in g.get("class", "").split()
    ]
    assert sorted(edges) == sorted((x["from"], x["to"], x["kind"]) for x in EVERYTHING["edges"])
    # every state the role names has a style
    assert {s["state"] for s in EVERYTHING["steps"]} == set(STATES)


def test_hover_titles_hold_the_reasons_and_labels_name_the_kind():
    root = _parse(EVERYTHING)
    titles = {
        g.get("data-step"): g.find(f"{SVG}title").text
        for g in root.iter(f"{SVG}g")
        if g.get("data-step")
    }
    assert "reason: upstream right failed" in titles["<b>join</b>"]
    assert "[effect, fix]" in titles["right"]
    assert "when: input.text != ''" in titles["notify"]
    labels = [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "edge-label"]
    assert "failure" in labels and "compensation" in labels and "loop: max 3" in labels
    assert "decision: accept" in labels and any(x.startswith("if input.text") for x in labels)


def test_step_names_and_reasons_are_escaped():
    text = str(svg(EVERYTHING))
    assert "<b>" not in text and "&lt;b&gt;join&lt;/b&gt;" in text
    evil = doc(
        [{"name": '"><script>alert(1)</script>', "state": "skipped", "reason": "a\x01b & <i>"}],
        [],
    )
    out = str(svg(evil))
    assert "<script>" not in out and "<i>" not in out
    root = ET.fromstring(out)  # still well-formed XML: the control character was replaced
    (node,) = [g for g in root.iter(f"{SVG}g") if g.get("data-step")]
    assert node.get("data-step") == '"><script>alert(1)</script>'
    assert "a\ufffdb & <i>" in node.find(f"{SVG}title").text


def test_no_two_boxes_overlap_in_the_svg():
    root = _parse(EVERYTHING)
    boxes = [
        (float(r.get("x")), float(r.get("y")))
        for g in root.iter(f"{SVG}g")
        if g.get("data-step")
        for r in g.findall(f"{SVG}rect")
    ]
    assert len(boxes) == len(EVERYTHING["steps"])
    for (x1, y1), (x2, y2) in itertools.combinations(boxes, 2):
        assert x1 + NODE_W <= x2 or x2 + NODE_W <= x1 or y1 + NODE_H <= y2 or y2 + NODE_H <= y1


def test_no_document_no_drawing():
    assert str(svg(None)) == "" and str(svg({"steps": []})) == ""


@pytest.mark.parametrize("width", [80, 40, 120])
def test_the_text_drawing_fits_the_terminal_and_prints_brackets_literally(width):
    wide = dict(EVERYTHING)
    wide["steps"] = [
        *EVERYTHING["steps"],
        {"name": "x" * 200, "state": "not-reached", "reason": "r " * 90},
    ]
    graph = read_graph(wide)
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, color_system=None)
    for line in lines(graph, "job 1234abcd  everything  FAILED  attempt 1  (graph)", console.width):
        console.print(line, no_wrap=True, overflow="ellipsis", crop=True)
    out = buffer.getvalue().splitlines()
    assert max(len(x) for x in out) <= width, out
    text = "\n".join(out)
    assert "layer 1" in text and "edges" in text and "reasons" in text
    assert re.search(r"reserve ~> release +compensation", text)
    if width >= 80:
        assert re.search(r"<b>join</b> <~ reserve +loop: max 3", text)
    assert "[effect," in text  # brackets are text, not markup
    running = next(x for x in out if "notify" in x and "in flight" in x)
    assert running.startswith(" *")


def _partials():
    import jinja2

    from protomolt_jobs.host.dashboard import drawing

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("protomolt_jobs.host.dashboard", "templates"),
        autoescape=True,
    )
    env.filters["when"] = str
    drawing.install(env)
    return env


def test_the_report_partial_is_tables_with_the_cancel_section_and_escaped_text():
    report = {
        "status": "CANCELLED",
        "steps": [
            {"name": "<b>tok</b>", "status": "succeeded"},
            {"name": "embed", "status": "skipped", "reason": "<script>x</script> [a, b]"},
            {"name": "review", "status": "not run", "reason": "cancelled"},
        ],
        "claims": 1,
        "attempts": {"<b>tok</b>": 2},
        "durationsMs": {"<b>tok</b>": 1500},
        "operatorActions": [{"kind": "cancel", "actor": "alice", "reason": "why", "at": "t"}],
        "cancel": {
            "requestedAt": "2026-01-01T00:00:00Z",
            "actor": "alice",
            "compensate": True,
            "effectsAfterRequest": ["charge"],
            "compensations": ["refund"],
        },
    }
    html = _partials().get_template("_report.html").render(job={"report": report})
    assert "<script>" not in html and "<b>" not in html
    assert "&lt;script&gt;x&lt;/script&gt; [a, b]" in html
    assert "<td>&lt;b&gt;tok&lt;/b&gt;</td><td>succeeded</td><td>2</td><td>1.5 s</td>" in html
    assert 'class="report-not-run" data-step="review"' in html
    assert "<td>charge</td>" in html and "<td>refund</td>" in html and "alice" in html
    # a live job has no report: nothing is rendered
    assert _partials().get_template("_report.html").render(job={}).strip() == ""


def test_the_graph_partial_draws_and_lists_the_reasons():
    html = _partials().get_template("_graph.html").render(job={"graph": EVERYTHING})
    assert html.count("<svg") == 1 + len(EDGE_KINDS)  # the drawing and the legend's samples
    assert 'id="step-reasons"' in html and "upstream right failed" in html
    assert "&lt;b&gt;join&lt;/b&gt;" in html and "<b>join" not in html
    assert _partials().get_template("_graph.html").render(job={}).strip() == ""


def test_a_graph_past_the_sweep_limit_keeps_definition_order_and_still_draws():
    n = SWEEP_LIMIT + 10
    names = [f"s{i}" for i in range(n)]
    big = doc(["root", *names], [e("root", x) for x in names] + [e(names[0], names[-1])])
    plan = layout(read_graph(big))
    assert [s.step for s in plan.layers[1] if not s.dummy] == names[:-1]
    assert plan.layer_of(names[-1]) == 2
    root = _parse(big)
    assert sum(1 for g in root.iter(f"{SVG}g") if g.get("data-step")) == n + 1

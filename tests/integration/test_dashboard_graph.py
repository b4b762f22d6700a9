"""The drawing of a graph run (issue 31 item 1) on a real node: real PostgreSQL, the test
``Steps/Run`` gRPC server on loopback, the node's worker, its HTTP surface, the CLI as a
process and headless Chromium.

One run has a parallel branch (``left`` and ``right`` after ``reserve``), a step skipped by its
condition (``gated``), a failure (``boom``) that fails the run, and the compensation of
``reserve`` (``release``). The served job page's SVG is parsed (each node's state, each edge's
kind), the final report's table lists the skipped step with its reason, ``jobs show`` draws it
in 80 columns, and the browser shows the SVG with the skip reason as the hover title.
"""

from __future__ import annotations

import json
import re
import threading
import xml.etree.ElementTree as ET

from selenium.webdriver.common.by import By

from tests.integration import test_dashboard as board
from tests.integration.test_cli import cli
from tests.integration.test_dashboard_operator import shot
from tests.support.graphs import diamond, graph, step
from tests.support.grpc_servers import seed_workflow
from tests.support.node import http, node_environ, start_node, wait_for

TOKEN, _find, _sign_in = board.TOKEN, board._find, board._sign_in
#: headless Chromium, as the dashboard's own tests drive it
browser = board.browser
SVG = "{http://www.w3.org/2000/svg}"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
COOKIE = {"Cookie": f"protomolt_token={TOKEN}"}
CONDITION = "input.text == 'never'"

#: (from, to) -> kind: every edge the drawing must have.
EDGES = {
    ("reserve", "left"): "success",
    ("reserve", "right"): "success",
    ("reserve", "gated"): "condition",
    ("left", "boom"): "success",
    ("boom", "finish"): "success",
    ("right", "finish"): "success",
    ("reserve", "release"): "compensation",
}
STATES = {
    "reserve": "compensated",
    "left": "succeeded",
    "right": "succeeded",
    "gated": "skipped",
    "boom": "failed",
    "finish": "not-reached",
    "release": "succeeded",
}


def _workflow(target: str) -> dict:
    return graph(
        [
            step("reserve", target, compensate="release"),
            step("left", target, after=["reserve"]),
            step("right", target, sleep_ms=300, after=["reserve"]),
            step("gated", target, after=["reserve"], when=CONDITION),
            step("boom", target, fail="FAILED_PRECONDITION", after=["left"]),
            step("finish", target, after=["boom", "right"]),
            step("release", target),
        ],
        name="drawn",
    )


def _failed_run(url: str, target: str) -> str:
    status, answer, _ = http(
        "POST",
        f"{url}/protomolt/actions/submit-workflow",
        {"workflow": _workflow(target), "input": {"text": "draw me"}},
        headers=AUTH,
    )
    assert status == 200 and answer["ok"], answer
    job_id = answer["jobId"]

    def finished():
        _, got, _ = http(
            "POST", f"{url}/protomolt/actions/get-job", {"jobId": job_id}, headers=AUTH
        )
        return got["job"]["status"] in ("FAILED", "DEAD", "COMPLETED")

    wait_for(finished, timeout_s=60)
    return job_id


def _svg_of(page: str) -> ET.Element:
    (drawn,) = re.findall(r"<svg xmlns=\"http://www.w3.org/2000/svg\".*?</svg>", page, re.DOTALL)
    return ET.fromstring(drawn)


def test_a_graph_run_is_drawn_with_states_edge_kinds_and_the_report_table(
    tmp_path, fresh_dsn, services
):
    surfaces = start_node(node_environ(tmp_path, fresh_dsn, token=TOKEN))
    try:
        url = surfaces.http.url
        job_id = _failed_run(url, services.target)

        # get-job's graph: the role's account (and a bad flag is refused, naming it)
        _, answer, _ = http(
            "POST",
            f"{url}/protomolt/actions/get-job",
            {"jobId": job_id, "graph": True},
            headers=AUTH,
        )
        job = answer["job"]
        assert job["status"] == "FAILED", job.get("error")
        drawn = job["graph"]
        assert drawn["kind"] == "graph"
        assert {s["name"]: s["state"] for s in drawn["steps"]} == STATES
        assert {(x["from"], x["to"]): x["kind"] for x in drawn["edges"]} == EDGES
        gated = next(s for s in drawn["steps"] if s["name"] == "gated")
        assert gated["reason"] == f"condition false: {CONDITION}" and gated["when"] == CONDITION
        boom = next(s for s in drawn["steps"] if s["name"] == "boom")
        assert boom["attempts"] == 1 and "durationMs" in boom
        # finish (after boom's success) never started: the report counts no attempt of it
        report = job["report"]
        assert "finish" not in report["attempts"] and report["attempts"]["boom"] == 1
        status, refused, _ = http(
            "POST",
            f"{url}/protomolt/actions/get-job",
            {"jobId": job_id, "graph": "yes"},
            headers=AUTH,
        )
        assert (status, refused["error"]) == (400, "invalid-input") and "graph" in refused[
            "message"
        ]

        # the served page: the SVG, parsed
        status, body, _ = http("GET", f"{url}/ui/jobs/{job_id}", headers=COOKIE)
        assert status == 200
        page = body.decode()
        root = _svg_of(page)
        nodes = {g.get("data-step"): g for g in root.iter(f"{SVG}g") if g.get("data-step")}
        assert {n: g.get("data-state") for n, g in nodes.items()} == STATES
        for name, state in STATES.items():
            assert f"state-{state}" in nodes[name].get("class").split()
        assert f"condition false: {CONDITION}" in nodes["gated"].find(f"{SVG}title").text
        edges = {
            (g.get("data-from"), g.get("data-to")): g.get("data-kind")
            for g in root.iter(f"{SVG}g")
            if "edge" in (g.get("class") or "").split()
        }
        assert edges == EDGES
        # the report table lists the skipped step with its reason
        (row,) = re.findall(
            r'<tr class="report-skipped" data-step="gated">(.*?)</tr>', page, re.DOTALL
        )
        cells = re.findall(r"<td>(.*?)</td>", row, re.DOTALL)
        assert cells[0] == "gated" and cells[1] == "skipped"
        assert cells[-1] == f"condition false: {CONDITION}".replace("'", "&#39;")
        assert re.search(r'data-step="boom"><td>boom</td><td>failed</td><td>1</td>', page)
        assert 'id="report-compensated">Undone by their compensation steps: reserve.' in page
        assert 'id="step-reasons"' in page

        # the CLI draws the same run in 80 columns, from the job's short id
        shown = cli(
            "jobs", "show", job_id[:8], "--url", url, "--token", TOKEN, env={"COLUMNS": "80"}
        )
        assert shown.returncode == 0, shown.stderr
        out = shown.stdout.splitlines()
        assert max(len(line) for line in out) <= 80, shown.stdout
        assert out[0].startswith(f"job {job_id[:8]}  drawn  FAILED")
        assert any(re.match(r"^  gated +skipped", line) for line in out), shown.stdout
        assert any(re.fullmatch(r"  reserve ~> release +compensation", x) for x in out)
        assert any(
            re.fullmatch(r"  reserve -\?> gated +condition: " + re.escape(CONDITION), x)
            for x in out
        ), out
        assert any(f"gated (skipped): condition false: {CONDITION}" in line for line in out)
        whole = json.loads(
            cli("jobs", "show", job_id, "--json", "--url", url, "--token", TOKEN).stdout
        )
        assert whole["graph"] == drawn and whole["layers"][0] == ["reserve"]
        assert sorted(whole["layers"][1]) == ["gated", "left", "release", "right"]
    finally:
        surfaces.close()


def test_the_svg_renders_in_a_browser_with_the_skip_reason_as_hover_title(
    tmp_path, fresh_dsn, services, browser
):
    surfaces = start_node(node_environ(tmp_path, fresh_dsn, token=TOKEN))
    try:
        url = surfaces.http.url
        job_id = _failed_run(url, services.target)
        _sign_in(browser, url, TOKEN)
        # the login's redirect must land before the next page is asked for: otherwise it can
        # land after it, and the browser shows the list instead of the job (seen in CI)
        _find(browser, "#jobs")
        browser.get(f"{url}/ui/jobs/{job_id}")
        drawing = _find(browser, "svg#graph-svg")
        size = drawing.size
        assert size["width"] > 300 and size["height"] > 100, size
        gated = _find(browser, 'svg#graph-svg g.node[data-step="gated"]')
        assert gated.is_displayed()
        assert gated.find_element(By.CSS_SELECTOR, "rect").size["width"] > 100
        title = gated.find_element(By.CSS_SELECTOR, "title").get_attribute("textContent")
        assert f"reason: condition false: {CONDITION}" in title
        kinds = {
            e.get_attribute("data-kind")
            for e in browser.find_elements(By.CSS_SELECTOR, "svg#graph-svg g.edge")
        }
        assert kinds == {"success", "condition", "compensation"}
        rows = browser.find_elements(By.CSS_SELECTOR, '#report tr[data-step="gated"] td')
        assert [r.text for r in rows][-1] == f"condition false: {CONDITION}"
        shot(browser, "job-graph", at="svg#graph-svg")  # docs/operations.md, when asked
    finally:
        surfaces.close()


def test_a_sequential_run_parked_on_a_step_is_a_chain_with_the_waiting_step(
    tmp_path, fresh_dsn, services
):
    """A sequential workflow is drawn as its chain; the step a WAITING job is parked on is
    ``waiting``, the steps before it ``succeeded``, the page draws it and ``jobs show`` too."""
    surfaces = start_node(node_environ(tmp_path, fresh_dsn, token=TOKEN))
    try:
        url = surfaces.http.url
        status, answer, _ = http(
            "POST",
            f"{url}/protomolt/actions/submit-workflow",
            {"workflow": seed_workflow(services.target), "input": {"text": "a b c"}},
            headers=AUTH,
        )
        assert status == 200 and answer["ok"], answer
        job_id = answer["jobId"]

        def parked():
            _, got, _ = http(
                "POST",
                f"{url}/protomolt/actions/get-job",
                {"jobId": job_id, "graph": True},
                headers=AUTH,
            )
            return got["job"] if got["job"]["status"] == "WAITING" else None

        job = wait_for(parked, timeout_s=60)
        drawn = job["graph"]
        assert drawn["kind"] == "sequential" and "report" not in job
        names = [s["name"] for s in drawn["steps"]]
        assert names == ["tokenize", "embed", "review"]
        assert [(e["from"], e["to"], e["kind"]) for e in drawn["edges"]] == [
            ("tokenize", "embed", "success"),
            ("embed", "review", "success"),
        ]
        assert [s["state"] for s in drawn["steps"]] == ["succeeded", "succeeded", "waiting"]
        assert drawn["steps"][-1]["completion"] == "external"
        _, body, _ = http("GET", f"{url}/ui/jobs/{job_id}", headers=COOKIE)
        root = _svg_of(body.decode())
        (review,) = [g for g in root.iter(f"{SVG}g") if g.get("data-step") == "review"]
        assert review.get("data-state") == "waiting" and "parked" in "".join(review.itertext())
        assert 'id="report"' not in body.decode()  # no final report before the end
        shown = cli("jobs", "show", job_id, "--url", url, "--token", TOKEN, env={"COLUMNS": "80"})
        assert shown.returncode == 0, shown.stderr
        assert any(re.match(r"^  review +parked", line) for line in shown.stdout.splitlines())
    finally:
        surfaces.close()


def test_the_steps_in_flight_of_a_running_graph_are_marked(tmp_path, fresh_dsn, services):
    """While ``b`` and ``c`` of a diamond run side by side (held on the server until the test
    lets them answer), both are ``running`` and the SVG marks them ``in-flight``; ``d`` is not
    reached yet."""
    held = threading.Event()

    def hold(request, context):
        if request.step in ("b", "c"):
            held.wait(30)
        return services._do_run(request, context)

    services.set_handler("jobs.test.Steps/Run", hold)
    surfaces = start_node(node_environ(tmp_path, fresh_dsn, token=TOKEN))
    try:
        url = surfaces.http.url
        status, answer, _ = http(
            "POST",
            f"{url}/protomolt/actions/submit-workflow",
            {"workflow": diamond(services.target, sleep_ms=0), "input": {"text": "x"}},
            headers=AUTH,
        )
        assert status == 200 and answer["ok"], answer
        job_id = answer["jobId"]

        def states():
            _, got, _ = http(
                "POST",
                f"{url}/protomolt/actions/get-job",
                {"jobId": job_id, "graph": True},
                headers=AUTH,
            )
            return {s["name"]: s["state"] for s in got["job"]["graph"]["steps"]}

        flying = {"a": "succeeded", "b": "running", "c": "running", "d": "not-reached"}
        wait_for(lambda: states() == flying, timeout_s=30)
        _, body, _ = http("GET", f"{url}/ui/jobs/{job_id}", headers=COOKIE)
        root = _svg_of(body.decode())
        marked = {
            g.get("data-step")
            for g in root.iter(f"{SVG}g")
            if "in-flight" in (g.get("class") or "").split()
        }
        assert marked == {"b", "c"}
        held.set()
        wait_for(lambda: set(states().values()) == {"succeeded"}, timeout_s=30)
    finally:
        held.set()
        surfaces.close()

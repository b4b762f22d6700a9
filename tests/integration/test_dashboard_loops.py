"""A loop run on the operator's dashboard in a real headless Chromium: a run PAUSED by an
exhausted ``park`` loop is extended from its job page (extend-loop: the loop step from a
select, ``by``, confirmed, POST-redirect-GET with a flash) and goes on; the page's drawing
(served SVG) has the loop's back-edge and the body's iteration counts. Real node, real
PostgreSQL, the test ``Steps/Run`` service on loopback."""

from __future__ import annotations

import urllib.request

from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from tests.integration.test_dashboard import _find, _text, _text_becomes, browser
from tests.support.graphs import graph, step
from tests.support.node import http, node_environ, start_node, wait_for

__all__ = ["browser"]  # the fixture, shared with test_dashboard.py


def _looping(target: str) -> dict:
    """a -> b -> c -> d; d loops back to b once (max 1) and parks when exhausted."""
    return graph(
        [
            step("a", target),
            step("b", target, after=["a"]),
            step("c", target, after=["b"]),
            step("d", target, after=["c"], loop={"to": "b", "max": 1, "onExhausted": "park"}),
        ],
        name="looping-page",
    )


def _job(url: str, job_id: str) -> dict:
    return http("POST", f"{url}/protomolt/actions/get-job", {"jobId": job_id})[1]["job"]


def test_a_paused_loop_run_is_extended_from_its_page_and_goes_on(
    tmp_path, fresh_dsn, services, browser
):
    surfaces = start_node(node_environ(tmp_path, fresh_dsn))
    try:
        url = surfaces.http.url
        status, answer, _ = http(
            "POST",
            f"{url}/protomolt/actions/submit-workflow",
            {"workflow": _looping(services.target), "input": {"text": "x"}},
        )
        assert status == 200 and answer["ok"], answer
        job_id = answer["jobId"]
        wait_for(lambda: _job(url, job_id)["status"] == "PAUSED", timeout_s=60)
        assert services.step_calls("b") == 2

        # a run without a loop is not offered extend-loop; this one is, with its loop step
        browser.get(f"{url}/ui/jobs/{job_id}")
        _text_becomes(browser, "#job-status", "PAUSED")
        choices = Select(_find(browser, "#extend-loop-step"))
        assert [o.get_attribute("value") for o in choices.options] == ["d"]
        # the drawing: the back-edge d -> b and the body's iteration counts
        svg = browser.find_element(By.CSS_SELECTOR, "svg").get_attribute("outerHTML")
        assert 'data-kind="loop"' in svg and 'data-from="d"' in svg and 'data-to="b"' in svg
        assert "2 iterations" in svg

        # not confirmed: nothing is sent
        browser.find_element(By.ID, "action-extend-loop").click()
        assert _text(browser, "#job-status") == "PAUSED"
        assert services.step_calls("b") == 2

        by = browser.find_element(By.ID, "extend-loop-by")
        by.clear()
        by.send_keys("1")
        browser.find_element(By.ID, "reason-extend-loop").send_keys("one more try")
        browser.find_element(By.ID, "confirm-extend-loop").click()
        browser.find_element(By.ID, "action-extend-loop").click()
        _text_becomes(browser, "#flash-text", "extend-loop: now QUEUED")
        assert "loop 'd' may now re-run 2 times" in _text(browser, "#flash-text")
        assert browser.current_url.endswith(f"/ui/jobs/{job_id}")  # redirected: a GET

        # the run went on: one more iteration, then the raised bound exhausted it again
        wait_for(
            lambda: services.step_calls("d") == 3 and _job(url, job_id)["status"] == "PAUSED",
            timeout_s=60,
        )
        job = _job(url, job_id)
        assert [(c["name"], c.get("iteration", 0)) for c in job["checkpoints"]][-3:] == [
            ("b", 2),
            ("c", 2),
            ("d", 2),
        ]
        history = http("POST", f"{url}/protomolt/actions/job-history", {"jobId": job_id})[1]
        (extended,) = [t for t in history["transitions"] if t["kind"] == "extend-loop"]
        assert extended["reason"] == "by 1: one more try"

        # the served page draws the third iteration
        with urllib.request.urlopen(f"{url}/ui/jobs/{job_id}", timeout=20) as page:
            served = page.read().decode()
        assert "3 iterations" in served and 'data-kind="loop"' in served
    finally:
        surfaces.close()

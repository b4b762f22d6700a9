"""The dashboard at ``/ui`` in a real headless Chromium (Debian's ``chromium`` and
``chromium-driver``, driven by selenium): sign in, list and filter 200 jobs, the WAITING inbox,
open a job, a wrong answer in the complete-step form shows the verb's error, a right one moves
the job to COMPLETED. A real node, real PostgreSQL, real gRPC step servers.

On failure a screenshot and the page source go to ``$PROTOMOLT_TEST_ARTIFACTS`` (default
``test-artifacts/``). Without the browser the tests that drive it fail at their ``browser``
fixture with the install command (``.ci/run`` installs it when missing); they are never
skipped, and the other tests here and in the suite still run (``tests/support/browser.py``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import urllib.parse
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from tests.support.browser import browser_paths, require_browser
from tests.support.factories import parked_job
from tests.support.grpc_servers import TestServices, descriptor_set_b64, seed_workflow
from tests.support.node import http, node_environ, start_node, start_node_with_file, wait_for

TOKEN = "dashboard-secret"
CHROMIUM, CHROMEDRIVER = browser_paths()
JOBS = 200
ARTIFACTS = Path(os.environ.get("PROTOMOLT_TEST_ARTIFACTS", "test-artifacts"))


def tally_workflow(target: str) -> dict:
    """One external step whose answer (jobs.test.Tokens) has an integer field to get wrong."""
    return {
        "name": "tally",
        "schema": {"descriptorSetBase64": descriptor_set_b64()},
        "inputType": "jobs.test.Text",
        "steps": [
            {
                "name": "count",
                "target": target,
                "method": "jobs.test.Tokenizer/Tokenize",
                "completion": "external",
            }
        ],
    }


@pytest.fixture
def browser(request):
    require_browser(CHROMIUM, CHROMEDRIVER)  # fails this test alone, with the apt-get hint
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="pmj-chromium-")
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            stem = ARTIFACTS / request.node.name
            driver.get_screenshot_as_file(f"{stem}.png")
            Path(f"{stem}.html").write_text(driver.page_source)
            print(f"screenshot: {stem}.png")
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _find(driver, css: str, timeout_s: float = 20.0):
    return wait_for(
        lambda: (driver.find_elements(By.CSS_SELECTOR, css) or [None])[0], timeout_s=timeout_s
    )


def _text(driver, css: str) -> str:
    """The text of the first element matching ``css`` ("" when none). The live refresh may
    replace the element between finding and reading it: read again then."""
    for _ in range(20):
        try:
            elements = driver.find_elements(By.CSS_SELECTOR, css)
            return elements[0].text if elements else ""
        except StaleElementReferenceException:
            continue
    raise AssertionError(f"{css} kept going stale")


def _click(driver, css: str, timeout_s: float = 20.0) -> None:
    """Click the first element matching ``css``, again if the live refresh replaced it."""

    def clicked():
        try:
            elements = driver.find_elements(By.CSS_SELECTOR, css)
            if elements:
                elements[0].click()
                return True
        except StaleElementReferenceException:
            pass
        return False

    wait_for(clicked, timeout_s=timeout_s)


def _text_becomes(driver, css: str, expected: str, timeout_s: float = 30.0) -> None:
    wait_for(lambda: expected in _text(driver, css), timeout_s=timeout_s)


def _submit(url: str, workflow: dict, text: str) -> str:
    status, answer, _ = http(
        "POST",
        f"{url}/protomolt/actions/submit-workflow",
        {"workflow": workflow, "input": {"text": text}},
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert status == 200 and answer["ok"], answer
    return answer["jobId"]


def _waiting(url: str) -> int:
    _, answer, _ = http(
        "POST",
        f"{url}/protomolt/actions/list-jobs",
        {"status": "WAITING", "limit": 500},
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    return len(answer["jobs"])


def test_dashboard_in_a_real_browser(tmp_path, fresh_dsn, browser):
    with TestServices(max_workers=16) as services:
        env = node_environ(tmp_path, fresh_dsn, token=TOKEN, worker_count=4)
        surfaces = start_node(env)
        try:
            url = surfaces.http.url
            seed = seed_workflow(services.target)
            for i in range(JOBS):
                _submit(url, seed, f"document number {i} for review")
            tally_id = _submit(url, tally_workflow(services.target), "count me")
            wait_for(lambda: _waiting(url) == JOBS + 1, timeout_s=180)

            # Without the token a page sends the browser to the login form.
            browser.get(f"{url}/ui/")
            _find(browser, "#login-form")
            browser.find_element(By.ID, "token").send_keys("wrong")
            browser.find_element(By.ID, "login-submit").click()
            _text_becomes(browser, ".error", "Wrong token")
            browser.find_element(By.ID, "token").send_keys(TOKEN)
            browser.find_element(By.ID, "login-submit").click()

            # The list: a page of 50, the counts, and paging.
            _find(browser, "#jobs")
            rows = browser.find_elements(By.CSS_SELECTOR, "#jobs tr.job-row")
            assert len(rows) == 50
            assert _text(browser, "#count-waiting") == str(JOBS + 1)
            _click(browser, "#next-page")
            _find(browser, "#prev-page")
            assert len(browser.find_elements(By.CSS_SELECTOR, "#jobs tr.job-row")) == 50

            # Filters: status and workflow.
            browser.get(f"{url}/ui/")
            Select(_find(browser, "#filter-status")).select_by_value("WAITING")
            browser.find_element(By.ID, "filter-workflow").send_keys("tally")
            browser.find_element(By.ID, "apply-filters").click()
            _find(browser, f'tr[data-job-id="{tally_id}"]')
            wait_for(lambda: _text(browser, "#jobs tbody").count("tally") == 1)
            assert "seed-review" not in _text(browser, "#jobs tbody")
            browser.get(f"{url}/ui/?status=COMPLETED")
            _find(browser, "#jobs td.empty")

            # The inbox holds every parked job.
            browser.find_element(By.ID, "nav-inbox").click()
            _text_becomes(browser, "#inbox-count", f"{JOBS + 1} waiting")

            # Open the tally job: a wrong answer shows the verb's error, nothing changes.
            _click(browser, f'tr[data-job-id="{tally_id}"] a.job-link')
            _text_becomes(browser, "#job-status", "WAITING")
            _find(browser, "#complete-form")
            browser.find_element(By.ID, "field-count").send_keys("eleven")
            browser.find_element(By.ID, "complete-submit").click()
            _text_becomes(browser, "#flash-text", "invalid-input")
            assert "jobs.test.Tokens" in _text(browser, "#flash-text")
            assert browser.current_url.endswith(f"/ui/jobs/{tally_id}")  # redirected back
            assert _text(browser, "#job-status") == "WAITING"
            # What was typed is kept in the form.
            field = browser.find_element(By.ID, "field-count")
            assert field.get_attribute("value") == "eleven"
            # The right answer completes the step; the page updates itself to COMPLETED.
            field.clear()
            field.send_keys("2")
            browser.find_element(By.ID, "complete-submit").click()
            _text_becomes(browser, "#flash-text", "complete-step: step 'count' answered")
            _text_becomes(browser, "#job-status", "COMPLETED", timeout_s=60)
            _text_becomes(browser, "#checkpoints", '"count": 2')
            events = _text(browser, "#events")
            assert "ACCEPTED" in events and "WAITING" in events

            # A seed job from the inbox: approve it in the form.
            browser.get(f"{url}/ui/inbox")
            _click(browser, "#inbox tr.job-row a.job-link")
            _find(browser, "#complete-form")
            timeline = _text(browser, "#timeline")
            assert "tokenize" in timeline and "review" in timeline
            browser.find_element(By.ID, "field-approved").click()
            browser.find_element(By.ID, "field-note").send_keys("looks right")
            browser.find_element(By.ID, "complete-submit").click()
            _text_becomes(browser, "#job-status", "COMPLETED", timeout_s=60)
            _text_becomes(browser, "#job-verdict", "3 steps")
            wait_for(lambda: _waiting(url) == JOBS - 1, timeout_s=30)
            # The transition history is on the page.
            _text_becomes(browser, "#history", "COMPLETED")

            # An operator action from its button: cancel a parked job, with a reason.
            browser.get(f"{url}/ui/inbox")
            _click(browser, "#inbox tr.job-row a.job-link")
            _find(browser, "#action-cancel-job")
            form = browser.find_element(By.ID, "action-cancel-job").find_element(By.XPATH, "..")
            form.find_element(By.NAME, "reason").send_keys("not needed")
            browser.find_element(By.ID, "confirm-cancel-job").click()
            browser.find_element(By.ID, "action-cancel-job").click()
            _text_becomes(browser, "#job-status", "CANCELLED", timeout_s=30)
            _text_becomes(browser, "#history", "not needed")
        finally:
            surfaces.close()


def test_dashboard_pages_answer_without_a_browser(tmp_path, fresh_dsn):
    """The HTTP side: the login redirect, the cookie, and a 404 page for an unknown job."""
    surfaces = start_node(node_environ(tmp_path, fresh_dsn, token=TOKEN))
    try:
        url = surfaces.http.url
        status, _, headers = http("GET", f"{url}/ui/static/dashboard.css")
        assert status == 200 and headers["Content-Type"].startswith("text/css")
        status, body, _ = http(
            "GET", f"{url}/ui/jobs/not-a-uuid", headers={"Cookie": f"protomolt_token={TOKEN}"}
        )
        assert status == 404 and b"invalid-input" in body
        status, body, _ = http("GET", f"{url}/ui/", headers={"Cookie": "protomolt_token=nope"})
        assert status in (200, 303) and (status == 303 or b"login-form" in body)
        # A graph workflow's job shows what each step waits for.
        graph = {
            "name": "fork",
            "schema": {"descriptorSetBase64": descriptor_set_b64()},
            "inputType": "jobs.test.Text",
            "steps": [
                {
                    "name": "tokenize",
                    "target": "127.0.0.1:1",
                    "method": "jobs.test.Tokenizer/Tokenize",
                    "rules": ["text = input.text"],
                },
                {
                    "name": "again",
                    "target": "127.0.0.1:1",
                    "method": "jobs.test.Tokenizer/Tokenize",
                    "after": [{"step": "tokenize", "on": "done"}],
                },
            ],
        }
        job_id = _submit(url, graph, "fork me")
        status, body, _ = http(
            "GET", f"{url}/ui/jobs/{job_id}", headers={"Cookie": f"protomolt_token={TOKEN}"}
        )
        assert status == 200 and b"after tokenize (done)" in body, body[:2000]
        # A form posted by another site's page is refused, whatever the cookie.
        status, body, _ = http(
            "POST",
            f"{url}/ui/jobs/00000000-0000-0000-0000-000000000001/action/cancel-job",
            raw=b"reason=x",
            headers={
                "Cookie": f"protomolt_token={TOKEN}",
                "Origin": "http://evil.example",
                "Content-Type": "application/x-www-form-urlencoded",
            },
        )
        assert status == 403 and b"permission-denied" in body
        # An Origin that is not a URL at all is refused the same way, not a 500.
        for origin in ("http://[", "http://[::1"):
            status, body, _ = http(
                "POST",
                f"{url}/ui/jobs/00000000-0000-0000-0000-000000000001/action/cancel-job",
                raw=b"reason=x",
                headers={"Cookie": f"protomolt_token={TOKEN}", "Origin": origin},
            )
            assert status == 403 and b"permission-denied" in body, (origin, status)
            status, body, _ = http(
                "POST",
                f"{url}/protomolt/actions/cancel-job",
                {"jobId": "00000000-0000-0000-0000-000000000001"},
                headers={"Authorization": f"Bearer {TOKEN}", "Origin": origin},
            )
            assert (status, body["error"]) == (403, "permission-denied"), (origin, body)
        # The API stays JSON: a verb without the token is a 401 envelope, not a redirect.
        status, body, _ = http("GET", f"{url}/protomolt/actions")
        assert status == 401 and body["error"] == "unauthenticated"
    finally:
        surfaces.close()


def _no_follow(url: str, path: str, headers: dict[str, str] | None = None):
    """One GET that does not follow a redirect: ``(status, Location header or None, body)``."""
    import http.client

    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.getheader("Location"), resp.read()
    finally:
        conn.close()


def test_ui_without_the_trailing_slash_redirects(tmp_path, fresh_dsn):
    """``/ui`` is sent to ``/ui/`` (its query kept), not answered with a 404 JSON body; without
    the token it goes to the login form like every page."""
    surfaces = start_node(node_environ(tmp_path, fresh_dsn, token=TOKEN))
    try:
        url = surfaces.http.url
        cookie = {"Cookie": f"protomolt_token={TOKEN}"}
        assert _no_follow(url, "/ui", cookie)[:2] == (307, "/ui/")
        assert _no_follow(url, "/ui?status=DEAD", cookie)[:2] == (307, "/ui/?status=DEAD")
        assert _no_follow(url, "/ui")[:2] == (303, "/ui/login")
        status, body, _ = http("GET", f"{url}/ui", headers=cookie)
        assert status == 200 and b"<html" in body.lower()
    finally:
        surfaces.close()


def test_the_jobs_page_searches_by_id_or_its_start(tmp_path, fresh_dsn):
    """The id filter: a unique start (or the whole id) opens the job, an ambiguous one lists
    the candidates, a malformed one shows list-jobs' invalid-input naming idPrefix."""
    surfaces = start_node(node_environ(tmp_path, fresh_dsn))
    try:
        url = surfaces.http.url
        ids = [
            "38ff9f29-0000-4000-8000-000000000001",
            "38ff9f29-0000-4000-8000-000000000002",
            "38ff0000-0000-4000-8000-000000000003",
        ]
        for job_id in ids:
            status, body, _ = http(
                "POST",
                f"{url}/protomolt/actions/submit-workflow",
                {"workflow": tally_workflow("127.0.0.1:1"), "input": {}, "jobId": job_id},
            )
            assert status == 200 and body["ok"], body
        assert _no_follow(url, "/ui/?id=38ff0000")[:2] == (303, f"/ui/jobs/{ids[2]}")
        assert _no_follow(url, f"/ui/?id={ids[1]}")[:2] == (303, f"/ui/jobs/{ids[1]}")
        status, _, page = _no_follow(url, "/ui/?id=38ff9f29")
        assert status == 200
        assert ids[0].encode() in page and ids[1].encode() in page
        assert b"2 jobs start with &#39;38ff9f29&#39;: pick one" in page
        assert ids[2].encode() not in page
        status, _, page = _no_follow(url, "/ui/?id=zz")
        assert status == 200 and b"invalid-input" in page and b"idPrefix" in page
    finally:
        surfaces.close()


def test_with_the_database_gone_pages_and_forms_are_503_quickly(tmp_path, fresh_dsn):
    """Not 404 "no such job" after three database waits: 503 with the unavailable message,
    within the store's bound (2 s) and a little."""
    import time

    import psycopg

    from tests.support import pg

    surfaces = start_node(node_environ(tmp_path, fresh_dsn))
    try:
        url = surfaces.http.url
        job_id = "00000000-0000-0000-0000-000000000001"
        pg.drop_database(psycopg.conninfo.conninfo_to_dict(fresh_dsn)["dbname"])
        for method, path, raw in (
            ("GET", "/ui/", None),
            ("GET", "/ui/inbox", None),
            ("GET", f"/ui/jobs/{job_id}", None),
            ("POST", f"/ui/jobs/{job_id}/complete", b"stepName=review&approved=on"),
            ("POST", f"/ui/jobs/{job_id}/action/cancel-job", b"reason=x&confirm=on"),
        ):
            started = time.monotonic()
            status, body, _ = http(method, f"{url}{path}", raw=raw)
            elapsed = time.monotonic() - started
            assert status == 503, (path, status)
            assert b"the jobs database cannot be reached" in body, path
            assert elapsed < 3.5, (path, elapsed)
    finally:
        surfaces.close()


def test_malformed_query_values_and_html_in_job_fields(tmp_path, fresh_dsn):
    """Malformed paging and filters show an invalid-input naming what was typed, never a 500;
    HTML in a workflow name, a job's input, a cancel reason (the job's error) and in echoed
    query values is escaped on every page; without the token no page shows a job."""
    surfaces = start_node(node_environ(tmp_path, fresh_dsn, token=TOKEN))
    evil = "<script>alert(1)</script>\"'><img src=x onerror=alert(2)>"
    quoted = urllib.parse.quote(evil)
    cookie = {"Cookie": f"protomolt_token={TOKEN}"}
    try:
        url = surfaces.http.url
        wf = seed_workflow("127.0.0.1:9", review="invoke")
        wf["name"] = "w-" + evil
        job_id = _submit(url, wf, evil)
        status, answer, _ = http(
            "POST",
            f"{url}/protomolt/actions/cancel-job",
            {"jobId": job_id, "reason": evil},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert status == 200 and answer["ok"], answer
        pages = [
            f"/ui/?page={10**30}",
            "/ui/?page=-5",
            "/ui/?page=abc",
            f"/ui/?status={quoted}",
            f"/ui/?workflow={quoted}",
            f"/ui/?queue={quoted}",
            f"/ui/?after={quoted}",
            f"/ui/jobs/{quoted}",
            f"/ui/jobs/{job_id}",
            "/ui/",
            "/ui/inbox",
        ]
        for path in pages:
            status, body, _ = http("GET", url + path, headers=cookie)
            assert status in (200, 404), (path, status)
            assert b"<script>alert" not in body and b"<img src=x" not in body, path
        status, body, _ = http("GET", f"{url}/ui/?page={10**30}", headers=cookie)
        assert b"invalid-input: &#39;page&#39; must be at most" in body, body[:3000]
        status, body, _ = http("GET", f"{url}/ui/?status={quoted}", headers=cookie)
        assert b"invalid-input: &#39;status&#39; must be one of" in body
        status, body, _ = http("GET", f"{url}/ui/jobs/{job_id}", headers=cookie)
        assert b"&lt;script&gt;alert(1)&lt;/script&gt;" in body  # shown, as text
        for headers in ({}, {"Cookie": "protomolt_token=wrong"}, {"Cookie": "protomolt_token="}):
            for path in ("/ui/", f"/ui/jobs/{job_id}", "/ui/inbox"):
                status, body, _ = http("GET", url + path, headers=headers)
                assert b"login-form" in body and job_id.encode() not in body, (headers, path)
            status, _, _ = http("GET", f"{url}/metrics", headers=headers)
            assert status == 401
    finally:
        surfaces.close()


#: A node with named tokens, groups and scopes (issue 26): editor-1 may operate, reader-1 only
#: read and answer parked steps.
SCOPED = """
[node.tokens]
editor-1 = "editor-secret"
reader-1 = "reader-secret"
[node.groups]
editor = ["editor-1"]
reader = ["reader-1"]
[node.scopes]
editor = ["service-invoke", "job-complete", "job-control"]
reader = ["service-invoke"]
"""


def _sign_in(browser, url: str, token: str) -> None:
    browser.get(f"{url}/ui/login")
    _find(browser, "#login-form")
    browser.find_element(By.ID, "token").send_keys(token)
    browser.find_element(By.ID, "login-submit").click()


def test_the_dashboard_acts_as_the_signed_in_principal(tmp_path, fresh_dsn, store, browser):
    """Signed in as editor-1, a cancel is recorded with actor editor-1; an unknown token is
    refused on the login page; reader-1 is offered no operator button. The node has only
    [node.tokens] (no api_token): the case whose login accepted any string before."""
    first, second = parked_job(store), parked_job(store)
    surfaces = start_node_with_file(tmp_path, fresh_dsn, SCOPED)
    try:
        url = surfaces.http.url
        # An unknown token stays on the login page, with a message.
        _sign_in(browser, url, "no-such-token")
        _text_becomes(browser, ".error", "Wrong token")
        assert browser.current_url.endswith("/ui/login")
        assert browser.find_elements(By.ID, "login-form")
        browser.get(f"{url}/ui/")
        _find(browser, "#login-form")  # still signed out

        # reader-1 sees the job but is offered no operator button.
        _sign_in(browser, url, "reader-secret")
        _text_becomes(browser, "#principal", "reader-1")
        browser.get(f"{url}/ui/jobs/{first.job_id}")
        _text_becomes(browser, "#job-status", "WAITING")
        assert browser.find_elements(By.CSS_SELECTOR, "[id^=action-]") == []
        _click(browser, "header .logout button")
        _find(browser, "#login-form")

        # editor-1 cancels from the button; the history names editor-1.
        _sign_in(browser, url, "editor-secret")
        _text_becomes(browser, "#principal", "editor-1")
        browser.get(f"{url}/ui/jobs/{second.job_id}")
        _find(browser, "#action-cancel-job")
        form = browser.find_element(By.ID, "action-cancel-job").find_element(By.XPATH, "..")
        form.find_element(By.NAME, "reason").send_keys("from the dashboard")
        browser.find_element(By.ID, "confirm-cancel-job").click()
        browser.find_element(By.ID, "action-cancel-job").click()
        _text_becomes(browser, "#job-status", "CANCELLED", timeout_s=30)
        last = store.job_history(second.job_id).transitions[-1]
        assert (last.kind, last.actor, last.reason) == ("cancel", "editor-1", "from the dashboard")
        _text_becomes(browser, "#history", "editor-1")
    finally:
        surfaces.close()


def test_dashboard_forms_run_as_the_cookie_principal_without_a_browser(tmp_path, fresh_dsn, store):
    """The HTTP side of the same: a reader's forged cancel is 403 on the page and a 'denied'
    row of the job's history; the login form refuses an unknown token with 401."""
    job = parked_job(store)
    surfaces = start_node_with_file(tmp_path, fresh_dsn, SCOPED)
    try:
        url = surfaces.http.url
        status, body, _ = http("POST", f"{url}/ui/login", raw=b"token=no-such-token")
        assert status == 401 and b"Wrong token" in body and b"login-form" in body
        status, _, _ = http("POST", f"{url}/ui/login", raw=b"token=reader-secret")
        assert status in (200, 303)
        reader = {"Cookie": "protomolt_token=reader-secret"}
        status, body, _ = http("GET", f"{url}/ui/jobs/{job.job_id}", headers=reader)
        assert status == 200 and b'id="action-cancel-job"' not in body
        status, body, _ = http(
            "POST",
            f"{url}/ui/jobs/{job.job_id}/action/cancel-job",
            raw=b"reason=forged",
            headers={**reader, "Content-Type": "application/x-www-form-urlencoded"},
        )
        assert status == 403 and b"permission-denied" in body and b"job-control" in body
        last = store.job_history(job.job_id).transitions[-1]
        assert (last.kind, last.actor) == ("denied", "reader-1")
        assert store.job_get(job.job_id).status == "WAITING"
        editor = {"Cookie": "protomolt_token=editor-secret"}
        status, body, _ = http("GET", f"{url}/ui/jobs/{job.job_id}", headers=editor)
        assert status == 200 and b'id="action-cancel-job"' in body
    finally:
        surfaces.close()

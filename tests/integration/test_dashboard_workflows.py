"""The dashboard's workflows page (``/ui/workflows``) in a real headless Chromium: the stored
workflows with their version, retention and last test result, a failing case with its first
difference; a caller without ``schema-read`` is refused (403) and sees no workflow. A real
node on real PostgreSQL; the workflows are the guide's *Tests in the definition* example."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

from selenium.webdriver.common.by import By

from tests.integration.test_dashboard import _find, _text, _text_becomes, browser  # noqa: F401
from tests.support.node import http, start_node_with_file

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "workflows.md"
_BLOCK = re.compile(r"<!-- tests-example: workflow order -->\n```json\n(?P<body>.*?)```", re.DOTALL)
ROOT, READER = "root-secret", "reader-secret"
NODE = f"""
[node]
api_token = "{ROOT}"
[node.tokens]
reader-1 = "{READER}"
[node.groups]
reader = ["reader-1"]
[node.scopes]
reader = ["service-invoke"]
"""
DIFF = "unmocked: step 'charge' was called 3 times; its mocks answer 2"


def _order() -> dict:
    return json.loads(_BLOCK.search(GUIDE.read_text(encoding="utf-8")).group("body"))


def _put(url: str, name: str, body: dict) -> dict:
    status, answer, _ = http(
        "PUT",
        f"{url}/protomolt/workflows/{name}",
        body,
        headers={"Authorization": f"Bearer {ROOT}"},
    )
    assert status == 200, answer
    return answer


def test_the_workflows_page_shows_version_retention_and_last_test(tmp_path, fresh_dsn, browser):  # noqa: F811
    node = start_node_with_file(tmp_path, fresh_dsn, NODE)
    try:
        url = node.http.url
        failing = copy.deepcopy(_order())
        failing["tests"][1]["mocks"]["charge"][1] = {"status": {"code": "UNAVAILABLE"}}
        _put(url, "order", _order())
        _put(url, "order", failing)  # version 2 fails one case; the gate is off
        kept = {**_order(), "retention": {"completed": "P1D", "failed": "P30D"}}
        _put(url, "kept", kept)

        browser.get(f"{url}/ui/login")
        _find(browser, "#login-form")
        browser.find_element(By.ID, "token").send_keys(ROOT)
        browser.find_element(By.ID, "login-submit").click()
        _find(browser, "#jobs, #jobs-empty, main")
        browser.find_element(By.ID, "nav-workflows").click()
        _find(browser, "#workflows")

        order = 'tr[data-workflow="order"]'
        assert _text(browser, f"{order} .workflow-version") == "2"
        _text_becomes(browser, f"{order} .test-result", "failed")
        assert "2 passed, 1 failed" in _text(browser, f"{order} .workflow-test")
        assert "by api (put)" in _text(browser, f"{order} .workflow-test")
        assert _text(browser, f"{order} .case-failed") == f"FAIL charge retried once: {DIFF}"
        assert len(browser.find_elements(By.CSS_SELECTOR, f"{order} .case-passed")) == 2
        assert "completed 30d" in _text(browser, f"{order} .workflow-retention")

        kept_row = 'tr[data-workflow="kept"]'
        assert _text(browser, f"{kept_row} .workflow-version") == "1"
        assert _text(browser, f"{kept_row} .test-result") == "passed"
        retention = _text(browser, f"{kept_row} .workflow-retention")
        assert "completed 1d (workflow)" in retention
        assert "failed 30d (workflow)" in retention
        assert "dead 30d" in retention and "dead 30d (workflow)" not in retention

        # a caller without schema-read: refused, naming the scope, no workflow shown
        status, body, _ = http(
            "GET", f"{url}/ui/workflows", headers={"Cookie": f"protomolt_token={READER}"}
        )
        assert status == 403, body
        assert b"permission-denied" in body and b"schema-read" in body
        assert b'data-workflow="order"' not in body
    finally:
        node.close()

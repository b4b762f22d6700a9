"""The run's artifacts on the job page and ``promote-artifact`` from it, in a real headless
Chromium (docs/artifacts.md *Promote*): a caller holding ``job-control`` promotes a verified
artifact with a reason (the flash says so, the artifact's log names the caller and the reason);
a caller without it is offered no button, and a post it forges is refused 403 naming the
scope (recorded in the run's history); an artifact that is not verified is refused with the
verb's message (``not-verified`` naming its state), never a 500. Real node with tokens, real
PostgreSQL, the test ``Steps/Run`` service on loopback.
"""

from __future__ import annotations

from selenium.webdriver.common.by import By

from tests.integration.test_dashboard import _find, _text, _text_becomes, browser
from tests.integration.test_explain_inputs import NODE, TOKENS, post, status_becomes, submit
from tests.support.graphs import graph, step
from tests.support.node import start_node_with_file

__all__ = ["browser"]  # the fixture, shared with test_dashboard.py


def _validated(t: str) -> dict:
    """a, b, and v validating both: a and b end verified, v draft."""
    return graph(
        [
            step("a", t),
            step("b", t, reads=["a"]),
            step("v", t, reads=["a", "b"], validates=["a", "b"]),
        ],
        name="validated",
    )


def _sign_in(browser, url: str, who: str) -> None:
    browser.get(f"{url}/ui/login")
    _find(browser, "#login-form")
    browser.find_element(By.ID, "token").send_keys(TOKENS[who])
    browser.find_element(By.ID, "login-submit").click()
    _text_becomes(browser, "#principal", who)


def _forge(browser, url: str, job_id: str, fields: dict[str, str]) -> None:
    """Post the promote form the page did not offer, from the page itself (same origin)."""
    browser.execute_script(
        """
        const f = document.createElement('form');
        f.method = 'post';
        f.action = arguments[0];
        for (const [k, v] of Object.entries(arguments[1])) {
            const i = document.createElement('input');
            i.type = 'hidden'; i.name = k; i.value = v; f.appendChild(i);
        }
        document.body.appendChild(f);
        f.submit();
        """,
        f"{url}/ui/jobs/{job_id}/action/promote-artifact",
        fields,
    )


def _state(browser, artifact_id: str) -> str:
    return _text(browser, f'tr[data-artifact-id="{artifact_id}"] .artifact-state')


def test_promote_an_artifact_from_the_job_page(tmp_path, fresh_dsn, services, browser):
    surfaces = start_node_with_file(tmp_path, fresh_dsn, NODE)
    try:
        url = surfaces.http.url
        job_id = submit(url, _validated(services.target), {"text": "x"})
        status_becomes(url, job_id, "COMPLETED")
        _, listed, _ = post(url, "list-artifacts", {"jobId": job_id})
        ids = {a["step"]: a["artifactId"] for a in listed["artifacts"] if a["port"] == "response"}
        states = {a["step"]: a["state"] for a in listed["artifacts"] if a["port"] == "response"}
        assert states == {"a": "verified", "b": "verified", "v": "draft"}

        # ana (no job-control) sees the artifacts but no promote button; a forged post is
        # refused 403 naming the scope, recorded in the run's history; nothing changes
        _sign_in(browser, url, "ana")
        browser.get(f"{url}/ui/jobs/{job_id}")
        _find(browser, f'tr[data-artifact-id="{ids["a"]}"]')
        assert _state(browser, ids["a"]) == "verified"
        assert browser.find_elements(By.CSS_SELECTOR, "[id^=promote-]") == []
        _forge(browser, url, job_id, {"artifactId": ids["a"], "reason": "r", "confirm": "on"})
        _text_becomes(browser, "#form-error", "permission-denied")
        assert "job-control" in _text(browser, "#form-error")
        _, history, _ = post(url, "job-history", {"jobId": job_id})
        last = history["transitions"][-1]
        assert (last["kind"], last["actor"]) == ("denied", "ana")
        assert "promote-artifact" in last["reason"]
        _, got, _ = post(url, "get-artifact", {"artifactId": ids["a"]})
        assert got["artifact"]["state"] == "verified"

        # ops (job-control): a promote form on each verified artifact, none on the draft
        _sign_in(browser, url, "ops")
        browser.get(f"{url}/ui/jobs/{job_id}")
        _find(browser, f"#promote-{ids['a']}")
        assert browser.find_elements(By.ID, f"promote-{ids['b']}")
        assert not browser.find_elements(By.ID, f"promote-{ids['v']}")
        scope = browser.find_element(By.CSS_SELECTOR, f"#promote-form-{ids['a']} .scope")
        assert scope.get_attribute("data-scope") == "job-control"
        # without a reason: the verb's invalid-input, naming the field
        browser.find_element(By.ID, f"promote-confirm-{ids['a']}").click()
        browser.find_element(By.ID, f"promote-{ids['a']}").click()
        _text_becomes(browser, "#flash-text", "promote-artifact: invalid-input")
        assert "'reason'" in _text(browser, "#flash-text")
        assert _state(browser, ids["a"]) == "verified"
        # with a reason: promoted, the caller and the reason in the artifact's log
        browser.find_element(By.ID, f"promote-reason-{ids['a']}").send_keys("board signed off")
        browser.find_element(By.ID, f"promote-confirm-{ids['a']}").click()
        browser.find_element(By.ID, f"promote-{ids['a']}").click()
        _text_becomes(
            browser, "#flash-text", f"promote-artifact: artifact {ids['a']} is now promoted"
        )
        assert _state(browser, ids["a"]).startswith("promoted")
        assert not browser.find_elements(By.ID, f"promote-{ids['a']}")
        _, got, _ = post(url, "get-artifact", {"artifactId": ids["a"]})
        assert [
            (t["actor"], t["from"], t["to"], t["reason"]) for t in got["artifact"]["transitions"]
        ][-1] == ("ops", "verified", "promoted", "board signed off")

        # a race: b is retracted after the page offered its button; the press is refused
        # with the verb's message naming the state, and b stays retracted
        _find(browser, f"#promote-{ids['b']}")
        status, retracted, _ = post(
            url, "retract-artifact", {"artifactId": ids["b"], "reason": "bad data"}
        )
        assert status == 200 and retracted["ok"], retracted
        browser.find_element(By.ID, f"promote-reason-{ids['b']}").send_keys("ship it")
        browser.find_element(By.ID, f"promote-confirm-{ids['b']}").click()
        browser.find_element(By.ID, f"promote-{ids['b']}").click()
        _text_becomes(
            browser,
            "#flash-text",
            f"promote-artifact refused: not-verified: artifact {ids['b']} is retracted",
        )
        assert _state(browser, ids["b"]).startswith("retracted")
        # a draft one, posted though not offered: refused the same way, nothing written
        _forge(browser, url, job_id, {"artifactId": ids["v"], "reason": "r", "confirm": "on"})
        _text_becomes(
            browser,
            "#flash-text",
            f"promote-artifact refused: not-verified: artifact {ids['v']} is draft",
        )
        _, got, _ = post(url, "get-artifact", {"artifactId": ids["v"]})
        assert (got["artifact"]["state"], got["artifact"]["transitions"]) == ("draft", [])
    finally:
        surfaces.close()

"""A run waiting for an input on the dashboard in a real headless Chromium (issue 29 item 6;
docs/explain.md): the inbox names the input's owner and offers the supply form; the job page
renders explain-job (*Why is it waiting?*); a value of the wrong type is refused on the page
as invalid-input naming the field, and a right one, supplied by the owner signed in, queues
the run, which completes. Real node with tokens, real PostgreSQL, the test ``Steps/Run``
service on loopback."""

from __future__ import annotations

from selenium.webdriver.common.by import By

from tests.integration.test_dashboard import _find, _text, _text_becomes, browser
from tests.integration.test_explain_inputs import (
    NODE,
    TOKENS,
    doc_workflow,
    explain,
    get_job,
    status_becomes,
    submit,
)
from tests.support.node import start_node_with_file

__all__ = ["browser"]  # the fixture, shared with test_dashboard.py


def test_the_inbox_names_the_owner_and_the_owner_supplies_the_input_from_the_page(
    tmp_path, fresh_dsn, services, browser
):
    surfaces = start_node_with_file(tmp_path, fresh_dsn, NODE)
    try:
        url = surfaces.http.url
        job_id = submit(url, doc_workflow(services.target), {"text": "q3"})
        status_becomes(url, job_id, "WAITING", "waiting_input")

        browser.get(f"{url}/ui/login")
        _find(browser, "#login-form")
        browser.find_element(By.ID, "token").send_keys(TOKENS["ana"])
        browser.find_element(By.ID, "login-submit").click()
        _find(browser, "#jobs")  # the login's redirect landed

        # the inbox: the run, its step, the input and its owner, a supply form
        browser.get(f"{url}/ui/inbox")
        row = _find(browser, f'tr.input-row[data-job-id="{job_id}"]')
        assert row.get_attribute("data-path") == "lang"
        assert row.find_element(By.CSS_SELECTOR, "td.owner").text == "team:data"
        assert "analyse" in row.text
        assert not browser.find_elements(By.CSS_SELECTOR, f'#inbox tr[data-job-id="{job_id}"]')

        # the job page: explain-job's account and the supply form
        browser.get(f"{url}/ui/jobs/{job_id}")
        analyse = _find(browser, '#explain-steps tr[data-step="analyse"]')
        assert (
            "lang (owner team:data)"
            in analyse.find_element(By.CSS_SELECTOR, ".missing-inputs").text
        )
        assert "supply-input" in analyse.find_element(By.CSS_SELECTOR, ".waiting-on").text
        publish = _find(browser, '#explain-steps tr[data-step="publish"]')
        assert publish.find_element(By.CSS_SELECTOR, ".blocked-by").text == "analyse (waiting)"
        assert "team:data" in _text(browser, "#supply .owner")
        assert not browser.find_elements(By.ID, "complete-form")  # not an external step

        # a value of the wrong type: invalid-input naming the field, the values kept
        browser.find_element(By.ID, "supply-value").send_keys('{"a": 1}')
        browser.find_element(By.ID, "supply-submit").click()
        _text_becomes(browser, "#flash-text", "supply-input: invalid-input: 'value' is not valid")
        assert "'lang'" in _text(browser, "#flash-text")
        assert get_job(url, job_id)["status"] == "WAITING"

        # the right value, typed as text: the run is queued and completes
        value = browser.find_element(By.ID, "supply-value")
        value.clear()
        value.send_keys("en")
        browser.find_element(By.ID, "supply-reason").send_keys("from the page")
        browser.find_element(By.ID, "supply-submit").click()
        _text_becomes(browser, "#flash-text", "supply-input: lang supplied; the job is QUEUED")
        done = status_becomes(url, job_id, "COMPLETED")
        assert done["input"]["lang"] == "en"
        (revision,) = explain(url, job_id)["revisions"]
        assert revision["actor"] == "ana" and revision["reason"] == "from the page"
    finally:
        surfaces.close()

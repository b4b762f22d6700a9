"""The operator's dashboard in a real headless Chromium (issue 31 items 2, 3 and 7): only the
actions a job's status allows, each confirmed; a deferred resume from a local time and zone,
shown on the page; bad input named on the page; reconcile of a RECOVERY_REQUIRED job from the
inbox; a race lost to the worker named in the message; bulk requeue with one outcome per job;
the broken integrity row highlighted. Real node, real PostgreSQL.

Screenshots for docs/operations.md: set ``PROTOMOLT_SCREENSHOTS=docs/img`` once to refresh
them (``docs/img/*.png``); without it the test saves nothing (failures still leave a screenshot
in ``$PROTOMOLT_TEST_ARTIFACTS``, as in test_dashboard.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from tests.integration.test_dashboard import _click, _find, _text, _text_becomes, browser
from tests.integration.test_dashboard_actions import job_in
from tests.support.node import node_environ, start_node, wait_for

__all__ = ["browser"]  # the fixture, shared with test_dashboard.py

SHOTS = os.environ.get("PROTOMOLT_SCREENSHOTS", "")


def shot(driver, name: str, at: str = "") -> None:
    """Save the page (scrolled to the element ``at`` names, when given) as
    ``$PROTOMOLT_SCREENSHOTS/<name>.png`` when that is set."""
    if not SHOTS:
        return
    Path(SHOTS).mkdir(parents=True, exist_ok=True)
    driver.set_window_size(1280, 900)
    if at:
        driver.execute_script(
            "arguments[0].scrollIntoView({block: 'start'})",
            driver.find_element(By.CSS_SELECTOR, at),
        )
    driver.get_screenshot_as_file(str(Path(SHOTS) / f"{name}.png"))


def _press(driver, verb: str, *, reason: str = "", confirm: bool = True) -> None:
    if reason:
        field = driver.find_element(By.ID, f"reason-{verb}")
        field.clear()
        field.send_keys(reason)
    if confirm:
        driver.find_element(By.ID, f"confirm-{verb}").click()
    driver.find_element(By.ID, f"action-{verb}").click()


def _set(driver, css: str, value: str) -> None:
    """Set an input's value as typed (a datetime-local box's keys depend on the locale)."""
    driver.execute_script("arguments[0].value = arguments[1]", _find(driver, css), value)


def test_the_operator_dashboard_in_a_real_browser(tmp_path, fresh_dsn, store, browser):
    surfaces = start_node(node_environ(tmp_path, fresh_dsn))
    try:
        url = surfaces.http.url
        dead, failed, waiting = (job_in(store, s) for s in ("DEAD", "FAILED", "WAITING"))
        paused, stuck = job_in(store, "PAUSED"), job_in(store, "RECOVERY_REQUIRED")

        # The jobs list: relative times beside absolute ones; RECOVERY_REQUIRED has its badge.
        browser.get(f"{url}/ui/")
        _find(browser, f'tr[data-job-id="{stuck}"]')
        assert "just now" in _text(browser, f'tr[data-job-id="{dead}"]') or "ago" in _text(
            browser, f'tr[data-job-id="{dead}"]'
        )
        badge = browser.find_element(
            By.CSS_SELECTOR, f'tr[data-job-id="{stuck}"] .status-recovery_required'
        )
        paused_badge = browser.find_element(
            By.CSS_SELECTOR, f'tr[data-job-id="{paused}"] .status-paused'
        )
        assert badge.value_of_css_property(
            "background-color"
        ) != paused_badge.value_of_css_property("background-color")
        shot(browser, "jobs")

        # A WAITING job: cancel and pause only; without the confirm box nothing is sent.
        browser.get(f"{url}/ui/jobs/{waiting}")
        _text_becomes(browser, "#job-status", "WAITING")
        offered = {
            e.get_attribute("id") for e in browser.find_elements(By.CSS_SELECTOR, "[id^=action-]")
        }
        assert offered == {"action-cancel-job", "action-pause-job"}, offered
        shot(browser, "job-waiting", at="#actions")
        _press(browser, "pause-job", confirm=False)
        assert browser.current_url.endswith(f"/ui/jobs/{waiting}")
        assert not browser.find_elements(By.ID, "flash")
        assert _text(browser, "#job-status") == "WAITING"

        # A race: the job is completed (step answered, run settled) before the cancel lands.
        store.job_complete_parked(
            waiting, "approve", {"name": "approve", "skipped": False, "response": {}}
        )
        claimed = store.job_claim("w", 30.0, queues=(store.job_get(waiting).queue,))
        store.job_complete(claimed.lease, {}, "done")
        _press(browser, "cancel-job", reason="too late")
        _text_becomes(browser, "#flash-text", "cancel-job refused")
        assert "is COMPLETED" in _text(browser, "#flash-text")
        _text_becomes(browser, "#job-status", "COMPLETED")
        assert browser.current_url.endswith(f"/ui/jobs/{waiting}")  # not the POST address

        # A PAUSED job: a time the clocks skip is refused naming the field, then a deferred
        # resume from a local time in Berlin shows its UTC run-after time.
        browser.get(f"{url}/ui/jobs/{paused}")
        _find(browser, "#resume-at")
        assert not browser.find_elements(By.ID, "action-requeue-job")
        _set(browser, "#resume-at", "2027-03-28T02:30")
        Select(browser.find_element(By.ID, "resume-zone")).select_by_value("Europe/Berlin")
        _press(browser, "resume-job", reason="after the window")
        _text_becomes(
            browser, "#flash-text", "invalid-input: Field 'at': 2027-03-28 02:30:00 does not exist"
        )
        shot(browser, "invalid-input")
        assert _text(browser, "#job-status") == "PAUSED"
        _set(browser, "#resume-at", "2030-07-01T09:30")
        Select(browser.find_element(By.ID, "resume-zone")).select_by_value("Europe/Berlin")
        _press(browser, "resume-job", reason="after the window")
        _text_becomes(browser, "#flash-text", "to run after 2030-07-01T07:30:00Z")
        _text_becomes(browser, "#job-status", "QUEUED")
        assert _text(browser, "#run-after").startswith("2030-07-01 07:30:00 in ")
        shot(browser, "job-deferred-resume")

        # RECOVERY_REQUIRED: in the inbox with its badge; reconcile from its form.
        browser.get(f"{url}/ui/inbox")
        _find(browser, f'#recovery tr[data-job-id="{stuck}"]')
        shot(browser, "inbox-recovery")
        _click(browser, f'#recovery tr[data-job-id="{stuck}"] a.job-link')
        _text_becomes(browser, "#job-status", "RECOVERY_REQUIRED")
        assert not browser.find_elements(By.ID, "action-resume-job")
        assert browser.find_elements(By.ID, "action-migrate-checkpoint")
        assert (
            browser.find_element(By.ID, "reconcile-step-name").get_attribute("value") == "tokenize"
        )
        Select(browser.find_element(By.ID, "reconcile-outcome")).select_by_value("not-done")
        browser.find_element(By.ID, "reason-reconcile-step").send_keys("the call never left")
        shot(browser, "job-recovery", at="#actions")
        _press(browser, "reconcile-step")
        _text_becomes(browser, "#flash-text", "reconcile-step: now QUEUED")
        _text_becomes(browser, "#job-status", "QUEUED")
        _text_becomes(browser, "#history", "the call never left")

        # Bulk: requeue the DEAD and FAILED jobs and a WAITING one; each outcome is reported.
        other = job_in(store, "WAITING")
        browser.get(f"{url}/ui/?workflow=seed-review")
        for job_id in (dead, failed, other):
            _click(browser, f'tr[data-job-id="{job_id}"] input.pick')
        Select(browser.find_element(By.ID, "bulk-action")).select_by_value("requeue-job")
        browser.find_element(By.ID, "bulk-reason").send_keys("broker is back")
        browser.find_element(By.ID, "bulk-confirm").click()
        browser.find_element(By.ID, "bulk-submit").click()
        _text_becomes(browser, "#flash-text", "requeue-job on 3 jobs: 2 done, 1 refused")
        assert "workflow=seed-review" in browser.current_url
        for job_id in (dead, failed):
            _find(browser, f'#bulk-outcomes tr.outcome-ok[data-job-id="{job_id}"]')
        refused = _text(browser, f'#bulk-outcomes tr.outcome-refused[data-job-id="{other}"]')
        assert "is WAITING; only a DEAD or FAILED job can be requeued" in refused
        shot(browser, "bulk")
        wait_for(lambda: store.job_get(dead).status == "QUEUED")

        # A broken history chain: the row that no longer matches its hash is highlighted.
        with psycopg.connect(fresh_dsn, autocommit=True) as conn:
            conn.execute(
                "UPDATE workflow_run_transition SET reason = 'edited by hand' "
                "WHERE job_id = %s AND seq = 2",
                (stuck,),
            )
        browser.get(f"{url}/ui/jobs/{stuck}")
        _text_becomes(browser, "#integrity", "broken at seq 2")
        row = _find(browser, "#broken-row")
        assert row.text.startswith("2 ")
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", row)
        shot(browser, "job-broken-chain")
    finally:
        surfaces.close()

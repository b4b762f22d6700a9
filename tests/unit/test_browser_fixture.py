"""Without Chromium only the dashboard's browser tests fail, with the apt-get hint; the suite
still collects and runs (issue 31). No browser is started here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.browser import INSTALL_HINT, browser_paths, require_browser

ROOT = Path(__file__).resolve().parents[2]


def test_a_missing_browser_fails_the_test_with_the_install_command(tmp_path):
    driver = tmp_path / "chromedriver"
    driver.write_text("")
    missing = str(tmp_path / "no-chromium")
    with pytest.raises(pytest.fail.Exception) as info:
        require_browser(missing, str(driver))
    message = str(info.value)
    assert missing in message and str(driver) not in message
    assert "apt-get install chromium chromium-driver" in message and INSTALL_HINT in message
    with pytest.raises(pytest.fail.Exception, match="no-driver"):
        require_browser(str(driver), str(tmp_path / "no-driver"))


def test_a_present_browser_passes(tmp_path):
    chromium, driver = tmp_path / "chromium", tmp_path / "chromedriver"
    chromium.write_text("")
    driver.write_text("")
    assert require_browser(str(chromium), str(driver)) is None


def test_the_paths_come_from_the_environment_first(tmp_path):
    environ = {"PROTOMOLT_TEST_CHROMIUM": "/x/chromium", "PROTOMOLT_TEST_CHROMEDRIVER": "/x/d"}
    assert browser_paths(environ) == ("/x/chromium", "/x/d")
    chromium, driver = browser_paths({})
    assert chromium.endswith("chromium") and driver.endswith("chromedriver")


def test_the_dashboard_module_collects_without_a_browser(tmp_path):
    """Collection no longer aborts: every test of the module is collected with the browser's
    paths pointing nowhere (before, the module raised at import and pytest stopped)."""
    env = dict(os.environ)
    env["PROTOMOLT_TEST_CHROMIUM"] = str(tmp_path / "no-chromium")
    env["PROTOMOLT_TEST_CHROMEDRIVER"] = str(tmp_path / "no-chromedriver")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--collect-only",
            "-q",
            "tests/integration/test_dashboard.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "test_dashboard_in_a_real_browser" in done.stdout
    assert "test_dashboard_pages_answer_without_a_browser" in done.stdout

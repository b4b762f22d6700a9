"""Where the dashboard's browser tests find Chromium, and the failure when it is missing.

A real browser is part of the suite, like PostgreSQL: a test that needs it fails (never skips)
with the install command. Only those tests: the check runs in their fixture, not at import, so
``pytest`` without Chromium still collects and runs everything else.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import pytest

__all__ = ["INSTALL_HINT", "browser_paths", "require_browser"]

#: What to run when the browser is missing (``.ci/run`` runs it).
INSTALL_HINT = "apt-get install chromium chromium-driver (.ci/run does this)"


def browser_paths(environ: Mapping[str, str] = os.environ) -> tuple[str, str]:
    """``(chromium, chromedriver)``: ``$PROTOMOLT_TEST_CHROMIUM`` and
    ``$PROTOMOLT_TEST_CHROMEDRIVER`` when set, else the ones on ``PATH``, else Debian's paths."""
    chromium = environ.get("PROTOMOLT_TEST_CHROMIUM") or shutil.which("chromium")
    driver = environ.get("PROTOMOLT_TEST_CHROMEDRIVER") or shutil.which("chromedriver")
    return chromium or "/usr/bin/chromium", driver or "/usr/bin/chromedriver"


def require_browser(chromium: str, chromedriver: str) -> None:
    """Fail the calling test (a fixture's setup) when either file is missing.

    :raises pytest.fail.Exception: naming the missing paths and :data:`INSTALL_HINT`.
    """
    missing = [path for path in (chromium, chromedriver) if not Path(path).exists()]
    if missing:
        pytest.fail(
            f"the dashboard's browser tests need Debian's chromium and chromium-driver; "
            f"missing {', '.join(missing)}: {INSTALL_HINT}",
            pytrace=False,
        )

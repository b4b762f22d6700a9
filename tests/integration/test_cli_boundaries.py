"""Start failures are one clear line, never a traceback: a busy port under ``demo``, a DSN
that leads nowhere (the error names ``jobs.dsn``)."""

from __future__ import annotations

import io
import socket

import pytest
from rich.console import Console

from protomolt_jobs.hooks.contract import ComposerError
from protomolt_jobs.host.demo import run_demo
from tests.support.node import node_environ, start_node


def _console() -> Console:
    return Console(file=io.StringIO(), width=400, record=True)


def test_demo_on_a_busy_port_is_one_error_line_and_exit_1(tmp_path, fresh_dsn, monkeypatch):
    monkeypatch.setenv("PROTOMOLT_JOBS_DSN", fresh_dsn)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        console = _console()
        code = run_demo(
            data_dir=tmp_path / "data",
            http_port=busy.getsockname()[1],
            timeout_s=30,
            console=console,
        )
    text = console.export_text()
    assert code == 1
    assert "error: the demo node did not start" in text
    assert "Traceback" not in text


def test_demo_with_a_dsn_that_leads_nowhere_names_jobs_dsn(tmp_path, monkeypatch):
    monkeypatch.setenv("PROTOMOLT_JOBS_DSN", "not a dsn")
    console = _console()
    code = run_demo(data_dir=tmp_path / "data", timeout_s=30, console=console)
    text = console.export_text()
    assert code == 1
    assert "jobs.dsn" in text
    assert "Traceback" not in text


@pytest.mark.parametrize("dsn", ["not a dsn", "postgresql://postgres@127.0.0.1:1/none"])
def test_a_node_whose_dsn_leads_nowhere_fails_naming_jobs_dsn(tmp_path, dsn):
    with pytest.raises(ComposerError, match=r"jobs\.dsn .* does not lead to a usable database"):
        start_node(node_environ(tmp_path / "data", dsn))

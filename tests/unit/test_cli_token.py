"""The client commands' token: --token, else the canonical variable, else its alias (the
precedence the node's configuration loader uses)."""

from __future__ import annotations

import argparse

from protomolt_jobs.host.cli import _token


def test_the_canonical_variable_beats_its_alias(monkeypatch):
    monkeypatch.setenv("PROTOMOLT_API_TOKEN", "alias")
    monkeypatch.setenv("PROTOMOLT_NODE_API_TOKEN", "canonical")
    assert _token(argparse.Namespace(token=None)) == "canonical"
    assert _token(argparse.Namespace(token="flag")) == "flag"


def test_the_alias_alone_still_works(monkeypatch):
    monkeypatch.delenv("PROTOMOLT_NODE_API_TOKEN", raising=False)
    monkeypatch.setenv("PROTOMOLT_API_TOKEN", "alias")
    assert _token(argparse.Namespace(token=None)) == "alias"

"""The progress token and the ``reportsProgress`` key (issue 28 item 2; docs/long-steps.md
*ReportProgress*): unit tests with a fake step call (no network)."""

from __future__ import annotations

import base64
import copy
import dataclasses
import json
import uuid

import pytest

from protomolt_jobs import workflow as engine
from protomolt_jobs.store.progress_token import (
    HEADER,
    UNKNOWN_LEASE_TOKEN,
    ProgressToken,
    mac_of,
)
from protomolt_jobs.store.records import Lease
from protomolt_jobs.workflow import resumable
from protomolt_jobs.workflow.effects import EffectContext
from tests.support.render_service import message_class, render_workflow

RUNTIME = engine.Runtime()


def _token(**overrides):
    fields = {
        "lease": Lease(uuid.uuid4(), "worker-1", 2, uuid.uuid4()),
        "step": "render",
        "iteration": 3,
        "resumable": True,
        **overrides,
    }
    return ProgressToken(**fields)


def _read(token):
    """What decoding ``token``'s text gives back: every binding but the lease token, which
    the text never carries (its mac stands for it)."""
    decoded = ProgressToken.decode(token.encode())
    assert decoded.lease.token == UNKNOWN_LEASE_TOKEN
    assert decoded.mac == mac_of(decoded.bound, token.lease.token)
    return dataclasses.replace(
        decoded, lease=dataclasses.replace(decoded.lease, token=token.lease.token), mac="", bound=""
    )


def test_a_token_round_trips_every_binding():
    token = _token()
    text = token.encode()
    assert text.startswith("pmp2.") and text.isascii() and "=" not in text
    assert _read(token) == token
    assert str(token.lease.token) not in base64.urlsafe_b64decode(text[5:] + "==").decode()


def test_a_token_rewritten_by_its_holder_no_longer_matches_its_mac():
    token = _token(definition_sha256="c" * 64)
    decoded = ProgressToken.decode(token.encode())
    body = json.loads(base64.urlsafe_b64decode(token.encode()[5:] + "=="))
    for i, value in [(1, "publish"), (2, 4), (6, False), (7, "other"), (10, "")]:
        forged = list(body)
        forged[i] = value
        raw = base64.urlsafe_b64encode(json.dumps(forged).encode()).decode().rstrip("=")
        rewritten = ProgressToken.decode("pmp2." + raw)
        assert rewritten.mac == decoded.mac  # the holder cannot recompute it ...
        assert mac_of(rewritten.bound, token.lease.token) != rewritten.mac  # ... so no match


def test_a_token_of_the_first_format_is_refused():
    body = ["00000000-0000-0000-0000-000000000001", "render", 0, 1, "w", str(uuid.uuid4()), True]
    raw = base64.urlsafe_b64encode(json.dumps(body).encode()).decode().rstrip("=")
    for prefix in ("pmp1.", "pmp2."):  # the lease token in the clear is not a mac
        with pytest.raises(ValueError, match=r"^token: "):
            ProgressToken.decode(prefix + raw)


def test_a_token_carries_the_calls_fingerprints():
    prints = {
        "adapter_version": "render-1.0",
        "input_sha256": "a" * 64,
        "descriptor_sha256": "b" * 64,
        "definition_sha256": "c" * 64,
    }
    token = _token(**prints)
    assert _read(token) == token
    # a token issued without fingerprints (7 elements) still reads, with none
    legacy = _token()
    assert ProgressToken.decode(legacy.encode()).definition_sha256 == ""
    # fingerprints that would make the token too long are left out, never a refused token
    huge = _token(**{**prints, "adapter_version": "v" * 3000})
    text = huge.encode()
    assert len(text) <= 2048
    assert _read(huge) == _token(lease=huge.lease)


def test_a_token_with_a_malformed_fingerprint_is_refused():
    good = _token(definition_sha256="c" * 64, input_sha256="a" * 64).encode()
    body = json.loads(base64.urlsafe_b64decode(good[5:] + "=" * (-len(good[5:]) % 4)))
    assert len(body) == 11
    for i, bad in [(8, "xyz"), (10, "C" * 64), (7, 5), (9, None)]:
        forged = list(body)
        forged[i] = bad
        raw = base64.urlsafe_b64encode(json.dumps(forged).encode()).decode().rstrip("=")
        with pytest.raises(ValueError, match=r"^token: "):
            ProgressToken.decode("pmp2." + raw)
    raw = base64.urlsafe_b64encode(json.dumps(body[:9]).encode()).decode().rstrip("=")
    with pytest.raises(ValueError, match=r"^token: "):
        ProgressToken.decode("pmp2." + raw)


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "  ",
        5,
        "garbage",
        "pmp2.",
        "pmp2.!!!",
        "pmp2.bm90IGpzb24",
        "pmp2." + "A" * 3000,
        "pmp1.x",
    ],
)
def test_anything_else_is_refused_naming_token(text):
    with pytest.raises(ValueError, match=r"^token: "):
        ProgressToken.decode(text)


def test_a_token_of_another_shape_is_refused():
    good = _token().encode()
    body = json.loads(base64.urlsafe_b64decode(good[5:] + "=" * (-len(good[5:]) % 4)))
    for i, bad in [(2, -1), (3, "2"), (0, "not-a-uuid"), (1, ""), (6, "yes")]:
        forged = list(body)
        forged[i] = bad
        raw = base64.urlsafe_b64encode(json.dumps(forged).encode()).decode().rstrip("=")
        with pytest.raises(ValueError, match=r"^token: "):
            ProgressToken.decode("pmp2." + raw)


def _step(reports):
    wf = copy.deepcopy(render_workflow("127.0.0.1:1"))
    del wf["steps"][0]["resumable"]
    if reports is not None:
        wf["steps"][0]["reportsProgress"] = reports
    return engine.parse_workflow(wf, RUNTIME).steps[0]


def test_reports_progress_must_be_a_boolean():
    assert _step(True).reports_progress is True
    assert _step(None).reports_progress is False
    with pytest.raises(engine.WorkflowParseError, match="'reportsProgress' must be true or false"):
        _step("yes")


class _Fake:
    def __init__(self):
        self.metadata = []

    def __call__(self, channel, step, request, timeout_s, metadata, watch):
        self.metadata.append(metadata)
        out = message_class("render.v1.RenderChunk")()
        out.done = True
        return out


def _call(monkeypatch, step, effects):
    fake = _Fake()
    monkeypatch.setattr(resumable, "call_unary", fake)
    request = message_class("render.v1.RenderRequest")(scene="s", frames=1)
    resumable.call(None, step, request, 1000, lambda: 1000, [("a", "b")], effects)
    return fake.metadata


def test_only_a_step_that_opts_in_carries_the_token(monkeypatch):
    issued, prints = [], []

    def token(step, iteration, is_resumable, fingerprints):
        issued.append((step, iteration, is_resumable))
        prints.append(dict(fingerprints))
        return (HEADER, "pmp1.x")

    reports = []
    effects = EffectContext(
        job_id="j", progress_token=token, on_progress=lambda *a: reports.append(a)
    )
    assert _call(monkeypatch, _step(True), effects) == [[("a", "b"), (HEADER, "pmp1.x")]]
    assert issued == [("render", 0, False)]
    # the token carries the call's fingerprints, the same ones its closing report stores
    assert prints[0]["adapterVersion"] == "render-1.0" and len(prints[0]["inputSha256"]) == 64
    assert reports[0][2]["inputSha256"] == prints[0]["inputSha256"]
    # a reporting step that is not resumable has its row closed after the call
    assert [(r[0], r[2]["done"], r[2]["percent"]) for r in reports] == [("render", True, 100.0)]
    issued.clear()
    reports.clear()
    assert _call(monkeypatch, _step(None), effects) == [[("a", "b")]]
    assert issued == [] and reports == []


def test_declared_and_reports_follow_the_key():
    wf = copy.deepcopy(render_workflow("127.0.0.1:1"))
    del wf["steps"][0]["resumable"]
    plain = engine.parse_workflow(wf, RUNTIME)
    assert not resumable.declared(plain) and not resumable.reports(plain)
    wf["steps"][0]["reportsProgress"] = True
    reporting = engine.parse_workflow(wf, RUNTIME)
    assert resumable.declared(reporting) and resumable.reports(reporting)

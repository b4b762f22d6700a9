"""Breaker: an integer too large for a double is invalid input, not an OverflowError."""

from __future__ import annotations

import pytest

from protomolt_jobs.workflow import envelope
from protomolt_jobs.workflow.types import WorkflowParseError
from tests.unit.test_envelope_input import WORKFLOW


@pytest.mark.parametrize("data", [{"d": 10**400}, {"dv": 10**400}, {"meta": {"a": 10**400}}])
def test_an_integer_beyond_a_double_is_invalid_input(data):
    with pytest.raises(WorkflowParseError) as caught:
        envelope.parse_input(WORKFLOW, data, ignore_unknown_fields=False)
    assert caught.value.message.startswith("'input' is not valid proto3 JSON for t.Rich")

"""runs/retention.py: the definition's ``retention`` key, its shapes, the node's bounds, what a
run stores and what is shown; and the config keys that bound it."""

from __future__ import annotations

import pytest

from protomolt_jobs.config import ConfigError, JobsConfig
from protomolt_jobs.runs import retention
from protomolt_jobs.runs.scheduling import FieldError

DAY = 86_400.0
BOUNDS = retention.Bounds(3_600.0, 400 * DAY)


def test_no_key_is_none_everywhere():
    assert retention.parse({"steps": []}) is None
    assert retention.parse({"retention": None}) is None
    assert retention.stamp({"steps": []}, BOUNDS, 30 * DAY) is None


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("P1D", DAY), ("PT36H", 1.5 * DAY), ("P2W", 14 * DAY), ("1d", DAY), ("90m", 5_400.0)],
)
def test_one_duration_applies_to_every_final_status(value, seconds):
    assert retention.parse({"retention": value}) == {
        "COMPLETED": seconds,
        "FAILED": seconds,
        "CANCELLED": seconds,
        "DEAD": seconds,
    }


def test_an_object_names_statuses_and_the_rest_keep_the_nodes_setting_at_submit():
    definition = {"retention": {"completed": "P1D", "dead": "P90D"}}
    assert retention.parse(definition) == {"COMPLETED": DAY, "DEAD": 90 * DAY}
    assert retention.stamp(definition, BOUNDS, 30 * DAY) == {
        "COMPLETED": DAY,
        "DEAD": 90 * DAY,
        "FAILED": 30 * DAY,
        "CANCELLED": 30 * DAY,
    }
    # a node that keeps runs forever (0): the statuses left out are kept
    assert retention.stamp(definition, BOUNDS, 0.0) == {"COMPLETED": DAY, "DEAD": 90 * DAY}


@pytest.mark.parametrize(
    ("value", "field", "said"),
    [
        (5, "retention", "must be a duration"),
        ([], "retention", "must be a duration"),
        ({}, "retention", "names no status"),
        ("P", "retention", "positive duration"),
        ("PT", "retention", "positive duration"),
        ("P1Y", "retention", "positive duration"),
        ("0d", "retention", "positive duration"),
        ("-1d", "retention", "positive duration"),
        ({"complete": "P1D"}, "retention.complete", "keys are final statuses"),
        ({"failed": 3}, "retention.failed", "positive duration"),
    ],
)
def test_malformed_values_name_the_field(value, field, said):
    with pytest.raises(FieldError) as info:
        retention.parse({"retention": value})
    assert info.value.field == field
    assert said in info.value.message


def test_the_bounds_are_named_with_their_setting_and_value():
    with pytest.raises(FieldError) as info:
        retention.parse({"retention": {"completed": "PT30M"}}, BOUNDS)
    assert info.value.field == "retention.completed"
    assert info.value.message == (
        "'retention.completed' (30m) is below the node's minimum retention "
        "jobs.workflow_retention_min_seconds = 3600 (1h)"
    )
    with pytest.raises(FieldError) as info:
        retention.parse({"retention": "P401D"}, BOUNDS)
    assert "above the node's maximum retention jobs.workflow_retention_max_seconds = " in (
        info.value.message
    )
    assert retention.parse({"retention": "PT1H"}, BOUNDS) is not None  # the bound itself


def test_effective_says_where_each_status_comes_from():
    shown = retention.effective({"retention": {"completed": "P1D"}}, 30 * DAY)
    assert shown["completed"] == {"seconds": DAY, "source": "workflow"}
    assert shown["failed"] == {"seconds": 30 * DAY, "source": "node"}
    assert retention.effective({"retention": "P1D"}, 0.0)["dead"]["source"] == "workflow"
    assert retention.effective({}, 0.0)["dead"] == {"seconds": None, "source": "node"}


def test_the_config_bounds_are_checked():
    config = JobsConfig.from_mapping(
        {"workflow_retention_min_seconds": "86400", "workflow_retention_max_seconds": "864000"}
    )
    assert retention.Bounds.of(config) == retention.Bounds(DAY, 10 * DAY)
    with pytest.raises(ConfigError, match="must not be above"):
        JobsConfig(workflow_retention_min_seconds=10 * DAY, workflow_retention_max_seconds=DAY)
    with pytest.raises(ConfigError, match="workflow_retention_min_seconds"):
        JobsConfig(workflow_retention_min_seconds=0.0)

"""JobsConfig bounds: every number is finite and sane, and every error names the key and the
expected form (a NaN lease used to boot a node whose claim loops failed twice a second)."""

from __future__ import annotations

import dataclasses

import pytest

from protomolt_jobs.config import ConfigError, JobsConfig

NON_FINITE = ["nan", "inf", "-inf", "NaN", "Infinity"]


@pytest.mark.parametrize("key", ["lease_seconds", "backoff_base_seconds", "shutdown_grace_seconds"])
@pytest.mark.parametrize("raw", NON_FINITE)
def test_non_finite_seconds_are_refused_naming_the_key(key, raw):
    with pytest.raises(ConfigError, match=rf"^jobs\.{key} must be a finite number of seconds"):
        JobsConfig.from_mapping({key: raw})
    with pytest.raises(ConfigError, match=rf"^jobs\.{key} must be a finite number of seconds"):
        JobsConfig(**{key: float(raw)})


@pytest.mark.parametrize(
    ("key", "most", "too_big"),
    [
        ("lease_seconds", 86_400, 86_400.5),
        ("backoff_base_seconds", 86_400, 1e308),
        ("shutdown_grace_seconds", 3_600, 3_601),
    ],
)
def test_seconds_have_an_upper_bound(key, most, too_big):
    assert getattr(JobsConfig(**{key: float(most)}), key) == most
    with pytest.raises(ConfigError, match=rf"jobs\.{key} .* at most {most}; got"):
        JobsConfig.from_mapping({key: str(too_big)})
    with pytest.raises(ConfigError, match=rf"jobs\.{key}"):
        JobsConfig.from_mapping({key: 10**400})  # a TOML integer too large for a float


@pytest.mark.parametrize(
    ("key", "most"),
    [
        ("worker_count", 4096),
        ("poll_interval_ms", 3_600_000),
        ("sweep_interval_ms", 3_600_000),
        ("relay_poll_interval_ms", 3_600_000),
        ("max_attempts", 1000),
        ("pool_max_size", 1000),
        ("max_concurrent_per_target", 4096),
    ],
)
def test_integers_have_an_upper_bound(key, most):
    assert getattr(JobsConfig.from_mapping({key: str(most)}), key) == most
    for raw in (most + 1, str(most + 1), 10**21, "1" * 5000):
        with pytest.raises(
            ConfigError, match=rf"^jobs\.{key} must be a positive integer of at most {most}; got"
        ):
            JobsConfig.from_mapping({key: raw})


@pytest.mark.parametrize("raw", ["\u00b2", "1.5", "1e3", "", " ", "0x10"])
def test_integers_that_are_not_plain_decimals_are_refused(raw):
    with pytest.raises(ConfigError, match=r"^jobs\.worker_count must be a positive integer"):
        JobsConfig.from_mapping({"worker_count": raw})


def test_a_huge_value_is_echoed_cut_short():
    with pytest.raises(ConfigError) as info:
        JobsConfig.from_mapping({"worker_count": "9" * 5000})
    assert len(str(info.value)) < 200


def test_defaults_are_within_the_bounds():
    config = JobsConfig()
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if isinstance(value, float | int) and not isinstance(value, bool):
            JobsConfig(**{field.name: value})  # no ConfigError
    assert JobsConfig(shutdown_grace_seconds=0).shutdown_grace_seconds == 0


def test_outbox_payloads_and_prune_foreign_rows_read_their_values_and_refuse_the_rest():
    config = JobsConfig.from_mapping(
        {"dsn": "postgresql:///x", "outbox_payloads": "always", "prune_foreign_rows": "true"}
    )
    assert (config.outbox_payloads, config.prune_foreign_rows) == ("always", True)
    assert JobsConfig.from_mapping({"prune_foreign_rows": False}).prune_foreign_rows is False
    assert JobsConfig.from_mapping({"prune_foreign_rows": " FALSE "}).prune_foreign_rows is False
    defaults = JobsConfig()
    assert (defaults.outbox_payloads, defaults.prune_foreign_rows) == ("columns", False)
    with pytest.raises(ConfigError, match="jobs.outbox_payloads must be 'columns'"):
        JobsConfig.from_mapping({"outbox_payloads": "Always"})
    for raw in ("yes", "1", 1, ""):
        with pytest.raises(ConfigError, match="jobs.prune_foreign_rows must be true or false"):
            JobsConfig.from_mapping({"prune_foreign_rows": raw})
    with pytest.raises(ConfigError, match="unknown key jobs.prune_foreign_row;"):
        JobsConfig.from_mapping({"prune_foreign_row": True})
    with pytest.raises(ConfigError, match="unknown key jobs.outbox_payload;"):
        JobsConfig.from_mapping({"outbox_payload": "always"})


def test_require_workflow_tests_is_a_boolean_off_by_default():
    assert JobsConfig().require_workflow_tests is False
    assert JobsConfig.from_mapping({"require_workflow_tests": True}).require_workflow_tests
    assert JobsConfig.from_mapping({"require_workflow_tests": " true "}).require_workflow_tests
    assert not JobsConfig.from_mapping({"require_workflow_tests": "false"}).require_workflow_tests
    for raw in ("yes", "1", 1, ""):
        with pytest.raises(ConfigError, match="jobs.require_workflow_tests must be true or false"):
            JobsConfig.from_mapping({"require_workflow_tests": raw})


def test_group_commit_is_auto_on_or_off_and_auto_follows_the_claim_loops():
    """jobs.group_commit (issue 33): auto turns group commit on from GROUP_COMMIT_AUTO_LOOPS
    claim loops, where it was measured to pay; on and off force it; anything else is refused
    naming the key."""
    from protomolt_jobs.config import GROUP_COMMIT_AUTO_LOOPS

    assert JobsConfig().group_commit == "auto"
    assert JobsConfig(worker_count=GROUP_COMMIT_AUTO_LOOPS - 1).group_commit_on is False
    assert JobsConfig(worker_count=GROUP_COMMIT_AUTO_LOOPS).group_commit_on is True
    assert JobsConfig.from_mapping({"group_commit": "on", "worker_count": 1}).group_commit_on
    off = JobsConfig.from_mapping({"group_commit": "off", "worker_count": 64})
    assert off.group_commit_on is False
    for raw in ("true", "ON", "", 1):
        with pytest.raises(ConfigError, match="jobs.group_commit"):
            JobsConfig.from_mapping({"group_commit": raw})

"""topics.ensure_topics against the real Tansu broker."""

from __future__ import annotations

import logging

import pytest

from protomolt_jobs.config import ConfigError, JobsConfig
from protomolt_jobs.kafka.topics import ensure_topics, wanted_topics
from tests.support.kafka import partitions_of, unique_topic


def _config(broker, **kw) -> JobsConfig:
    return JobsConfig(dsn="postgresql://unused", kafka_bootstrap=broker.bootstrap, **kw)


def test_creates_missing_topics_with_configured_partitions(broker, caplog):
    events, requests = unique_topic("ev"), unique_topic("rq")
    config = _config(broker, events_topic=events, request_topic=requests, topic_partitions=3)
    with caplog.at_level(logging.INFO, logger="protomolt_jobs.topics"):
        ensure_topics(config)
    assert partitions_of(broker.bootstrap, events) == [0, 1, 2]
    assert partitions_of(broker.bootstrap, requests) == [0, 1, 2]
    ready = [r for r in caplog.records if getattr(r, "action", None) == "topics_ready"]
    assert len(ready) == 1 and sorted(ready[0].created_topics) == sorted([events, requests])


def test_existing_topics_are_fine(broker, caplog):
    events = unique_topic("ev")
    config = _config(broker, events_topic=events, topic_partitions=2)
    ensure_topics(config)
    with caplog.at_level(logging.INFO, logger="protomolt_jobs.topics"):
        ensure_topics(_config(broker, events_topic=events, topic_partitions=5))
    ready = [r for r in caplog.records if getattr(r, "action", None) == "topics_ready"]
    assert ready and events in ready[0].existing_topics
    # an existing topic keeps its partitions (keys keep their partition)
    assert partitions_of(broker.bootstrap, events) == [0, 1]


def test_default_request_topic_is_included():
    config = JobsConfig(dsn="postgresql://unused", kafka_bootstrap="127.0.0.1:1")
    assert wanted_topics(config) == ["workflow-run-events", "workflow-run-requests"]


def test_unreachable_broker_logs_and_returns(caplog):
    config = JobsConfig(dsn="postgresql://unused", kafka_bootstrap="127.0.0.1:1")
    with caplog.at_level(logging.WARNING, logger="protomolt_jobs.topics"):
        ensure_topics(config, timeout_s=1.0)
    assert any(getattr(r, "action", None) == "topics_unverified" for r in caplog.records)


def test_no_bootstrap_is_a_config_error():
    with pytest.raises(ConfigError, match="kafka_bootstrap"):
        ensure_topics(JobsConfig(dsn="postgresql://unused"))

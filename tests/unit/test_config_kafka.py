"""``[jobs.kafka.producer]`` / ``[jobs.kafka.consumer]``: every librdkafka setting can be set,
the keys the lanes own cannot, a stock Apache Kafka broker's bounds hold, and librdkafka
itself judges names and values before anything starts (issue #32, item 2)."""

from __future__ import annotations

import pytest

from protomolt_jobs.config import (
    CONSUMER_DEFAULTS,
    CONSUMER_GROUP,
    CONSUMER_OWNED,
    PRODUCER_OWNED,
    ConfigError,
    JobsConfig,
)
from protomolt_jobs.host.nodeconfig import NodeConfig
from protomolt_jobs.kafka.relay import Relay
from protomolt_jobs.kafka.request_consumer import RequestConsumer
from protomolt_jobs.kafka.topics import wanted_topics

BROKER = {"dsn": "postgresql://unused", "kafka_bootstrap": "127.0.0.1:1"}


def test_the_defaults_are_within_a_stock_brokers_bounds():
    session = CONSUMER_DEFAULTS["session.timeout.ms"]
    assert 6_000 <= session <= 1_800_000
    assert CONSUMER_DEFAULTS["heartbeat.interval.ms"] * 3 <= session
    rc = RequestConsumer(object(), submitter=None, config=JobsConfig(**BROKER))
    assert rc.settings["session.timeout.ms"] == 6_000
    assert rc.settings["group.id"] == CONSUMER_GROUP
    assert rc.settings["enable.auto.commit"] is False


def test_session_timeout_below_the_brokers_minimum_is_refused_naming_the_bound():
    with pytest.raises(ConfigError) as info:
        JobsConfig.from_mapping({"kafka": {"consumer": {"session.timeout.ms": 1000}}})
    text = str(info.value)
    assert text.startswith("jobs.kafka.consumer.session.timeout.ms must be an integer from 6000")
    assert "group.min.session.timeout.ms (6000)" in text and "got 1000" in text
    with pytest.raises(ConfigError, match="1800000"):
        JobsConfig.from_mapping({"kafka": {"consumer": {"session.timeout.ms": 1_800_001}}})


def test_a_node_config_file_with_a_short_session_is_refused_at_load(tmp_path):
    path = tmp_path / "protomolt.toml"
    path.write_text(
        '[node]\nroles = ["jobs"]\n[jobs]\ndsn = "postgresql://x"\n'
        '[jobs.kafka.consumer]\n"session.timeout.ms" = 1000\n'
    )
    with pytest.raises(ConfigError) as info:
        NodeConfig.load(path, environ={})
    assert "jobs.kafka.consumer.session.timeout.ms" in str(info.value)
    assert f"{path} [jobs] kafka" in str(info.value)  # where it came from


def test_every_setting_reaches_the_clients_and_the_environment_overrides_per_property():
    config = JobsConfig.from_mapping(
        {
            **BROKER,
            "kafka": {
                "producer": {"compression.type": "lz4", "linger.ms": 20},
                "consumer": {"session.timeout.ms": 10_000, "client.rack": "a"},
            },
            # PROTOMOLT_JOBS_KAFKA_CONSUMER: JSON, over the file's table property by property
            "kafka_consumer": '{"session.timeout.ms": 12000, "fetch.wait.max.ms": 100}',
        }
    )
    rc = RequestConsumer(object(), submitter=None, config=config)
    assert rc.settings["session.timeout.ms"] == 12_000
    assert rc.settings["client.rack"] == "a" and rc.settings["fetch.wait.max.ms"] == 100
    relay = Relay(object(), config=config)
    assert relay.settings["compression.type"] == "lz4" and relay.settings["linger.ms"] == 20
    assert (relay.settings["acks"], relay.settings["enable.idempotence"]) == ("all", True)
    assert relay.settings["partitioner"] == "murmur2_random"


def test_an_alias_counts_as_its_property():
    config = JobsConfig.from_mapping(
        {**BROKER, "kafka": {"producer": {"delivery.timeout.ms": 60_000}}}
    )
    relay = Relay(object(), config=config)
    assert relay.settings["message.timeout.ms"] == 60_000
    assert relay.claim_s == 2 * (60 + 5)  # the claim lease follows the configured timeout
    with pytest.raises(ConfigError, match="both linger.ms and queue.buffering.max.ms"):
        JobsConfig.from_mapping(
            {"kafka": {"producer": {"linger.ms": 5, "queue.buffering.max.ms": 5}}}
        )


@pytest.mark.parametrize(
    ("kind", "key"),
    [("producer", k) for k in PRODUCER_OWNED] + [("consumer", k) for k in CONSUMER_OWNED],
)
def test_owned_keys_are_refused_with_the_reason(kind, key):
    with pytest.raises(ConfigError, match=rf"^jobs\.kafka\.{kind}\.{key} cannot be set: "):
        JobsConfig.from_mapping({"kafka": {kind: {key: "x"}}})


@pytest.mark.parametrize(
    ("kind", "key"),
    [("producer", "request.required.acks"), ("producer", "metadata.broker.list")],
)
def test_an_owned_key_under_an_alias_is_refused_too(kind, key):
    with pytest.raises(ConfigError, match=rf"{key} \(an alias of .*\) cannot be set"):
        JobsConfig.from_mapping({"kafka": {kind: {key: "1"}}})


@pytest.mark.parametrize(
    ("table", "match"),
    [
        ({"consumer": {"sesion.timeout.ms": 7000}}, 'No such configuration property: "sesion'),
        ({"producer": {"compression.type": "zstdx"}}, 'Invalid value "zstdx"'),
        ({"consumer": {"max.poll.interval.ms": 5000}}, "max.poll.interval.ms"),
        ({"producer": {"max.in.flight": 6}}, "max.in.flight"),
        ({"producer": {"session.timeout.ms": 7000}}, "a consumer property: the producer would"),
        ({"consumer": {"linger.ms": 5}}, "a producer property: the consumer would ignore"),
        ({"consumer": {"heartbeat.interval.ms": 6000}}, "must be below session.timeout.ms"),
        ({"producer": {"message.timeout.ms": 0}}, "from 1 to 3600000"),
        ({"consumer": {"error_cb": "x"}}, "is a callback"),
        ({"consumer": {"fetch.max.bytes": [1]}}, "must be a string, number or boolean"),
        ({"consumer": {"Session.Timeout": 1}}, "is not a librdkafka property name"),
        ({"produce": {}}, "unknown key jobs.kafka.produce; known keys: consumer, producer"),
    ],
)
def test_misspelt_misplaced_or_malformed_settings_are_refused(table, match):
    with pytest.raises(ConfigError, match=match):
        JobsConfig.from_mapping({"kafka": table})


def test_the_kafka_key_is_a_table_not_the_bootstrap():
    with pytest.raises(ConfigError, match="set jobs.kafka_bootstrap"):
        JobsConfig.from_mapping({"kafka": "127.0.0.1:9092"})
    assert JobsConfig.from_mapping({"kafka": '{"consumer": {"client.rack": "b"}}'}).kafka_consumer


def test_the_in_process_hooks_skip_the_broker_bounds_not_the_owned_keys():
    config = JobsConfig(**BROKER)
    rc = RequestConsumer(
        object(), submitter=None, config=config, consumer_config={"session.timeout.ms": 2000}
    )
    assert rc.settings["session.timeout.ms"] == 2000  # the test broker enforces no bound
    with pytest.raises(ConfigError, match="enable.auto.commit cannot be set"):
        RequestConsumer(
            object(), submitter=None, config=config, consumer_config={"enable.auto.commit": True}
        )


def test_event_types_and_registry_failure_values():
    config = JobsConfig.from_mapping({**BROKER, "event_types": "upstream", "events_topic": "ev"})
    assert config.extended_topic == "ev.extended"
    assert wanted_topics(config) == ["ev", "ev.extended", "workflow-run-requests"]
    assert JobsConfig(**BROKER).extended_topic is None
    assert wanted_topics(JobsConfig(**BROKER)) == ["workflow-run-events", "workflow-run-requests"]
    with pytest.raises(ConfigError, match="^jobs.event_types must be 'extended'"):
        JobsConfig.from_mapping({"event_types": "all"})
    assert JobsConfig.from_mapping({"registry_failure": "fallback-id-0"}).registry_failure
    with pytest.raises(ConfigError, match="^jobs.registry_failure must be 'halt' or"):
        JobsConfig.from_mapping({"registry_failure": "fallback"})


def test_the_environment_sets_the_tables_as_json_over_the_file(tmp_path):
    path = tmp_path / "protomolt.toml"
    path.write_text(
        '[node]\nroles = ["jobs"]\n[jobs]\ndsn = "postgresql://x"\n'
        '[jobs.kafka.producer]\n"compression.type" = "lz4"\n"linger.ms" = 5\n'
    )
    environ = {
        "PROTOMOLT_JOBS_KAFKA_PRODUCER": '{"linger.ms": 20}',
        "PROTOMOLT_JOBS_KAFKA_CONSUMER": '{"session.timeout.ms": 30000}',
    }
    config = JobsConfig.from_mapping(NodeConfig.load(path, environ=environ).section("jobs"))
    assert config.producer_settings()["linger.ms"] == 20
    assert config.producer_settings()["compression.type"] == "lz4"
    assert config.consumer_settings()["session.timeout.ms"] == 30_000
    environ["PROTOMOLT_JOBS_KAFKA_CONSUMER"] = '{"session.timeout.ms": 1000}'
    with pytest.raises(ConfigError, match="session.timeout.ms must be an integer from 6000"):
        NodeConfig.load(path, environ=environ)


def test_the_topic_admin_client_connects_with_the_producers_security_settings(monkeypatch):
    from protomolt_jobs.kafka import topics

    seen: list[dict] = []

    class Admin:
        def __init__(self, conf):
            seen.append(conf)

        def create_topics(self, requested, **_kw):
            raise topics.KafkaException("no broker here")

    monkeypatch.setattr(topics, "AdminClient", Admin)
    config = JobsConfig.from_mapping(
        {
            **BROKER,
            "kafka": {
                "producer": {
                    "security.protocol": "SASL_SSL",
                    "sasl.mechanisms": "PLAIN",
                    "sasl.username": "relay",
                    "sasl.password": "secret",
                    "ssl.endpoint.identification.algorithm": "none",
                    "compression.type": "lz4",
                }
            },
        }
    )
    topics.ensure_topics(config)
    (conf,) = seen
    assert conf["security.protocol"] == "SASL_SSL" and conf["sasl.mechanisms"] == "PLAIN"
    assert conf["ssl.endpoint.identification.algorithm"] == "none"
    assert conf["sasl.password"] == "secret" and "compression.type" not in conf
    assert conf["bootstrap.servers"] == "127.0.0.1:1"

"""The Kafka lanes: the outbox relay (``relay``), the request consumer (``request_consumer``),
topic creation (``topics``), Confluent framing (``framing``) and the wire contract (``wire``)."""

"""Node channels: shared for the node's life, so their reconnect backoff must stay short."""

from __future__ import annotations

import grpc

from protomolt_jobs.host import channels as channels_mod
from protomolt_jobs.host.channels import Channels


def test_network_channels_are_shared_and_cap_reconnect_backoff(tmp_path, monkeypatch):
    made: list[tuple[str, dict]] = []
    real = grpc.insecure_channel

    def spy(target, options=None, **kw):
        made.append((target, dict(options or ())))
        return real(target, options=options, **kw)

    monkeypatch.setattr(channels_mod.grpc, "insecure_channel", spy)
    node_channels = Channels(tmp_path, node_id="t")
    try:
        first = node_channels.channel("127.0.0.1:1", False)
        assert node_channels.channel("127.0.0.1:1", False) is first  # one per (target, tls)
        assert [t for t, _ in made] == ["127.0.0.1:1"]
        options = made[0][1]
        # gRPC's default grows to 120 s: a step would keep failing UNAVAILABLE that long
        # after its target came back.
        assert options["grpc.max_reconnect_backoff_ms"] <= 5_000
    finally:
        node_channels.close()

"""Telemetry: Prometheus metrics (``metrics``), OpenTelemetry traces (``tracing``) and the log
formats (``logs``). Every layer may use it; it imports nothing of the jobs role."""

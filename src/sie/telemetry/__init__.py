"""Telemetry behind one facade: logging set-up now; OpenTelemetry meters/tracers and Prometheus exposition."""

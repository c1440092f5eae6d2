"""The composition root: CLI, settings, telemetry, metrics, ops view and the demo workflow."""

__all__: list[str] = []

"""The worker loop, effect execution and the append-only runner journal."""

__all__: list[str] = []

"""Consumption: the inbox (reserve in the caller's transaction) and the consumer runtime."""

__all__: list[str] = []

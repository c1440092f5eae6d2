"""Delivery: the transactional outbox (enqueue in the caller's transaction) and the relay."""

__all__: list[str] = []

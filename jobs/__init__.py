"""Ownership and effects: the SQL jobs module, the single claimant, and its fences."""

__all__: list[str] = []

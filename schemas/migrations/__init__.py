"""Forward-only SQL migrations, applied in version order by schemas.migrate."""

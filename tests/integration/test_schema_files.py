"""The schema files (each module's current SQL) and the migrations build the same database.

One database comes from the forward-only migrations (the test template), one from
schemas/roles.sql and the modules' schema.sql files (accord.schemas.schema_files); their
catalogs must match object for object: columns, constraints, indexes, sequences, functions
(whole definitions, SECURITY DEFINER and SET options included), views, triggers, grants on
schemas, tables, columns and functions, and comments. The control: the same comparison of a
database built from an altered schema file finds the alteration.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from accord.schemas import schema_files

SCHEMAS = [schema for schema, _ in schema_files.MODULE_FILES]


def _acl(column: str, default: str | None = None) -> str:
    # Sorted: two databases may hold the same privileges in a different order. A NULL ACL is
    # the owner's default privileges, which an explicit REVOKE of nothing spells out.
    acl = column if default is None else f"COALESCE({column}, {default})"
    return f"(SELECT array_agg(a::text ORDER BY a::text) FROM unnest({acl}) a)"


FUNCTION_DEFAULT = "acldefault('f'::\"char\", p.proowner)"
RELATION_DEFAULT = (
    "acldefault((CASE c.relkind WHEN 'S' THEN 's' ELSE 'r' END)::\"char\", c.relowner)"
)
SCHEMA_DEFAULT = "acldefault('n'::\"char\", nspowner)"

CATALOG: dict[str, str] = {
    "columns": """
        SELECT table_schema, table_name, column_name, data_type, udt_name, is_nullable,
               column_default, character_maximum_length, is_identity, identity_generation
        FROM information_schema.columns WHERE table_schema = ANY($1) ORDER BY 1, 2, 3""",
    "constraints": """
        SELECT n.nspname, c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid),
               c.condeferrable, c.condeferred
        FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
        WHERE n.nspname = ANY($1) ORDER BY 1, 2, 3""",
    "indexes": """
        SELECT schemaname, tablename, indexname, indexdef FROM pg_indexes
        WHERE schemaname = ANY($1) ORDER BY 1, 2, 3""",
    "sequences": """
        SELECT schemaname, sequencename, data_type::text, start_value, increment_by, max_value,
               cycle FROM pg_sequences WHERE schemaname = ANY($1) ORDER BY 1, 2""",
    "functions": f"""
        SELECT n.nspname, p.proname, pg_get_function_identity_arguments(p.oid),
               pg_get_functiondef(p.oid), {_acl("p.proacl", FUNCTION_DEFAULT)}
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = ANY($1) ORDER BY 1, 2, 3""",
    "views": """
        SELECT schemaname, viewname, definition FROM pg_views
        WHERE schemaname = ANY($1) ORDER BY 1, 2""",
    "triggers": """
        SELECT n.nspname, c.relname, t.tgname, pg_get_triggerdef(t.oid)
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = ANY($1) AND NOT t.tgisinternal ORDER BY 1, 2, 3""",
    "relation_grants": f"""
        SELECT n.nspname, c.relname, c.relkind::text,
               {_acl("c.relacl", RELATION_DEFAULT)}
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = ANY($1) AND c.relkind IN ('r', 'v', 'S', 'm', 'p')
        ORDER BY 1, 2""",
    "column_grants": f"""
        SELECT n.nspname, c.relname, a.attname, {_acl("a.attacl")}
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = ANY($1) AND a.attacl IS NOT NULL ORDER BY 1, 2, 3""",
    "schema_grants": f"""
        SELECT nspname, {_acl("nspacl", SCHEMA_DEFAULT)} FROM pg_namespace
        WHERE nspname = ANY($1) ORDER BY 1""",
    "comments": """
        SELECT n.nspname, c.relname, d.objsubid, d.description
        FROM pg_description d JOIN pg_class c ON c.oid = d.objoid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = ANY($1) AND d.classoid = 'pg_class'::regclass
        UNION ALL
        SELECT n.nspname, p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')',
               0, d.description
        FROM pg_description d JOIN pg_proc p ON p.oid = d.objoid
        JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = ANY($1) AND d.classoid = 'pg_proc'::regclass
        ORDER BY 1, 2, 3""",
}


async def catalog(conn: asyncpg.Connection) -> dict[str, list[tuple[Any, ...]]]:
    return {
        kind: [_frozen(row) for row in await conn.fetch(query, SCHEMAS)]
        for kind, query in CATALOG.items()
    }


def _frozen(row: asyncpg.Record) -> tuple[Any, ...]:
    return tuple(tuple(v) if isinstance(v, list) else v for v in row)


def differences(
    a: dict[str, list[tuple[Any, ...]]], b: dict[str, list[tuple[Any, ...]]]
) -> list[str]:
    """Each catalog row found in one database and not the other, named by its kind."""
    found = []
    for kind in CATALOG:
        left, right = set(a[kind]), set(b[kind])
        found += [
            f"{kind}: only from the migrations: {row}" for row in sorted(left - right, key=str)
        ]
        found += [f"{kind}: only from the files: {row}" for row in sorted(right - left, key=str)]
    return found


async def build_from(dsn: str, texts: list[str]) -> dict[str, list[tuple[Any, ...]]]:
    conn = await asyncpg.connect(dsn)
    try:
        for text in texts:
            await conn.execute(text)
        return await catalog(conn)
    finally:
        await conn.close()


async def test_the_schema_files_build_what_the_migrations_build(
    pg: asyncpg.Connection, empty_pg_dsn: str
) -> None:
    migrated = await catalog(pg)
    assert all(migrated[kind] for kind in ("columns", "functions", "views", "relation_grants"))
    from_files = await build_from(empty_pg_dsn, schema_files.texts())
    assert differences(migrated, from_files) == []


async def test_an_altered_schema_file_is_caught(pg: asyncpg.Connection, empty_pg_dsn: str) -> None:
    """The control: a claim that would take one row more, and a grant gone, are found."""
    texts = schema_files.texts()
    jobs = next(i for i, (s, _) in enumerate(schema_files.MODULE_FILES, 1) if s == "jobs")
    assert "LIMIT p_limit" in texts[jobs]
    texts[jobs] = texts[jobs].replace("LIMIT p_limit", "LIMIT p_limit + 1", 1)
    relay = next(i for i, (s, _) in enumerate(schema_files.MODULE_FILES, 1) if s == "relay")
    grant = next(line for line in texts[relay].splitlines() if line.startswith("GRANT "))
    texts[relay] = texts[relay].replace(grant + "\n", "", 1)
    found = differences(await catalog(pg), await build_from(empty_pg_dsn, texts))
    assert any(f.startswith("functions:") and "claim" in f for f in found), found
    assert any("grants:" in f for f in found), found


def test_the_files_are_clean_pg_dump_output() -> None:
    for _, path in schema_files.MODULE_FILES:
        text = path.read_text(encoding="utf-8")
        assert text.startswith("-- The current definition of the `")
        assert "\\restrict" not in text and "Dumped from" not in text

-- 0001 foundation: one PostgreSQL schema (namespace) per accord module.
-- Each module's tables live in its own schema; later migrations fill them.
CREATE SCHEMA IF NOT EXISTS relay;
CREATE SCHEMA IF NOT EXISTS consumers;
CREATE SCHEMA IF NOT EXISTS jobs;

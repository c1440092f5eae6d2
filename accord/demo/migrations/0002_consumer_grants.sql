-- The demo's consumers run as accord_consumer (accord's 0014; `accord consume` sets that role
-- by default). The `report` class only calls jobs.submit, which accord grants it; the
-- `report_projection` class upserts the projection (sql.UPSERT_PUBLISHED_REPORT: INSERT ...
-- ON CONFLICT DO UPDATE ... WHERE, which reads the existing row). It never deletes: emptying
-- the projection is replay's (accord_projection) reset.
--
-- A migration of its own rather than an edit of 0001: 0001 is applied in databases migrated
-- by accord 0.2, and a changed applied file is refused (MigrationTampered).
GRANT USAGE ON SCHEMA demo_projection TO accord_consumer;
GRANT SELECT, INSERT, UPDATE ON demo_projection.published_reports TO accord_consumer;

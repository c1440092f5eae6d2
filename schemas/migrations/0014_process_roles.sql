-- 0014 process roles: the relay and the consumers run as principals of their own, each with
-- only the grants its SQL needs (relay/sql.py; consumers/sql.py, consumers/inbox.py,
-- consumers/poison.py), instead of as the database owner. `accord relay` connects with
-- role accord_relay and `accord consume` with role accord_consumer by default
-- (ACCORD_RELAY_ROLE / ACCORD_CONSUMER_ROLE; empty: as the DSN's own user). See
-- docs/authority.md, "Process roles".
--
-- * accord_relay     the outbox relay: reads outbox rows, claims and settles them under its
--                    lease token (UPDATE of the lease and delivery columns only), holds
--                    permanent failures, prunes published rows (DELETE). It cannot enqueue
--                    (no INSERT), and has no privilege on the jobs or consumers schemas: it
--                    cannot read or touch a job, an effect or the inbox.
-- * accord_consumer  the consumer runtime: reserves operations in the inbox, logs
--                    deliveries, records poison, prunes both logs, and starts work through
--                    jobs.submit (SECURITY DEFINER, idempotent on the operation) and nothing
--                    else of the jobs module: it cannot claim, renew, publish (succeed) or
--                    fail a job, begin or resolve an effect, repair, or touch any jobs table
--                    by plain DML. An application grants it what its handlers write (a
--                    projection's table, say), in the application's own migrations.
-- Both read schemas.migrations (the start-up schema check) and neither is granted to the
-- other or to accord_worker / accord_repair / accord_projection.
--
-- LISTEN and pg_notify need no privilege. Roles are cluster-wide while migrations run per
-- database (grants are per database), and test databases share one cluster: each role is
-- created at most once, and a concurrent creation from another database's migration is
-- tolerated (unique_violation on pg_authid, or duplicate_object), as in 0006.
DO $$
DECLARE
    v_role text;
BEGIN
    FOREACH v_role IN ARRAY ARRAY['accord_relay', 'accord_consumer'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_role) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', v_role);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;  -- another database's migration created it first
            END;
        END IF;
        -- SET ROLE (the `role` the processes set at connection start) needs membership: a
        -- non-superuser migrating user gets it.
        IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
           AND NOT pg_has_role(current_user, v_role, 'MEMBER') THEN
            EXECUTE format('GRANT %I TO %I', v_role, current_user);
        END IF;
    END LOOP;
END $$;

-- ---------------------------------------------------------------------------------------
-- accord_relay
GRANT USAGE ON SCHEMA relay TO accord_relay;
-- CLAIM returns whole rows; SETTLE, PRUNE and the claim's FOR UPDATE read state, lease and
-- age columns.
GRANT SELECT ON relay.outbox TO accord_relay;
-- CLAIM stamps (lease_token, lease_expires_at, attempts); SETTLE writes (state,
-- published_at, publish_id, last_reason, lease_token, lease_expires_at). Never the event
-- itself (event_id, tenant, operation_id, type, version, authority_epoch, digest, body,
-- trace, occurred_at, enqueued_at): a relay cannot change what a row says.
GRANT UPDATE (state, attempts, last_reason, lease_token, lease_expires_at, published_at,
              publish_id)
    ON relay.outbox TO accord_relay;
-- PRUNE: published rows past the retention window, in bounded batches.
GRANT DELETE ON relay.outbox TO accord_relay;

-- ---------------------------------------------------------------------------------------
-- accord_consumer
GRANT USAGE ON SCHEMA consumers TO accord_consumer;
-- RESERVE / RESERVE_MANY / RECORD_DELIVERY insert, COLLISIONS reads, the prunes delete.
-- The deliveries' and poison's ids are identity columns: INSERT needs no sequence privilege.
GRANT SELECT, INSERT, DELETE ON consumers.inbox, consumers.deliveries TO accord_consumer;
-- The prunes lock their batch with FOR UPDATE SKIP LOCKED, which PostgreSQL allows only with
-- UPDATE on at least one column of the table: the retention clock, which gives nothing the
-- DELETE does not already give.
GRANT UPDATE (first_seen_at) ON consumers.inbox TO accord_consumer;
GRANT UPDATE (received_at) ON consumers.deliveries TO accord_consumer;
-- INSERT_POISON ... RETURNING id. Poison records are never read, changed or removed by it.
GRANT INSERT ON consumers.poison TO accord_consumer;
GRANT SELECT (id) ON consumers.poison TO accord_consumer;

-- A consumer that starts work calls jobs.submit (DESIGN §6). It is SECURITY DEFINER with a
-- pinned search_path since 0006 (re-created so in 0011); made so again here, whatever a
-- deployment did since, because the consumer role has no privilege on any jobs table. USAGE
-- on the schema lets it name the function; EXECUTE on every other jobs function was taken
-- from PUBLIC in 0006 and is taken again here, for any created since without its REVOKE
-- (none is, on 0013). From here on USAGE makes that rule load-bearing: a later migration
-- that adds a function in schema jobs must REVOKE EXECUTE on it FROM PUBLIC.
ALTER FUNCTION jobs.submit(text, text, text, text, jsonb, integer)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA jobs FROM PUBLIC;
GRANT USAGE ON SCHEMA jobs TO accord_consumer;
GRANT EXECUTE ON FUNCTION jobs.submit(text, text, text, text, jsonb, integer)
    TO accord_consumer;

-- ---------------------------------------------------------------------------------------
-- Both: the start-up schema check (schemas.migrate.check) reads the ledger.
GRANT USAGE ON SCHEMA schemas TO accord_relay, accord_consumer;
GRANT SELECT ON schemas.migrations TO accord_relay, accord_consumer;

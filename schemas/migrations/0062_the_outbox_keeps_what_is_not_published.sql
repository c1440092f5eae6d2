-- 0062 The relay's role keeps the outbox's promise itself (an audit of least privilege: since
-- 0014 the relay role holds DELETE on relay.outbox, for the prune of published rows, and
-- UPDATE of its state, for the settle; so "rows are never deleted before they are
-- published" and "a held row leaves only through a person" were kept by the relay's code, not
-- by its role: a relay login could delete a pending or held row, losing a committed event
-- with no audit, or put a held row back to pending without anyone deciding it).
--   * A row that is not published is never deleted, and a held row is never changed, but by
--     the outbox's owner: the migrations and relay.release_held / relay.discard_held (SECURITY
--     DEFINER, run as the repair role, audited). Any other role is refused with
--     insufficient_privilege, naming the way out.
--   * The triggers' WHEN clauses keep the relay's own work out of the function: the settle
--     updates pending rows, the prune deletes published ones.
CREATE FUNCTION relay.outbox_guard() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF pg_has_role(current_user,
                   (SELECT c.relowner FROM pg_class c WHERE c.oid = TG_RELID), 'MEMBER') THEN
        RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    IF OLD.state = 'held' THEN
        RAISE EXCEPTION 'relay.outbox row % (event %) is held: only a person moves it on',
            OLD.id, OLD.event_id
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'as the repair role: accord relay release-held (publish it) or accord'
                         ' relay discard-held (give it up, audited)';
    END IF;
    RAISE EXCEPTION 'relay.outbox row % (event %) is %: only a published row is removed',
        OLD.id, OLD.event_id, OLD.state
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'a committed event leaves the outbox by being published (accord relay)';
END $$;
COMMENT ON FUNCTION relay.outbox_guard() IS 'Refuses, but to the outbox''s owner, deleting a row that is not published and changing a held row (0062)';

CREATE TRIGGER outbox_unpublished_kept BEFORE DELETE ON relay.outbox
    FOR EACH ROW WHEN (OLD.state <> 'published') EXECUTE FUNCTION relay.outbox_guard();
CREATE TRIGGER outbox_held_kept BEFORE UPDATE ON relay.outbox
    FOR EACH ROW WHEN (OLD.state = 'held') EXECUTE FUNCTION relay.outbox_guard();

-- 0044 What the relay's pruning took, kept: relay.pruned holds the latest enqueue time of a
-- published event the relay ever deleted. `accord replay --rebuild` empties a projection and
-- applies the retained events again; once events were pruned, the rows they made would be
-- deleted and never come back, so a rebuild is refused from then on (a replay without
-- --rebuild, which applies events on top of the projection, is not).

CREATE TABLE relay.pruned (
    one boolean DEFAULT true NOT NULL,
    through timestamp with time zone NOT NULL,
    CONSTRAINT pruned_one_check CHECK (one),
    CONSTRAINT pruned_pkey PRIMARY KEY (one)
);

GRANT SELECT, INSERT, UPDATE ON TABLE relay.pruned TO accord_relay;

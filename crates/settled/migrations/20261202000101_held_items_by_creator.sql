-- Releasing a creator's hold puts its held items back to eligible in every
-- period still in the hot tables (settled_engine's release_held: by key,
-- any scope). Without an index on the creator alone, that UPDATE read every
-- row of every period (about 150 ms per million rows, per period kept: a
-- month of a million creators a day made each release a 4.5 s scan). Held
-- items are few, so this index is small; created on the parent, it is
-- built on every partition and added to each one attached later.
CREATE INDEX token_trade_volume_held
    ON settlement.token_trade_volume (creator) WHERE status = 'held';

-- Leased claims stamp the item with the timeline of the primary that
-- granted them (settled_engine.fence_epoch()); with the attempt it is the
-- fence, so a claim lost in an asynchronous failover cannot complete in the
-- name of the claim the new primary hands out with the same attempt number.
ALTER TABLE settlement.token_trade_volume ADD COLUMN fence_epoch integer NOT NULL DEFAULT 0;

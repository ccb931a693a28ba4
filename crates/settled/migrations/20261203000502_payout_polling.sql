-- Polling payouts the provider accepted long ago and never confirmed (a
-- lost webhook): when each was last asked about, so a poller walks through
-- them all instead of asking about the same oldest ones again.
ALTER TABLE settlement.payouts ADD COLUMN polled_at timestamptz;
CREATE INDEX payouts_sent_by_poll ON settlement.payouts (coalesce(polled_at, sent_at)) WHERE status = 'sent';

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'settled_worker') THEN
        RETURN;
    END IF;
    GRANT UPDATE (polled_at) ON settlement.payouts TO settled_worker;
END
$$;

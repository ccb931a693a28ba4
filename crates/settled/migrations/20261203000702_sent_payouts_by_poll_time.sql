-- The look-up of long-sent payouts (`poll_sent`: status 'sent', oldest
-- coalesce(polled_at, sent_at) first, LIMIT a batch) read every sent payout
-- and sorted them, on every housekeeping round of every deliverer: with a
-- provider that keeps payments pending for long, that is every payment in
-- flight, several times a minute. This index hands them out in that order.
CREATE INDEX payouts_sent_by_poll_time ON settlement.payouts ((coalesce(polled_at, sent_at)))
    WHERE status = 'sent';

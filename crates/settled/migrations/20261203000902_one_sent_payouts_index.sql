-- 20261203000702 created payouts_sent_by_poll_time on the expression and
-- predicate of 20261203000502's payouts_sent_by_poll: the same index twice,
-- each maintained on every payout that is sent and every one that leaves
-- `sent`. One of them goes.
DROP INDEX IF EXISTS settlement.payouts_sent_by_poll_time;

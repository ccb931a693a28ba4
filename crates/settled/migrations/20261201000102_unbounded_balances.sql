-- A balance is a running sum of ledger entries less payouts. Each entry is
-- at most a uint256 (78 digits), but their sum is not: at the largest
-- volumes NUMERIC(78,0) overflowed after about nine periods, and the item
-- failed with a raw "numeric field overflow". The column now takes any
-- whole, non-negative number; amounts moved in one step (ledger entries,
-- payouts) keep their uint256 bound.
ALTER TABLE settlement.creator_balance
    ALTER COLUMN balance TYPE numeric,
    ADD CONSTRAINT creator_balance_whole_units CHECK (balance = trunc(balance));

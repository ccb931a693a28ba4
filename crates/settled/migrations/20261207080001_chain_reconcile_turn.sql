-- The reconciliation of a wallet with the chain's Transfer logs reads the
-- whole history from block 0: one deliverer of the fleet runs it per
-- period, not each of them, and not each at its start. The turn is taken
-- on the database's clock by a conditional update of this column
-- (`chain::watch`), and is taken whether or not that reconciliation then
-- finishes: a deliverer that dies in it leaves the next turn to the next
-- period.
ALTER TABLE settlement.chain_wallet_watch ADD COLUMN reconcile_turn_at timestamptz;

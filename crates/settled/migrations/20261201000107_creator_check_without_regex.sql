-- A creator is '0x' and 40 lowercase hex digits. The check said it with a
-- regular expression; PostgreSQL evaluates every CHECK of a row on every
-- UPDATE, so each settled item ran it twice (the work row marked settled,
-- the balance credited), and a 5,000-creator chunk statement spent 35 to
-- 45 ms of its 200 in the regex (docs/benchmarks.md, "The creator check
-- without a regular expression"). The same set of strings, said without
-- one: exactly 42 bytes, and stripping trailing hex digits leaves '0x'
-- ('x' is not a hex digit, so the strip stops there; the 40 stripped
-- characters are one byte each, so they are exactly the 40 after '0x').
-- Same constraint names, so errors name the same constraint as before.
ALTER TABLE settlement.token_trade_volume DROP CONSTRAINT token_trade_volume_creator_check;
ALTER TABLE settlement.token_trade_volume ADD CONSTRAINT token_trade_volume_creator_check
    CHECK (octet_length(creator) = 42 AND rtrim(creator, '0123456789abcdef') = '0x');

ALTER TABLE settlement.creator_balance DROP CONSTRAINT creator_balance_creator_check;
ALTER TABLE settlement.creator_balance ADD CONSTRAINT creator_balance_creator_check
    CHECK (octet_length(creator) = 42 AND rtrim(creator, '0123456789abcdef') = '0x');

ALTER TABLE settlement.payouts DROP CONSTRAINT payouts_creator_check;
ALTER TABLE settlement.payouts ADD CONSTRAINT payouts_creator_check
    CHECK (octet_length(creator) = 42 AND rtrim(creator, '0123456789abcdef') = '0x');

ALTER TABLE settlement.creator_holds DROP CONSTRAINT creator_holds_creator_check;
ALTER TABLE settlement.creator_holds ADD CONSTRAINT creator_holds_creator_check
    CHECK (octet_length(creator) = 42 AND rtrim(creator, '0123456789abcdef') = '0x');

ALTER TABLE settlement.ledger_carry DROP CONSTRAINT ledger_carry_creator_check;
ALTER TABLE settlement.ledger_carry ADD CONSTRAINT ledger_carry_creator_check
    CHECK (octet_length(creator) = 42 AND rtrim(creator, '0123456789abcdef') = '0x');

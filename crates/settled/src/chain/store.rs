//! The chain rail's statements over `settlement.chain_*`: a transaction as
//! stored (its state, where it was mined, its attempts), and its moves,
//! each one conditional update whose row count is the answer (the allowed
//! moves are the table `settlement.chain_tx_moves`, which a trigger
//! checks; every move appends to `settlement.chain_tx_history`). This
//! module never signs and never calls the node.

use std::collections::HashMap;

use alloy_primitives::{Address, B256};
use sqlx::PgConnection;

use crate::money::Amount;

/// Where a transaction stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum TxState {
    /// Signed and stored, maybe never sent.
    Signed,
    /// Sent to the node, not mined (or its block left the chain).
    Broadcast,
    /// Mined in a block that is canonical as far as settled saw.
    Included,
    /// Mined, succeeded, and buried under the confirmation depth (final).
    Confirmed,
    /// Mined, failed, and buried under the confirmation depth (final).
    Reverted,
    /// Given up, and its filler buried under the confirmation depth (final):
    /// its payouts are signed again under new nonces.
    Filled,
}

impl TxState {
    /// Every state.
    pub(crate) const ALL: [TxState; 6] = [
        TxState::Signed,
        TxState::Broadcast,
        TxState::Included,
        TxState::Confirmed,
        TxState::Reverted,
        TxState::Filled,
    ];

    /// The stored value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            TxState::Signed => "signed",
            TxState::Broadcast => "broadcast",
            TxState::Included => "included",
            TxState::Confirmed => "confirmed",
            TxState::Reverted => "reverted",
            TxState::Filled => "filled",
        }
    }

    /// Parses a stored value.
    pub(crate) fn parse(value: &str) -> Option<TxState> {
        TxState::ALL.into_iter().find(|s| s.as_str() == value)
    }
}

/// One attempt of a transaction (a replacement is another, same nonce).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Attempt {
    /// 1 for the first.
    pub attempt: i32,
    /// Its hash.
    pub hash: B256,
    /// Its signed bytes.
    pub raw: Vec<u8>,
    /// The filler of a nonce given up (a zero-value transfer to itself).
    pub filler: bool,
}

/// A stored transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ChainTx {
    /// Its id.
    pub id: i64,
    /// Its nonce.
    pub nonce: i64,
    /// Where it stands.
    pub state: TxState,
    /// Where it was mined: block number, block hash, the attempt mined.
    pub mined: Option<(u64, B256, B256)>,
    /// Its attempts, oldest first (none when read by `tx_of_payout` in any
    /// state but `signed`: the rail sends bytes only then).
    pub attempts: Vec<Attempt>,
    /// Milliseconds since it was last sent (None: never).
    pub since_broadcast_ms: Option<i64>,
    /// Milliseconds since its newest attempt was signed.
    pub since_signed_ms: i64,
    /// Given up: its newest attempt is a filler (or its nonce was spent by
    /// a transaction not settled's).
    pub given_up: bool,
    /// When it took its nonce, seconds since the Unix epoch (the database's clock).
    pub created_unix: i64,
    /// Marked for an operator: settled cannot account for its spent nonce.
    pub awaiting_operator: bool,
}

impl ChainTx {
    /// The newest attempt (the one sent).
    pub(crate) fn latest(&self) -> &Attempt {
        self.attempts.last().expect("a stored transaction has an attempt")
    }

    /// True when the attempt `hash` is its filler.
    pub(crate) fn filler_mined(&self, hash: B256) -> bool {
        self.attempts.iter().any(|a| a.hash == hash && a.filler)
    }

    /// True when `hash` is one of its attempts (false: a transaction not
    /// settled's spent its nonce).
    pub(crate) fn has_attempt(&self, hash: B256) -> bool {
        self.attempts.iter().any(|a| a.hash == hash)
    }
}

/// A payout a transaction pays: what it pays, to whom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Paid {
    /// The payout.
    pub payout_id: i64,
    /// Its place in the transaction's call.
    pub position: i32,
    /// The recipient signed into the transaction.
    pub recipient: Address,
    /// The amount signed into it.
    pub amount: Amount,
    /// Its transaction reverted as a batch: it is signed again in a smaller one.
    pub given_up: bool,
}

#[derive(sqlx::FromRow)]
struct TxRow {
    id: i64,
    nonce: i64,
    state: String,
    block_number: Option<i64>,
    block_hash: Option<String>,
    mined_hash: Option<String>,
    since_broadcast_ms: Option<i64>,
    since_signed_ms: i64,
    given_up: bool,
    created_unix: i64,
    awaiting_operator: bool,
}

const TX_COLUMNS: &str = "t.id, t.nonce, t.state, t.block_number, t.block_hash, t.mined_hash, \
     (extract(epoch FROM clock_timestamp() - t.broadcast_at) * 1000)::bigint AS since_broadcast_ms, \
     (SELECT (extract(epoch FROM clock_timestamp() - max(a.signed_at)) * 1000)::bigint \
      FROM settlement.chain_tx_attempts a WHERE a.tx_id = t.id) AS since_signed_ms, \
     t.given_up_at IS NOT NULL AS given_up, \
     extract(epoch FROM t.created_at)::bigint AS created_unix, \
     t.awaiting_operator_at IS NOT NULL AS awaiting_operator";

fn hash(text: &str) -> anyhow::Result<B256> {
    text.parse().map_err(|e| anyhow::anyhow!("stored hash {text:?}: {e}"))
}

/// The attempts of transactions `ids`, oldest first, by transaction: one
/// query for any number of transactions.
async fn attempts_of(conn: &mut PgConnection, ids: &[i64]) -> anyhow::Result<HashMap<i64, Vec<Attempt>>> {
    let rows: Vec<(i64, i32, String, Vec<u8>, bool)> = sqlx::query_as(
        "SELECT tx_id, attempt, hash, raw, filler FROM settlement.chain_tx_attempts
         WHERE tx_id = ANY($1) ORDER BY tx_id, attempt",
    )
    .bind(ids) // $1
    .fetch_all(&mut *conn)
    .await?;
    let mut by_tx: HashMap<i64, Vec<Attempt>> = HashMap::with_capacity(ids.len());
    for (tx_id, attempt, h, raw, filler) in rows {
        by_tx.entry(tx_id).or_default().push(Attempt {
            attempt,
            hash: hash(&h)?,
            raw,
            filler,
        });
    }
    Ok(by_tx)
}

/// The transactions of `rows`, with their attempts.
async fn complete(conn: &mut PgConnection, rows: Vec<TxRow>) -> anyhow::Result<Vec<ChainTx>> {
    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    let mut attempts = attempts_of(conn, &ids).await?;
    rows.into_iter()
        .map(|row| {
            let of_row = attempts.remove(&row.id).unwrap_or_default();
            from_row(row, of_row)
        })
        .collect()
}

/// The transaction of `row`, with `attempts`.
fn from_row(row: TxRow, attempts: Vec<Attempt>) -> anyhow::Result<ChainTx> {
    let state =
        TxState::parse(&row.state).ok_or_else(|| anyhow::anyhow!("chain tx {}: state {:?}", row.id, row.state))?;
    let mined = match (row.block_number, row.block_hash, row.mined_hash) {
        (Some(n), Some(b), Some(m)) => Some((n as u64, hash(&b)?, hash(&m)?)),
        _ => None,
    };
    Ok(ChainTx {
        id: row.id,
        nonce: row.nonce,
        state,
        mined,
        attempts,
        since_broadcast_ms: row.since_broadcast_ms,
        since_signed_ms: row.since_signed_ms,
        given_up: row.given_up,
        created_unix: row.created_unix,
        awaiting_operator: row.awaiting_operator,
    })
}

/// A payout's link to its transaction, read with the transaction.
#[derive(sqlx::FromRow)]
struct LinkRow {
    #[sqlx(flatten)]
    tx: TxRow,
    position: i32,
    recipient: String,
    amount: String,
}

/// The transaction that pays payout `payout_id`, and what it pays it.
/// Its attempts are read only while it is `signed`, the one state in which
/// the rail sends its bytes (a batch's hundred payouts would otherwise
/// read its signed bytes a hundred times); in any other state they are
/// left empty.
pub(crate) async fn tx_of_payout(conn: &mut PgConnection, payout_id: i64) -> anyhow::Result<Option<(ChainTx, Paid)>> {
    let row: Option<LinkRow> = sqlx::query_as(&format!(
        "SELECT {TX_COLUMNS}, l.position, l.recipient, l.amount::text AS amount
         FROM settlement.chain_tx_payouts l JOIN settlement.chain_txs t ON t.id = l.tx_id
         WHERE l.payout_id = $1 AND NOT l.given_up"
    ))
    .bind(payout_id) // $1
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else { return Ok(None) };
    let paid = Paid {
        payout_id,
        position: row.position,
        recipient: row.recipient.parse()?,
        amount: Amount::parse_decimal(&row.amount)?,
        given_up: false,
    };
    let tx = if row.tx.state == TxState::Signed.as_str() {
        complete(conn, vec![row.tx])
            .await?
            .pop()
            .expect("one row, one transaction")
    } else {
        from_row(row.tx, Vec::new())?
    };
    Ok(Some((tx, paid)))
}

/// Transaction `id`.
pub(crate) async fn tx(conn: &mut PgConnection, id: i64) -> anyhow::Result<Option<ChainTx>> {
    let rows: Vec<TxRow> = sqlx::query_as(&format!(
        "SELECT {TX_COLUMNS} FROM settlement.chain_txs t WHERE t.id = $1"
    ))
    .bind(id) // $1
    .fetch_all(&mut *conn)
    .await?;
    Ok(complete(conn, rows).await?.pop())
}

/// The payouts of transaction `tx_id` still `queued`, by id.
pub(crate) async fn still_queued(conn: &mut PgConnection, tx_id: i64) -> anyhow::Result<Vec<i64>> {
    Ok(sqlx::query_scalar(
        "SELECT l.payout_id FROM settlement.chain_tx_payouts l JOIN settlement.payouts p ON p.id = l.payout_id
         WHERE l.tx_id = $1 AND p.status = 'queued' ORDER BY l.payout_id",
    )
    .bind(tx_id) // $1
    .fetch_all(&mut *conn)
    .await?)
}

/// The payouts transaction `tx_id` pays, in call order.
pub(crate) async fn payouts_of(conn: &mut PgConnection, tx_id: i64) -> anyhow::Result<Vec<Paid>> {
    let rows: Vec<(i64, i32, String, String, bool)> = sqlx::query_as(
        "SELECT payout_id, position, recipient, amount::text, given_up FROM settlement.chain_tx_payouts
         WHERE tx_id = $1 ORDER BY position",
    )
    .bind(tx_id) // $1
    .fetch_all(&mut *conn)
    .await?;
    rows.into_iter()
        .map(|(payout_id, position, recipient, amount, given_up)| {
            Ok(Paid {
                payout_id,
                position,
                recipient: recipient.parse()?,
                amount: Amount::parse_decimal(&amount)?,
                given_up,
            })
        })
        .collect()
}

/// The transactions of `sender` on `chain_id` not final yet, by nonce.
pub(crate) async fn in_flight(conn: &mut PgConnection, chain_id: u64, sender: Address) -> anyhow::Result<Vec<ChainTx>> {
    let rows: Vec<TxRow> = sqlx::query_as(&format!(
        "SELECT {TX_COLUMNS} FROM settlement.chain_txs t
         WHERE t.chain_id = $1 AND t.sender = $2 AND t.state IN ('signed', 'broadcast', 'included')
         ORDER BY t.nonce"
    ))
    .bind(chain_id as i64) // $1
    .bind(lower(sender)) // $2
    .fetch_all(&mut *conn)
    .await?;
    complete(conn, rows).await
}

/// An address as stored: lower-case hex.
pub(crate) fn lower(address: Address) -> String {
    format!("{address:#x}")
}

/// A hash as stored.
pub(crate) fn hex(hash: B256) -> String {
    format!("{hash:#x}")
}

/// Transaction `id` was sent: signed moves to broadcast; the time of its
/// last sending is kept. False when it is past both (mined meanwhile).
pub(crate) async fn mark_broadcast(conn: &mut PgConnection, id: i64) -> anyhow::Result<bool> {
    let moved = sqlx::query(
        "UPDATE settlement.chain_txs SET state = 'broadcast', broadcast_at = now()
         WHERE id = $1 AND state IN ('signed', 'broadcast')",
    )
    .bind(id) // $1
    .execute(conn)
    .await?;
    Ok(moved.rows_affected() == 1)
}

/// Transaction `id`, in `from`, was mined: attempt `mined_hash` in block
/// `number` (hash `block`). False when it was not in `from` any more, or
/// another process holds its row (the followers of every deliverer look
/// at the same transactions: one moves it and its payouts, the others go
/// on to the next rather than wait for it, and look again next round).
pub(crate) async fn mark_included(
    conn: &mut PgConnection,
    id: i64,
    from: TxState,
    number: u64,
    block: B256,
    mined_hash: B256,
) -> anyhow::Result<bool> {
    let moved = sqlx::query(
        "UPDATE settlement.chain_txs t
         SET state = 'included', block_number = $3, block_hash = $4, mined_hash = $5
         WHERE t.id = $1 AND t.state = $2
           AND t.id IN (SELECT f.id FROM settlement.chain_txs f WHERE f.id = $1 FOR NO KEY UPDATE SKIP LOCKED)",
    )
    .bind(id) // $1
    .bind(from.as_str()) // $2
    .bind(number as i64) // $3
    .bind(hex(block)) // $4
    .bind(hex(mined_hash)) // $5
    .execute(conn)
    .await?;
    Ok(moved.rows_affected() == 1)
}

/// Transaction `id`'s block `block` left the canonical chain: it is
/// broadcast again. False when it was not included there.
pub(crate) async fn mark_reorged(conn: &mut PgConnection, id: i64, block: B256) -> anyhow::Result<bool> {
    let moved = sqlx::query(
        "UPDATE settlement.chain_txs
         SET state = 'broadcast', block_number = NULL, block_hash = NULL, mined_hash = NULL, broadcast_at = NULL
         WHERE id = $1 AND state = 'included' AND block_hash = $2",
    )
    .bind(id) // $1
    .bind(hex(block)) // $2
    .execute(conn)
    .await?;
    Ok(moved.rows_affected() == 1)
}

/// Transaction `id`, included in block `block`, is final: confirmed,
/// reverted, or filled. False when it was not included there, or another
/// process holds its row (as [`mark_included`]).
pub(crate) async fn mark_final(conn: &mut PgConnection, id: i64, block: B256, to: TxState) -> anyhow::Result<bool> {
    assert!(
        matches!(to, TxState::Confirmed | TxState::Reverted | TxState::Filled),
        "{to:?} is not final"
    );
    let moved = sqlx::query(
        "UPDATE settlement.chain_txs t SET state = $3
         WHERE t.id = $1 AND t.state = 'included' AND t.block_hash = $2
           AND t.id IN (SELECT f.id FROM settlement.chain_txs f WHERE f.id = $1 FOR NO KEY UPDATE SKIP LOCKED)",
    )
    .bind(id) // $1
    .bind(hex(block)) // $2
    .bind(to.as_str()) // $3
    .execute(conn)
    .await?;
    Ok(moved.rows_affected() == 1)
}

/// An attempt to store: its signature, gas limit, fees, and whether it is
/// a filler.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NewAttempt<'a> {
    /// The signed attempt.
    pub signed: &'a super::wallet::Signed,
    /// Its gas limit.
    pub gas_limit: u64,
    /// Its fees.
    pub fees: super::sign::Fees,
    /// The filler of a nonce given up.
    pub filler: bool,
}

/// Stores `attempt` of transaction `id` (a replacement or a filler: the
/// same nonce, higher fees) while it is not mined and has no such attempt.
/// False when another process stored that attempt first, or it was mined
/// meanwhile.
pub(crate) async fn add_attempt(
    conn: &mut PgConnection,
    id: i64,
    attempt: i32,
    new: &NewAttempt<'_>,
) -> anyhow::Result<bool> {
    let added = sqlx::query(
        "INSERT INTO settlement.chain_tx_attempts
             (tx_id, attempt, hash, raw, gas_limit, max_fee_per_gas, max_priority_fee_per_gas, filler)
         SELECT $1, $2, $3, $4, $5, $6::numeric, $7::numeric, $8
         WHERE EXISTS (SELECT 1 FROM settlement.chain_txs WHERE id = $1 AND state IN ('signed', 'broadcast'))
         ON CONFLICT (tx_id, attempt) DO NOTHING",
    )
    .bind(id) // $1
    .bind(attempt) // $2
    .bind(hex(new.signed.hash)) // $3
    .bind(&new.signed.raw) // $4
    .bind(new.gas_limit as i64) // $5
    .bind(new.fees.max_fee_per_gas.to_string()) // $6
    .bind(new.fees.max_priority_fee_per_gas.to_string()) // $7
    .bind(new.filler) // $8
    .execute(conn)
    .await?;
    Ok(added.rows_affected() == 1)
}

/// Marks transaction `id` given up because of `why`, while it is not mined
/// and not given up yet. False otherwise.
pub(crate) async fn mark_given_up(conn: &mut PgConnection, id: i64, why: &str) -> anyhow::Result<bool> {
    let why: String = why.chars().take(GIVEN_UP_WHY_CHARS_MAX).collect();
    let marked = sqlx::query(
        "UPDATE settlement.chain_txs SET given_up_at = now(), given_up_why = $2
         WHERE id = $1 AND given_up_at IS NULL AND state IN ('signed', 'broadcast')",
    )
    .bind(id) // $1
    .bind(why) // $2
    .execute(conn)
    .await?;
    Ok(marked.rows_affected() == 1)
}

/// The longest reason a give-up keeps (`chain_txs.given_up_why`).
pub(crate) const GIVEN_UP_WHY_CHARS_MAX: usize = 500;

/// Gives up the payouts of transaction `id`, a batch that reverted or a
/// transaction filled at the confirmation depth (final: its nonce is spent
/// and none of its attempts can be mined any more), so that they can be
/// signed again. False when it is neither.
pub(crate) async fn give_up_payouts(conn: &mut PgConnection, id: i64) -> anyhow::Result<bool> {
    let given = sqlx::query(
        "UPDATE settlement.chain_tx_payouts l SET given_up = true
         WHERE l.tx_id = $1 AND NOT l.given_up
           AND EXISTS (SELECT 1 FROM settlement.chain_txs t WHERE t.id = $1 AND t.state IN ('reverted', 'filled'))",
    )
    .bind(id) // $1
    .execute(conn)
    .await?;
    Ok(given.rows_affected() > 0)
}

/// Marks transaction `id`, not final, for an operator because of `why`
/// (settled cannot account for its spent nonce), once: its state and its
/// payouts' stay as they are. False when it is marked already, or final.
pub(crate) async fn mark_awaiting_operator(conn: &mut PgConnection, id: i64, why: &str) -> anyhow::Result<bool> {
    let why: String = why.chars().take(GIVEN_UP_WHY_CHARS_MAX).collect();
    let marked = sqlx::query(
        "UPDATE settlement.chain_txs SET awaiting_operator_at = now(), awaiting_operator_why = $2
         WHERE id = $1 AND awaiting_operator_at IS NULL AND state IN ('signed', 'broadcast', 'included')",
    )
    .bind(id) // $1
    .bind(why) // $2
    .execute(conn)
    .await?;
    Ok(marked.rows_affected() == 1)
}

/// A transaction waiting for an operator: its nonce, state, why, and the
/// payouts it pays.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct AwaitingOperator {
    /// Its nonce.
    pub nonce: i64,
    /// Its state.
    pub state: String,
    /// Why.
    pub why: String,
    /// The payouts it pays.
    pub payout_ids: Vec<i64>,
}

/// The transactions of `sender` on `chain_id`, not final, marked for an
/// operator, by nonce.
pub(crate) async fn awaiting_operator(
    conn: &mut PgConnection,
    chain_id: u64,
    sender: Address,
) -> anyhow::Result<Vec<AwaitingOperator>> {
    Ok(sqlx::query_as(
        "SELECT t.nonce, t.state, t.awaiting_operator_why AS why,
                coalesce(array_agg(l.payout_id ORDER BY l.payout_id) FILTER (WHERE l.payout_id IS NOT NULL),
                         '{}') AS payout_ids
         FROM settlement.chain_txs t
         LEFT JOIN settlement.chain_tx_payouts l ON l.tx_id = t.id AND NOT l.given_up
         WHERE t.chain_id = $1 AND t.sender = $2 AND t.awaiting_operator_at IS NOT NULL
           AND t.state IN ('signed', 'broadcast', 'included')
         GROUP BY t.id ORDER BY t.nonce",
    )
    .bind(chain_id as i64) // $1
    .bind(lower(sender)) // $2
    .fetch_all(conn)
    .await?)
}

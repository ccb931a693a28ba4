//! The chain rail's transactions as operators read them (the dashboard's
//! `/chain` page, a payout's page): newest first, paged by keyset, each
//! with every attempt's hash and the payouts it pays. It reads; it never
//! calls a node.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

/// Transactions on one page by default, and at most.
pub const TXS_PER_PAGE_DEFAULT: i64 = 50;
/// The most transactions one page shows.
pub const TXS_PER_PAGE_MAX: i64 = 500;

/// One transaction.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Tx {
    /// Its id.
    pub id: i64,
    /// The chain's id.
    pub chain_id: i64,
    /// The hot wallet that signed it.
    pub sender: String,
    /// Its nonce: its identity on the chain, shared by its attempts.
    pub nonce: i64,
    /// `payouts` or `approve`.
    pub purpose: String,
    /// signed, broadcast, included, confirmed or reverted.
    pub state: String,
    /// The block an attempt of it was mined in, while included or final.
    pub block_number: Option<i64>,
    /// That block's hash.
    pub block_hash: Option<String>,
    /// The attempt mined.
    pub mined_hash: Option<String>,
    /// When it took its nonce.
    pub created_at: DateTime<Utc>,
    /// When it last changed state.
    pub updated_at: DateTime<Utc>,
    /// Times a reorg took it out of the chain.
    pub reorgs: i64,
    /// Why it waits for an operator (a spent nonce settled cannot account
    /// for), while it does.
    pub awaiting_operator_why: Option<String>,
}

/// One signed attempt (a replacement is a later attempt under the nonce).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Attempt {
    /// Its transaction.
    pub tx_id: i64,
    /// 1 for the first, then each replacement.
    pub attempt: i32,
    /// Its hash.
    pub hash: String,
    /// Its fee cap, in wei per gas.
    pub max_fee_per_gas: String,
    /// Its tip, in wei per gas.
    pub max_priority_fee_per_gas: String,
    /// When it was signed.
    pub signed_at: DateTime<Utc>,
}

/// A payout a transaction pays (or paid, before it was given up).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Paid {
    /// Its transaction.
    pub tx_id: i64,
    /// The payout.
    pub payout_id: i64,
    /// The recipient.
    pub recipient: String,
    /// The amount, base units.
    pub amount: String,
    /// The payout's state.
    pub status: String,
    /// Given up by this transaction (its batch reverted and was split).
    pub given_up: bool,
}

/// A transaction with its attempts and payouts.
#[derive(Debug, Clone)]
pub struct Listed {
    /// The transaction.
    pub tx: Tx,
    /// Its attempts, oldest first.
    pub attempts: Vec<Attempt>,
    /// Its payouts, in call order.
    pub payouts: Vec<Paid>,
}

/// A page of transactions, newest first, and the cursor of the next.
#[derive(Debug, Clone)]
pub struct Page {
    /// The transactions.
    pub txs: Vec<Listed>,
    /// Pass as `before` for the next (older) page; None on the last.
    pub next: Option<i64>,
}

const TXS_SQL: &str = "
SELECT t.id, t.chain_id, t.sender, t.nonce, t.purpose, t.state, t.block_number, t.block_hash, t.mined_hash,
       t.created_at, t.updated_at,
       (SELECT count(*) FROM settlement.chain_tx_history h
        WHERE h.tx_id = t.id AND h.from_state = 'included' AND h.to_state = 'broadcast') AS reorgs,
       CASE WHEN t.state IN ('signed', 'broadcast', 'included') THEN t.awaiting_operator_why END AS awaiting_operator_why
FROM settlement.chain_txs t
WHERE ($1::bigint IS NULL OR t.id < $1) AND ($2::bigint IS NULL OR t.id = $2)
ORDER BY t.id DESC
LIMIT $3";

/// The transactions older than `before` (all when None), or only `only`,
/// `limit` of them, newest first.
pub async fn page(conn: &mut PgConnection, before: Option<i64>, only: Option<i64>, limit: i64) -> sqlx::Result<Page> {
    let limit = limit.clamp(1, TXS_PER_PAGE_MAX);
    let mut txs: Vec<Tx> = sqlx::query_as(TXS_SQL)
        .bind(before) // $1
        .bind(only) // $2
        .bind(limit + 1) // $3
        .fetch_all(&mut *conn)
        .await?;
    let next = (txs.len() as i64 > limit).then(|| {
        txs.truncate(limit as usize);
        txs.last().map(|t| t.id)
    });
    let ids: Vec<i64> = txs.iter().map(|t| t.id).collect();
    let attempts: Vec<Attempt> = sqlx::query_as(
        "SELECT tx_id, attempt, hash, max_fee_per_gas::text AS max_fee_per_gas,
                max_priority_fee_per_gas::text AS max_priority_fee_per_gas, signed_at
         FROM settlement.chain_tx_attempts WHERE tx_id = ANY($1) ORDER BY tx_id, attempt",
    )
    .bind(&ids) // $1
    .fetch_all(&mut *conn)
    .await?;
    let payouts: Vec<Paid> = sqlx::query_as(
        "SELECT l.tx_id, l.payout_id, l.recipient, l.amount::text AS amount, p.status, l.given_up
         FROM settlement.chain_tx_payouts l JOIN settlement.payouts p ON p.id = l.payout_id
         WHERE l.tx_id = ANY($1) ORDER BY l.tx_id, l.position",
    )
    .bind(&ids) // $1
    .fetch_all(&mut *conn)
    .await?;
    let txs = txs
        .into_iter()
        .map(|tx| Listed {
            attempts: attempts.iter().filter(|a| a.tx_id == tx.id).cloned().collect(),
            payouts: payouts.iter().filter(|p| p.tx_id == tx.id).cloned().collect(),
            tx,
        })
        .collect();
    Ok(Page {
        txs,
        next: next.flatten(),
    })
}

/// The transactions that pay (or paid, then gave up) payout `payout_id`:
/// (transaction id, nonce, state, given up), oldest first.
pub async fn of_payout(conn: &mut PgConnection, payout_id: i64) -> sqlx::Result<Vec<(i64, i64, String, bool)>> {
    sqlx::query_as(
        "SELECT t.id, t.nonce, t.state, l.given_up
         FROM settlement.chain_tx_payouts l JOIN settlement.chain_txs t ON t.id = l.tx_id
         WHERE l.payout_id = $1 ORDER BY t.id",
    )
    .bind(payout_id) // $1
    .fetch_all(conn)
    .await
}

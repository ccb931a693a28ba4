//! The chain rail's metrics, read from the database at scrape time by
//! `settled serve` (docs/operations.md, "The chain rail"): per hot wallet,
//! its transactions in flight and the age of the oldest (a nonce stuck),
//! the reorgs seen, and what its deliverer last recorded
//! ([`super::watch`]): the gas balance and the newest reconciliation's
//! mismatches. Names start `settled_chain_`; amounts are the database's
//! exact integers. It reads; it never calls a node.

use sqlx::PgConnection;

/// One hot wallet's numbers.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct WalletGauges {
    /// The chain's id.
    pub chain_id: i64,
    /// The hot wallet (lower-case hex).
    pub sender: String,
    /// Transactions signed, broadcast or included, not yet final.
    pub in_flight: i64,
    /// Seconds since the oldest of them took its nonce (0 when none).
    pub oldest_in_flight_secs: f64,
    /// Included transactions whose block left the canonical chain, ever.
    pub reorgs: i64,
    /// The gas balance in wei, as last recorded (None: never).
    pub gas_balance: Option<String>,
    /// Seconds since it was recorded.
    pub observed_age_secs: Option<f64>,
    /// Mismatches of the newest reconciliation (None: none ran).
    pub reconcile_mismatches: Option<i32>,
    /// Seconds since it ran.
    pub reconciled_age_secs: Option<f64>,
}

const GAUGES_SQL: &str = "
SELECT s.chain_id, s.sender,
       (SELECT count(*) FROM settlement.chain_txs t
        WHERE t.chain_id = s.chain_id AND t.sender = s.sender
          AND t.state IN ('signed', 'broadcast', 'included')) AS in_flight,
       coalesce((SELECT extract(epoch FROM now() - min(t.created_at))::float8 FROM settlement.chain_txs t
                 WHERE t.chain_id = s.chain_id AND t.sender = s.sender
                   AND t.state IN ('signed', 'broadcast', 'included')), 0) AS oldest_in_flight_secs,
       (SELECT count(*) FROM settlement.chain_tx_history h
        JOIN settlement.chain_txs t ON t.id = h.tx_id
        WHERE t.chain_id = s.chain_id AND t.sender = s.sender
          AND h.from_state = 'included' AND h.to_state = 'broadcast') AS reorgs,
       w.gas_balance::text AS gas_balance,
       extract(epoch FROM now() - w.observed_at)::float8 AS observed_age_secs,
       w.reconcile_mismatches,
       extract(epoch FROM now() - w.reconciled_at)::float8 AS reconciled_age_secs
FROM settlement.chain_senders s
LEFT JOIN settlement.chain_wallet_watch w ON w.chain_id = s.chain_id AND w.sender = s.sender
ORDER BY s.chain_id, s.sender";

/// Every hot wallet's numbers, now.
pub(crate) async fn gauges(conn: &mut PgConnection) -> sqlx::Result<Vec<WalletGauges>> {
    sqlx::query_as(GAUGES_SQL).fetch_all(conn).await
}

/// A family's value for one wallet (None: no series for it).
type Value = fn(&WalletGauges) -> Option<String>;

/// The metric families, in order: (name, type, help, value).
const FAMILIES: [(&str, &str, &str, Value); 7] = [
    (
        "settled_chain_in_flight_transactions",
        "gauge",
        "Transactions of a hot wallet signed, broadcast or included, not yet confirmed or reverted.",
        |w| Some(w.in_flight.to_string()),
    ),
    (
        "settled_chain_oldest_in_flight_seconds",
        "gauge",
        "Seconds since the oldest transaction in flight took its nonce (0 when none): a nonce stuck.",
        |w| Some(format!("{:.3}", w.oldest_in_flight_secs)),
    ),
    (
        "settled_chain_reorgs_total",
        "counter",
        "Included transactions whose block left the canonical chain (each sent again).",
        |w| Some(w.reorgs.to_string()),
    ),
    (
        "settled_chain_gas_balance_wei",
        "gauge",
        "The hot wallet's balance of the chain's own coin, in wei, as its deliverer last read it.",
        |w| w.gas_balance.clone(),
    ),
    (
        "settled_chain_gas_balance_age_seconds",
        "gauge",
        "Seconds since a deliverer last recorded the gas balance.",
        |w| w.observed_age_secs.map(|s| format!("{s:.3}")),
    ),
    (
        "settled_chain_reconcile_mismatches",
        "gauge",
        "Mismatches between the token's Transfer logs and the payouts in the newest reconciliation a deliverer ran.",
        |w| w.reconcile_mismatches.map(|n| n.to_string()),
    ),
    (
        "settled_chain_reconcile_age_seconds",
        "gauge",
        "Seconds since a deliverer last reconciled with the chain.",
        |w| w.reconciled_age_secs.map(|s| format!("{s:.3}")),
    ),
];

/// The gauges in Prometheus text: each family once, a series per wallet
/// it has a value for.
pub(crate) fn text(wallets: &[WalletGauges]) -> String {
    if wallets.is_empty() {
        return String::new();
    }
    let mut out = String::new();
    for (name, kind, help, value) in FAMILIES {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for w in wallets {
            if let Some(value) = value(w) {
                out.push_str(&format!(
                    "{name}{{chain_id=\"{}\",sender=\"{}\"}} {value}\n",
                    w.chain_id, w.sender
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wallet(sender: &str, watched: bool) -> WalletGauges {
        WalletGauges {
            chain_id: 1,
            sender: sender.to_string(),
            in_flight: 2,
            oldest_in_flight_secs: 12.5,
            reorgs: 3,
            gas_balance: watched
                .then(|| "115792089237316195423570985008687907853269984665640564039457584007913129639935".into()),
            observed_age_secs: watched.then_some(1.0),
            reconcile_mismatches: watched.then_some(0),
            reconciled_age_secs: watched.then_some(2.0),
        }
    }

    #[test]
    fn each_family_is_written_once_with_a_series_per_wallet_that_has_a_value_and_exact_amounts() {
        assert_eq!(text(&[]), "");
        let out = text(&[wallet("0xaa", true), wallet("0xbb", false)]);
        for (name, kind, _, _) in FAMILIES {
            assert_eq!(out.matches(&format!("# TYPE {name} {kind}\n")).count(), 1, "{out}");
        }
        assert!(
            out.contains("settled_chain_reorgs_total{chain_id=\"1\",sender=\"0xbb\"} 3\n"),
            "{out}"
        );
        assert!(out.contains("settled_chain_oldest_in_flight_seconds{chain_id=\"1\",sender=\"0xaa\"} 12.500\n"));
        let gas = "settled_chain_gas_balance_wei{chain_id=\"1\",sender=\"0xaa\"} 115792089237316195423570985008687907853269984665640564039457584007913129639935\n";
        assert!(out.contains(gas), "the balance as the database's exact integer: {out}");
        assert!(
            !out.contains("settled_chain_gas_balance_wei{chain_id=\"1\",sender=\"0xbb\"}"),
            "never watched: no series"
        );
        assert!(!out.contains("settled_chain_reconcile_mismatches{chain_id=\"1\",sender=\"0xbb\"}"));
    }
}

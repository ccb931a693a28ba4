//! One payout as settled reads it: [`PayoutRow`], the one type every
//! reader of `settlement.payouts` decodes a payout into, through one column
//! list ([`PAYOUT_COLUMNS`]). Stored values are parsed here, at the edge:
//! the state into [`PayoutState`], the amount into [`Amount`], the creator
//! into [`CreatorAddress`], the kind into [`PayoutKind`]; a stored value that
//! does not parse is an error naming the payout and its column, never a
//! string carried inward. This module reads; it never moves a payout.

use sqlx::postgres::{PgRow, PgTypeInfo, PgValueRef};
use sqlx::{PgConnection, Postgres};

use super::PayoutState;
use crate::address::CreatorAddress;
use crate::money::Amount;

/// The columns of [`PayoutRow`], for `SELECT {PAYOUT_COLUMNS} FROM
/// settlement.payouts p ...` (the table is always aliased `p`) and for
/// `RETURNING` after an `UPDATE settlement.payouts p`.
pub const PAYOUT_COLUMNS: &str = "p.id, p.kind, p.creator, p.amount::text AS amount, p.status, p.provider_key, \
     CASE WHEN p.kind = 'withdrawal' AND NOT p.provider_key_from_id THEN p.provider_key \
          ELSE p.id::text END AS reference, \
     p.idempotency_key, p.provider_id";

/// What a payout is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PayoutKind {
    /// A creator's withdrawal, made through the API.
    Withdrawal,
    /// A period's reward paid to its creator through the provider (leased mode).
    Settlement,
}

impl PayoutKind {
    /// The stored value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            PayoutKind::Withdrawal => "withdrawal",
            PayoutKind::Settlement => "settlement",
        }
    }

    /// Parses a stored value.
    pub(crate) fn parse(value: &str) -> Option<PayoutKind> {
        [PayoutKind::Withdrawal, PayoutKind::Settlement]
            .into_iter()
            .find(|k| k.as_str() == value)
    }
}

impl std::fmt::Display for PayoutKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One payout, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayoutRow {
    /// Its id.
    pub id: i64,
    /// A withdrawal or a settlement.
    pub kind: PayoutKind,
    /// Who it pays.
    pub creator: CreatorAddress,
    /// How much, in base units.
    pub amount: Amount,
    /// Where it stands.
    pub state: PayoutState,
    /// The idempotency key every call to a rail carries for it (a
    /// withdrawal's from its request's key, a settlement's from its period
    /// and creator, or `payout-ID` for payouts made before keys came from
    /// requests).
    pub provider_key: String,
    /// What the provider shows as the payment's reference: part of the
    /// request under the key, so as lasting as the key (a withdrawal's
    /// provider key; the id for payouts keyed by their id).
    pub reference: String,
    /// A withdrawal's request key (None for a settlement).
    pub idempotency_key: Option<String>,
    /// The rail's id of its payment, once it accepted it (never replaced).
    pub provider_id: Option<String>,
}

/// A stored value that is not what its column must hold.
#[derive(Debug, thiserror::Error)]
#[error("payout {payout}'s {column} {value:?} {why}")]
pub(crate) struct StoredValueError {
    /// The payout.
    pub payout: i64,
    /// The column.
    pub column: &'static str,
    /// The value as stored.
    pub value: String,
    /// What is wrong with it.
    pub why: String,
}

/// A payout's columns as stored, before they are parsed.
#[derive(Debug, Clone, sqlx::FromRow)]
struct Stored {
    id: i64,
    kind: String,
    creator: String,
    amount: String,
    status: String,
    provider_key: String,
    reference: String,
    idempotency_key: Option<String>,
    provider_id: Option<String>,
}

impl TryFrom<Stored> for PayoutRow {
    type Error = StoredValueError;

    fn try_from(stored: Stored) -> Result<PayoutRow, StoredValueError> {
        let id = stored.id;
        let bad = |column: &'static str, value: &str, why: String| StoredValueError {
            payout: id,
            column,
            value: value.to_string(),
            why,
        };
        Ok(PayoutRow {
            id,
            kind: PayoutKind::parse(&stored.kind)
                .ok_or_else(|| bad("kind", &stored.kind, "is neither withdrawal nor settlement".into()))?,
            creator: CreatorAddress::parse(&stored.creator)
                .map_err(|e| bad("creator", &stored.creator, format!("is not an address: {e}")))?,
            amount: Amount::parse_decimal(&stored.amount)
                .map_err(|e| bad("amount", &stored.amount, format!("is not an amount: {e}")))?,
            state: PayoutState::parse(&stored.status)
                .ok_or_else(|| bad("status", &stored.status, "is not a payout state".into()))?,
            provider_key: stored.provider_key,
            reference: stored.reference,
            idempotency_key: stored.idempotency_key,
            provider_id: stored.provider_id,
        })
    }
}

impl<'r> sqlx::FromRow<'r, PgRow> for PayoutRow {
    fn from_row(row: &'r PgRow) -> sqlx::Result<PayoutRow> {
        PayoutRow::try_from(Stored::from_row(row)?).map_err(|e| sqlx::Error::ColumnDecode {
            index: format!("{:?}", e.column),
            source: Box::new(e),
        })
    }
}

/// A payout state read alone (a `GROUP BY status`, say) decodes from its
/// text; a value that is no state is an error naming the column.
impl sqlx::Type<Postgres> for PayoutState {
    fn type_info() -> PgTypeInfo {
        <&str as sqlx::Type<Postgres>>::type_info()
    }

    fn compatible(ty: &PgTypeInfo) -> bool {
        <&str as sqlx::Type<Postgres>>::compatible(ty)
    }
}

impl<'r> sqlx::Decode<'r, Postgres> for PayoutState {
    fn decode(value: PgValueRef<'r>) -> Result<PayoutState, sqlx::error::BoxDynError> {
        let text = <&str as sqlx::Decode<Postgres>>::decode(value)?;
        PayoutState::parse(text).ok_or_else(|| format!("{text:?} is not a payout state").into())
    }
}

/// Payout `id`, if it exists.
pub async fn load(conn: &mut PgConnection, id: i64) -> anyhow::Result<Option<PayoutRow>> {
    Ok(sqlx::query_as(&format!(
        "SELECT {PAYOUT_COLUMNS} FROM settlement.payouts p WHERE p.id = $1"
    ))
    .bind(id) // $1
    .fetch_optional(conn)
    .await?)
}

/// The payouts whose provider keys are among `keys`, in id order.
pub(crate) async fn load_by_provider_keys(conn: &mut PgConnection, keys: &[String]) -> anyhow::Result<Vec<PayoutRow>> {
    Ok(sqlx::query_as(&format!(
        "SELECT {PAYOUT_COLUMNS} FROM settlement.payouts p WHERE p.provider_key = ANY($1) ORDER BY p.id"
    ))
    .bind(keys) // $1
    .fetch_all(conn)
    .await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CREATOR: &str = "0x00000000000000000000000000000000000000aa";

    fn stored() -> Stored {
        Stored {
            id: 12,
            kind: "withdrawal".into(),
            creator: CREATOR.into(),
            amount: "1000".into(),
            status: "queued".into(),
            provider_key: "withdrawal-k".into(),
            reference: "withdrawal-k".into(),
            idempotency_key: Some("k".into()),
            provider_id: None,
        }
    }

    #[test]
    fn a_stored_payout_decodes_into_its_types() {
        let row = PayoutRow::try_from(stored()).unwrap();
        assert_eq!(row.kind, PayoutKind::Withdrawal);
        assert_eq!(row.creator, CreatorAddress::parse(CREATOR).unwrap());
        assert_eq!(row.amount, Amount::parse_decimal("1000").unwrap());
        assert_eq!(row.state, PayoutState::Queued);
        for state in PayoutState::ALL {
            let decoded = PayoutRow::try_from(Stored {
                status: state.as_str().into(),
                ..stored()
            });
            assert_eq!(decoded.unwrap().state, state);
        }
    }

    #[test]
    fn a_bad_stored_value_is_an_error_naming_the_payout_and_its_column() {
        let cases = [
            (
                Stored {
                    status: "in_transit".into(),
                    ..stored()
                },
                "status",
                "payout 12's status \"in_transit\" is not a payout state",
            ),
            (
                Stored {
                    amount: "-5".into(),
                    ..stored()
                },
                "amount",
                "payout 12's amount \"-5\" is not an amount",
            ),
            (
                Stored {
                    creator: "0xAA".into(),
                    ..stored()
                },
                "creator",
                "payout 12's creator \"0xAA\" is not an address",
            ),
            (
                Stored {
                    kind: "refund".into(),
                    ..stored()
                },
                "kind",
                "payout 12's kind \"refund\" is neither withdrawal nor settlement",
            ),
        ];
        for (bad, column, says) in cases {
            let err = PayoutRow::try_from(bad).unwrap_err();
            assert_eq!(err.column, column);
            assert!(err.to_string().starts_with(says), "{err}");
        }
    }
}

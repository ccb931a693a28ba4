//! Scope values as the queue's statements bind them.
//!
//! The engine is given scopes as text. It binds a scope in the scope
//! column's own type when it knows that type's form (`date`, `bigint`,
//! `integer`, `uuid`, `text`), so that PostgreSQL plans the statement with
//! the scope as a constant of the column's type. On a table partitioned by
//! scope, the planner then leaves out (and does not lock) every other
//! scope's partition. Bound as text and cast, a date would not do: a cast
//! from text to a date depends on the session's `DateStyle` (it is only
//! STABLE), so the planner keeps every partition and prunes them at
//! execution, after it has locked them all. Other scope types are bound as
//! text and cast in the statement, as before.

use chrono::NaiveDate;
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgTypeInfo};
use sqlx::{Encode, Postgres, Type};
use uuid::Uuid;

use crate::common::error::EngineError;

/// The scope column's type, as far as binding goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ScopeKind {
    Date,
    Int8,
    Int4,
    Uuid,
    Text,
}

impl ScopeKind {
    /// The kind of a (validated) scope type name.
    pub(super) fn of(scope_type: &str) -> ScopeKind {
        match scope_type {
            "date" => ScopeKind::Date,
            "bigint" | "int8" => ScopeKind::Int8,
            "integer" | "int" | "int4" => ScopeKind::Int4,
            "uuid" => ScopeKind::Uuid,
            _ => ScopeKind::Text,
        }
    }

    /// `scope` as a value of this kind; a date must be written YYYY-MM-DD
    /// (the form the runs table keeps scopes in).
    pub(super) fn arg(self, scope: &str, scope_type: &str) -> Result<ScopeArg, EngineError> {
        let invalid = || EngineError::InvalidScope {
            scope: scope.to_string(),
            scope_type: scope_type.to_string(),
        };
        Ok(match self {
            ScopeKind::Date => ScopeArg::Date(
                NaiveDate::parse_from_str(scope, "%Y-%m-%d")
                    .ok()
                    .filter(|d| d.format("%Y-%m-%d").to_string() == scope)
                    .ok_or_else(invalid)?,
            ),
            ScopeKind::Int8 => ScopeArg::Int8(scope.parse().map_err(|_| invalid())?),
            ScopeKind::Int4 => ScopeArg::Int4(scope.parse().map_err(|_| invalid())?),
            ScopeKind::Uuid => ScopeArg::Uuid(scope.parse().map_err(|_| invalid())?),
            ScopeKind::Text => ScopeArg::Text(scope.to_string()),
        })
    }
}

/// A scope bound in its column's type (see the module's text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ScopeArg {
    Date(NaiveDate),
    Int8(i64),
    Int4(i32),
    Uuid(Uuid),
    Text(String),
}

impl Type<Postgres> for ScopeArg {
    fn type_info() -> PgTypeInfo {
        <String as Type<Postgres>>::type_info()
    }

    fn compatible(ty: &PgTypeInfo) -> bool {
        [
            <NaiveDate as Type<Postgres>>::type_info(),
            <i64 as Type<Postgres>>::type_info(),
            <i32 as Type<Postgres>>::type_info(),
            <Uuid as Type<Postgres>>::type_info(),
        ]
        .contains(ty)
            || <String as Type<Postgres>>::compatible(ty)
    }
}

impl Encode<'_, Postgres> for ScopeArg {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        match self {
            ScopeArg::Date(v) => <NaiveDate as Encode<Postgres>>::encode_by_ref(v, buf),
            ScopeArg::Int8(v) => <i64 as Encode<Postgres>>::encode_by_ref(v, buf),
            ScopeArg::Int4(v) => <i32 as Encode<Postgres>>::encode_by_ref(v, buf),
            ScopeArg::Uuid(v) => <Uuid as Encode<Postgres>>::encode_by_ref(v, buf),
            ScopeArg::Text(v) => <String as Encode<Postgres>>::encode_by_ref(v, buf),
        }
    }

    fn produces(&self) -> Option<PgTypeInfo> {
        Some(match self {
            ScopeArg::Date(_) => <NaiveDate as Type<Postgres>>::type_info(),
            ScopeArg::Int8(_) => <i64 as Type<Postgres>>::type_info(),
            ScopeArg::Int4(_) => <i32 as Type<Postgres>>::type_info(),
            ScopeArg::Uuid(_) => <Uuid as Type<Postgres>>::type_info(),
            ScopeArg::Text(_) => <String as Type<Postgres>>::type_info(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_bind_in_their_columns_type_and_bad_ones_are_named() {
        let date = ScopeKind::of("date");
        assert_eq!(
            date.arg("2026-11-28", "date").unwrap(),
            ScopeArg::Date(NaiveDate::from_ymd_opt(2026, 11, 28).unwrap())
        );
        for bad in ["2026-11-31", "2026-1-5", "28.11.2026", "", "2026-11-28 "] {
            let err = date.arg(bad, "date").unwrap_err().to_string();
            assert!(
                err.contains(&format!("{bad:?}")) && err.contains("date"),
                "{bad:?}: {err}"
            );
        }
        assert_eq!(ScopeKind::of("bigint").arg("-7", "bigint").unwrap(), ScopeArg::Int8(-7));
        assert!(ScopeKind::of("integer").arg("3000000000", "integer").is_err());
        assert!(ScopeKind::of("uuid").arg("not-a-uuid", "uuid").is_err());
        assert_eq!(
            ScopeKind::of("text").arg("week 48", "text").unwrap(),
            ScopeArg::Text("week 48".into())
        );
        assert_eq!(ScopeKind::of("timestamptz"), ScopeKind::Text);
    }
}

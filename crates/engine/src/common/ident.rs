//! SQL identifiers a queue is built from, and what the catalog says about
//! a queue's table: both kinds of queue render their statements from
//! identifiers checked here, and read a table's columns and indexes with
//! these statements before they use it.

use crate::common::error::EngineError;

pub(crate) fn check_identifier(field: &'static str, value: &str, allow_schema: bool) -> Result<(), EngineError> {
    let part_ok = |p: &str| {
        !p.is_empty()
            && p.len() <= 63
            && p.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
            && p.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    };
    let parts: Vec<&str> = value.split('.').collect();
    let ok = match parts.as_slice() {
        [one] => part_ok(one),
        [schema, name] if allow_schema => part_ok(schema) && part_ok(name),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(EngineError::InvalidIdentifier {
            field,
            value: value.to_string(),
        })
    }
}

#[derive(sqlx::FromRow)]
pub(crate) struct IndexRow {
    pub(crate) unique: bool,
    pub(crate) columns: Vec<String>,
    pub(crate) predicate: Option<String>,
}

pub(crate) const COLUMNS_SQL: &str = "SELECT a.attname::text FROM pg_attribute a
     WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped";

pub(crate) const INDEXES_SQL: &str = "SELECT i.indisunique AS unique,
            array(SELECT a.attname::text FROM unnest(i.indkey) WITH ORDINALITY k(attnum, ord)
                  JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                  ORDER BY k.ord) AS columns,
            pg_get_expr(i.indpred, i.indrelid) AS predicate
     FROM pg_index i WHERE i.indrelid = to_regclass($1)";

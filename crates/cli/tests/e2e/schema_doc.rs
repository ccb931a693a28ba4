//! docs/schema.md against the catalog of a freshly migrated database (the
//! engine's migrations, then the settlement's): every table, column,
//! constraint, index, trigger and function of `settled_engine` and
//! `settlement`, each difference named. The structural parts are generated
//! blocks; `SETTLED_WRITE_SCHEMA_DOC=1 cargo test -p settled-cli --test e2e
//! schema_doc::` rewrites them from the catalog, keeping the prose.
//!
//! A status's allowed values are written once, in its check constraint:
//! the Rust enums that name them are tested against it here, and the
//! document shows them only in its generated blocks.

mod catalog;
use crate::common;
mod document;

use common::Env;
use document::Generated;
use settled::payouts::{Applied, PayoutState, Source};
use settled_engine::{ItemStatus, RunState};
use sqlx::{Connection, PgConnection};

const SCHEMA_DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/schema.md");
/// Set to 1, the document test rewrites the generated blocks first.
const WRITE_VAR: &str = "SETTLED_WRITE_SCHEMA_DOC";
const REGENERATE: &str = "SETTLED_WRITE_SCHEMA_DOC=1 cargo test -p settled-cli --test e2e schema_doc::";

/// Every block docs/schema.md must have, as the catalog renders it.
async fn generated(env: &Env) -> Vec<Generated> {
    let mut conn = PgConnection::connect(&env.db.url).await.expect("connect");
    let mut out: Vec<Generated> = catalog::relations(&mut conn)
        .await
        .into_iter()
        .map(|rel| Generated {
            heading: format!("## {}", rel.name),
            name: rel.name,
            header: &["column", "type", "null", "default", "meaning"],
            rows: rel.columns.into_iter().map(|c| (c.name, c.spec.to_vec())).collect(),
            facts: rel.facts,
        })
        .collect();
    for schema in catalog::SCHEMAS {
        out.push(Generated {
            name: format!("functions in {schema}"),
            heading: format!("## Functions in {schema}"),
            header: &["function", "returns", "security", "meaning"],
            rows: catalog::functions(&mut conn, schema)
                .await
                .into_iter()
                .map(|f| (f.signature, f.spec.to_vec()))
                .collect(),
            facts: Vec::new(),
        });
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn the_schema_document_matches_the_migrated_catalog() {
    let env = Env::new().await;
    let generated = generated(&env).await;
    let mut doc = std::fs::read_to_string(SCHEMA_DOC).expect("docs/schema.md");
    if std::env::var(WRITE_VAR).is_ok_and(|v| v == "1") {
        doc = document::rewrite(&doc, &generated);
        std::fs::write(SCHEMA_DOC, &doc).expect("write docs/schema.md");
    }
    let tables: Vec<&str> = generated
        .iter()
        .map(|g| g.name.as_str())
        .filter(|n| !n.starts_with("functions in "))
        .collect();
    let mut problems = document::problems(&doc, &generated);
    problems.extend(document::sections_without_prose(&doc, &tables));
    problems.extend(restated_lists(&doc, &generated));
    assert!(
        problems.is_empty(),
        "{}\n\n{} difference(s) between docs/schema.md and the catalog. Regenerate the blocks with \
         `{REGENERATE}`; prose is written by hand.",
        problems.join("\n"),
        problems.len()
    );
}

/// Prose that lists all the allowed values of a status (three or more): a
/// copy of a check constraint that would drift from it.
fn restated_lists(doc: &str, generated: &[Generated]) -> Vec<String> {
    let prose = document::prose_of(doc);
    let mut out = Vec::new();
    for g in generated {
        let checks = g.facts.iter().filter(|f| f.kind == "constraint");
        for (column, values) in checks.filter_map(|f| catalog::allowed_values(&f.def)) {
            let restating = prose
                .iter()
                .filter(|p| values.len() >= 3 && values.iter().all(|v| p.contains(&format!("`{v}`"))));
            for p in restating {
                let start: String = p.trim().chars().take(60).collect();
                out.push(format!(
                    "docs/schema.md restates the allowed values of {}.{column} by hand (in \"{start}...\"); \
                     its generated block has them",
                    g.name
                ));
            }
        }
    }
    out
}

/// The values a check constraint of `table` allows.
async fn allowed(env: &Env, table: &str, constraint: &str) -> Vec<String> {
    let def: String = sqlx::query_scalar(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = $1::regclass AND conname = $2",
    )
    .bind(table) // $1
    .bind(constraint) // $2
    .fetch_optional(&env.pool)
    .await
    .unwrap()
    .unwrap_or_else(|| panic!("{table} has no constraint {constraint}"));
    catalog::allowed_values(&def)
        .unwrap_or_else(|| panic!("{constraint} is not a list of allowed values: {def}"))
        .1
}

/// Names what `constraint` allows that `rust` lacks, and the reverse.
fn mismatches(constraint: &str, allowed: &[String], rust_name: &str, rust: &[&str]) -> Vec<String> {
    let lacking = allowed.iter().filter(|v| !rust.contains(&v.as_str()));
    let refused = rust.iter().filter(|v| !allowed.iter().any(|a| a == *v));
    lacking
        .map(|v| format!("{constraint} allows `{v}`, which {rust_name} lacks"))
        .chain(refused.map(|v| format!("{rust_name} has `{v}`, which {constraint} refuses")))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn each_status_check_allows_exactly_the_values_of_its_rust_enum() {
    let env = Env::new().await;
    let enums: [(&str, &str, &str, Vec<&str>); 5] = [
        (
            "settlement.payouts",
            "payouts_status_check",
            "PayoutState::ALL",
            PayoutState::ALL.iter().map(|s| s.as_str()).collect(),
        ),
        (
            "settlement.token_trade_volume",
            "token_trade_volume_status_check",
            "ItemStatus::ALL",
            ItemStatus::ALL.iter().map(|s| s.as_str()).collect(),
        ),
        (
            "settled_engine.runs",
            "runs_state_check",
            "RunState::ALL",
            RunState::ALL.iter().map(|s| s.as_str()).collect(),
        ),
        (
            "settlement.payout_conflicts",
            "payout_conflicts_source_check",
            "payouts::Source::ALL",
            Source::ALL.iter().map(|s| s.as_str()).collect(),
        ),
        (
            "settlement.api_tokens",
            "api_tokens_role_check",
            "tokens::Role::ALL",
            settled::tokens::Role::ALL.iter().map(|r| r.as_str()).collect(),
        ),
    ];
    let mut problems = Vec::new();
    for (table, constraint, rust_name, rust) in enums {
        let allowed = allowed(&env, table, constraint).await;
        problems.extend(mismatches(constraint, &allowed, rust_name, &rust));
    }
    // A webhook event's outcome is an Applied, or one the API names itself
    // (an unknown payout): every Applied must be storable.
    let outcomes = allowed(&env, "settlement.provider_events", "provider_events_outcome_check").await;
    for a in Applied::ALL
        .iter()
        .filter(|a| !outcomes.iter().any(|o| o == a.as_str()))
    {
        problems.push(format!(
            "Applied::ALL has `{}`, which provider_events_outcome_check refuses",
            a.as_str()
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The delivery queue's table is written out in a migration; its statuses
/// are the engine's, as `Queue::table_sql` makes every continuous queue.
#[tokio::test(flavor = "multi_thread")]
async fn the_delivery_jobs_statuses_are_the_engines_queue_statuses() {
    let env = Env::new().await;
    let mut conn = PgConnection::connect(&env.db.url).await.expect("connect");
    sqlx::query("CREATE SCHEMA probe").execute(&mut conn).await.unwrap();
    settled_engine::Queue::with_key("probe_delivery", "probe.payout_jobs", "payout_id", "bigint")
        .expect("a valid queue")
        .create_table(&mut conn)
        .await
        .expect("the engine's queue table");
    let engine = allowed(&env, "probe.payout_jobs", "payout_jobs_status_check").await;
    let migrated = allowed(&env, "settlement.payout_jobs", "payout_jobs_status_check").await;
    assert_eq!(
        migrated, engine,
        "settlement.payout_jobs' statuses differ from the engine's continuous queues' (Queue::table_sql)"
    );
}

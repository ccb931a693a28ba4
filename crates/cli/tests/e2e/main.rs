//! The black-box tests of `settled`: each drives the real binary (and the
//! real PostgreSQL, PgBouncer, anvil, Prometheus or Chromium it needs)
//! against a database of its own. They are one test binary, one module per
//! mechanism, so that they share one private test server and one migrated
//! template, link once, and run side by side: run one module with
//! `cargo test -p settled-cli --test e2e hostile::`, one test by its path.

mod chain_support;
mod common;

mod alerts;
mod api;
mod audit;
mod balances;
mod bench;
mod bench_chain;
mod bench_continuous;
mod chain_contracts;
mod chain_deliver;
mod chain_faults;
mod chain_give_up;
mod chain_ops;
mod chain_storm;
mod chaos;
mod chaos_payouts;
mod console;
mod crash;
mod dashboard;
mod delivery;
mod docs;
mod exactly_once;
mod failover;
mod harness_adapter;
mod hostile;
mod hostile_provider;
mod import;
mod key_window;
mod least_privilege;
mod ledger_and_verify;
mod locking;
mod openapi;
mod partitions;
mod payouts;
mod period_input;
mod pooler;
mod provider;
mod queues;
mod reconcile;
mod reliability;
mod restart;
mod returns;
mod runs;
mod schema_doc;
mod security;
mod standby;
mod traces;

//! Helpers shared by the black-box tests: each test gets its own database
//! and drives the real `settled` binary.
#![allow(dead_code)]

use std::process::{Command, Output, Stdio};

use settled_testkit::TestDb;
use sqlx::PgPool;

/// The `settled` binary built for these tests.
pub const SETTLED: &str = env!("CARGO_BIN_EXE_settled");

/// A fresh database with the migrations applied, and a pool on it.
pub struct Env {
    pub db: TestDb,
    pub pool: PgPool,
}

impl Env {
    pub async fn new() -> Env {
        let db = TestDb::create().await.expect("test database");
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(8)
            .connect(&db.url)
            .await
            .expect("connect");
        settled::db::migrate(&pool).await.expect("migrate");
        Env { db, pool }
    }

    /// A `settled` command bound to this test's database.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(SETTLED);
        cmd.args(args)
            .env("DATABASE_URL", &self.db.url)
            .env("SETTLED_LOG", "warn")
            .stdin(Stdio::null());
        cmd
    }

    /// Runs `settled ARGS` to completion.
    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("run settled")
    }

    /// Runs `settled ARGS` and requires exit 0.
    pub fn run_ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "settled {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub async fn scalar_i64(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sql)
            .fetch_one(&self.pool)
            .await
            .expect(sql)
    }

    pub async fn scalar_text(&self, sql: &str) -> String {
        sqlx::query_scalar(sql)
            .fetch_one(&self.pool)
            .await
            .expect(sql)
    }
}

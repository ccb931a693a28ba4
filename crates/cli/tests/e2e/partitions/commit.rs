//! An archive whose commit answer is lost, certainly not committed, or unknowable.

use super::*;

/// A proxy that faults the archive's COMMIT (its connection is the one
/// that takes the archive's lock).
async fn archive_commit_proxy(env: &Env, fault: CommitFault, then_refuse: bool) -> PgProxy {
    let plan = FaultPlan {
        armed_by: "hashtext('settled archive')".into(),
        fault,
        then_refuse,
    };
    PgProxy::start(&env.db.url, plan).await
}

/// Runs `settled ARGS` through `url` without blocking the proxy's runtime.
async fn run_through(env: &Env, url: &str, args: &[&str]) -> std::process::Output {
    let mut cmd = env.cmd(args);
    cmd.env("DATABASE_URL", url);
    tokio::task::spawn_blocking(move || cmd.output().expect("run settled"))
        .await
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Every archive file of `period` is in `dir`, verifies OK against the
/// database, and the database names it.
async fn assert_archived_and_verified(env: &Env, dir: &Path, period: &str, rows: i64) {
    let file = dir.join(format!("ledger-{period}.csv"));
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join(format!("ledger-{period}.manifest.json"))).unwrap()).unwrap();
    assert_eq!(manifest["rows"], rows, "{manifest}");
    let checked = env.run_ok(&["verify", "--archive", file.to_str().unwrap()]);
    assert!(checked.contains("OK, every check holds"), "{checked}");
    let recorded = env
        .scalar_text(&format!(
            "SELECT file || ' ' || ledger_rows || ' ' || sha256 FROM settlement.archived_periods WHERE period = '{period}'"
        ))
        .await;
    assert_eq!(
        recorded,
        format!("{} {rows} {}", file.display(), manifest["sha256"].as_str().unwrap())
    );
}

/// Nothing of an archive before `before` exists: no file in `dir`, no
/// record, and every settled period still has its partitions.
async fn assert_nothing_archived(env: &Env, dir: &Path, partitions: &str) {
    let left: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "files left behind: {left:?}");
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.archived_periods").await,
        0
    );
    assert_eq!(
        env.scalar_text(&partitions_of("settlement.reward_ledger")).await,
        partitions
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_archive_whose_commit_answer_is_lost_keeps_its_files_and_learns_that_it_committed() {
    let env = Env::new().await;
    let dir = tempfile::tempdir().unwrap();
    seed_and_settle(&env, "2026-11-24", "300");
    seed_and_settle(&env, "2026-11-25", "200");
    // The server commits; the proxy drops its answer and both connections.
    let proxy = archive_commit_proxy(&env, CommitFault::LoseAnswer, false).await;
    let out = run_through(
        &env,
        &proxy.url(),
        &[
            "archive",
            "--before",
            "2026-11-26",
            "--dir",
            dir.path().to_str().unwrap(),
            "--drop-ledger",
        ],
    )
    .await;
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(proxy.faults(), 1, "the COMMIT's answer was lost: {stdout}\n{stderr}");
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("archived 2026-11-24: 300 ledger rows"), "{stdout}");
    assert!(stdout.contains("archived 2026-11-25: 200 ledger rows"), "{stdout}");
    assert!(
        stderr.contains("the answer to COMMIT was lost; a new connection found the archive committed"),
        "{stderr}"
    );
    // --drop-ledger: the files are now the only copy of these ledger rows.
    assert_eq!(env.scalar_text(&partitions_of("settlement.reward_ledger")).await, "");
    assert_archived_and_verified(&env, dir.path(), "2026-11-24", 300).await;
    assert_archived_and_verified(&env, dir.path(), "2026-11-25", 200).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_archive_that_certainly_did_not_commit_removes_its_files_and_can_run_again() {
    let env = Env::new().await;
    let dir = tempfile::tempdir().unwrap();
    let dir_arg = dir.path().to_str().unwrap().to_string();
    seed_and_settle(&env, "2026-11-24", "300");
    let archive_args = ["archive", "--before", "2026-11-25", "--dir", dir_arg.as_str()];

    // Refused at COMMIT by the server (a deferred constraint): a clear answer.
    exec(
        &env,
        "CREATE FUNCTION public.refuse_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN RAISE EXCEPTION 'refused at commit'; END $$;
         CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER INSERT ON settlement.archived_periods
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.refuse_at_commit();",
    )
    .await;
    let refused = env.run(&archive_args);
    assert_eq!(refused.status.code(), Some(1));
    let stderr = text(&refused.stderr);
    assert!(
        stderr.contains("a new connection found it not committed: its files were removed")
            && stderr.contains("refused at commit"),
        "{stderr}"
    );
    assert_nothing_archived(&env, dir.path(), "reward_ledger_p20261124").await;
    exec(&env, "DROP TRIGGER refuse_at_commit ON settlement.archived_periods").await;

    // COMMIT never reaches the server: a lost connection, and a rollback.
    let proxy = archive_commit_proxy(&env, CommitFault::CutBefore, false).await;
    let cut = run_through(&env, &proxy.url(), &archive_args).await;
    assert_eq!(proxy.faults(), 1);
    assert_eq!(cut.status.code(), Some(1));
    let stderr = text(&cut.stderr);
    assert!(
        stderr.contains("committing the archive failed, and a new connection found it not committed: its files were removed and nothing was archived"),
        "{stderr}"
    );
    assert_nothing_archived(&env, dir.path(), "reward_ledger_p20261124").await;

    // Nothing half done: the same archive then runs to the end.
    let out = env.run_ok(&archive_args);
    assert!(out.contains("archived 2026-11-24: 300 ledger rows"), "{out}");
    assert_archived_and_verified(&env, dir.path(), "2026-11-24", 300).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_archive_whose_outcome_cannot_be_learned_keeps_its_files_and_says_how_to_check() {
    let env = Env::new().await;
    let dir = tempfile::tempdir().unwrap();
    seed_and_settle(&env, "2026-11-24", "300");
    // The answer is lost and the database stays unreachable through the proxy.
    let proxy = archive_commit_proxy(&env, CommitFault::LoseAnswer, true).await;
    let out = run_through(
        &env,
        &proxy.url(),
        &[
            "archive",
            "--before",
            "2026-11-25",
            "--dir",
            dir.path().to_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(proxy.faults(), 1);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    let file = dir.path().join("ledger-2026-11-24.csv");
    assert!(
        stderr.contains("the outcome of the archive is unknown")
            && stderr.contains("The files are kept. Check each with `settled verify --archive FILE`")
            && stderr.contains(file.to_str().unwrap()),
        "{stderr}"
    );
    // The check it names tells the truth: the server had committed.
    assert_archived_and_verified(&env, dir.path(), "2026-11-24", 300).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_daemons_archive_keeps_its_files_when_the_commit_answer_is_lost() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let env = Env::new().await;
    let dir = tempfile::tempdir().unwrap();
    let old = (chrono::Utc::now().date_naive() - chrono::Duration::days(10)).to_string();
    seed_and_settle(&env, &old, "300");
    let proxy = archive_commit_proxy(&env, CommitFault::LoseAnswer, false).await;
    let mut daemon = archive_daemon(&env, dir.path())
        .env("DATABASE_URL", proxy.url())
        .env("SETTLED_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_one_archived(&env).await;
    // Its COMMIT's answer was lost: it must learn the outcome, not delete.
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let (log, stderr) = (log.clone(), daemon.stderr.take().unwrap());
        std::thread::spawn(move || {
            for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)) {
                let line = line.unwrap_or_default();
                log.lock().unwrap().push_str(&(line + "\n"));
            }
        })
    };
    let learned = "the answer to the archive's COMMIT was lost; a new connection found it committed";
    wait_until(60, "the daemon to say what it learned", || {
        let found =
            log.lock().unwrap().contains(learned) || log.lock().unwrap().contains("archiving refused or failed");
        async move { found }
    })
    .await;
    assert_eq!(proxy.faults(), 1);
    kill(Pid::from_raw(daemon.id() as i32), Signal::SIGTERM).unwrap();
    assert!(wait_bounded(&mut daemon, 30).success());
    reader.join().unwrap();
    let log = log.lock().unwrap().clone();
    assert!(log.contains(learned), "{log}");
    assert_archived_and_verified(&env, dir.path(), &old, 300).await;
}

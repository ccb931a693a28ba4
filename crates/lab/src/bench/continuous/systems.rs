//! Starting, feeding and stopping a system under test. Settled: its
//! engine's tables, W claim loops split over up to
//! [`MAX_WORKER_PROCESSES`] `settled bench-queue-worker` processes, and a
//! producer in the bench's own process calling `Queue::enqueue` (fixed
//! rate, one job per call) or `Queue::enqueue_many` (saturation). A peer:
//! its `continuous` script, which installs its schema, starts its workers,
//! says `ready`, produces on `GO` (paced by the `ENQUEUE n` lines the
//! bench writes, or to a depth), and stops on `STOP` with one JSON line.

use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use settled_engine::NewJob;
use sqlx::PgPool;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use super::pacer::{token_line, Pacer};
use super::worker::{QueueWorkerReport, ServeMode};
use super::workload::{self, now_us, Payload};
use super::{CaseSpec, Ctx, Producer, System, MAX_WORKER_PROCESSES, READY_TIMEOUT_SECS, STOP_TIMEOUT_SECS};

/// Connections of settled's producer (fixed-rate enqueues run concurrently on them).
pub(super) const PRODUCER_CONNECTIONS: u32 = 32;
/// Most jobs one bulk enqueue of the saturation producer sends.
pub(super) const BULK_JOBS_MAX: u64 = 500;

/// What a system said about itself when it stopped.
#[derive(Debug, Default)]
pub struct Described {
    pub version: String,
    pub settings: String,
    /// Jobs enqueued, when the system's own producer counted them.
    pub enqueued: Option<u64>,
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// A system whose workers are ready.
pub(super) enum Running {
    Settled(SettledRun),
    Peer(Box<PeerRun>),
}

/// A process of the case, its stdin, and its stdout: read to `ready`,
/// then drained all along (a process blocked on a full pipe would be
/// measured as slow), keeping its last JSON line.
struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Option<Lines<BufReader<ChildStdout>>>,
    drained: Option<tokio::task::JoinHandle<std::io::Result<String>>>,
}

impl Proc {
    fn spawn(mut cmd: Command, stderr: Stdio) -> anyhow::Result<Proc> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()?;
        let stdin = child.stdin.take();
        let stdout = Some(BufReader::new(child.stdout.take().context("no stdout")?).lines());
        Ok(Proc {
            child,
            stdin,
            stdout,
            drained: None,
        })
    }

    /// Waits for its `ready` line (lines before it are skipped), then
    /// drains the rest in the background.
    async fn ready(&mut self) -> anyhow::Result<()> {
        let mut lines = self.stdout.take().context("stdout already taken")?;
        let wait = async {
            while let Some(line) = lines.next_line().await? {
                if line.trim() == "ready" {
                    return Ok(());
                }
            }
            anyhow::bail!("it ended without saying `ready`")
        };
        tokio::time::timeout(Duration::from_secs(READY_TIMEOUT_SECS), wait)
            .await
            .context("no `ready` in time")??;
        self.drained = Some(tokio::spawn(async move {
            let mut last = String::new();
            while let Some(line) = lines.next_line().await? {
                if line.trim_start().starts_with('{') {
                    last = line;
                }
            }
            Ok(last)
        }));
        Ok(())
    }

    async fn say(&mut self, line: &str) -> anyhow::Result<()> {
        let stdin = self.stdin.as_mut().context("stdin already closed")?;
        stdin.write_all(line.as_bytes()).await?;
        stdin.flush().await?;
        Ok(())
    }

    /// Closes stdin, waits for stdout's end and the exit (which must be
    /// 0), and returns the last JSON line.
    async fn finish(mut self) -> anyhow::Result<String> {
        drop(self.stdin.take());
        let drained = self.drained.take().context("the process was never ready")?;
        let read = async {
            let last = drained.await??;
            let status = self.child.wait().await?;
            anyhow::ensure!(status.success(), "it exited with {status}");
            anyhow::ensure!(!last.is_empty(), "it printed no JSON line");
            anyhow::Ok(last)
        };
        tokio::time::timeout(Duration::from_secs(STOP_TIMEOUT_SECS), read)
            .await
            .context("it did not stop in time")?
    }
}

/// Installs the system in the case's database and starts its workers.
pub(super) async fn start(ctx: &Ctx, spec: &CaseSpec, url: &str, pool: &PgPool) -> anyhow::Result<Running> {
    match &spec.system {
        System::Settled(mode) => Ok(Running::Settled(
            SettledRun::start(ctx, *mode, spec.workers, url, pool).await?,
        )),
        System::Peer(peer) => Ok(Running::Peer(Box::new(PeerRun::start(ctx, peer, spec, url).await?))),
    }
}

impl Running {
    /// Runs the producer for the case's seconds; returns the jobs it enqueued.
    pub(super) async fn produce(&mut self, ctx: &Ctx, spec: &CaseSpec, pool: &PgPool) -> anyhow::Result<u64> {
        let until = Instant::now() + Duration::from_secs(ctx.opts.seconds);
        match (self, spec.producer) {
            (Running::Settled(_), Producer::Fixed) => settled_fixed(pool, ctx.opts.rate, until).await,
            (Running::Settled(_), Producer::Saturation) => settled_saturation(pool, ctx.opts.depth, until).await,
            (Running::Peer(peer), producer) => peer.produce(producer, ctx.opts.rate, until).await,
        }
    }

    /// Stops the workers (work in hand finishes) and collects what they say.
    pub(super) async fn stop(self) -> anyhow::Result<Described> {
        match self {
            Running::Settled(run) => run.stop().await,
            Running::Peer(run) => (*run).stop().await,
        }
    }
}

/// W claim loops split over up to [`MAX_WORKER_PROCESSES`] processes.
pub(super) fn split_workers(workers: u32) -> Vec<u32> {
    let processes = workers.clamp(1, MAX_WORKER_PROCESSES);
    (0..processes)
        .map(|i| workers / processes + u32::from(i < workers % processes))
        .collect()
}

/// Settled's worker processes.
pub(super) struct SettledRun {
    mode: ServeMode,
    loops: Vec<u32>,
    batch: u32,
    procs: Vec<Proc>,
}

impl SettledRun {
    async fn start(ctx: &Ctx, mode: ServeMode, workers: u32, url: &str, pool: &PgPool) -> anyhow::Result<SettledRun> {
        settled_engine::migrate(pool).await?;
        let mut conn = pool.acquire().await?;
        sqlx::query("CREATE SCHEMA bench_queue").execute(&mut *conn).await?;
        workload::queue().create_table(&mut conn).await?;
        drop(conn);
        let loops = split_workers(workers);
        let mut procs = Vec::new();
        for &concurrency in &loops {
            let mut cmd = Command::new(&ctx.exe);
            cmd.arg("bench-queue-worker")
                .args(["--mode", if mode == ServeMode::Tx { "tx" } else { "leased" }])
                .args(["--concurrency", &concurrency.to_string()])
                .args(["--batch", &ctx.opts.batch.to_string()])
                .args(["--work-ms", &ctx.opts.work_ms.to_string()])
                .args(["--retention-secs", &ctx.opts.retention_secs.to_string()])
                .env("DATABASE_URL", url)
                .env("SETTLED_LOG", "warn");
            procs.push(Proc::spawn(cmd, Stdio::inherit())?);
        }
        for proc in &mut procs {
            proc.ready().await.context("a settled worker process")?;
        }
        Ok(SettledRun {
            mode,
            loops,
            batch: ctx.opts.batch,
            procs,
        })
    }

    async fn stop(self) -> anyhow::Result<Described> {
        let mut total = QueueWorkerReport::default();
        for mut proc in self.procs {
            proc.say("stop\n").await?;
            let last = proc.finish().await.context("a settled worker process")?;
            let r: QueueWorkerReport =
                serde_json::from_str(&last).with_context(|| format!("a worker's report: {last:?}"))?;
            total.claimed += r.claimed;
            total.settled += r.settled;
            total.fence_rejections += r.fence_rejections;
            total.rescued += r.rescued;
            total.pruned += r.pruned;
        }
        let mut extra = serde_json::Map::new();
        extra.insert("settled_by_workers".into(), total.settled.into());
        extra.insert("claimed".into(), total.claimed.into());
        extra.insert("fence_rejections".into(), total.fence_rejections.into());
        extra.insert("rescued".into(), total.rescued.into());
        Ok(Described {
            version: env!("CARGO_PKG_VERSION").into(),
            settings: format!(
                "{} mode, {} process(es) x {:?} claim loops, batch {}, LISTEN wake-up, engine defaults otherwise",
                if self.mode == ServeMode::Tx {
                    "in-transaction"
                } else {
                    "leased"
                },
                self.loops.len(),
                self.loops,
                self.batch
            ),
            enqueued: None,
            extra,
        })
    }
}

/// A new job, stamped with the enqueue time now.
fn new_job(seq: u64, enq_us: i64) -> anyhow::Result<NewJob> {
    Ok(NewJob::new(seq.to_string()).payload(&Payload { enq_us })?)
}

/// One `Queue::enqueue` call per job, in autocommit, as a request handler
/// would; the calls of a tick run concurrently. A call still waiting for a
/// connection at the deadline is dropped: a producer behind its rate shows
/// as fewer jobs, not as a longer case.
async fn settled_fixed(pool: &PgPool, rate: u64, until: Instant) -> anyhow::Result<u64> {
    let queue = Arc::new(workload::queue());
    let (seq, sent) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut pacer = Pacer::new(rate);
    let mut calls = tokio::task::JoinSet::new();
    while Instant::now() < until {
        let due: u64 = pacer.next().await.iter().sum();
        for _ in 0..due {
            let (pool, queue, seq, sent) = (pool.clone(), queue.clone(), seq.clone(), sent.clone());
            calls.spawn(async move {
                let mut conn = pool.acquire().await?;
                if Instant::now() >= until {
                    return anyhow::Ok(());
                }
                let job = new_job(seq.fetch_add(1, Ordering::Relaxed) + 1, now_us())?;
                queue.enqueue(&mut conn, &job).await?;
                sent.fetch_add(1, Ordering::Relaxed);
                anyhow::Ok(())
            });
        }
        while let Some(done) = calls.try_join_next() {
            done??;
        }
    }
    while let Some(done) = calls.join_next().await {
        done??;
    }
    Ok(sent.load(Ordering::Relaxed))
}

/// Keeps `depth` jobs ready with `Queue::enqueue_many`.
async fn settled_saturation(pool: &PgPool, depth: u64, until: Instant) -> anyhow::Result<u64> {
    let queue = workload::queue();
    let mut conn = pool.acquire().await?;
    let mut seq = 0;
    while Instant::now() < until {
        let ready = queue.stats(&mut conn).await?.ready.max(0) as u64;
        if ready >= depth {
            tokio::time::sleep(Duration::from_millis(2)).await;
            continue;
        }
        let enq_us = now_us();
        let jobs = (0..(depth - ready).min(BULK_JOBS_MAX))
            .map(|_| {
                seq += 1;
                new_job(seq, enq_us)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        queue.enqueue_many(&mut conn, &jobs).await?;
    }
    Ok(seq)
}

/// A peer's `continuous` script.
pub(super) struct PeerRun {
    name: String,
    proc: Proc,
    log: std::path::PathBuf,
}

/// The last line a peer's `continuous` prints.
#[derive(Debug, serde::Deserialize)]
struct PeerFinal {
    version: String,
    settings: String,
    enqueued: u64,
}

impl PeerRun {
    async fn start(ctx: &Ctx, peer: &str, spec: &CaseSpec, url: &str) -> anyhow::Result<PeerRun> {
        let dir = super::super::peers::peer_dir_in(&ctx.opts.peers_dir, peer)?;
        let log = ctx.scratch.join(format!("{peer}-continuous.log"));
        let mut cmd = Command::new(dir.join("continuous"));
        cmd.current_dir(&dir)
            .env("BENCH_DATABASE_URL", url)
            .env("BENCH_WORKERS", spec.workers.to_string())
            .env("BENCH_PRODUCER", spec.producer.name())
            .env("BENCH_DEPTH", ctx.opts.depth.to_string())
            .env("BENCH_WORK_MS", ctx.opts.work_ms.to_string());
        let mut run = PeerRun {
            name: peer.to_string(),
            proc: Proc::spawn(cmd, Stdio::from(std::fs::File::create(&log)?))?,
            log,
        };
        if let Err(err) = run.proc.ready().await {
            return Err(with_log(&run.name, &run.log, err));
        }
        Ok(run)
    }

    async fn produce(&mut self, producer: Producer, rate: u64, until: Instant) -> anyhow::Result<u64> {
        let fed = async {
            self.proc.say("GO\n").await?;
            let mut pacer = Pacer::new(rate);
            while Instant::now() < until {
                match producer {
                    Producer::Fixed => {
                        let lines: String = pacer.next().await.into_iter().map(token_line).collect();
                        self.proc.say(&lines).await?;
                    }
                    Producer::Saturation => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
            self.proc.say("STOP\n").await
        }
        .await;
        fed.map_err(|e| with_log(&self.name, &self.log, e))?;
        Ok(0)
    }

    async fn stop(self) -> anyhow::Result<Described> {
        let (name, log) = (self.name, self.log);
        let last = self.proc.finish().await.map_err(|e| with_log(&name, &log, e))?;
        let fin: PeerFinal = serde_json::from_str(&last).with_context(|| format!("peer {name}'s report: {last:?}"))?;
        Ok(Described {
            version: fin.version,
            settings: fin.settings,
            enqueued: Some(fin.enqueued),
            extra: serde_json::Map::new(),
        })
    }
}

/// The error with the end of the peer's log.
fn with_log(peer: &str, log: &std::path::Path, err: anyhow::Error) -> anyhow::Error {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let head = lines.iter().take(2).copied().collect::<Vec<_>>().join(" | ");
    let tail = lines.iter().rev().take(5).copied().collect::<Vec<_>>().join(" | ");
    err.context(format!(
        "peer {peer} (its log {}: first lines: {head}; last lines, last first: {tail})",
        log.display()
    ))
}

//! Fixed-rate pacing: credit accrues on real elapsed time (never on loop
//! iterations, which would under-offer whenever a tick runs late), and is
//! handed out in whole jobs, at most `batch_max` per token. The tokens
//! travel as `ENQUEUE n` lines: the bench writes them to a peer's stdin,
//! and `settled lab harness-adapter` reads them from the harness.

use std::time::{Duration, Instant};

/// How often the pacer hands out credit.
pub(super) const TICK_MS: u64 = 10;
/// Most jobs one token asks for.
pub const TOKEN_JOBS_MAX: u64 = 128;

/// Credit of a fixed offered rate.
#[derive(Debug)]
pub struct Pacer {
    rate_per_s: f64,
    credit: f64,
    last: Instant,
    tick: Duration,
    token_max: u64,
}

impl Pacer {
    /// A pacer offering `rate_per_s` jobs per second from now, every
    /// `TICK_MS`, in tokens of at most `TOKEN_JOBS_MAX`.
    pub fn new(rate_per_s: u64) -> Pacer {
        Pacer::with(rate_per_s, Duration::from_millis(TICK_MS), TOKEN_JOBS_MAX)
    }

    /// A pacer with its own tick and largest token.
    pub fn with(rate_per_s: u64, tick: Duration, token_max: u64) -> Pacer {
        Pacer {
            rate_per_s: rate_per_s as f64,
            credit: 0.0,
            last: Instant::now(),
            tick,
            token_max: token_max.max(1),
        }
    }

    /// The tokens due at `now`: whole jobs of the credit accrued since the
    /// last call, split into tokens of at most the largest token.
    pub fn due(&mut self, now: Instant) -> Vec<u64> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.credit += self.rate_per_s * elapsed;
        let mut whole = self.credit.floor() as u64;
        self.credit -= whole as f64;
        let mut tokens = Vec::new();
        while whole > 0 {
            let n = whole.min(self.token_max);
            tokens.push(n);
            whole -= n;
        }
        tokens
    }

    /// Waits for the next tick and returns its tokens.
    pub async fn next(&mut self) -> Vec<u64> {
        tokio::time::sleep(self.tick).await;
        self.due(Instant::now())
    }
}

/// The `ENQUEUE n` line for a token.
pub fn token_line(n: u64) -> String {
    format!("ENQUEUE {n}\n")
}

/// The job count of an `ENQUEUE n` line (None for any other line).
pub fn parse_token(line: &str) -> Option<u64> {
    line.trim()
        .strip_prefix("ENQUEUE ")?
        .trim()
        .parse()
        .ok()
        .filter(|n| *n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credit_follows_elapsed_time_not_calls() {
        let start = Instant::now();
        let mut pacer = Pacer::new(1000);
        pacer.last = start;
        // One late tick of 250 ms owes 250 jobs, in tokens of at most 128.
        let tokens = pacer.due(start + Duration::from_millis(250));
        assert_eq!(tokens, vec![128, 122]);
        // A fraction of a job is kept for later, not lost.
        assert!(pacer.due(start + Duration::from_micros(250_500)).is_empty());
        assert_eq!(pacer.due(start + Duration::from_micros(251_000)), vec![1]);
    }

    #[test]
    fn tokens_parse_only_when_well_formed() {
        assert_eq!(parse_token("ENQUEUE 25\n"), Some(25));
        assert_eq!(parse_token(token_line(7).as_str()), Some(7));
        for bad in ["ENQUEUE 0", "ENQUEUE x", "enqueue 5", "STOP", ""] {
            assert_eq!(parse_token(bad), None, "{bad}");
        }
    }
}

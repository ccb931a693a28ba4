//! Progress for long commands: a bar on a terminal, a log line every few
//! seconds otherwise.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Seconds between progress lines when stderr is not a terminal.
pub(crate) const PROGRESS_LOG_INTERVAL_SECS: u64 = 2;

/// A progress display.
pub struct Progress {
    label: String,
    len: u64,
    bar: Option<ProgressBar>,
    last_line: Mutex<Instant>,
    started: Instant,
}

impl Progress {
    /// A display for `len` units of work.
    pub fn new(label: &str, len: u64) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template("{msg:>10} [{bar:40}] {pos}/{len} {per_sec} eta {eta}")
                    .expect("valid template")
                    .progress_chars("=> "),
            );
            bar.set_message(label.to_string());
            bar
        });
        Progress {
            label: label.to_string(),
            len,
            bar,
            last_line: Mutex::new(Instant::now()),
            started: Instant::now(),
        }
    }

    /// A display that shows nothing.
    pub fn hidden() -> Progress {
        Progress {
            label: String::new(),
            len: 0,
            bar: Some(ProgressBar::hidden()),
            last_line: Mutex::new(Instant::now()),
            started: Instant::now(),
        }
    }

    /// Sets how much is done.
    pub fn set(&self, pos: u64) {
        match &self.bar {
            Some(bar) => bar.set_position(pos),
            None => {
                let mut last = self.last_line.lock().expect("progress lock");
                if last.elapsed() >= Duration::from_secs(PROGRESS_LOG_INTERVAL_SECS) {
                    *last = Instant::now();
                    let secs = self.started.elapsed().as_secs_f64().max(1e-9);
                    eprintln!("{}: {pos}/{} ({:.0}/s)", self.label, self.len, pos as f64 / secs);
                }
            }
        }
    }

    /// Prints a line above the bar (or on stderr without one).
    pub fn println(&self, line: &str) {
        match &self.bar {
            Some(bar) if !bar.is_hidden() => bar.println(line),
            _ => eprintln!("{line}"),
        }
    }

    /// Says what the work is doing now, as [`println`](Self::println), but
    /// nothing when the display is hidden.
    pub(crate) fn note(&self, line: &str) {
        match &self.bar {
            Some(bar) if bar.is_hidden() => {}
            _ => self.println(line),
        }
    }

    /// Ends the display.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

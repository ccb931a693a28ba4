//! The signals the models send a worker process: the faults the leased and
//! the payouts models share (a crash, a pause, its end).

use std::fmt;

/// A signal sent to a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Signal {
    /// SIGKILL: the worker dies; what it held in memory is lost.
    Kill,
    /// SIGSTOP: the worker stops where it is.
    Stop,
    /// SIGCONT: a stopped worker goes on.
    Cont,
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Signal::Kill => "SIGKILL",
            Signal::Stop => "SIGSTOP",
            Signal::Cont => "SIGCONT",
        })
    }
}

//! Numbers the benches measure with: median and percentile, the load
//! average, the wall clock in microseconds, and processes' CPU time read
//! from `/proc`.

pub(super) fn median(mut xs: Vec<f64>) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

pub(in crate::bench) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub(in crate::bench) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}

pub(in crate::bench) fn unix_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// Linux's clock ticks per second in `/proc/<pid>/stat` (USER_HZ).
const CLOCK_TICKS_PER_SEC: f64 = 100.0;

/// A process's CPU time (user + system), in seconds; 0 when it is gone.
fn cpu_secs(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command (which may hold spaces): state is field 3,
    // utime and stime are fields 14 and 15.
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i)?.parse::<f64>().ok())
        .sum();
    ticks / CLOCK_TICKS_PER_SEC
}

/// The parent of `pid`.
pub(super) fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// CPU seconds so far of: the database server (its postmaster and the
/// processes it started), the deliverers, and this process.
pub(super) struct CpuSnapshot {
    pub(super) postgres: f64,
    pub(super) deliverers: f64,
    pub(super) simulator: f64,
}

pub(super) fn cpu_snapshot(postmaster: Option<u32>, deliverers: &[u32]) -> CpuSnapshot {
    let postgres = postmaster.map_or(0.0, |pm| {
        let children: f64 = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| parent_of(*pid) == Some(pm))
            .map(cpu_secs)
            .sum();
        children + cpu_secs(pm)
    });
    CpuSnapshot {
        postgres,
        deliverers: deliverers.iter().map(|p| cpu_secs(*p)).sum(),
        simulator: cpu_secs(std::process::id()),
    }
}

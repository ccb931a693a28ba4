//! Pickup latencies of the last window, fed by the engine's histogram
//! through the lab's one-histogram recorder.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{BUCKET_MS, PICKUP_MAX_US};

/// Pickup latencies of the last window, in per-second HDR histograms
/// (bounded memory over any run length).
pub struct PickupWindow {
    buckets: Mutex<VecDeque<(Instant, hdrhistogram::Histogram<u64>)>>,
    window: Duration,
}

impl PickupWindow {
    pub(super) fn new(window: Duration) -> PickupWindow {
        PickupWindow {
            buckets: Mutex::new(VecDeque::new()),
            window,
        }
    }

    pub(super) fn record(&self, seconds: f64) {
        let us = ((seconds.max(0.0) * 1e6) as u64).clamp(1, PICKUP_MAX_US);
        let mut buckets = self.buckets.lock().expect("pickup window");
        let now = Instant::now();
        let fresh = buckets
            .back()
            .is_some_and(|(at, _)| now.duration_since(*at) < Duration::from_millis(BUCKET_MS));
        if !fresh {
            let h = hdrhistogram::Histogram::new_with_bounds(1, PICKUP_MAX_US, 3).expect("valid bounds");
            buckets.push_back((now, h));
        }
        if let Some((_, h)) = buckets.back_mut() {
            h.saturating_record(us);
        }
    }

    /// p50, p95 and p99 in ms over the window (None when nothing was claimed).
    pub(super) fn percentiles(&self) -> Option<(f64, f64, f64)> {
        let mut buckets = self.buckets.lock().expect("pickup window");
        while buckets.front().is_some_and(|(at, _)| at.elapsed() > self.window) {
            buckets.pop_front();
        }
        let mut all = hdrhistogram::Histogram::<u64>::new_with_bounds(1, PICKUP_MAX_US, 3).expect("valid bounds");
        for (_, h) in buckets.iter() {
            all.add(h).ok()?;
        }
        if all.is_empty() {
            return None;
        }
        let ms = |q: f64| all.value_at_quantile(q) as f64 / 1000.0;
        Some((ms(0.50), ms(0.95), ms(0.99)))
    }
}

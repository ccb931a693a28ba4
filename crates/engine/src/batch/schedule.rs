//! Schedules: a cron expression in a time zone, evaluated on the local wall
//! clock and then placed on the time line, so daylight-saving changes neither
//! skip nor repeat a day.
//!
//! A local time that does not exist (the hour skipped in spring) fires at the
//! same wall time plus the gap; a local time that exists twice (the hour
//! repeated in autumn) fires once, at its first occurrence.

use std::str::FromStr;

use chrono::{DateTime, Duration, LocalResult, NaiveDate, NaiveDateTime, Offset, TimeZone, Utc};
use chrono_tz::Tz;

/// Longest catch-up window, in days.
pub const MAX_CATCH_UP_DAYS: u32 = 366;

/// A parsed schedule.
#[derive(Debug, Clone)]
pub struct Schedule {
    expression: String,
    cron: cron::Schedule,
    tz: Tz,
}

/// Why a schedule is invalid.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ScheduleError {
    /// The cron expression does not parse.
    #[error("invalid cron expression {expression:?}: {reason} (5 fields: min hour day month weekday, or 6 with seconds first)")]
    Cron {
        /// The expression.
        expression: String,
        /// The parser's reason.
        reason: String,
    },
    /// Unknown time zone.
    #[error("unknown time zone {0:?} (use an IANA name such as Asia/Seoul)")]
    TimeZone(String),
}

impl Schedule {
    /// Parses `expression` (standard 5-field cron, or 6 fields with seconds
    /// first) in the IANA time zone `tz`.
    pub fn parse(expression: &str, tz: &str) -> Result<Schedule, ScheduleError> {
        let fields = expression.split_whitespace().count();
        let full = if fields == 5 {
            format!("0 {expression}")
        } else {
            expression.to_string()
        };
        let cron = cron::Schedule::from_str(&full).map_err(|e| ScheduleError::Cron {
            expression: expression.to_string(),
            reason: e.to_string(),
        })?;
        let tz = Tz::from_str(tz).map_err(|_| ScheduleError::TimeZone(tz.to_string()))?;
        Ok(Schedule {
            expression: expression.to_string(),
            cron,
            tz,
        })
    }

    /// The expression as given.
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// The time zone.
    pub fn tz(&self) -> Tz {
        self.tz
    }

    /// Places a local wall-clock time on the time line.
    fn instant(&self, local: NaiveDateTime) -> Option<DateTime<Utc>> {
        match self.tz.from_local_datetime(&local) {
            LocalResult::Single(t) => Some(t.with_timezone(&Utc)),
            LocalResult::Ambiguous(first, _) => Some(first.with_timezone(&Utc)),
            // In a gap: read the wall time with the offset in force before
            // the gap, which lands the same wall time plus the gap later.
            LocalResult::None => {
                let before = self.tz.from_local_datetime(&(local - Duration::hours(6))).earliest()?;
                let offset = before.offset().fix().local_minus_utc();
                Some(Utc.from_utc_datetime(&(local - Duration::seconds(i64::from(offset)))))
            }
        }
    }

    /// Fire times in `(from, to]`, oldest first, with the local date of each.
    pub fn fire_times(&self, from: DateTime<Utc>, to: DateTime<Utc>) -> Vec<(DateTime<Utc>, NaiveDate)> {
        // Walk the local wall clock, starting a day early to cover offsets.
        let local_from = from.with_timezone(&self.tz).naive_local() - Duration::days(1);
        let start = Utc.from_utc_datetime(&local_from);
        let mut out: Vec<(DateTime<Utc>, NaiveDate)> = Vec::new();
        for wall in self.cron.after(&start) {
            let local = wall.naive_utc();
            let Some(at) = self.instant(local) else {
                continue;
            };
            if at > to {
                // Wall times only grow; once two days past `to`, stop.
                if local > to.with_timezone(&self.tz).naive_local() + Duration::days(2) {
                    break;
                }
                continue;
            }
            if at > from && out.last().is_none_or(|(last, _)| *last != at) {
                out.push((at, local.date()));
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// The first fire time after `after`.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local_from = after.with_timezone(&self.tz).naive_local() - Duration::hours(3);
        let start = Utc.from_utc_datetime(&local_from);
        self.cron
            .after(&start)
            .take(10_000)
            .filter_map(|wall| self.instant(wall.naive_utc()))
            .find(|t| *t > after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn days_fired(schedule: &Schedule, from: &str, to: &str) -> Vec<NaiveDate> {
        schedule
            .fire_times(utc(from), utc(to))
            .into_iter()
            .map(|(_, d)| d)
            .collect()
    }

    #[test]
    fn seoul_at_five_fires_daily_at_20_utc() {
        let s = Schedule::parse("0 5 * * *", "Asia/Seoul").unwrap();
        let fires = s.fire_times(utc("2026-11-27T00:00:00Z"), utc("2026-11-29T00:00:00Z"));
        let times: Vec<String> = fires.iter().map(|(t, _)| t.to_rfc3339()).collect();
        assert_eq!(times, ["2026-11-27T20:00:00+00:00", "2026-11-28T20:00:00+00:00"]);
        assert_eq!(fires[0].1.to_string(), "2026-11-28");
    }

    #[test]
    fn new_york_fires_once_per_local_day_across_both_dst_changes() {
        // 2026: DST starts Sun 8 March (02:00 -> 03:00), ends Sun 1 November (02:00 -> 01:00).
        for expr in ["0 5 * * *", "30 2 * * *", "30 1 * * *", "0 0 * * *"] {
            let s = Schedule::parse(expr, "America/New_York").unwrap();
            for (from, to) in [
                ("2026-03-05T12:00:00Z", "2026-03-12T12:00:00Z"),
                ("2026-10-29T12:00:00Z", "2026-11-05T12:00:00Z"),
            ] {
                let days = days_fired(&s, from, to);
                let mut unique = days.clone();
                unique.dedup();
                assert_eq!(days, unique, "{expr}: a day fired twice: {days:?}");
                assert_eq!(days.len(), 7, "{expr} {from}: expected 7 days, got {days:?}");
                for pair in days.windows(2) {
                    assert_eq!(
                        pair[1] - pair[0],
                        Duration::days(1),
                        "{expr}: a day was skipped: {days:?}"
                    );
                }
            }
        }
        // The skipped 02:30 of 8 March fires at 03:30 EDT (07:30 UTC).
        let s = Schedule::parse("30 2 * * *", "America/New_York").unwrap();
        let on_change = s.fire_times(utc("2026-03-08T00:00:00Z"), utc("2026-03-09T00:00:00Z"));
        assert_eq!(on_change[0].0.to_rfc3339(), "2026-03-08T07:30:00+00:00");
        // The repeated 01:30 of 1 November fires once, at its first occurrence (EDT, 05:30 UTC).
        let s = Schedule::parse("30 1 * * *", "America/New_York").unwrap();
        let on_change = s.fire_times(utc("2026-11-01T00:00:00Z"), utc("2026-11-02T00:00:00Z"));
        assert_eq!(on_change.len(), 1);
        assert_eq!(on_change[0].0.to_rfc3339(), "2026-11-01T05:30:00+00:00");
    }

    #[test]
    fn next_after_and_seconds_field() {
        let s = Schedule::parse("*/10 * * * * *", "UTC").unwrap();
        let next = s.next_after(utc("2026-11-29T10:00:03Z")).unwrap();
        assert_eq!(next.to_rfc3339(), "2026-11-29T10:00:10+00:00");
        let s = Schedule::parse("0 5 * * *", "Asia/Seoul").unwrap();
        assert_eq!(
            s.next_after(utc("2026-11-28T20:00:00Z")).unwrap().to_rfc3339(),
            "2026-11-29T20:00:00+00:00"
        );
    }

    #[test]
    fn bad_schedules_are_named() {
        assert!(matches!(
            Schedule::parse("0 25 * * *", "UTC"),
            Err(ScheduleError::Cron { .. })
        ));
        assert!(matches!(
            Schedule::parse("0 5 * * *", "Mars/Olympus"),
            Err(ScheduleError::TimeZone(_))
        ));
    }
}

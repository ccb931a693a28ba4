//! `settled bench --pairs K`: the ratio of the product to one set-based
//! transaction over the same period, measured in K rounds in one run.
//!
//! A shared machine's speed drifts by tens of percent within minutes, and
//! the full bench measures a strategy and the floors minutes apart, so one
//! ratio from it says as much about the drift as about the code. Here each
//! round settles the same period three ways, back to back, each on its own
//! copy of one vacuumed template (see `casedb`): with `skip-locked-chunk`
//! (W processes, --concurrency claim loops each, --chunk), with the
//! set-based transaction (`floors`), and with the product's own chunk
//! statement under pgbench, W clients each alone on its own key range (the
//! ceiling of splitting the work with SKIP LOCKED: no client code, no claim
//! meeting another; skipped without pgbench). The order rotates from round
//! to round so a steady drift favours none; the report gives every round,
//! and each series' median with its spread (min to max).

use super::{floors, strategy, CaseResult, CaseSpec, Ctx, Strategy};

/// One round: the product and the floor, back to back.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PairRound {
    /// 1-based.
    pub round: u32,
    /// Which ran first.
    pub first: String,
    /// skip-locked-chunk, creators/s.
    pub product_per_second: f64,
    /// The set-based transaction (its run's finish included), creators/s.
    pub set_based_per_second: f64,
    /// product / set-based.
    pub ratio: f64,
    /// pgbench on disjoint key ranges, creators/s (None without pgbench).
    #[serde(default)]
    pub ranges_per_second: Option<f64>,
    /// pgbench on disjoint key ranges / set-based.
    #[serde(default)]
    pub ranges_ratio: Option<f64>,
}

/// The three ways a round settles its period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    Product,
    SetBased,
    Ranges,
}

impl Way {
    fn name(self) -> &'static str {
        match self {
            Way::Product => "skip-locked-chunk",
            Way::SetBased => "set-based",
            Way::Ranges => "pgbench-ranges",
        }
    }
}

/// A series over the rounds: its median and its spread.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Spread {
    /// The middle value (the mean of the two middle ones for an even count).
    pub median: f64,
    /// The smallest value.
    pub min: f64,
    /// The largest value.
    pub max: f64,
}

impl Spread {
    /// The spread of `values`; None when there are none.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Spread> {
        let mut values: Vec<f64> = values.into_iter().collect();
        values.sort_by(f64::total_cmp);
        let n = values.len();
        let median = match n {
            0 => return None,
            n if n % 2 == 1 => values[n / 2],
            n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
        };
        Some(Spread {
            median,
            min: values[0],
            max: values[n - 1],
        })
    }
}

/// Every round, and each series' median and spread.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PairsReport {
    /// Creators per case.
    pub creators: u64,
    /// Worker processes (and pgbench clients).
    pub workers: u32,
    /// Claim loops per worker process.
    pub concurrency: u32,
    /// Items per claim.
    pub chunk: u32,
    /// The rounds, in order.
    pub rounds: Vec<PairRound>,
    /// skip-locked-chunk / set-based.
    pub ratio: Option<Spread>,
    /// skip-locked-chunk, creators/s.
    pub product_per_second: Option<Spread>,
    /// The set-based transaction, creators/s.
    pub set_based_per_second: Option<Spread>,
    /// pgbench on disjoint key ranges, creators/s.
    pub ranges_per_second: Option<Spread>,
    /// pgbench on disjoint key ranges / set-based.
    pub ranges_ratio: Option<Spread>,
}

impl PairsReport {
    /// The report of `rounds` settled with `spec`.
    fn new(spec: &CaseSpec, rounds: Vec<PairRound>) -> PairsReport {
        let spread = |f: fn(&PairRound) -> Option<f64>| Spread::of(rounds.iter().filter_map(f));
        PairsReport {
            creators: spec.creators,
            workers: spec.workers,
            concurrency: spec.concurrency,
            chunk: spec.chunk,
            ratio: spread(|r| Some(r.ratio)),
            product_per_second: spread(|r| Some(r.product_per_second)),
            set_based_per_second: spread(|r| Some(r.set_based_per_second)),
            ranges_per_second: spread(|r| r.ranges_per_second),
            ranges_ratio: spread(|r| r.ranges_ratio),
            rounds,
        }
    }
}

/// The rounds, each verified.
pub(super) async fn pairs(ctx: &Ctx, rounds: u32) -> anyhow::Result<PairsReport> {
    let opts = &ctx.opts;
    let spec = CaseSpec {
        strategy: Strategy::SkipLockedChunk,
        workers: opts.workers.first().copied().unwrap_or(4),
        concurrency: opts.concurrency,
        work_ms: 0,
        creators: opts.creators,
        chunk: opts.chunk,
    };
    let pgbench = floors::pgbench_program();
    if pgbench.is_none() {
        eprintln!("pairs: pgbench not found: the key-range ceiling is skipped");
    }
    let mut ways = vec![Way::Product, Way::SetBased];
    if pgbench.is_some() {
        ways.push(Way::Ranges);
    }
    let mut out = Vec::new();
    for round in 1..=rounds {
        let mut order = ways.clone();
        order.rotate_left((round as usize - 1) % ways.len());
        let (mut product, mut set_based, mut ranges) = (0.0, 0.0, None);
        for way in &order {
            match (way, &pgbench) {
                (Way::Product, _) => product = rate(strategy::run_strategy_case(ctx, &spec).await)?,
                (Way::SetBased, _) => set_based = rate(floors::set_based_case(ctx, opts.creators).await)?,
                (Way::Ranges, Some(pgbench)) => {
                    let case = floors::pgbench_case(
                        ctx,
                        pgbench,
                        floors::PgbenchFloor::Ranges,
                        spec.workers,
                        opts.creators,
                        opts.chunk,
                    )
                    .await;
                    ranges = Some(rate(case)?);
                }
                (Way::Ranges, None) => {}
            }
        }
        let pair = PairRound {
            round,
            first: order[0].name().to_string(),
            product_per_second: product,
            set_based_per_second: set_based,
            ratio: product / set_based,
            ranges_per_second: ranges,
            ranges_ratio: ranges.map(|r| r / set_based),
        };
        eprintln!(
            "pairs: round {round}: skip-locked-chunk {product:.0}, set-based {set_based:.0}, pgbench-ranges {} creators/s; ratio {:.3}",
            ranges.map_or("-".to_string(), |r| format!("{r:.0}")),
            pair.ratio
        );
        out.push(pair);
    }
    Ok(PairsReport::new(&spec, out))
}

fn rate(case: CaseResult) -> anyhow::Result<f64> {
    match (case.rate(), &case.error) {
        (Some(rate), _) => Ok(rate),
        (None, Some(err)) => anyhow::bail!("{} failed: {err}", case.name),
        (None, None) => anyhow::bail!("{} failed verify", case.name),
    }
}

/// The rounds as markdown: every round, then each series' median and spread.
pub fn pairs_markdown(report: &PairsReport) -> String {
    let PairsReport {
        creators,
        workers,
        concurrency,
        chunk,
        ..
    } = report;
    let loops = if *concurrency == 1 { "loop" } else { "loops" };
    let mut out = format!(
        "Same-run rounds: {creators} creators, every case copied from one vacuumed, analyzed template; \
         skip-locked-chunk with {workers} processes x {concurrency} {loops}, chunk {chunk}; \
         one set-based transaction; pgbench-ranges: the product's chunk statement, {workers} pgbench clients each on \
         its own key range\n\n\
         | round | first | skip-locked-chunk creators/s | set-based creators/s | pgbench-ranges creators/s | ratio | pgbench-ranges ratio |\n\
         |---|---|---|---|---|---|---|\n"
    );
    for r in &report.rounds {
        out.push_str(&format!(
            "| {} | {} | {:.0} | {:.0} | {} | {:.3} | {} |\n",
            r.round,
            r.first,
            r.product_per_second,
            r.set_based_per_second,
            r.ranges_per_second.map_or("-".to_string(), |v| format!("{v:.0}")),
            r.ratio,
            r.ranges_ratio.map_or("-".to_string(), |v| format!("{v:.3}")),
        ));
    }
    out.push_str("\n| series | median | min | max |\n|---|---|---|---|\n");
    let series = [
        ("ratio", report.ratio, 3),
        ("skip-locked-chunk creators/s", report.product_per_second, 0),
        ("set-based creators/s", report.set_based_per_second, 0),
        ("pgbench-ranges creators/s", report.ranges_per_second, 0),
        ("pgbench-ranges ratio", report.ranges_ratio, 3),
    ];
    for (name, spread, digits) in series {
        if let Some(s) = spread {
            out.push_str(&format!(
                "| {name} | {:.digits$} | {:.digits$} | {:.digits$} |\n",
                s.median, s.min, s.max
            ));
        }
    }
    if let Some(ratio) = report.ratio {
        out.push_str(&format!(
            "\nMedian ratio: {:.3} (rounds from {:.3} to {:.3})\n",
            ratio.median, ratio.min, ratio.max
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(ratio: f64) -> PairRound {
        PairRound {
            round: 1,
            first: "set-based".into(),
            product_per_second: ratio,
            set_based_per_second: 1.0,
            ratio,
            ranges_per_second: Some(ratio + 0.5),
            ranges_ratio: Some(ratio + 0.5),
        }
    }

    fn spec() -> CaseSpec {
        CaseSpec {
            strategy: Strategy::SkipLockedChunk,
            workers: 4,
            concurrency: 1,
            work_ms: 0,
            creators: 10,
            chunk: 5000,
        }
    }

    #[test]
    fn the_median_is_the_middle_value_or_the_mean_of_the_two_middle_ones() {
        assert_eq!(Spread::of([]), None);
        assert_eq!(
            Spread::of([1.4, 0.9, 1.1]),
            Some(Spread {
                median: 1.1,
                min: 0.9,
                max: 1.4
            })
        );
        assert_eq!(Spread::of([1.4, 0.9, 1.1, 1.2]).map(|s| s.median), Some(1.15));
    }

    #[test]
    fn the_report_gives_every_round_and_each_series_median_and_spread() {
        let report = PairsReport::new(&spec(), vec![round(1.25), round(1.5), round(0.75)]);
        assert_eq!(
            report.ratio,
            Some(Spread {
                median: 1.25,
                min: 0.75,
                max: 1.5
            })
        );
        assert_eq!(report.ranges_ratio.map(|s| (s.min, s.max)), Some((1.25, 2.0)));
        let text = pairs_markdown(&report);
        assert!(text.contains("4 processes x 1 loop, chunk 5000"), "{text}");
        assert!(text.contains("| 1 | set-based | 1 | 1 | 2 | 1.250 | 1.750 |"), "{text}");
        assert!(text.contains("| ratio | 1.250 | 0.750 | 1.500 |"), "{text}");
        assert!(
            text.contains("| pgbench-ranges ratio | 1.750 | 1.250 | 2.000 |"),
            "{text}"
        );
        assert!(
            text.contains("Median ratio: 1.250 (rounds from 0.750 to 1.500)"),
            "{text}"
        );
    }
}

//! `settled bench --pairs K`: the ratio of the product to one set-based
//! transaction over the same period, measured in K rounds in one run.
//!
//! A shared machine's speed drifts by tens of percent within minutes, and
//! the full bench measures a strategy and the floors minutes apart, so one
//! ratio from it says as much about the drift as about the code. Here each
//! round settles a fresh period three ways, back to back: with
//! `skip-locked-chunk` (W processes, one claim loop each, --chunk), with
//! the set-based transaction, and with the product's own chunk statement
//! under pgbench, W clients each alone on its own key range (the ceiling of
//! splitting the work with SKIP LOCKED: no client code, no claim meeting
//! another; skipped without pgbench). The order rotates from round to round
//! so a steady drift favours none; each round's ratios are of runs a minute
//! or two apart, and the report gives every round and the medians.

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

/// The rounds, each verified.
pub(super) async fn pairs(ctx: &Ctx, rounds: u32) -> anyhow::Result<Vec<PairRound>> {
    let opts = &ctx.opts;
    let spec = CaseSpec {
        strategy: Strategy::SkipLockedChunk,
        workers: opts.workers.first().copied().unwrap_or(4),
        concurrency: 1,
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
                    let case = floors::pgbench_ranges_case(ctx, pgbench, spec.workers, opts.creators, opts.chunk).await;
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
    Ok(out)
}

fn rate(case: CaseResult) -> anyhow::Result<f64> {
    match (case.rate(), &case.error) {
        (Some(rate), _) => Ok(rate),
        (None, Some(err)) => anyhow::bail!("{} failed: {err}", case.name),
        (None, None) => anyhow::bail!("{} failed verify", case.name),
    }
}

/// The median of the rounds' product / set-based ratios.
pub fn median_ratio(rounds: &[PairRound]) -> Option<f64> {
    median(rounds.iter().map(|r| r.ratio).collect())
}

/// The median of the rounds' pgbench-ranges / set-based ratios.
pub fn median_ranges_ratio(rounds: &[PairRound]) -> Option<f64> {
    median(rounds.iter().filter_map(|r| r.ranges_ratio).collect())
}

fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => None,
        n if n % 2 == 1 => Some(values[n / 2]),
        n => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

/// The rounds as markdown.
pub fn pairs_markdown(creators: u64, workers: u32, chunk: u32, rounds: &[PairRound]) -> String {
    let mut out = format!(
        "Same-run rounds: {creators} creators; skip-locked-chunk with {workers} processes x 1 loop, chunk {chunk}; \
         one set-based transaction; pgbench-ranges: the product's chunk statement, {workers} pgbench clients each on \
         its own key range\n\n\
         | round | first | skip-locked-chunk creators/s | set-based creators/s | pgbench-ranges creators/s | ratio | pgbench-ranges ratio |\n\
         |---|---|---|---|---|---|---|\n"
    );
    for r in rounds {
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
    if let Some(median) = median_ratio(rounds) {
        out.push_str(&format!("\nMedian ratio: {median:.3}\n"));
    }
    if let Some(median) = median_ranges_ratio(rounds) {
        out.push_str(&format!("Median pgbench-ranges ratio: {median:.3}\n"));
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

    #[test]
    fn the_median_is_the_middle_ratio_or_the_mean_of_the_two_middle_ones() {
        assert_eq!(median_ratio(&[]), None);
        assert_eq!(median_ratio(&[round(1.4), round(0.9), round(1.1)]), Some(1.1));
        assert_eq!(
            median_ratio(&[round(1.4), round(0.9), round(1.1), round(1.2)]),
            Some(1.15)
        );
        let text = pairs_markdown(10, 4, 5000, &[round(1.25)]);
        assert!(text.contains("| 1 | set-based | 1 | 1 | 2 | 1.250 | 1.750 |"), "{text}");
        assert!(text.contains("Median ratio: 1.250"), "{text}");
        assert!(text.contains("Median pgbench-ranges ratio: 1.750"), "{text}");
    }
}

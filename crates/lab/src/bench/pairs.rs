//! `settled bench --pairs K`: the ratio of the product to one set-based
//! transaction over the same period, measured as K pairs in one run.
//!
//! A shared machine's speed drifts by tens of percent within minutes, and
//! the full bench measures a strategy and the floors minutes apart, so one
//! ratio from it says as much about the drift as about the code. Here each
//! round settles a fresh period with `skip-locked-chunk` (W processes, one
//! claim loop each, --chunk) and another with the set-based transaction,
//! back to back, the order alternating from round to round so a steady
//! drift favours neither; the ratio of each round is of two runs a minute
//! apart, and the report gives every round and the median.

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
    let mut out = Vec::new();
    for round in 1..=rounds {
        let product_first = round % 2 == 1;
        let (mut product, mut set_based) = (None, None);
        for product_now in [product_first, !product_first] {
            if product_now {
                product = Some(rate(strategy::run_strategy_case(ctx, &spec).await)?);
            } else {
                set_based = Some(rate(floors::set_based_case(ctx, opts.creators).await)?);
            }
        }
        let (product, set_based) = (product.unwrap_or_default(), set_based.unwrap_or_default());
        let pair = PairRound {
            round,
            first: if product_first {
                "skip-locked-chunk"
            } else {
                "set-based"
            }
            .to_string(),
            product_per_second: product,
            set_based_per_second: set_based,
            ratio: product / set_based,
        };
        eprintln!(
            "pairs: round {round}: skip-locked-chunk {product:.0}, set-based {set_based:.0} creators/s, ratio {:.3}",
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

/// The median of the rounds' ratios.
pub fn median_ratio(rounds: &[PairRound]) -> Option<f64> {
    let mut ratios: Vec<f64> = rounds.iter().map(|r| r.ratio).collect();
    ratios.sort_by(f64::total_cmp);
    match ratios.len() {
        0 => None,
        n if n % 2 == 1 => Some(ratios[n / 2]),
        n => Some((ratios[n / 2 - 1] + ratios[n / 2]) / 2.0),
    }
}

/// The rounds as markdown.
pub fn pairs_markdown(creators: u64, workers: u32, chunk: u32, rounds: &[PairRound]) -> String {
    let mut out = format!(
        "Same-run pairs: {creators} creators, skip-locked-chunk with {workers} processes x 1 loop, chunk {chunk}, \
         against one set-based transaction\n\n\
         | round | first | skip-locked-chunk creators/s | set-based creators/s | ratio |\n|---|---|---|---|---|\n"
    );
    for r in rounds {
        out.push_str(&format!(
            "| {} | {} | {:.0} | {:.0} | {:.3} |\n",
            r.round, r.first, r.product_per_second, r.set_based_per_second, r.ratio
        ));
    }
    if let Some(median) = median_ratio(rounds) {
        out.push_str(&format!("\nMedian ratio: {median:.3}\n"));
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
        assert!(text.contains("| 1 | set-based | 1 | 1 | 1.250 |"), "{text}");
        assert!(text.contains("Median ratio: 1.250"), "{text}");
    }
}

use settled_models::check;
use settled_models::payouts::{Guards, Payouts, property};
fn main() {
    for m in [Payouts::ci_confirmed(), Payouts::ci_two_payouts()] {
        let out = check::check(m.clone());
        print!("{}", out.report());
        println!("cycle: {:?}", check::find_cycle(&m).map_err(|a| a.iter().map(|a| a.to_string()).collect::<Vec<_>>()));
        for p in out.failed() { if let Some(path) = out.discoveries.get(p) { println!("-- {p}"); print!("{}", check::trace(&m, path)); } }
    }
    for (m, g, p) in [
        (Payouts::ci_confirmed(), Guards { state_condition: false, ..Guards::ALL }, property::RETURNED_AT_MOST_ONCE),
        (Payouts::ci_confirmed(), Guards { state_condition: false, ..Guards::ALL }, property::RETURNED_ONLY_UNPAID),
        (Payouts::ci_confirmed(), Guards { state_condition: false, ..Guards::ALL }, property::TOKEN_ONCE),
        (Payouts::ci_confirmed(), Guards { event_id: false, ..Guards::ALL }, property::EVENT_AT_MOST_ONCE),
        (Payouts::ci_confirmed(), Guards { idempotency_key: false, ..Guards::ALL }, property::PAID_AT_MOST_ONCE),
    ] {
        let m = m.without(g);
        let out = check::find(m.clone(), p);
        print!("{}", out.report());
        if let Some(path) = out.discoveries.get(p) { print!("{}", check::trace(&m, path)); }
    }
}

//! The holds page as a maud template: every interpolated value is escaped
//! by the template engine; nothing here touches the database.

use maud::{html, Markup};

use super::pages::page;
use crate::settlement::Hold;

/// A hold's age, for people.
pub(super) fn age(secs: f64) -> String {
    let secs = secs.max(0.0) as u64;
    match secs {
        0..=119 => format!("{secs} s"),
        120..=7199 => format!("{} min", secs / 60),
        7200..=172_799 => format!("{} h", secs / 3600),
        _ => format!("{} days", secs / 86_400),
    }
}

/// A hold's release form; `from` is the page to come back to.
pub(super) fn release_form(hold: &Hold, from: &str) -> Markup {
    html! {
        form method="post" action=(format!("/dashboard/holds/{}/release", hold.id)) {
            input type="hidden" name="from" value=(from);
            button { "release" }
        }
    }
}

/// The active holds, oldest first, with a release form each, and the form
/// that places one.
pub(super) fn holds(active: &[(Hold, f64)]) -> Markup {
    let body = html! {
        @if active.is_empty() {
            p { "No active holds." }
        } @else {
            table #holds {
                tr { th { "hold" } th { "creator" } th { "reason" } th { "placed (UTC)" } th { "age" } th {} }
                @for (hold, secs) in active {
                    tr data-hold=(hold.id) {
                        td { (hold.id) }
                        td.mono { a href=(format!("/creators/{}", hold.creator)) { (hold.creator) } }
                        td { (hold.reason) }
                        td { (hold.created_at.format("%Y-%m-%d %H:%M:%S")) }
                        td { (age(*secs)) }
                        td { (release_form(hold, "holds")) }
                    }
                }
            }
        }
        p.note {
            "While a hold is active the creator's items are held instead of paid and withdrawals are refused; \
             releasing it makes the held items eligible again. The forms ask for the API token: any user name, \
             the token as the password."
        }
        h2 { "place a hold" }
        form #place-hold method="post" action="/dashboard/holds" {
            label { "creator " input type="text" name="creator" size="44" placeholder="0x…"; } " "
            label { "reason " input type="text" name="reason" size="40" maxlength="500"; } " "
            button { "place" }
        }
    };
    page("holds", None, body)
}

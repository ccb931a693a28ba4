//! The payouts model: the payout protocol as built in
//! `crates/settled/src/payouts/{mod.rs,deliver.rs}`,
//! `crates/settled/src/api/{payouts/,provider_events.rs}` and migration
//! `20261203000501_payout_lifecycle.sql`.
//!
//! What it holds: a creator's balance; payout requests (`POST /v1/payouts`
//! with an `Idempotency-Key`, sent again by a client that timed out); the
//! key claimed (`idempotency::begin`), the debit, the payout row, its
//! delivery job and the stored answer committed in one transaction; payouts
//! through their states (created, queued, sent, paid, failed, cancelled,
//! expired), each move checked against `settlement.payout_transitions`;
//! confirmation tokens redeemed by racing requests and expiring; the
//! creator's cancel and the sweeper's expiry of unconfirmed payouts;
//! a paid payment the provider returns later (`payment.returned`, applied by
//! its webhook or a look-up of paid payouts, or before its `paid` was
//! heard: sent straight to returned), its funds back once;
//! delivery in leased mode on the continuous queue `payout_delivery`, with
//! the payout's own provider key, crashes and paused zombies rescued,
//! snoozes that spend no attempt, and a dead letter (attempts spent) that
//! keeps its payout queued until an operator replays it; a provider that
//! accepts a payment as pending and later pays or fails it, answers 503,
//! applies and then times out, or refuses; its webhooks duplicated and
//! lost; polling of payouts that stay sent; funds returned in the same
//! transaction as the transition that fails, cancels or expires a payout.
//!
//! The guards are the code's, each removable on its own ([`Guards`]), and
//! several stand behind one another: every move is a conditional update
//! (`move_payout`), the trigger `check_payout_change` refuses a move the
//! transitions table has not, and `payout_returns`' primary key refuses a
//! second return. Without the conditional update the application reads the
//! state, decides, and writes it blind: the model then splits each
//! transition into its read and its write. With it the read decides
//! nothing, so the two are one step.
//!
//! Left out: `failed` after `paid` from a provider without a returned
//! status (the database reads it as the same return; the model's provider
//! says `returned`), the provider's key window (tests/e2e/key_window.rs in the
//! CLI's tests drives it), settlement payouts (`record_settlement_payment` makes them in
//! the leased completion's transaction as `sent`, `paid` or `failed`; from
//! there they are this machine's sent payouts, without a delivery job),
//! holds, the provider's rate limits (a snooze, like a 503), and operators
//! cancelling a delivery job by hand.

mod action;
mod bounds;
mod described;
mod effects;
mod enabled;
mod model;
mod state;
mod writes;

pub use action::{Action, Answer};
pub use state::transitions;
pub use state::{
    event_name, event_of, Delivered, Delivery, Intent, JobRow, JobStatus, KeyRow, Payment, PayoutRow, PayoutState,
    Post, ProviderStatus, Request, Source, State, Worker,
};

/// Faults and racing requests, each at most this many times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Faults {
    /// A delivery worker killed (it stays down).
    pub crashes: u8,
    /// A delivery worker paused past its lease (a zombie when it wakes).
    pub pauses: u8,
    /// The provider answering 503 before applying anything.
    pub provider_unavailable: u8,
    /// The provider applying the payment, then the caller timing out.
    pub applied_then_timed_out: u8,
    /// The provider refusing a payment (4xx).
    pub refusals: u8,
    /// A payment the provider accepted failing later (`payment.failed`).
    pub provider_failures: u8,
    /// A webhook delivered once more.
    pub webhook_duplicates: u8,
    /// A webhook never delivered.
    pub webhook_losses: u8,
    /// A paid payment the provider returns later (`payment.returned`).
    pub returns: u8,
    /// Requests redeeming a payout's confirmation token (racing ones too).
    pub redemptions: u8,
    /// A creator cancelling an unconfirmed payout.
    pub cancels: u8,
    /// `POST /v1/payouts` sent again with the same key before an answer (a
    /// client that timed out, through another server).
    pub request_repeats: u8,
    /// A request paused past its key's `locked_until`, so a repeat takes
    /// the key over (`idempotency::begin`).
    pub key_lock_expiries: u8,
}

/// The guards a variant may go without: each is a statement or a
/// constraint of the code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Guards {
    /// `settlement.move_payout`: `UPDATE payouts .. WHERE id = $1 AND
    /// status = ANY(from_states)`, its answer the truth (and the sweeper's
    /// `expire_unconfirmed_payouts`, `.. AND status = 'created'`). Without
    /// it: the state read, then written blind.
    pub state_condition: bool,
    /// The trigger `check_payout_change`: a change of `status` that
    /// `settlement.payout_transitions` does not list raises, and its
    /// transaction rolls back.
    pub transition_table: bool,
    /// `settlement.payout_returns`' primary key: a second return of a
    /// payout raises, and its transaction rolls back.
    pub one_return: bool,
    /// `OnceToken::redeem_in`: `UPDATE once_tokens .. WHERE id = $1 AND
    /// status = 'issued' AND expires_at > now()`. Without it only the
    /// expiry is checked.
    pub one_time_token: bool,
    /// `settlement.provider_events`' primary key: `INSERT .. ON CONFLICT
    /// (id) DO NOTHING`, a repeat rolled back and answered 200.
    pub event_id: bool,
    /// The provider key derived from the payout (`provider_key`, a
    /// generated column). Without it, each delivery attempt sends a key of
    /// its own.
    pub idempotency_key: bool,
    /// `idempotency::begin` and `finish`: a request's key claimed (a
    /// repeat answered 409 while the first holds it, or taking it over once
    /// its lock passed), and its answer stored in the payout's transaction
    /// only while the key is in progress (else the transaction rolls back).
    pub request_key: bool,
    /// `payouts.idempotency_key UNIQUE`: a second payout of one key raises.
    pub unique_request_key: bool,
}

impl Guards {
    /// Every guard the code has.
    pub const ALL: Guards = Guards {
        state_condition: true,
        transition_table: true,
        one_return: true,
        one_time_token: true,
        event_id: true,
        idempotency_key: true,
        request_key: true,
        unique_request_key: true,
    };
}

/// The payouts model at some bounds.
#[derive(Debug, Clone)]
pub struct Payouts {
    /// Payout requests (each of one unit, under a key of its own), made in order.
    pub requests: u8,
    /// The creator's balance before them (settled rewards).
    pub credit: i8,
    /// Payouts are created with `"confirm": true` (a token to redeem).
    pub confirm: bool,
    /// Delivery workers.
    pub workers: u8,
    /// Attempts of a delivery job before it is a dead letter
    /// (`RetryPolicy::max_attempts`; `settled deliver` has 25).
    pub max_attempts: u8,
    /// Faults and races.
    pub faults: Faults,
    /// The guards in force.
    pub guards: Guards,
}

/// Property names.
pub mod property {
    /// Safety.
    pub const BALANCE_NOT_NEGATIVE: &str = "a balance never goes negative";
    /// Safety.
    pub const MONEY_CONSERVED: &str = "credits = balance + payouts not returned";
    /// Safety.
    pub const RETURNED_AT_MOST_ONCE: &str = "funds are returned at most once";
    /// Safety.
    pub const RETURNED_ONLY_UNPAID: &str = "funds are returned only for a payout that did not pay";
    /// Safety.
    pub const PAID_AT_MOST_ONCE: &str = "the provider pays each payout at most once";
    /// Safety.
    pub const REQUEST_ONCE: &str = "a payout request (its Idempotency-Key) makes at most one payout";
    /// Safety.
    pub const EVENT_AT_MOST_ONCE: &str = "each provider event is recorded at most once";
    /// Safety.
    pub const TOKEN_ONCE: &str = "a confirmation token is redeemed at most once";
    /// Liveness.
    pub const EVERY_PAYOUT_ENDS: &str =
        "every request is answered and every payout ends paid, or with its funds returned (a payment the provider returned, returned)";
}

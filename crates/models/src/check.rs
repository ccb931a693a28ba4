//! Running a model: the checker at given bounds, what it found (states,
//! depth, time, each property held or its counterexample), traces printed
//! one action a line, and the acyclicity check that makes the liveness
//! properties sound.
//!
//! stateright checks an `eventually` property only at terminal states (no
//! action enabled) and does not recognise a cycle as a path that never
//! terminates. So every model here bounds its faults with budgets, and
//! [`find_cycle`] proves, at the same bounds, that its state graph has no
//! cycle: every behaviour then ends in a terminal state, where the
//! property is checked. The goals are stable (a final status stays final
//! unless a fault undoes it, and faults are bounded), so a goal met on one
//! path into a shared state is met on every path through it.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::fmt::{Debug, Display};
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use stateright::{Checker, Expectation, HasDiscoveries, Model, Path};

/// A model that can describe its states in one line, for traces.
pub trait Described: Model
where
    Self::State: Debug,
    Self::Action: Display,
{
    /// The model's name and bounds, e.g. `leased work (2 workers, 1 item)`.
    fn name(&self) -> String;

    /// One line: what the rows, the workers and the outside world hold.
    fn describe(&self, state: &Self::State) -> String;
}

/// What one property came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Held over every state (always), every terminal path (eventually),
    /// or was reached (sometimes).
    Held,
    /// A counterexample (always, eventually) or no example (sometimes).
    Failed,
}

/// What a check found.
pub struct Outcome<M: Model> {
    /// The model's name and bounds.
    pub name: String,
    /// States generated, with repeats.
    pub states: usize,
    /// Distinct states.
    pub unique_states: usize,
    /// Longest path explored.
    pub depth: usize,
    /// Wall-clock time of the check.
    pub elapsed: Duration,
    /// Each property, its expectation and its verdict, in the model's order.
    pub verdicts: Vec<(&'static str, Expectation, Verdict)>,
    /// The path found for each property that has one (counterexamples of
    /// `always` and `eventually`, examples of `sometimes`).
    pub discoveries: HashMap<&'static str, Path<M::State, M::Action>>,
    /// The whole state space was explored (else the check stopped at the
    /// discovery it looked for, and the other verdicts are unknown).
    pub complete: bool,
}

impl<M: Model> Outcome<M> {
    /// True when every property held.
    pub fn all_held(&self) -> bool {
        self.verdicts.iter().all(|(_, _, v)| *v == Verdict::Held)
    }

    /// The properties that failed.
    pub fn failed(&self) -> Vec<&'static str> {
        self.verdicts
            .iter()
            .filter(|(_, _, v)| *v == Verdict::Failed)
            .map(|(name, _, _)| *name)
            .collect()
    }

    /// A report: the figures, then one line per property.
    pub fn report(&self) -> String {
        let mut out = format!(
            "{}: {} states ({} unique), depth {}, {:.2} s\n",
            self.name,
            self.states,
            self.unique_states,
            self.depth,
            self.elapsed.as_secs_f64()
        );
        for (name, expectation, verdict) in &self.verdicts {
            let what = match (expectation, verdict) {
                _ if !self.complete && !self.discoveries.contains_key(name) => "not explored",
                (Expectation::Sometimes, Verdict::Held) => "reached",
                (Expectation::Sometimes, Verdict::Failed) => "NEVER REACHED",
                (_, Verdict::Held) => "holds",
                (_, Verdict::Failed) => "FAILS",
            };
            out.push_str(&format!("  {what:>13}  {expectation:?} {name}\n"));
        }
        out
    }
}

/// Threads the checker uses: the machine's cores.
fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Checks every property of `model` over its whole state space.
pub fn check<M>(model: M) -> Outcome<M>
where
    M: Described + Send + Sync + 'static,
    M::State: Debug + Clone + Hash + PartialEq + Send + Sync + 'static,
    M::Action: Display + Debug + Clone + PartialEq + Send + Sync + 'static,
{
    run(model, HasDiscoveries::All, true, threads())
}

/// Checks `model` until `property` has a discovery (or the space is spent):
/// a variant without a guard stops at its first counterexample. One thread,
/// breadth first: the counterexample is a shortest one, the same every run.
pub fn find<M>(model: M, property: &'static str) -> Outcome<M>
where
    M: Described + Send + Sync + 'static,
    M::State: Debug + Clone + Hash + PartialEq + Send + Sync + 'static,
    M::Action: Display + Debug + Clone + PartialEq + Send + Sync + 'static,
{
    run(model, HasDiscoveries::AnyOf([property].into_iter().collect()), false, 1)
}

fn run<M>(model: M, finish_when: HasDiscoveries, complete: bool, threads: usize) -> Outcome<M>
where
    M: Described + Send + Sync + 'static,
    M::State: Debug + Clone + Hash + PartialEq + Send + Sync + 'static,
    M::Action: Display + Debug + Clone + PartialEq + Send + Sync + 'static,
{
    let name = model.name();
    let properties = model.properties();
    let started = Instant::now();
    let checker = model
        .checker()
        .threads(threads)
        .finish_when(finish_when)
        .spawn_bfs()
        .join();
    let elapsed = started.elapsed();
    let discoveries = checker.discoveries();
    let verdicts = properties
        .iter()
        .map(|p| {
            let found = discoveries.contains_key(p.name);
            let held = match p.expectation {
                Expectation::Sometimes => found,
                Expectation::Always | Expectation::Eventually => !found,
            };
            let verdict = if held { Verdict::Held } else { Verdict::Failed };
            (p.name, p.expectation.clone(), verdict)
        })
        .collect();
    Outcome {
        name,
        states: checker.state_count(),
        unique_states: checker.unique_state_count(),
        depth: checker.max_depth(),
        elapsed,
        verdicts,
        discoveries,
        complete,
    }
}

/// A path as one line per action: the action (named after the function
/// and statement it models), then what the state holds after it.
pub fn trace<M>(model: &M, path: &Path<M::State, M::Action>) -> String
where
    M: Described,
    M::State: Debug + Clone,
    M::Action: Display + Debug + Clone,
{
    let steps = path.clone().into_vec();
    let mut out = String::new();
    if let Some((first, _)) = steps.first() {
        out.push_str(&format!("   0. (start)  => {}\n", model.describe(first)));
    }
    for (i, window) in steps.windows(2).enumerate() {
        let (_, action) = &window[0];
        let (after, _) = &window[1];
        let action = action.as_ref().map_or_else(String::new, |a| a.to_string());
        out.push_str(&format!(
            "  {:>2}. {action}\n        => {}\n",
            i + 1,
            model.describe(after)
        ));
    }
    out
}

/// A state on the search's path: its fingerprint, its successors, the next
/// one to visit, and the action that led into it.
type Frame<M> = (
    u64,
    Vec<(<M as Model>::Action, <M as Model>::State)>,
    usize,
    Option<<M as Model>::Action>,
);

/// A counterexample cut at the first state where `property` (an `always`)
/// is false: the checker's threads may report a path that goes on past it.
pub fn until_broken<M>(model: &M, path: &Path<M::State, M::Action>, property: &'static str) -> Path<M::State, M::Action>
where
    M: Model,
    M::State: Clone + PartialEq,
    M::Action: Clone + PartialEq,
{
    let condition = model.property(property).condition;
    let steps = path.clone().into_vec();
    let Some(broken) = steps.iter().position(|(state, _)| !condition(model, state)) else {
        return path.clone();
    };
    let actions: Vec<M::Action> = steps[..broken].iter().filter_map(|(_, a)| a.clone()).collect();
    Path::from_actions(model, steps[0].0.clone(), &actions).unwrap_or_else(|| path.clone())
}

/// Looks for a cycle in the model's state graph (depth first, from every
/// initial state). Returns the number of distinct states when there is
/// none, or the actions from an initial state around the cycle.
pub fn find_cycle<M>(model: &M) -> Result<usize, Vec<M::Action>>
where
    M: Model,
    M::State: Hash + Clone,
    M::Action: Clone,
{
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        OnPath,
        Done,
    }
    let fingerprint = |s: &M::State| {
        let mut h = DefaultHasher::new();
        s.hash(&mut h);
        h.finish()
    };
    let mut marks: HashMap<u64, Mark> = HashMap::new();
    for init in model.init_states() {
        if marks.contains_key(&fingerprint(&init)) {
            continue;
        }
        let mut stack: Vec<Frame<M>> = Vec::new();
        marks.insert(fingerprint(&init), Mark::OnPath);
        stack.push((fingerprint(&init), model.next_steps(&init), 0, None));
        while let Some(frame) = stack.last_mut() {
            if frame.2 == frame.1.len() {
                marks.insert(frame.0, Mark::Done);
                stack.pop();
                continue;
            }
            let (action, next) = frame.1[frame.2].clone();
            frame.2 += 1;
            let fp = fingerprint(&next);
            match marks.get(&fp) {
                Some(Mark::Done) => {}
                Some(Mark::OnPath) => {
                    let mut actions: Vec<M::Action> = stack.iter().filter_map(|f| f.3.clone()).collect();
                    actions.push(action);
                    return Err(actions);
                }
                None => {
                    marks.insert(fp, Mark::OnPath);
                    let steps = model.next_steps(&next);
                    stack.push((fp, steps, 0, Some(action)));
                }
            }
        }
    }
    Ok(marks.len())
}

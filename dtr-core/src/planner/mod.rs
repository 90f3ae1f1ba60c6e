//! The offline planner: replay a recorded iteration under the budget, knowing its
//! future, and place every allocation of the best schedule in one arena.
//!
//! Training repeats its iteration, so the recording of iteration k is the exact
//! future of iteration k+1 (until a divergence says otherwise). The planner
//! replays the [`Recording`] on a value-free `Runtime<()>` — the same runtime
//! code as the online path, so the same calls number storages and allocations
//! identically — once per portfolio entry:
//!
//! | entry | prices a candidate by |
//! |---|---|
//! | `learned:next-use` | e* / (bytes · time to its next direct read in the recording), e* by union-find |
//! | `learned:next-use-walk` | the same with e* by a walk of the evicted neighbourhood, bounded to 64 storages |
//! | `learned:dead` | remat's score, with storages the recording never reads again free |
//! | the configured policy | what the online runtime would do (no future) |
//! | `dtr-full` | h_DTR, full scan (no future) |
//! | `msps-full` | MSPS, full scan: recompute cost of the evicted lineage per byte, no staleness (no future) |
//! | `<entry>~k` for the learned entries, k = 1..=`plan_restarts` (8) | the entry's price times a fixed random factor per storage (seed k), where the entry ran to the end |
//! | `dtr-full~k`, `msps-full~k` | the same for the full-scan entries, while the planning work per recorded event is under `RESTART_WORK_PER_EVENT` (2 048) |
//! | `<entry>~k`, k > `plan_restarts`, in the flat arena only | the same, while the planning work per recorded event is under that limit, up to 64 rounds |
//!
//! Each simulation runs under a *logical* budget B' and logs its allocations
//! (with lifetimes) and its policy evictions (with the allocation they made room
//! for). The allocations, rematerialized copies included, go to the static
//! planner ([`remat_alloc::plan`]); when its arena exceeds the budget, B' shrinks
//! by the excess and the entry is simulated again. The perturbed copies are
//! random restarts of the greedy schedules: each is simulated exactly, so
//! they only ever replace the plan with a cheaper one. Their rounds are
//! bounded by a deterministic measure of planning work (candidates offered to
//! the policies, the neighbour links their walks examined, and the recorded
//! events driven), so a light recording searches longer and the plan never
//! depends on the machine's speed. The cheapest entry whose
//! arena fits the budget becomes the [`IterationPlan`]; the runtime adopts it
//! only when it costs no more than the recorded iteration did (or, after an
//! iteration the runtime had to rescue, no more than twice its first
//! computations: `Runtime::plan_bound`).
//!
//! Where no entry's schedule fits that way (a fixed placement of an eviction
//! schedule needs slack over its live bytes, and an op whose working set is
//! most of the budget leaves none), each entry is simulated once more in a
//! *compacting* arena of the budget ([`crate::DtrConfig::plan_moves`]); where
//! one fits and moves have a price, the winning entry is (its fixed
//! placement may have needed a shrunk budget), and so is each entry whose
//! schedule at the full budget cost less than the best plan but whose fixed
//! placement passed the budget, each taken if cheaper. In that
//! arena, where the free bytes hold a request but not in one piece, the
//! simulation slides blocks (or
//! evicts the cheapest window, whichever costs less), the moves charged, and
//! each compaction becomes a [`crate::plan::StepKind::Compact`] step that the
//! follower makes again; the arena is deterministic, so the blocks land where
//! the simulation put them ([`crate::IterationPlan::moves`]).
//!
//! With swap on, a simulation copies a swapped storage back at its read, as
//! an online step must; the iteration that follows the plan knows the read
//! is coming and starts the copy once its destination in the plan's arena
//! is free (`Runtime::prefetch_issue`). So each placed schedule is ranked by
//! its swap-ins re-timed that way ([`prefetch`]), and placed once more with
//! each swap-in's destination held free from when its copy must start,
//! where that fits; where it does not fit, the entry is simulated once more
//! with that much room left. A simulation chooses between swapping and
//! replaying a victim as the online step does, by the swap's round trip;
//! the swapping pass's winner is then simulated once more choosing by the
//! stall each swap is expected to leave once prefetched (Capuchin's test:
//! copies that fit before the next read, beside the copies back already
//! booked, stall nothing; `Runtime::price_swaps_by_future`), and taken
//! where its re-timed, placed cost is lower.
//!
//! Why it works: DTR's heuristics guess the future from the past (staleness); a
//! repeated iteration *is* its own past, so the future-knowing prices (Belady's
//! next use with recompute costs, free evictions of storages never read again)
//! become legitimate online. Fragmentation goes because nothing is placed at
//! run time: the placement is computed for the whole iteration at once.
//!
//! This file holds the portfolio and the placement; `simulate` runs one
//! entry's simulation of the recording (cut off at its `Limits`), and
//! `prefetch` re-times a placed schedule's swap-ins.

use std::sync::Arc;
use std::time::Instant;

use remat_alloc::plan::{compact_within, plan as place, Algorithm, Plan, Request as PlanRequest};

use crate::config::{BudgetMode, DtrConfig, PolicyKind, FIRST_ITERATION_LIMIT};
use crate::error::Result;
use crate::memory::arena::{arena_size, ARENA_ALIGN};
use crate::op::OutputSpec;
use crate::plan::IterationPlan;
use crate::policy::oracle::{EStar, Future, OracleKind};
use crate::policy::{score_kind, ScoreKind};
use crate::record::{Event, Recording};
use crate::stats::NoPlan;

/// What planning a recording gives: the plan, or what the simulations ran
/// into instead.
pub(crate) type Planned = std::result::Result<IterationPlan, NoPlan>;

/// Shrinks of the simulated budget tried per portfolio entry.
const SHRINK_ATTEMPTS: usize = 4;

/// Above this many allocations only the O(n log n) placement runs (the greedy
/// one is O(n²)).
const GREEDY_MAX_REQUESTS: usize = 20_000;

/// One portfolio entry.
#[derive(Debug, Clone, Copy)]
enum Entry {
    Learned(OracleKind, EStar),
    /// A learned entry whose prices are perturbed by a seed (never 0).
    Perturbed(OracleKind, EStar, u64),
    Configured,
    Online(PolicyKind, bool),
    /// A full-scan score entry (`Online(kind, false)` with `kind`'s score)
    /// whose scores are perturbed by a seed (never 0).
    PerturbedScore(PolicyKind, ScoreKind, u64),
}

impl Entry {
    /// The seed of a perturbed copy (0: the entry itself).
    fn seed(self) -> u64 {
        match self {
            Entry::Perturbed(_, _, seed) | Entry::PerturbedScore(_, _, seed) => seed,
            _ => 0,
        }
    }

    /// This entry's copy under restart `seed`, for the entries that have
    /// one: the learned entries and the full-scan score policies.
    fn restarted(self, seed: u64, config: &DtrConfig) -> Option<Entry> {
        match self {
            Entry::Learned(kind, e_star) => Some(Entry::Perturbed(kind, e_star, seed)),
            Entry::Online(kind, false) => {
                let score = score_kind(kind, config)?;
                Some(Entry::PerturbedScore(kind, score, seed))
            }
            _ => None,
        }
    }
}

/// Planning work per recorded event (the policy decisions' work — candidates
/// offered plus the neighbour links their walks examined — plus the recorded
/// events driven, over every simulation so far) below which restart rounds
/// go on past `plan_restarts`, in the flat arena only, up to
/// [`DtrConfig::MAX_PLAN_RESTARTS`] rounds, and below which the full-scan
/// entries are restarted at all. The heavy recordings measured (the DTR
/// paper's lstm and treelstm, 5–6k ops, 0.5–0.8 ms of planning per op) spend
/// 4 600–11 500 per event on the portfolio and the first eight rounds alone,
/// and remat-burn's 4 949-op test model 23 000–43 000 on the portfolio, so a
/// light recording searches more without planning longer per event than
/// they do.
const RESTART_WORK_PER_EVENT: u64 = 2048;

const PORTFOLIO: [(&str, Entry); 6] = [
    (
        "learned:next-use",
        Entry::Learned(OracleKind::NextUse, EStar::UnionFind),
    ),
    (
        "learned:next-use-walk",
        Entry::Learned(OracleKind::NextUse, EStar::Walk(64)),
    ),
    (
        "learned:dead",
        Entry::Learned(OracleKind::Dead, EStar::UnionFind),
    ),
    // The configured online policy, with the configured sampling: a plan can
    // always at least repeat what the online runtime does.
    ("online", Entry::Configured),
    ("dtr-full", Entry::Online(PolicyKind::Dtr, false)),
    ("msps-full", Entry::Online(PolicyKind::Msps, false)),
];

/// How a simulation places its allocations.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Placement {
    /// In a flat arena of this many bytes (the budget, or less to leave room
    /// for prefetched swap-ins), best fit at run time of the simulation:
    /// the policy sees addresses and evicts to open holes; the offsets are the
    /// simulation's own.
    Arena(u64),
    /// Under a logical budget (no addresses), placed afterwards by the static
    /// planner; fits only if the planner's arena is within the budget.
    Logical(u64),
    /// Under a logical budget counting each request rounded to the arena's
    /// alignment: what an online run in a compacting arena can hold (the
    /// physical floor, [`min_feasible_budget`]). Never a plan.
    Compacting(u64),
    /// In a compacting arena of this many bytes (the budget): as `Arena`,
    /// and where the free bytes hold a request but not in one piece, blocks
    /// slide to open it (or the cheapest window is evicted, whichever costs
    /// less, as online); the compactions become steps of the plan, and the
    /// moves are charged. The offsets are each allocation's when made.
    Moving(u64),
}

/// Whether restart round `seed` (1-based, at most
/// [`DtrConfig::MAX_PLAN_RESTARTS`]) runs, and if so whether it is an extra
/// round (past `plan_restarts`: flat arena only): rounds up to
/// `plan_restarts` always run (none when it is 0); an extra one only while
/// some entry competed in the arena and the planning work is under `limit`.
fn restart_round(
    seed: u32,
    plan_restarts: u32,
    in_arena: bool,
    work: u64,
    limit: u64,
) -> Option<bool> {
    let extra = seed > plan_restarts;
    let runs = plan_restarts > 0 && (!extra || (in_arena && work < limit));
    runs.then_some(extra)
}

/// Plan the iteration after `rec` under `config`'s budget. `measured_ns` is the
/// most a plan may cost: what the recorded iteration cost (first computations
/// plus rematerializations), or more after a rescued one. It is also what
/// simulations are cut off by, so it decides which entries run to the end and
/// are restarted. `Ok(None)`: no entry fits, or none is cheap enough; a
/// setting out of range is an [`Error::Config`].
///
/// With swap on, the portfolio runs twice: recomputing only (the boundary's
/// swapped storages still come back by a copy), then swapping too, held to
/// the first's best; the swapping plan is taken only where it is cheaper, so
/// swap never makes a plan slower than the recompute-only one. Planning then
/// takes up to twice as long.
///
/// "Held to the first's best" bounds what a swapping simulation costs
/// *without its stalls*: a simulation times each swap-in at its read, and
/// placed, the plan's swap-ins are prefetched, which saves at most those
/// stalls. So the first's best cuts a swapping simulation off only once its
/// compute, replays and moves alone pass it; with its stalls it is cut off at
/// `measured_ns`, like the first pass. (Cut off by its stalled cost at the
/// first's best, as until session 33, a swapping plan that would have won
/// once prefetched was lost wherever the recompute-only plan was already
/// cheap: resnet32 at 0.2 and 64 GB/s planned 1.248 instead of 1.190.)
pub(crate) fn plan_iteration(
    rec: &Arc<Recording>,
    config: &DtrConfig,
    measured_ns: f64,
) -> Result<Planned> {
    if !config.swap.enabled {
        return plan_with_work_limit(rec, config, measured_ns, RESTART_WORK_PER_EVENT, None)
            .map(|(plan, _)| plan);
    }
    let (recompute, winner) =
        plan_with_work_limit(rec, config, measured_ns, RESTART_WORK_PER_EVENT, None)?;
    let bound_ns = recompute
        .as_ref()
        .map_or(measured_ns, |p| p.total_ns.min(measured_ns));
    let (swapping, _) = plan_with_work_limit(
        rec,
        config,
        measured_ns,
        RESTART_WORK_PER_EVENT,
        Some(Swapping {
            bound_ns,
            recompute_winner: winner,
        }),
    )?;
    Ok(match (recompute, swapping) {
        (Ok(r), Ok(s)) if s.total_ns < r.total_ns => Ok(IterationPlan {
            plan_ms: r.plan_ms + s.plan_ms,
            simulations: r.simulations + s.simulations,
            ..s
        }),
        (Ok(r), Ok(s)) => Ok(IterationPlan {
            plan_ms: r.plan_ms + s.plan_ms,
            simulations: r.simulations + s.simulations,
            ..r
        }),
        (Ok(p), Err(_)) | (Err(_), Ok(p)) => Ok(p),
        (Err(mut r), Err(s)) => {
            r.merge(&s);
            Err(r)
        }
    })
}

/// A portfolio entry, by its name and what it simulates.
type Winner = (&'static str, Entry);

/// What the swapping pass of [`plan_iteration`] takes from the
/// recompute-only one.
struct Swapping {
    /// What a plan must cost less than, and so must a simulation without
    /// its stalls (ns): the recompute-only plan's cost.
    bound_ns: f64,
    /// The entry that made the recompute-only plan, if any.
    recompute_winner: Option<Winner>,
}

/// [`plan_iteration`] with extra restart rounds while the planning work per
/// recorded event is under `work_per_event`, and the entry that made the
/// plan. `swapping`: the simulations may swap storages out (the swapping
/// pass); `None`: recompute only.
fn plan_with_work_limit(
    rec: &Arc<Recording>,
    config: &DtrConfig,
    measured_ns: f64,
    work_per_event: u64,
    swapping: Option<Swapping>,
) -> Result<(Planned, Option<Winner>)> {
    config.check()?;
    let Some(budget) = config.budget else {
        return Ok((Err(NoPlan::default()), None));
    };
    let started = Instant::now();
    let mut planner = Planner {
        rec,
        config,
        budget,
        future: Arc::new(future_of(rec)),
        measured_ns,
        best: None,
        best_entry: None,
        best_simulated: f64::INFINITY,
        placed_fit: None,
        over_at_budget: Vec::new(),
        simulations: 0,
        work: 0,
        swap_outs: swapping.is_some(),
        hidden: false,
        stall_free_ns: (swapping.as_ref()).map_or(f64::INFINITY, |s| s.bound_ns.min(measured_ns)),
        search: NoPlan {
            bound_ns: measured_ns,
            compute_ns: rec.compute_ns() as f64,
            budget,
            ..NoPlan::default()
        },
    };
    let physical = config.budget_mode == BudgetMode::Physical;
    // The entries that can be restarted (learned and full-scan score
    // entries), each with two flags: whether its simulation in a flat arena
    // ran to the end, and whether its first logical one did (a simulation is
    // cut off once it cannot cost less than the best plan so far, or than
    // `measured_ns`).
    let mut competitive = Vec::new();
    for (name, entry) in PORTFOLIO {
        let done = planner.try_entry(name, entry, physical, true)?;
        if entry.restarted(1, config).is_some() {
            competitive.push((name, entry, done));
        }
    }
    // Random restarts where an entry competed: each copy scales every
    // storage's price by its own fixed factor, so it makes a different greedy
    // schedule, simulated exactly; the plan can only get cheaper. Rounds
    // 1 ..= `plan_restarts` in both placements; then, while the planning work
    // per recorded event stays under `RESTART_WORK_PER_EVENT`, more rounds in
    // the flat arena only, whose placement is part of the simulation and so
    // of the work counted (a static placement and its compaction are not).
    // The full-scan entries' copies run only while the work is under it, in
    // any round.
    // (Perturbing every learned entry in both placements too found more on
    // resnet32 at up to 5x the planning time: docs/history/dtr-experiments.md.)
    let work_limit = work_per_event.saturating_mul(rec.events.len() as u64);
    let in_any_arena = competitive.iter().any(|&(_, _, (in_arena, _))| in_arena);
    // Rounds that simulated a copy (none where no entry competed).
    let mut rounds = 0;
    for seed in 1..=DtrConfig::MAX_PLAN_RESTARTS {
        let Some(extra) = restart_round(
            seed,
            config.plan_restarts,
            in_any_arena,
            planner.work,
            work_limit,
        ) else {
            break;
        };
        let simulated = planner.simulations;
        for &(name, entry, (in_arena, placed)) in &competitive {
            // A full-scan entry's simulation walks whole evicted regions at
            // every decision: its copies run only while planning is light.
            let full_scan = matches!(entry, Entry::Online(..));
            if full_scan && planner.work >= work_limit {
                continue;
            }
            if let Some(copy) = entry.restarted(u64::from(seed), config) {
                planner.try_entry(name, copy, in_arena, placed && !extra)?;
            }
        }
        if planner.simulations > simulated {
            rounds = seed;
        }
    }
    // Plans that move blocks (swap off only: the follower's prefetches time
    // copies by a fixed layout). A schedule that holds a request's bytes
    // but not in one piece slides blocks to open it, as the online step in
    // its compacting arena does, and the plan repeats the same compactions
    // (its moves charged).
    if physical && config.plan_moves && !config.swap.enabled {
        match planner.best_entry {
            // No schedule placed without moves fits: every entry, moving.
            None => {
                for (name, entry) in PORTFOLIO {
                    planner.try_placement(name, entry, Placement::Moving(budget), false)?;
                }
            }
            // The winner's fixed placement may have needed a shrunk budget
            // (more evictions): its schedule at the full budget with moves,
            // taken where it costs less, moves included. Then the entries
            // whose schedule at the full budget, unplaced, already cost less
            // than the best plan, cheapest first: a compacting arena evicts
            // what that budget evicts, plus moves or a window where a hole
            // is missing, so such a schedule is what a moving plan of the
            // entry can approach, and one that cost more is not expected to
            // win (not a proof: the paths may part). Of each entry, its
            // cheapest copy; the other copies while
            // the planning work is under the restarts' limit. Only where
            // moves have a price: free, a moving plan would replace nearly
            // every fixed one.
            Some((name, entry)) if config.move_bandwidth.is_some() => {
                planner.try_placement(name, entry, Placement::Moving(budget), false)?;
                // Simulated with moves: the winner, then (name, seed) of each.
                let mut tried = vec![(name, entry.seed())];
                // Entries one of whose copies was tried after the winner.
                let mut entries_tried: Vec<&str> = Vec::new();
                let mut over = std::mem::take(&mut planner.over_at_budget);
                over.sort_by(|a, b| a.0.total_cmp(&b.0));
                for (ns, name, entry) in over {
                    if planner.best.as_ref().is_none_or(|p| ns >= p.total_ns) {
                        break;
                    }
                    let another_copy = entries_tried.contains(&name);
                    if tried.contains(&(name, entry.seed()))
                        || (another_copy && planner.work >= work_limit)
                    {
                        continue;
                    }
                    tried.push((name, entry.seed()));
                    entries_tried.push(name);
                    planner.try_placement(name, entry, Placement::Moving(budget), false)?;
                }
            }
            Some(_) => {}
        }
    }
    // The swapping pass's winner once more, each swap priced by the stall
    // it is expected to leave once prefetched rather than by its round trip
    // (Capuchin's test: a copy out and back that fits before the next read,
    // beside the copies back already booked, costs nothing). The round trip
    // is what an online step pays; a plan prefetches, so where the link has
    // idle time it may swap storages cheap enough to replay that the round
    // trip never lets it swap. The estimate is optimistic (it cannot see
    // whether the copy's destination will be free a copy time before the
    // read), so the plan competes by its re-timed, placed cost like any
    // other: it is taken only where that is lower. Where the swapping pass
    // placed no schedule (all cut off: its round trips never paid), the
    // recompute-only winner is the entry tried.
    if let Some(swapping) = &swapping {
        if let Some((name, entry)) = planner.best_entry.or(swapping.recompute_winner) {
            planner.hidden = true;
            planner.try_placement(name, entry, Placement::Arena(budget), true)?;
            planner.try_placement(name, entry, Placement::Logical(budget), true)?;
        }
    }
    let Planner {
        best,
        best_entry,
        simulations,
        stall_free_ns,
        mut search,
        ..
    } = planner;
    let plan_ms = started.elapsed().as_secs_f64() * 1e3;
    search.simulations = simulations;
    match best {
        Some(p) if p.total_ns <= measured_ns.min(stall_free_ns) * (1.0 + 1e-9) => Ok((
            Ok(IterationPlan {
                plan_ms,
                simulations,
                restart_rounds: rounds,
                ..p
            }),
            best_entry,
        )),
        p => {
            search.cheapest_over_bound_ns = p.map(|p| p.total_ns);
            Ok((Err(search), None))
        }
    }
}

/// The smallest budget under which the configured policy replays `rec` online
/// within the replayer's first-iteration limit ([`FIRST_ITERATION_LIMIT`] times
/// its first computations: a first step at that budget finishes) and some
/// portfolio entry replays it at a cost of at most `max_overhead` times its
/// first computations (the planned steps after it), found by
/// bisection (to 512 B under a physical budget, where the arena rounds to
/// that, and to 1 B under a logical one). Under a physical budget the first
/// step is simulated in a compacting arena (each request rounded to 512 B, no
/// fragmentation: the floor the online runtime reaches once it falls back to
/// one); the steps after it must either run online there at most
/// `max_overhead` or follow what [`plan_iteration`] makes at the budget (a
/// plan placed without moving blocks), planned with the simulated online
/// step's cost as its bound, as the runtime plans with its recorded step's
/// (which decides what the planner cuts off and which entries it
/// restarts). Each bisection step runs the whole planner, restarts included
/// (`plan_restarts:0` makes the query faster and may raise its answer). (Asking the compacting arena for the
/// portfolio's plans too answered budgets at which no plan could be placed,
/// and the steady step ran online, thrashing.) Bisection assumes feasibility grows with the budget, so
/// where it does not, a smaller feasible budget may exist. `Ok(None)`: not
/// even a budget that holds every allocation of the iteration at once replays
/// it.
pub(crate) fn min_feasible_budget(
    rec: &Arc<Recording>,
    config: &DtrConfig,
    max_overhead: f64,
) -> Result<Option<u64>> {
    let future = Arc::new(future_of(rec));
    let limit_ns = max_overhead * rec.compute_ns() as f64;
    let physical = config.budget_mode == BudgetMode::Physical;
    let step = if physical { ARENA_ALIGN } else { 1 };
    // The first step at the budget runs online with the configured policy:
    // it must finish (within the replayer's first-iteration limit); the steps
    // after it follow a plan, which must cost at most `max_overhead`.
    let first_limit_ns = FIRST_ITERATION_LIMIT.max(max_overhead) * rec.compute_ns() as f64;
    let feasible = |b: u64| -> Result<bool> {
        let how = if physical {
            Placement::Compacting(b)
        } else {
            Placement::Logical(b)
        };
        let config = config.clone().with_budget(b);
        let (online, _) = simulate(
            rec,
            &config,
            Entry::Configured,
            how,
            b,
            Limits::total(first_limit_ns),
            &future,
            config.swap.enabled,
            false,
        )?;
        let Some(online) = online
            .ok()
            .filter(|s| s.total_ns <= first_limit_ns * (1.0 + 1e-9))
        else {
            return Ok(false);
        };
        if online.total_ns <= limit_ns * (1.0 + 1e-9) {
            return Ok(true);
        }
        // The steps after the first follow a plan if the planner makes one
        // within the limit, so ask the planner itself, bounded as the runtime
        // bounds it by the step it recorded: the simulated online step's cost
        // (what simulations are cut off by, and so which entries are
        // restarted; here above the limit), then held to the limit. This
        // approximates the runtime: its recorded step may have been rescued
        // (the simulation has no rescues), and its bound is then at least 2×
        // its computations. Under a physical budget the compacting arena above
        // is the online floor, not a plan: a plan must be placed.
        let bound = online.total_ns;
        let plan = plan_iteration(rec, &config, bound)?;
        Ok(plan.is_ok_and(|p| p.total_ns <= limit_ns * (1.0 + 1e-9)))
    };
    // Every byte the iteration starts with or allocates, each rounded: nothing
    // needs evicting there (in-place ops may copy on write: doubled if short).
    let mut hi: u64 = rec
        .start
        .storages
        .iter()
        .map(|&b| arena_size(b))
        .sum::<u64>()
        + step;
    for e in &rec.events {
        hi += match e {
            Event::Put { bytes } => arena_size(*bytes),
            Event::Apply { outputs, .. } => outputs
                .iter()
                .map(|o| match o {
                    OutputSpec::Fresh { bytes } => arena_size(*bytes),
                    OutputSpec::View { .. } => 0,
                })
                .sum(),
            _ => 0,
        };
    }
    let mut tries = 0;
    while !feasible(hi)? {
        tries += 1;
        if tries > 4 {
            return Ok(None);
        }
        hi = hi.saturating_mul(2);
    }
    let mut lo = 0u64; // taken as infeasible
    while hi - lo > step {
        let mid = (lo + (hi - lo) / 2).div_ceil(step) * step;
        if mid >= hi {
            break;
        }
        if feasible(mid)? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(Some(hi))
}

/// What one placement attempt found.
enum Outcome {
    /// The simulation failed (impossible budget or over the cost limit).
    Infeasible,
    /// It fits the budget (and became the best plan if it is the cheapest).
    /// With the room its swap-ins' prefetches would need beside it, when
    /// they did not fit (bytes, less than the budget).
    Fits(Option<u64>),
    /// Its static placement needs this many bytes, over the budget.
    Over(u64),
}

/// The planner's state while it works through the portfolio.
struct Planner<'a> {
    rec: &'a Arc<Recording>,
    config: &'a DtrConfig,
    budget: u64,
    future: Arc<Future>,
    measured_ns: f64,
    best: Option<IterationPlan>,
    /// The portfolio entry that made `best`.
    best_entry: Option<(&'static str, Entry)>,
    /// The best plan's simulated cost before its swap-ins were re-timed as
    /// prefetched (ns): what later simulations are cut off by. They time
    /// their swap-ins at the read, so against the re-timed cost they would
    /// be cut off before they could show theirs.
    best_simulated: f64,
    /// The largest simulated budget at which a placed schedule fitted.
    placed_fit: Option<u64>,
    /// The entries whose schedule at the full budget ran to the end but
    /// whose fixed placement passed it, with that schedule's cost (ns):
    /// the ones a compacting arena could place at the full budget.
    over_at_budget: Vec<(f64, &'static str, Entry)>,
    simulations: u32,
    /// [`Runtime::decision_work`] plus the recorded events driven, over every
    /// simulation so far (cut-off ones included): a deterministic measure of
    /// the planning time spent.
    work: u64,
    /// The simulations may swap storages out (with swap on in the config).
    swap_outs: bool,
    /// The simulations price each swap by the stall it is expected to leave
    /// once prefetched (`Runtime::price_swaps_by_future`).
    hidden: bool,
    /// What a plan must cost less than, and a simulation without its stalls
    /// (ns): the recompute-only plan's cost in the swapping pass
    /// ([`plan_iteration`]), else infinite.
    stall_free_ns: f64,
    /// What the simulations ran into, reported when no plan comes of them.
    search: NoPlan,
}

impl Planner<'_> {
    /// Simulate one entry in a flat arena (`in_arena`) and logically, then
    /// placed (`placed`). When the placement exceeds the budget, simulate
    /// again under a budget shrunk by the excess, then half-way back while it
    /// fits. A perturbed copy starts at the largest budget where a placed
    /// schedule already fitted and bisects up from there, without trying the
    /// full budget itself. Returns whether each of the two ran to the end
    /// (its first simulation was not cut off as costlier than the best plan).
    fn try_entry(
        &mut self,
        name: &'static str,
        entry: Entry,
        in_arena: bool,
        placed: bool,
    ) -> Result<(bool, bool)> {
        let budget = self.budget;
        let mut done = (false, false);
        if in_arena {
            let outcome = self.try_placement(name, entry, Placement::Arena(budget), false)?;
            done.0 = !matches!(outcome, Outcome::Infeasible);
            if let (Outcome::Fits(Some(room)), 0) = (outcome, entry.seed()) {
                self.try_placement(name, entry, Placement::Arena(budget - room), true)?;
            }
        }
        if !placed {
            return Ok(done);
        }
        let mut fits: Option<u64> = None;
        let mut room: Option<u64> = None;
        let mut over = budget;
        // A perturbed copy starts where a placed schedule already fitted:
        // at the full budget its placement would overflow as the unperturbed
        // one's did, and shrinking there costs simulations and placements.
        let mut b = match entry.seed() {
            0 => budget,
            _ => self.placed_fit.unwrap_or(budget),
        };
        for attempt in 0..SHRINK_ATTEMPTS {
            let outcome = self.try_placement(name, entry, Placement::Logical(b), false)?;
            if attempt == 0 {
                done.1 = !matches!(outcome, Outcome::Infeasible);
            }
            match outcome {
                Outcome::Infeasible => break,
                Outcome::Fits(r) => {
                    if fits.is_none_or(|f| b > f) {
                        room = r;
                    }
                    fits = Some(b);
                    self.placed_fit = self.placed_fit.max(Some(b));
                    if b == budget {
                        break;
                    }
                }
                Outcome::Over(arena) => {
                    over = b;
                    let excess = arena - budget + ARENA_ALIGN;
                    if fits.is_none() && excess < b {
                        b -= excess;
                        continue;
                    }
                }
            }
            let Some(lo) = fits else { break };
            let next = lo + (over - lo) / 2;
            if over - lo <= ARENA_ALIGN || next == b {
                break;
            }
            b = next;
        }
        // Its prefetched swap-ins did not fit beside it: simulate once more
        // with that much room left (unperturbed entries only), to the end:
        // it times its swap-ins at their reads, so it may cost more than the
        // best plan until they are re-timed.
        if let (Some(f), Some(r), 0) = (fits, room, entry.seed()) {
            self.try_placement(name, entry, Placement::Logical(f - r), true)?;
        }
        Ok(done)
    }

    /// Simulate `entry` placed `how`, cut off once it cannot cost less than
    /// the best plan so far (unless `uncut`) or the bound (with swaps priced
    /// by their prefetched stall, `self.hidden`, by the limits below instead),
    /// and keep it if it is the cheapest that fits.
    fn try_placement(
        &mut self,
        name: &'static str,
        entry: Entry,
        how: Placement,
        uncut: bool,
    ) -> Result<Outcome> {
        let limits = if self.hidden {
            // Its swaps are chosen for the stalls prefetching removes: it is
            // cut off by its cost without them, which no prefetch lowers.
            // With them, it may pass the bound by at most the step's
            // computations, the time its copies back can overlap.
            Limits {
                total_ns: self.measured_ns + self.rec.compute_ns() as f64,
                stall_free_ns: self.stall_free_ns.min(self.measured_ns),
            }
        } else {
            Limits {
                total_ns: match uncut {
                    false => self.best_simulated.min(self.measured_ns),
                    true => self.measured_ns,
                },
                stall_free_ns: self.stall_free_ns,
            }
        };
        self.simulations += 1;
        let (sim, work) = simulate(
            self.rec,
            self.config,
            entry,
            how,
            self.budget,
            limits,
            &self.future,
            self.swap_outs,
            self.hidden,
        )?;
        self.work += work;
        let sim = match sim {
            Ok(sim) => sim,
            Err(why) => {
                match why {
                    Infeasible::Impossible => self.search.impossible += 1,
                    Infeasible::TooCostly => self.search.too_costly += 1,
                    Infeasible::Failed => {}
                }
                return Ok(Outcome::Infeasible);
            }
        };
        let (mut offsets, mut arena, simulated_budget, mut mode) = match how {
            // Blocks move: the arena is the budget's.
            Placement::Moving(b) => (sim.offsets, b, b, "moving"),
            Placement::Arena(b) => {
                let arena = sim
                    .requests
                    .iter()
                    .zip(&sim.offsets)
                    .filter(|(r, _)| r.occupies())
                    .map(|(r, o)| o + r.size)
                    .max()
                    .unwrap_or(0);
                (sim.offsets, arena, b, "arena")
            }
            Placement::Logical(b) if self.config.budget_mode == BudgetMode::Physical => {
                let (offsets, arena) = placement(&sim.requests, self.budget);
                (offsets, arena, b, "placed")
            }
            // Logical budgets count bytes as requested: the simulation's own
            // peak is what must fit.
            Placement::Logical(b) | Placement::Compacting(b) => {
                (vec![0; sim.requests.len()], sim.peak, b, "logical")
            }
        };
        let sizes: Vec<u64> = sim.requests.iter().map(|r| r.size).collect();
        // Placed, the plan's swap-ins are prefetched: rank it by that, and
        // place it again with each swap-in's destination kept free from when
        // its copy must start, where that fits the budget and hides more.
        let mut saved = 0.0;
        let mut room = None;
        if let (Some(gbps), BudgetMode::Physical) =
            (self.config.swap.bandwidth_gbps, self.config.budget_mode)
        {
            let npb = 1.0 / gbps;
            let t = &prefetch::Timed::new(&sim.times, &sim.keys);
            // Prefetching saves at most the swap-ins' stalls: a schedule that
            // cannot beat the best plan even so is not re-timed or placed
            // again (each placement is O(n log n) to O(n²) in its requests).
            let most = t.most_saved();
            let can_win = self
                .best
                .as_ref()
                .is_none_or(|p| sim.total_ns - most < p.total_ns);
            if can_win && most > 0.0 {
                saved = prefetch::stalls_saved(t, &offsets, &sizes, npb);
            }
            if can_win && most > 0.0 && arena <= self.budget {
                for reach in [1.0, 0.5] {
                    let Some(ext) = prefetch::reach_back(&sim.requests, t, npb, reach) else {
                        break;
                    };
                    let (o, a) = placement_compacting(&ext, self.budget, false);
                    if a > self.budget {
                        // What the reach added beside the schedule.
                        let extra = a.saturating_sub(arena).next_multiple_of(ARENA_ALIGN);
                        if room.is_none() && extra > 0 && extra < self.budget / 2 {
                            room = Some(extra);
                        }
                        continue;
                    }
                    let s = prefetch::stalls_saved(t, &o, &sizes, npb);
                    if s > saved {
                        (offsets, arena, mode, saved) = (o, a, "prefetch", s);
                    }
                    room = None;
                    break;
                }
            }
        }
        let total_ns = sim.total_ns
            - saved
                .min(sim.total_ns - self.rec.compute_ns() as f64)
                .max(0.0);
        let seed = entry.seed();
        tracing::debug!(target: "remat_dtr::plan", entry = name, seed, mode, simulated_budget, total_ns, arena, "simulated");
        if arena > self.budget {
            self.search.over_budget += 1;
            if self
                .search
                .cheapest_unplaced
                .is_none_or(|(ns, _)| total_ns < ns)
            {
                self.search.cheapest_unplaced = Some((total_ns, arena));
            }
            if how == Placement::Logical(self.budget) {
                self.over_at_budget.push((total_ns, name, entry));
            }
            return Ok(Outcome::Over(arena));
        }
        if self.best.as_ref().is_none_or(|p| total_ns < p.total_ns) {
            self.best_simulated = sim.total_ns;
            self.best_entry = Some((name, entry));
            self.best = Some(IterationPlan {
                recording: self.rec.clone(),
                steps: sim.steps,
                offsets,
                sizes,
                arena_bytes: arena,
                simulated_budget,
                policy: match entry {
                    Entry::Configured => format!("{}/{mode}", self.config.policy.name()),
                    _ if seed != 0 => format!("{name}~{seed}/{mode}"),
                    _ => format!("{name}/{mode}"),
                },
                total_ns,
                bound_ns: sim.total_ns,
                compute_ns: self.rec.compute_ns() as f64,
                plan_ms: 0.0,
                simulations: 0,
                restart_rounds: 0,
                moves: matches!(how, Placement::Moving(_)),
            });
        }
        Ok(Outcome::Fits(room))
    }
}

/// The recording's reads by storage sequence number and the first-computation
/// clock before each event.
fn future_of(rec: &Recording) -> Future {
    let n = rec
        .reads
        .iter()
        .flatten()
        .map(|&s| s as usize + 1)
        .max()
        .unwrap_or(0);
    let mut reads = vec![Vec::new(); n];
    for (i, seqs) in rec.reads.iter().enumerate() {
        for &s in seqs {
            let r: &mut Vec<u32> = &mut reads[s as usize];
            if r.last() != Some(&(i as u32)) {
                r.push(i as u32);
            }
        }
    }
    let mut clock_at = Vec::with_capacity(rec.events.len() + 1);
    let mut clock = 0.0;
    for e in &rec.events {
        clock_at.push(clock);
        clock += e.cost_ns() as f64;
    }
    clock_at.push(clock);
    Future::new(reads, clock_at)
}

/// The smallest arena of the static planner's algorithms: offsets and bytes.
/// When even that passes `budget`, the best of them is compacted until it
/// fits ([`remat_alloc::plan::compact_within`]): eviction schedules stay near the budget
/// for long stretches, where constructive placements leave holes that
/// compaction closes (docs/dtr-results.md, "Compaction").
fn placement(requests: &[PlanRequest], budget: u64) -> (Vec<u64>, u64) {
    placement_compacting(requests, budget, true)
}

/// [`placement`], compacting only with `compact` (an O(n²) search: the
/// prefetch placements, tried once per schedule that may win, go without).
fn placement_compacting(requests: &[PlanRequest], budget: u64, compact: bool) -> (Vec<u64>, u64) {
    let algos: &[Algorithm] = if requests.len() <= GREEDY_MAX_REQUESTS {
        &[Algorithm::SeedSim, Algorithm::GreedyBySize]
    } else {
        &[Algorithm::SeedSim]
    };
    let mut best: Option<Plan> = None;
    for &a in algos {
        if let Ok(p) = place(requests, a) {
            if best.as_ref().is_none_or(|b| p.arena_bytes < b.arena_bytes) {
                best = Some(p);
            }
        }
    }
    let Some(mut best) = best else {
        return (Vec::new(), u64::MAX);
    };
    if compact && best.arena_bytes > budget {
        if let Ok(c) = compact_within(requests, &best, budget) {
            best = c;
        }
    }
    (best.offsets, best.arena_bytes)
}

pub(crate) mod prefetch;
mod simulate;

use simulate::{simulate, Infeasible, Limits};
#[cfg(test)]
mod tests;

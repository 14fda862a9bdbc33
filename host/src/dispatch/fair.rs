//! Fair dispatch: which handler plugins get the free workers of one claim. Pure (no I/O, no
//! clock): the inbox calls [`allot`] inside the claim transaction with the due deliveries it
//! found for each handler.
//!
//! Invariants:
//! - Max-min fair: each free worker goes to the handler with the fewest attempts running
//!   (this claim's picks included) that has a due delivery and room under its cap; ties go to
//!   the older due delivery. Handlers with due work therefore split the workers evenly, and a
//!   backlog of one handler delays another handler's due delivery by at most one attempt (the
//!   time until a worker frees up), or not at all while a worker is held for it.
//! - Work-conserving up to the headroom: a worker stays idle only when no handler that may take
//!   it has a due delivery, or when taking it would lift a handler beyond its fair share while
//!   it is one of the (at most `headroom`) workers held free for handlers with nothing running.
//! - Within a handler, deliveries are taken in the order given (oldest first): `allot` only
//!   decides how many of each handler's list are taken, never which, so per-key order is the
//!   inbox's business alone.

use std::collections::{HashMap, HashSet};

/// How one claim shares the free workers among handler plugins.
#[derive(Debug, Clone, Default)]
pub struct Fairness {
    /// Attempts a handler may run before it counts as borrowing idle workers:
    /// `workers / handler plugins`, at least 1.
    pub share: usize,
    /// Most workers kept free, while a handler borrows, for handlers with nothing running:
    /// `workers / 8` (0 = none is kept).
    pub headroom: usize,
    /// Handler → attempts of it running now (absent: none).
    pub running: HashMap<String, usize>,
    /// Handlers a worker is kept free for while they have nothing running (the ones sources
    /// name); a plugin that is only a parser, or no longer a handler, is not waited for.
    pub held_for: HashSet<String>,
}

impl Fairness {
    /// The rules for `workers` shared among `handler_plugins` handler plugins.
    pub fn new(workers: usize, handler_plugins: usize) -> Self {
        Self {
            share: (workers / handler_plugins.max(1)).max(1),
            headroom: workers / 8,
            running: HashMap::new(),
            held_for: HashSet::new(),
        }
    }

    /// One handler's standing in a claim, with its due deliveries (oldest first).
    pub fn lane<'a>(&self, handler: &str, room: usize, due: &'a [i64]) -> Lane<'a> {
        Lane {
            running: self.running.get(handler).copied().unwrap_or(0),
            room,
            held_for: self.held_for.contains(handler),
            due,
        }
    }
}

/// One handler in a claim.
#[derive(Debug, Clone, Copy)]
pub struct Lane<'a> {
    /// Attempts of it running now.
    pub running: usize,
    /// How many more it may start now (its `max_concurrency` less what runs).
    pub room: usize,
    /// A worker is kept free for it while it has nothing running.
    pub held_for: bool,
    /// Due times of its claimable deliveries, oldest first.
    pub due: &'a [i64],
}

/// Hands out up to `free` workers. Returns the lane index of each worker in the order handed
/// out; a lane's k-th pick takes its k-th due delivery.
pub fn allot(free: usize, rules: &Fairness, lanes: &[Lane<'_>]) -> Vec<usize> {
    let mut given = vec![0usize; lanes.len()];
    let mut picks = Vec::new();
    let load = |given: &[usize], i: usize| lanes[i].running + given[i];
    while picks.len() < free {
        let Some(i) = (0..lanes.len())
            .filter(|&i| given[i] < lanes[i].due.len() && given[i] < lanes[i].room)
            .min_by_key(|&i| (load(&given, i), lanes[i].due[given[i]], i))
        else {
            break;
        };
        if load(&given, i) >= rules.share {
            // Borrowing an idle worker: leave some free for handlers with nothing running, so
            // their next event starts at once. Every other candidate is at least as loaded
            // (so borrowing too), and the same handlers are idle for it: none may take it.
            let idle = (0..lanes.len())
                .filter(|&j| j != i && lanes[j].held_for && load(&given, j) == 0)
                .count();
            if free - picks.len() <= idle.min(rules.headroom) {
                break;
            }
        }
        given[i] += 1;
        picks.push(i);
    }
    picks
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (running, room, held_for, due)
    type Spec = (usize, usize, bool, Vec<i64>);
    /// (what, free, share, headroom, lanes, expected picks per lane)
    type Case = (&'static str, usize, usize, usize, Vec<Spec>, Vec<usize>);

    fn run(free: usize, share: usize, headroom: usize, specs: &[Spec]) -> Vec<usize> {
        let rules = Fairness {
            share,
            headroom,
            ..Fairness::default()
        };
        let lanes: Vec<Lane> = specs
            .iter()
            .map(|(running, room, held_for, due)| Lane {
                running: *running,
                room: *room,
                held_for: *held_for,
                due,
            })
            .collect();
        allot(free, &rules, &lanes)
    }

    fn counts(picks: &[usize], lanes: usize) -> Vec<usize> {
        let mut counts = vec![0; lanes];
        for &i in picks {
            counts[i] += 1;
        }
        counts
    }

    const MANY: usize = usize::MAX;

    fn backlog(n: i64) -> Vec<i64> {
        (0..n).collect()
    }

    #[test]
    fn table() {
        let cases: Vec<Case> = vec![
            (
                "alone with work, a handler takes every idle worker",
                64,
                32,
                8,
                vec![(0, MANY, true, backlog(1000))],
                vec![64],
            ),
            (
                "two backlogs split the workers evenly",
                64,
                32,
                8,
                vec![
                    (0, MANY, true, backlog(1000)),
                    (0, MANY, true, backlog(1000)),
                ],
                vec![32, 32],
            ),
            (
                "a freed worker goes to the handler with fewer running, however old the other's backlog",
                1,
                32,
                8,
                vec![
                    (63, MANY, true, backlog(100_000)),
                    (0, MANY, true, vec![1_000_000]),
                ],
                vec![0, 1],
            ),
            (
                "one worker is kept for each idle handler while another borrows",
                64,
                21,
                8,
                vec![
                    (0, MANY, true, backlog(1000)),
                    (0, MANY, true, vec![]),
                    (0, MANY, true, vec![]),
                ],
                vec![62, 0, 0],
            ),
            (
                "the kept workers are bounded by the headroom",
                64,
                6,
                8,
                vec![
                    (0, MANY, true, backlog(1000)),
                    (0, MANY, true, vec![]),
                    (0, MANY, true, vec![]),
                    (0, MANY, true, vec![]),
                    (0, MANY, true, vec![]),
                    (0, MANY, true, vec![]),
                    (0, MANY, true, vec![]),
                    (0, MANY, true, vec![]),
                    (0, MANY, true, vec![]),
                    (0, MANY, true, vec![]),
                ],
                vec![56, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            ),
            (
                "nothing is kept below eight workers (no headroom)",
                4,
                2,
                0,
                vec![(0, MANY, true, backlog(10)), (0, MANY, true, vec![])],
                vec![4, 0],
            ),
            (
                "the fair share itself is never held back",
                2,
                2,
                8,
                vec![(0, MANY, true, backlog(10)), (0, MANY, true, vec![])],
                vec![2, 0],
            ),
            (
                "no worker is kept for a handler that already runs something",
                4,
                2,
                8,
                vec![(10, MANY, true, backlog(10)), (1, MANY, true, vec![])],
                vec![4, 0],
            ),
            (
                "no worker is kept for a plugin no source names as a handler",
                4,
                2,
                8,
                vec![(10, MANY, true, backlog(10)), (0, MANY, false, vec![])],
                vec![4, 0],
            ),
            (
                "an explicit cap bounds a handler; its unused share goes to the others",
                10,
                5,
                1,
                vec![(0, 2, true, backlog(100)), (0, MANY, true, backlog(100))],
                vec![2, 8],
            ),
            (
                "a handler takes no more than it has due",
                10,
                5,
                0,
                vec![(0, MANY, true, backlog(3)), (0, MANY, true, backlog(100))],
                vec![3, 7],
            ),
            (
                "nothing free, nothing handed out",
                0,
                5,
                0,
                vec![(0, MANY, true, backlog(3))],
                vec![0],
            ),
            (
                "uneven standing is evened out first",
                6,
                5,
                0,
                vec![(4, MANY, true, backlog(100)), (0, MANY, true, backlog(100))],
                vec![1, 5],
            ),
        ];
        for (what, free, share, headroom, specs, expected) in cases {
            let picks = run(free, share, headroom, &specs);
            assert_eq!(counts(&picks, specs.len()), expected, "{what}");
        }
    }

    #[test]
    fn equal_loads_go_oldest_first() {
        // Both idle: the older due delivery first, then alternating by load.
        let picks = run(
            4,
            8,
            0,
            &[(0, MANY, true, vec![50, 60]), (0, MANY, true, vec![10, 70])],
        );
        assert_eq!(picks, [1, 0, 0, 1]);
    }

    #[test]
    fn the_new_event_is_first_when_its_handler_runs_least() {
        let picks = run(
            3,
            1,
            0,
            &[
                (5, MANY, true, backlog(100)),
                (0, MANY, true, vec![i64::MAX]),
            ],
        );
        assert_eq!(picks[0], 1);
    }

    /// Randomized: the invariants hold for any standing.
    #[test]
    fn invariants_hold_for_random_standings() {
        use rand::{Rng, SeedableRng, rngs::StdRng};
        let mut rng = StdRng::seed_from_u64(0x0fa1);
        for round in 0..5_000 {
            let workers = rng.random_range(1..=80usize);
            let handlers = rng.random_range(1..=6usize);
            let rules = Fairness::new(workers, handlers);
            let mut running_total = 0;
            let mut specs: Vec<Spec> = Vec::new();
            for _ in 0..handlers {
                let running = rng.random_range(0..=workers - running_total.min(workers));
                running_total += running;
                let room = if rng.random_bool(0.3) {
                    rng.random_range(0..=8)
                } else {
                    MANY
                };
                let due: Vec<i64> = {
                    let mut due: Vec<i64> = (0..rng.random_range(0..=40))
                        .map(|_| rng.random_range(0..1000))
                        .collect();
                    due.sort();
                    due
                };
                specs.push((running, room, rng.random_bool(0.8), due));
            }
            let free = workers.saturating_sub(running_total);
            let picks = run(free, rules.share, rules.headroom, &specs);
            let got = counts(&picks, handlers);
            let ctx = format!("round {round}: free {free}, {rules:?}, {specs:?} → {got:?}");
            assert!(picks.len() <= free, "{ctx}");
            for (i, (running, room, _, due)) in specs.iter().enumerate() {
                assert!(got[i] <= *room && got[i] <= due.len(), "{ctx}");
                // Max-min: nobody that could still take one ends up more than one below a
                // handler that took some.
                let wants_more = got[i] < (*room).min(due.len());
                for (j, (running_j, ..)) in specs.iter().enumerate() {
                    if wants_more && got[j] > 0 {
                        assert!(running + got[i] + 1 >= running_j + got[j], "{ctx}");
                    }
                }
            }
            // Work-conserving up to the headroom: idle workers left while someone could take
            // one are only the ones held free for idle handlers.
            let left = free - picks.len();
            let could = specs
                .iter()
                .enumerate()
                .any(|(i, (_, room, _, due))| got[i] < (*room).min(due.len()));
            if could {
                assert!(left <= rules.headroom, "{ctx}");
                let idle = specs
                    .iter()
                    .enumerate()
                    .filter(|(i, (running, _, held, _))| *held && running + got[*i] == 0)
                    .count();
                assert!(left <= idle, "{ctx}");
            }
        }
    }
}

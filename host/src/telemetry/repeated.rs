//! Log lines that a lasting fault would repeat many times a second (a descriptor limit reached,
//! a disk full or gone): the first is written, then at most one per period, saying how many
//! were left out, so the log stays readable and its disk is not filled by the fault itself.
//!
//! Invariants:
//! - No occurrence is lost from the count while the process runs. Each line says how many came
//!   since the last one written; those left out after the last line of a burst, which no later
//!   line would report, are reported by a line of their own once a whole period has passed
//!   without another (`…: N more in the 10 s after the last such line, none since`), written
//!   from a short-lived thread of this module's. (What is left out in the last period before
//!   the process exits is not reported.)
//! - That report never stands in for a line: while the fault lasts, a line with its fields is
//!   written every period, as before.

use std::{
    borrow::Cow,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tracing::Level;

/// How often a repeated line is written at most.
pub const REPEAT_EVERY: Duration = Duration::from_secs(10);

/// One kind of repeated log line (a `static` at its call site, or one per source or plugin).
pub struct Repeated {
    inner: Arc<Inner>,
}

struct Inner {
    /// What the lines say (their message, or its start), for the report of those left out.
    what: Cow<'static, str>,
    /// The lines' level, which that report takes too.
    level: Level,
    period: Duration,
    /// Starts what reports those left out ([`report_on_a_thread`]).
    start_reporter: StartReporter,
    state: Mutex<State>,
}

/// Starts what reports the occurrences left out once a period passes without another, and says
/// whether it started: [`report_on_a_thread`], or in this module's tests of the clock-driven
/// steps nothing (they take its place).
type StartReporter = fn(Arc<Inner>) -> bool;

/// A short-lived thread waits for a quiet period, then reports ([`Inner::report_when_quiet`]).
fn report_on_a_thread(inner: Arc<Inner>) -> bool {
    std::thread::Builder::new()
        .name("hookd-repeated".into())
        .spawn(move || inner.report_when_quiet())
        .is_ok()
}

#[derive(Default)]
struct State {
    /// When the last line was written.
    last: Option<Instant>,
    /// Occurrences left out since.
    left_out: u64,
    /// When the last of them came.
    last_left_out: Option<Instant>,
    /// A thread waits to report them.
    armed: bool,
    /// When starting that thread last failed (it is not tried again within a period).
    spawn_failed: Option<Instant>,
}

impl Repeated {
    /// Lines at `level` saying `what` (e.g. `accept failed`).
    pub fn new(level: Level, what: impl Into<Cow<'static, str>>) -> Self {
        Self::with_period(level, what, REPEAT_EVERY, report_on_a_thread)
    }

    fn with_period(
        level: Level,
        what: impl Into<Cow<'static, str>>,
        period: Duration,
        start_reporter: StartReporter,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                what: what.into(),
                level,
                period,
                start_reporter,
                state: Mutex::default(),
            }),
        }
    }

    /// Whether this occurrence is written: `Some(occurrences left out since the last line
    /// written)`, or `None` (counted, to be reported by the next line written, or by a report
    /// of its own once a period passes without another).
    pub fn write(&self) -> Option<u64> {
        self.write_at(Instant::now())
    }

    fn write_at(&self, now: Instant) -> Option<u64> {
        let period = self.inner.period;
        let mut state = self.inner.lock();
        if state
            .last
            .is_some_and(|at| now.saturating_duration_since(at) < period)
        {
            state.left_out += 1;
            state.last_left_out = Some(now);
            let may_spawn = state
                .spawn_failed
                .is_none_or(|at| now.saturating_duration_since(at) >= period);
            if !state.armed && may_spawn {
                // Without a reporter the count waits for the next line, as it always did.
                let spawned = (self.inner.start_reporter)(Arc::clone(&self.inner));
                state.armed = spawned;
                state.spawn_failed = (!spawned).then_some(now);
            }
            return None;
        }
        state.last = Some(now);
        state.last_left_out = None;
        Some(std::mem::take(&mut state.left_out))
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until a whole period has passed since the last occurrence left out, then reports
    /// those still left out; a line written meanwhile took the count, and nothing is reported.
    fn report_when_quiet(&self) {
        loop {
            let wait = match self.take_quiet(Instant::now()) {
                Quiet::Report(left_out) => return self.report(left_out),
                Quiet::Nothing => return,
                Quiet::NotYet(wait) => wait,
            };
            std::thread::sleep(wait);
        }
    }

    /// What the waiting thread does now (disarmed, under the same lock, unless it waits on).
    fn take_quiet(&self, now: Instant) -> Quiet {
        let mut state = self.lock();
        let Some(last_left_out) = state.last_left_out.filter(|_| state.left_out > 0) else {
            state.armed = false;
            return Quiet::Nothing;
        };
        let quiet_at = last_left_out + self.period;
        if now < quiet_at {
            return Quiet::NotYet(quiet_at - now);
        }
        state.armed = false;
        state.last_left_out = None;
        Quiet::Report(std::mem::take(&mut state.left_out))
    }

    fn report(&self, left_out: u64) {
        let (what, secs) = (&self.what, self.period.as_secs());
        let line =
            format!("{what}: {left_out} more in the {secs} s after the last such line, none since");
        match self.level {
            Level::ERROR => tracing::error!(left_out, "{line}"),
            Level::WARN => tracing::warn!(left_out, "{line}"),
            _ => tracing::info!(left_out, "{line}"),
        }
    }
}

/// What [`Inner::take_quiet`] found.
#[derive(Debug, PartialEq)]
enum Quiet {
    /// Report this many left out.
    Report(u64),
    /// Nothing left to report.
    Nothing,
    /// Look again after this long.
    NotYet(Duration),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_line_is_written_then_one_per_period_counting_those_left_out() {
        let repeated = Repeated::with_period(Level::WARN, "t", REPEAT_EVERY, |_| true);
        let start = Instant::now();
        assert_eq!(repeated.write_at(start), Some(0));
        for ms in [1, 500, 9_999] {
            assert_eq!(repeated.write_at(start + Duration::from_millis(ms)), None);
        }
        assert_eq!(repeated.write_at(start + REPEAT_EVERY), Some(3));
        assert_eq!(repeated.write_at(start + REPEAT_EVERY * 3), Some(0));
    }

    /// Those left out after the last line of a burst are reported once a whole period passed
    /// without another, once; while the fault lasts, lines are written as before (a report never
    /// stands in for one).
    #[test]
    fn the_last_ones_left_out_are_reported_once_a_period_passes_without_another() {
        let ms = Duration::from_millis;
        let repeated = Repeated::with_period(Level::WARN, "t", ms(100), |_| true);
        let inner = &repeated.inner;
        let start = Instant::now();
        assert_eq!(repeated.write_at(start), Some(0));
        assert_eq!(repeated.write_at(start + ms(10)), None);
        assert_eq!(repeated.write_at(start + ms(60)), None);
        assert!(inner.lock().armed);
        assert_eq!(
            inner.take_quiet(start + ms(120)),
            Quiet::NotYet(ms(40)),
            "one came 60 ms ago"
        );
        assert_eq!(inner.take_quiet(start + ms(160)), Quiet::Report(2));
        assert_eq!(inner.take_quiet(start + ms(170)), Quiet::Nothing);
        assert!(!inner.lock().armed);
        // The next occurrence is a line again, and so is one every period while it lasts.
        assert_eq!(repeated.write_at(start + ms(170)), Some(0));
        assert_eq!(repeated.write_at(start + ms(200)), None);
        assert_eq!(repeated.write_at(start + ms(270)), Some(1));
        assert_eq!(inner.take_quiet(start + ms(400)), Quiet::Nothing, "taken");
    }

    /// The thread does it by itself, on the real clock.
    #[test]
    fn a_thread_reports_them_unasked() {
        let repeated = Repeated::with_period(
            Level::WARN,
            "t",
            Duration::from_millis(50),
            report_on_a_thread,
        );
        assert_eq!(repeated.write(), Some(0));
        assert_eq!(repeated.write(), None);
        let deadline = Instant::now() + Duration::from_secs(30);
        while repeated.inner.lock().armed {
            assert!(Instant::now() < deadline, "reported within 30 s");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(repeated.inner.lock().left_out, 0, "taken by the report");
    }
}

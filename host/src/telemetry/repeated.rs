//! Log lines that a lasting fault would repeat many times a second (a descriptor limit reached,
//! a disk full or gone): the first is written, then at most one per period, saying how many
//! were left out, so the log stays readable and its disk is not filled by the fault itself.
//!
//! Invariant: no occurrence is lost from the count. Each line says how many came since the last
//! one written; and those left out after the last line of a burst, which no later line would
//! report, are reported once its period is over by a line of their own (`…: N more in the 10 s
//! after the last line about it`), written from a short-lived thread of this module's, so a
//! fault that stopped is seen to have stopped, with its full count.

use std::{
    borrow::Cow,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tracing::Level;

/// How often a repeated line is written at most.
pub const REPEAT_EVERY: Duration = Duration::from_secs(10);

/// One kind of repeated log line (a `static` at its call site, or one per source).
pub struct Repeated {
    inner: Arc<Inner>,
}

struct Inner {
    /// What the lines are about, for the line that reports the last ones left out.
    what: Cow<'static, str>,
    /// The lines' level, which that line takes too.
    level: Level,
    period: Duration,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// When the last line was written.
    last: Option<Instant>,
    /// Occurrences left out since.
    left_out: u64,
    /// A thread waits to report them when the period is over.
    armed: bool,
}

impl Repeated {
    /// Lines at `level` about `what` (e.g. `accepting connections failed`).
    pub fn new(level: Level, what: impl Into<Cow<'static, str>>) -> Self {
        Self::with_period(level, what, REPEAT_EVERY)
    }

    fn with_period(level: Level, what: impl Into<Cow<'static, str>>, period: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                what: what.into(),
                level,
                period,
                state: Mutex::default(),
            }),
        }
    }

    /// Whether this occurrence is written: `Some(occurrences left out since the last line
    /// written)`, or `None` (counted, to be reported by the next line written, or by a line of
    /// its own once the period is over).
    pub fn write(&self) -> Option<u64> {
        self.write_at(Instant::now())
    }

    fn write_at(&self, now: Instant) -> Option<u64> {
        let mut state = self.inner.lock();
        if state
            .last
            .is_some_and(|at| now.saturating_duration_since(at) < self.inner.period)
        {
            state.left_out += 1;
            if !state.armed {
                let inner = Arc::clone(&self.inner);
                // Without a thread the count waits for the next line, as it always did.
                state.armed = std::thread::Builder::new()
                    .name("hookd-repeated".into())
                    .spawn(move || inner.report_when_due())
                    .is_ok();
            }
            return None;
        }
        state.last = Some(now);
        Some(std::mem::take(&mut state.left_out))
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for the end of the period in which occurrences were left out and reports them,
    /// unless a line written meanwhile took the count (then waits for that line's period).
    fn report_when_due(&self) {
        loop {
            let Some(due) = self.lock().last.map(|at| at + self.period) else {
                return;
            };
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            if let Some(left_out) = self.take_due(Instant::now()) {
                self.report(left_out);
                return;
            }
            if !self.lock().armed {
                return;
            }
        }
    }

    /// The occurrences left out, if the period since the last line is over (they are then
    /// written as a line of their own, stamped now); disarms once nothing is left to report.
    fn take_due(&self, now: Instant) -> Option<u64> {
        let mut state = self.lock();
        if state.left_out == 0 {
            state.armed = false;
            return None;
        }
        let over = state
            .last
            .is_none_or(|at| now.saturating_duration_since(at) >= self.period);
        if !over {
            return None;
        }
        state.last = Some(now);
        state.armed = false;
        Some(std::mem::take(&mut state.left_out))
    }

    fn report(&self, left_out: u64) {
        let (what, secs) = (&self.what, self.period.as_secs());
        let line = format!("{what}: {left_out} more in the {secs} s after the last line about it");
        match self.level {
            Level::ERROR => tracing::error!(left_out, "{line}"),
            Level::WARN => tracing::warn!(left_out, "{line}"),
            _ => tracing::info!(left_out, "{line}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_line_is_written_then_one_per_period_counting_those_left_out() {
        let repeated = Repeated::new(Level::WARN, "t");
        let start = Instant::now();
        assert_eq!(repeated.write_at(start), Some(0));
        for ms in [1, 500, 9_999] {
            assert_eq!(repeated.write_at(start + Duration::from_millis(ms)), None);
        }
        assert_eq!(repeated.write_at(start + REPEAT_EVERY), Some(3));
        assert_eq!(repeated.write_at(start + REPEAT_EVERY * 3), Some(0));
    }

    /// The occurrences after the last line of a burst are reported once its period is over,
    /// once, by the waiting thread; a line written meanwhile takes the count instead.
    #[test]
    fn the_last_ones_left_out_are_reported_when_the_period_is_over() {
        let period = Duration::from_millis(100);
        let repeated = Repeated::with_period(Level::WARN, "t", period);
        let inner = &repeated.inner;
        let start = Instant::now();
        assert_eq!(repeated.write_at(start), Some(0));
        assert_eq!(repeated.write_at(start), None);
        assert_eq!(repeated.write_at(start), None);
        assert!(inner.lock().armed);
        assert_eq!(inner.take_due(start + period / 2), None, "not yet");
        assert_eq!(inner.take_due(start + period), Some(2));
        assert_eq!(inner.take_due(start + period * 3), None, "reported once");
        assert!(!inner.lock().armed);
        // The thread: what it finds left out when the period is over, it reports.
        let start = Instant::now();
        assert_eq!(repeated.write_at(start), None, "within the report's period");
        let deadline = Instant::now() + Duration::from_secs(10);
        while inner.lock().armed {
            assert!(Instant::now() < deadline, "reported within the period");
            std::thread::sleep(Duration::from_millis(10));
        }
        let state = inner.lock();
        assert_eq!(state.left_out, 0);
        assert!(state.last.is_some_and(|at| at >= start + period));
    }
}

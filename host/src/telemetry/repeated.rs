//! Log lines that a lasting fault would repeat many times a second (a descriptor limit reached,
//! a disk full or gone): the first is written, then at most one per period, saying how many
//! were left out, so the log stays readable and its disk is not filled by the fault itself.
//!
//! Invariant: no occurrence is lost from the count: each line says how many came since the
//! last one written.

use std::{
    sync::Mutex,
    time::{Duration, Instant},
};

/// How often a repeated line is written at most.
pub const REPEAT_EVERY: Duration = Duration::from_secs(10);

/// One kind of repeated log line (a `static` at its call site).
pub struct Repeated {
    /// When the last line was written, and the occurrences left out since.
    state: Mutex<(Option<Instant>, u64)>,
}

impl Repeated {
    pub const fn new() -> Self {
        Self {
            state: Mutex::new((None, 0)),
        }
    }

    /// Whether this occurrence is written: `Some(occurrences left out since the last line
    /// written)`, or `None` (counted, to be reported by the next line written).
    pub fn write(&self) -> Option<u64> {
        self.write_at(Instant::now())
    }

    fn write_at(&self, now: Instant) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (last, left_out) = &mut *state;
        if last.is_some_and(|at| now.saturating_duration_since(at) < REPEAT_EVERY) {
            *left_out += 1;
            return None;
        }
        *last = Some(now);
        Some(std::mem::take(left_out))
    }
}

impl Default for Repeated {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_line_is_written_then_one_per_period_counting_those_left_out() {
        let repeated = Repeated::new();
        let start = Instant::now();
        assert_eq!(repeated.write_at(start), Some(0));
        for ms in [1, 500, 9_999] {
            assert_eq!(repeated.write_at(start + Duration::from_millis(ms)), None);
        }
        assert_eq!(repeated.write_at(start + REPEAT_EVERY), Some(3));
        assert_eq!(repeated.write_at(start + REPEAT_EVERY * 3), Some(0));
    }
}

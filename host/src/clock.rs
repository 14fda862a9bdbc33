//! The host's one source of wall-clock time: the unix milliseconds that due times, leases,
//! receipt times and retry schedules are stored in.
//!
//! Invariant: `dispatch` and `inbox` never call `SystemTime::now()` themselves; they ask the
//! [`Clock`] they were given. Production uses [`Clock::system`]. Tests use [`Clock::tokio`],
//! which follows tokio's clock, so under `tokio::time::pause()` a 30-second backoff or lease
//! passes as soon as the runtime has nothing else to do, instead of a real sleep.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Where "now" comes from. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Clock(Source);

#[derive(Debug, Clone, Default)]
enum Source {
    /// The operating system's wall clock.
    #[default]
    System,
    /// Wall time at `start`, advanced by tokio's clock (which may be paused and auto-advanced).
    Tokio {
        wall_at_start: SystemTime,
        start: tokio::time::Instant,
    },
}

impl Clock {
    /// The operating system's wall clock.
    pub fn system() -> Self {
        Self(Source::System)
    }

    /// Today's wall time, advancing with tokio's clock from here on. Call it inside a runtime
    /// whose time may be paused (`#[tokio::test(start_paused = true)]`).
    pub fn tokio() -> Self {
        Self(Source::Tokio {
            wall_at_start: SystemTime::now(),
            start: tokio::time::Instant::now(),
        })
    }

    /// Now.
    pub fn now(&self) -> SystemTime {
        match &self.0 {
            Source::System => SystemTime::now(),
            Source::Tokio {
                wall_at_start,
                start,
            } => *wall_at_start + start.elapsed(),
        }
    }

    /// Now, in unix milliseconds (what the inbox stores).
    pub fn now_ms(&self) -> i64 {
        unix_ms(self.now())
    }
}

/// `time` in unix milliseconds; 0 for a time before 1970.
pub fn unix_ms(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis() as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_tokio_clock_follows_paused_time() {
        let clock = Clock::tokio();
        let before = clock.now_ms();
        tokio::time::sleep(Duration::from_secs(30)).await;
        let after = clock.now_ms();
        assert_eq!(after - before, 30_000);
    }

    #[test]
    fn the_system_clock_is_wall_time() {
        let wall = unix_ms(SystemTime::now());
        assert!((Clock::system().now_ms() - wall).abs() < 5_000);
    }
}

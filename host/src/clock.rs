//! The host's one source of wall-clock time: the unix milliseconds that due times, leases,
//! receipt times and retry schedules are stored in.
//!
//! Invariants:
//! - `dispatch` and `inbox` never call `SystemTime::now()` themselves; they ask the [`Clock`]
//!   they were given. Production uses [`Clock::system`]. Tests use [`Clock::tokio`], which
//!   follows tokio's clock, so under `tokio::time::pause()` a 30-second backoff or lease passes
//!   as soon as the runtime has nothing else to do, instead of a real sleep.
//! - On a shared database the system clock follows the database server's: the cluster's
//!   heartbeat measures the difference ([`Clock::follow`]), so every node stamps and compares
//!   leases and due times on one clock, whatever its own says. A tokio clock never follows.

use std::{
    sync::{
        Arc,
        atomic::{AtomicI64, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

/// Where "now" comes from. Cheap to clone; clones share what [`Clock::follow`] sets.
#[derive(Debug, Clone, Default)]
pub struct Clock {
    source: Source,
    /// Milliseconds added to the system clock's time: the database's clock minus this host's.
    offset_ms: Arc<AtomicI64>,
}

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
        Self::default()
    }

    /// Today's wall time, advancing with tokio's clock from here on. Call it inside a runtime
    /// whose time may be paused (`#[tokio::test(start_paused = true)]`).
    pub fn tokio() -> Self {
        Self {
            source: Source::Tokio {
                wall_at_start: SystemTime::now(),
                start: tokio::time::Instant::now(),
            },
            offset_ms: Arc::default(),
        }
    }

    /// Now.
    pub fn now(&self) -> SystemTime {
        let local = self.local();
        match self.offset_ms.load(Ordering::Relaxed) {
            0 => local,
            ms @ 1.. => local + Duration::from_millis(ms as u64),
            ms => local - Duration::from_millis(ms.unsigned_abs()),
        }
    }

    /// Now by the clock this one reads, before any [`Clock::follow`].
    fn local(&self) -> SystemTime {
        match &self.source {
            Source::System => SystemTime::now(),
            Source::Tokio {
                wall_at_start,
                start,
            } => *wall_at_start + start.elapsed(),
        }
    }

    /// [`Clock::local`] in unix milliseconds: what a reading of another clock is compared with.
    pub fn local_ms(&self) -> i64 {
        unix_ms(self.local())
    }

    /// Follows another clock from now on (every clone too), given `offset_ms`, its time minus
    /// [`Clock::local_ms`]. Returns whether this moved the clock: an offset within
    /// [`FOLLOW_STEP_MS`] of the one followed already is left alone (two readings of clocks in
    /// step differ by their round trip's noise, and following that would only add jitter), and
    /// a tokio clock never follows (its time is the test's).
    pub fn follow(&self, offset_ms: i64) -> bool {
        if !matches!(self.source, Source::System) {
            return false;
        }
        let current = self.offset_ms.load(Ordering::Relaxed);
        if (offset_ms - current).abs() < FOLLOW_STEP_MS {
            return false;
        }
        self.offset_ms.store(offset_ms, Ordering::Relaxed);
        true
    }

    /// The offset [`Clock::follow`] set (0 if none).
    pub fn offset_ms(&self) -> i64 {
        self.offset_ms.load(Ordering::Relaxed)
    }

    /// Now, in unix milliseconds (what the inbox stores).
    pub fn now_ms(&self) -> i64 {
        unix_ms(self.now())
    }
}

/// The smallest change of offset [`Clock::follow`] acts on, in milliseconds: far below a lease's
/// margin, far above a loopback or LAN round trip.
pub const FOLLOW_STEP_MS: i64 = 100;

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

    #[test]
    fn a_followed_offset_moves_every_clone_and_noise_moves_nothing() {
        let clock = Clock::system();
        let clone = clock.clone();
        assert!(!clock.follow(FOLLOW_STEP_MS - 1), "noise is not followed");
        assert_eq!(clone.offset_ms(), 0);
        assert!(clock.follow(-60_000));
        let behind = unix_ms(SystemTime::now()) - clone.now_ms();
        assert!((59_000..61_000).contains(&behind), "{behind}");
        assert!((clone.local_ms() - unix_ms(SystemTime::now())).abs() < 1_000);
        assert!(!clone.follow(-60_000 + FOLLOW_STEP_MS - 1));
        assert!(clone.follow(0), "back in step");
        assert!((clock.now_ms() - unix_ms(SystemTime::now())).abs() < 1_000);
    }

    #[tokio::test(start_paused = true)]
    async fn a_tokio_clock_never_follows() {
        let clock = Clock::tokio();
        assert!(!clock.follow(60_000));
        assert_eq!(clock.offset_ms(), 0);
    }
}

//! The host's one source of wall-clock time: the unix milliseconds that due times, leases,
//! receipt times and retry schedules are stored in.
//!
//! Invariants:
//! - `dispatch` and `inbox` never call `SystemTime::now()` themselves; they ask the [`Clock`]
//!   they were given. Production uses [`Clock::system`]. Tests use [`Clock::tokio`], which
//!   follows tokio's clock, so under `tokio::time::pause()` a 30-second backoff or lease passes
//!   as soon as the runtime has nothing else to do, instead of a real sleep.
//! - On a shared database the system clock follows the database server's: the cluster's
//!   heartbeat reads it ([`Clock::follow`]), so every node stamps and compares leases and due
//!   times on one clock, whatever its own says. A followed time runs on the monotonic clock from
//!   the reading it came from, so a step of this machine's own clock (an NTP correction, a
//!   manual `date`) changes nothing until a reading says so. While the two are within
//!   [`FOLLOW_STEP_MS`] the system clock is used as it is. A tokio clock never follows.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

/// Where "now" comes from. Cheap to clone; clones share what [`Clock::follow`] sets.
#[derive(Debug, Clone, Default)]
pub struct Clock {
    source: Source,
    /// The other clock's time at a monotonic instant, once it is followed.
    followed: Arc<Mutex<Option<Reading>>>,
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

/// One reading of another clock: its time, in unix milliseconds, at a monotonic instant (the
/// middle of the round trip that read it), and how long that round trip took.
#[derive(Debug, Clone, Copy)]
pub struct Reading {
    pub time_ms: i64,
    pub at: Instant,
    pub round_trip: Duration,
}

impl Reading {
    /// The other clock's time now, as this reading and the monotonic clock tell.
    fn now_ms(&self) -> i64 {
        self.time_ms + self.at.elapsed().as_millis() as i64
    }
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
            followed: Arc::default(),
        }
    }

    /// Now.
    pub fn now(&self) -> SystemTime {
        match self.followed() {
            Some(reading) => from_unix_ms(reading.now_ms()),
            None => self.local(),
        }
    }

    fn followed(&self) -> Option<Reading> {
        *self.followed.lock().unwrap_or_else(|e| e.into_inner())
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

    /// Follows the clock `reading` was taken of, from now on (every clone too), if it is worth
    /// acting on: only when this clock's time at the reading differs from it by more than
    /// [`FOLLOW_STEP_MS`] plus half the reading's round trip (less is the reading's own noise,
    /// and following it would only add jitter). Where the system clock is itself that close,
    /// it is used again as it is. A tokio clock never follows (its time is the test's).
    /// Returns the other clock's time minus this machine's, in milliseconds, if this changed
    /// what the clock follows.
    pub fn follow(&self, reading: Reading) -> Option<i64> {
        if !matches!(self.source, Source::System) {
            return None;
        }
        let since = reading.at.elapsed();
        let local_at_reading = unix_ms(self.local()) - since.as_millis() as i64;
        let ours_at_reading = unix_ms(self.now()) - since.as_millis() as i64;
        let noise = FOLLOW_STEP_MS + (reading.round_trip.as_millis() as i64) / 2;
        if (reading.time_ms - ours_at_reading).abs() <= noise {
            return None;
        }
        let offset_ms = reading.time_ms - local_at_reading;
        let follow = (offset_ms.abs() > noise).then_some(reading);
        *self.followed.lock().unwrap_or_else(|e| e.into_inner()) = follow;
        Some(offset_ms)
    }

    /// The followed clock's time minus this machine's, in milliseconds (0 while the system
    /// clock is used as it is).
    pub fn offset_ms(&self) -> i64 {
        self.followed()
            .map_or(0, |reading| reading.now_ms() - unix_ms(self.local()))
    }

    /// Now, in unix milliseconds (what the inbox stores).
    pub fn now_ms(&self) -> i64 {
        unix_ms(self.now())
    }
}

/// The difference from a followed clock below which a reading is noise, in milliseconds: far
/// below a lease's margin, far above a loopback or LAN round trip.
pub const FOLLOW_STEP_MS: i64 = 100;

/// Unix milliseconds as a time (times before 1970 as 1970).
fn from_unix_ms(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)
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

    /// A reading of a clock `offset_ms` from the system's, taken now over `round_trip_ms`.
    fn reading(offset_ms: i64, round_trip_ms: u64) -> Reading {
        Reading {
            time_ms: unix_ms(SystemTime::now()) + offset_ms,
            at: Instant::now(),
            round_trip: Duration::from_millis(round_trip_ms),
        }
    }

    #[test]
    fn a_followed_clock_moves_every_clone_and_noise_moves_nothing() {
        let clock = Clock::system();
        let clone = clock.clone();
        assert_eq!(clock.follow(reading(FOLLOW_STEP_MS - 20, 2)), None, "noise");
        assert_eq!(
            clock.follow(reading(FOLLOW_STEP_MS + 300, 900)),
            None,
            "a slow reading's noise"
        );
        assert_eq!(clone.offset_ms(), 0);
        let offset = clock.follow(reading(-60_000, 2)).unwrap();
        assert!((-60_100..-59_900).contains(&offset), "{offset}");
        let behind = unix_ms(SystemTime::now()) - clone.now_ms();
        assert!((59_000..61_000).contains(&behind), "{behind}");
        assert!((-61_000..-59_000).contains(&clone.offset_ms()));
        assert_eq!(
            clone.follow(reading(-60_000 + 50, 2)),
            None,
            "noise around the followed"
        );
        assert!(clone.follow(reading(0, 2)).is_some(), "back in step");
        assert_eq!(clock.offset_ms(), 0);
        assert!((clock.now_ms() - unix_ms(SystemTime::now())).abs() < 1_000);
    }

    /// What a reading says holds on the monotonic clock: a step of the system clock afterwards
    /// (as the followed time is computed from it) moves nothing.
    #[test]
    fn a_followed_time_runs_on_from_its_reading() {
        let clock = Clock::system();
        let taken = Reading {
            time_ms: 1_000_000,
            at: Instant::now() - Duration::from_secs(5),
            round_trip: Duration::from_millis(1),
        };
        clock.follow(taken).unwrap();
        let now = clock.now_ms();
        assert!((1_005_000..1_006_000).contains(&now), "{now}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_tokio_clock_never_follows() {
        let clock = Clock::tokio();
        assert_eq!(clock.follow(reading(60_000, 1)), None);
        assert_eq!(clock.offset_ms(), 0);
    }
}

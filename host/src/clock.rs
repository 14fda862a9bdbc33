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
//!   [`FOLLOW_STEP_MS`] the system clock is used as it is, but never beyond the noise band of
//!   the last reading that agreed, run on the monotonic clock ([`Clock::anchor`]): a step of
//!   this machine's clock between two readings moves its time by that band at most, so a node
//!   whose clock jumps ahead cannot take back a lease still running elsewhere before the next
//!   reading has it follow. A tokio clock never follows.
//! - What makes a reading good enough to act on is decided here alone ([`Clock::judge`]): a
//!   round trip within [`READING_MAX_ROUND_TRIP`], and a difference beyond the noise band.
//! - Reading "now" takes no lock: the followed reading sits in an `ArcSwapOption`, written at
//!   most once per reading.

use std::{
    sync::Arc,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use arc_swap::ArcSwapOption;

/// Where "now" comes from. Cheap to clone; clones share what [`Clock::follow`] sets.
#[derive(Debug, Clone, Default)]
pub struct Clock {
    source: Source,
    /// The other clock's time at a monotonic instant, once it is followed.
    followed: Arc<ArcSwapOption<Reading>>,
    /// The last reading that agreed with the system clock, which bounds it while not followed.
    anchor: Arc<ArcSwapOption<Reading>>,
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
            anchor: Arc::default(),
        }
    }

    /// Now.
    pub fn now(&self) -> SystemTime {
        if self.followed().is_some() {
            return self.unbounded_now();
        }
        let local = self.local();
        match self.anchor.load().as_deref() {
            Some(anchor) => {
                let (expected, band) = (anchor.now_ms(), noise_ms(anchor));
                from_unix_ms(unix_ms(local).clamp(expected - band, expected + band))
            }
            None => local,
        }
    }

    /// Now, by the followed reading or the system clock, not bounded by the anchor: what a new
    /// reading is judged against (bounded, a step of the system clock would never show).
    fn unbounded_now(&self) -> SystemTime {
        match self.followed() {
            Some(reading) => from_unix_ms(reading.now_ms()),
            None => self.local(),
        }
    }

    /// Keeps `reading`, which agreed with this clock ([`Clock::judge`]), as the band the system
    /// clock is held to until the next one.
    pub fn anchor(&self, reading: Reading) {
        if matches!(self.source, Source::System) {
            self.anchor.store(Some(Arc::new(reading)));
        }
    }

    fn followed(&self) -> Option<Reading> {
        self.followed.load().as_deref().copied()
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

    /// Whether `reading` agrees with this clock: `Ok(true)` when this clock's time at the
    /// reading is within [`FOLLOW_STEP_MS`] plus half the reading's round trip of it (less is
    /// the reading's own noise, and following it would only add jitter), `Ok(false)` when it
    /// differs by more, and an error when its round trip took over
    /// [`READING_MAX_ROUND_TRIP`] (half the round trip is how far off it may be). A tokio
    /// clock agrees with every reading (its time is the test's).
    pub fn judge(&self, reading: &Reading) -> Result<bool, SlowReading> {
        if reading.round_trip > READING_MAX_ROUND_TRIP {
            return Err(SlowReading(reading.round_trip));
        }
        if !matches!(self.source, Source::System) {
            return Ok(true);
        }
        let ours_at_reading =
            unix_ms(self.unbounded_now()) - reading.at.elapsed().as_millis() as i64;
        Ok((reading.time_ms - ours_at_reading).abs() <= noise_ms(reading))
    }

    /// Follows the clock `reading` was taken of, from now on (every clone too), if
    /// [`Clock::judge`] finds it differs; where the system clock is itself within the noise
    /// band of it, the system clock is used again as it is. Returns the other clock's time
    /// minus this machine's, in milliseconds, if this changed what the clock follows.
    pub fn follow(&self, reading: Reading) -> Result<Option<i64>, SlowReading> {
        if self.judge(&reading)? {
            self.anchor(reading);
            return Ok(None);
        }
        let local_at_reading = unix_ms(self.local()) - reading.at.elapsed().as_millis() as i64;
        let offset_ms = reading.time_ms - local_at_reading;
        let follow = (offset_ms.abs() > noise_ms(&reading)).then(|| Arc::new(reading));
        if follow.is_none() {
            self.anchor(reading);
        }
        self.followed.store(follow);
        Ok(Some(offset_ms))
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

/// The longest round trip of a reading that is acted on.
pub const READING_MAX_ROUND_TRIP: Duration = Duration::from_secs(1);

/// A reading whose round trip took over [`READING_MAX_ROUND_TRIP`].
#[derive(Debug, thiserror::Error)]
#[error("the reading took {} ms, too long to follow it", .0.as_millis())]
pub struct SlowReading(pub Duration);

/// How far off a reading may be by itself, in milliseconds.
fn noise_ms(reading: &Reading) -> i64 {
    FOLLOW_STEP_MS + (reading.round_trip.as_millis() as i64) / 2
}

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
        assert_eq!(
            clock.follow(reading(FOLLOW_STEP_MS - 20, 2)).unwrap(),
            None,
            "noise"
        );
        assert_eq!(
            clock.follow(reading(FOLLOW_STEP_MS + 300, 900)).unwrap(),
            None,
            "a slow reading's noise"
        );
        assert_eq!(clone.offset_ms(), 0);
        let offset = clock.follow(reading(-60_000, 2)).unwrap().unwrap();
        assert!((-60_100..-59_900).contains(&offset), "{offset}");
        let behind = unix_ms(SystemTime::now()) - clone.now_ms();
        assert!((59_000..61_000).contains(&behind), "{behind}");
        assert!((-61_000..-59_000).contains(&clone.offset_ms()));
        assert_eq!(
            clone.follow(reading(-60_000 + 50, 2)).unwrap(),
            None,
            "noise around the followed"
        );
        assert!(
            clone.follow(reading(0, 2)).unwrap().is_some(),
            "back in step"
        );
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
        clock.follow(taken).unwrap().unwrap();
        let now = clock.now_ms();
        assert!((1_005_000..1_006_000).contains(&now), "{now}");
    }

    /// While in step, the system clock is held to the band of the last reading that agreed,
    /// run on the monotonic clock: a step of it between two readings (here, a reading taken
    /// as if the system clock then stood 60 s behind where it stands now) moves "now" by the
    /// band at most; the next reading is judged against the system clock itself, so it is
    /// followed.
    #[test]
    fn a_step_of_the_system_clock_between_readings_moves_now_by_the_band_at_most() {
        let clock = Clock::system();
        let stepped = reading(-60_000, 2);
        clock.anchor(stepped);
        let band = noise_ms(&stepped);
        let now = clock.now_ms();
        let expected = unix_ms(SystemTime::now()) - 60_000;
        assert!(
            (expected - 1_000..=expected + band).contains(&now),
            "{now} against {expected}"
        );
        assert!(!clock.judge(&reading(-60_000, 2)).unwrap(), "out of step");
        assert!(clock.follow(reading(-60_000, 2)).unwrap().is_some());
        // In step again: the band moves with the reading that says so.
        assert_eq!(
            clock
                .follow(reading(0, 2))
                .unwrap()
                .map(|o| o.abs() < 1_000),
            Some(true)
        );
        assert!((clock.now_ms() - unix_ms(SystemTime::now())).abs() < 1_000);
    }

    #[tokio::test(start_paused = true)]
    async fn a_tokio_clock_never_follows() {
        let clock = Clock::tokio();
        assert_eq!(clock.follow(reading(60_000, 1)).unwrap(), None);
        assert_eq!(clock.offset_ms(), 0);
    }

    /// A reading that took too long is refused whatever it says, and changes nothing; one
    /// within the bound that agrees is judged so.
    #[test]
    fn a_slow_reading_is_refused_and_a_close_one_agrees() {
        let clock = Clock::system();
        let slow = reading(-60_000, READING_MAX_ROUND_TRIP.as_millis() as u64 + 1);
        let refused = clock.follow(slow).unwrap_err();
        assert!(refused.to_string().contains("1001 ms"), "{refused}");
        assert_eq!(clock.offset_ms(), 0);
        assert!(clock.judge(&reading(10, 2)).unwrap());
        assert!(!clock.judge(&reading(-60_000, 2)).unwrap());
    }
}

//! Maintenance windows: is a moment inside any window, when does that
//! answer change next (so the loop wakes exactly then instead of polling),
//! and when does the next one open (said in status).
//!
//! A window is days, a start and an end (HH:MM) in an IANA time zone, or
//! a cron schedule (`cron.rs`) with a duration. Days are weekdays (kured's
//! names), days of the month (negative from its end) and which weekday of
//! the month (the second Tuesday, the last Friday); a window belongs to the
//! day it starts on, and an end not after the start wraps past midnight
//! (kured's rule; start == end is a full day). Blackout dates close it for
//! whole days in its zone, cutting an opening that runs into one. Times
//! are wall-clock times in the zone, so daylight saving time is followed:
//! a 01:00–04:00 window is three hours on most days, two on the
//! spring-forward night; a time the clock skips moves forward by the gap
//! (02:30 becomes 03:30), and one it repeats happens once, at its first
//! occurrence.

mod cron;

use jiff::civil::{Date, Time, Weekday};
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp, ToSpan};

use crate::api::common::Window;

/// A [`Window`] checked and ready for arithmetic.
#[derive(Debug, Clone)]
pub struct Parsed {
    kind: Kind,
    /// Closed days, first and last (inclusive).
    blackouts: Vec<(Date, Date)>,
    zone: TimeZone,
}

#[derive(Debug, Clone)]
enum Kind {
    Daily {
        days: [bool; 7],
        days_of_month: Vec<i32>,
        weeks_of_month: Vec<i32>,
        start: Time,
        end: Time,
    },
    Cron {
        cron: cron::Cron,
        duration: SignedDuration,
    },
}

/// The longest `duration` of a scheduled window.
const MAX_DURATION: SignedDuration = SignedDuration::from_hours(168);
/// How far ahead a boundary is looked for: a yearly schedule, a 29th of
/// February, a month of blackouts.
const HORIZON_DAYS: i64 = 5 * 366;

/// Check a window against what the schema cannot: that its time zone
/// exists in the time zone database, its schedule and duration read, its
/// dates exist. The message names the field's value.
pub fn parse(w: &Window) -> Result<Parsed, String> {
    let name = if w.time_zone.is_empty() {
        "UTC"
    } else {
        &w.time_zone
    };
    let zone = TimeZone::get(name)
        .map_err(|_| format!("unknown time zone {name:?} (an IANA name such as Europe/Berlin)"))?;
    let kind = match (&w.schedule, &w.duration) {
        (Some(schedule), Some(duration)) => {
            let cron = cron::parse(schedule)?;
            let duration = crate::decide::do_not_disrupt::go_duration(duration)
                .filter(|d| d.is_positive() && *d <= MAX_DURATION)
                .ok_or_else(|| {
                    format!(
                        "duration {duration:?} is not a Go duration from 1s to 168h, e.g. 3h or 90m"
                    )
                })?;
            Kind::Cron { cron, duration }
        }
        (Some(_), None) => return Err("a window with a schedule needs a duration".into()),
        _ => {
            let mut days = [w.days.is_empty(); 7];
            for d in &w.days {
                let day = weekday(d).ok_or_else(|| format!("unknown day {d:?}"))?;
                days[day.to_monday_zero_offset() as usize] = true;
            }
            for d in &w.days_of_month {
                if !(1..=31).contains(&d.abs()) {
                    return Err(format!("day of the month {d} is not 1 to 31 or -1 to -31"));
                }
            }
            for k in &w.weeks_of_month {
                if !(1..=5).contains(&k.abs()) {
                    return Err(format!("week of the month {k} is not 1 to 5 or -1 to -5"));
                }
            }
            Kind::Daily {
                days,
                days_of_month: w.days_of_month.clone(),
                weeks_of_month: w.weeks_of_month.clone(),
                start: hhmm(&w.start)?,
                end: hhmm(&w.end)?,
            }
        }
    };
    let mut blackouts = Vec::new();
    for b in &w.blackouts {
        let first = day(&b.start)?;
        let last = b.end.as_deref().map(day).transpose()?.unwrap_or(first);
        if last < first {
            return Err(format!(
                "blackout {}..{} ends before it starts",
                b.start, last
            ));
        }
        blackouts.push((first, last));
    }
    Ok(Parsed {
        kind,
        blackouts,
        zone,
    })
}

fn hhmm(s: &str) -> Result<Time, String> {
    let (h, m) = s
        .split_once(':')
        .ok_or_else(|| format!("time {s:?} is not HH:MM"))?;
    let h: i8 = h.parse().map_err(|_| format!("time {s:?} is not HH:MM"))?;
    let m: i8 = m.parse().map_err(|_| format!("time {s:?} is not HH:MM"))?;
    Time::new(h, m, 0, 0).map_err(|_| format!("time {s:?} is not a time of day"))
}

fn day(s: &str) -> Result<Date, String> {
    s.parse()
        .map_err(|_| format!("date {s:?} is not a day YYYY-MM-DD"))
}

/// kured's and system-upgrade-controller's day names, case-insensitive.
fn weekday(s: &str) -> Option<Weekday> {
    Some(match s.to_ascii_lowercase().as_str() {
        "su" | "sun" | "sunday" | "0" => Weekday::Sunday,
        "mo" | "mon" | "monday" | "1" => Weekday::Monday,
        "tu" | "tue" | "tues" | "tuesday" | "2" => Weekday::Tuesday,
        "we" | "wed" | "wednesday" | "3" => Weekday::Wednesday,
        "th" | "thu" | "thur" | "thurs" | "thursday" | "4" => Weekday::Thursday,
        "fr" | "fri" | "friday" | "5" => Weekday::Friday,
        "sa" | "sat" | "saturday" | "6" => Weekday::Saturday,
        _ => return None,
    })
}

impl Parsed {
    /// Days before a moment's date whose openings may still be open then.
    fn lookback(&self) -> i64 {
        match &self.kind {
            Kind::Daily { .. } => 1,
            Kind::Cron { duration, .. } => duration.as_secs() / 86_400 + 1,
        }
    }

    fn blacked_out(&self, date: Date) -> bool {
        self.blackouts.iter().any(|(a, b)| *a <= date && date <= *b)
    }

    /// The openings that start on `date`: (opens, closes).
    fn openings(&self, date: Date) -> Vec<(Timestamp, Timestamp)> {
        if self.blacked_out(date) {
            return Vec::new();
        }
        match &self.kind {
            Kind::Daily {
                days,
                days_of_month,
                weeks_of_month,
                start,
                end,
            } => {
                let on = days[date.weekday().to_monday_zero_offset() as usize]
                    && month_day(date, days_of_month)
                    && week_of_month(date, weeks_of_month);
                let end_date = if end <= start {
                    date.tomorrow().ok()
                } else {
                    Some(date)
                };
                let opens = self.instant(date, *start);
                let closes = end_date.and_then(|d| self.instant(d, *end));
                match (on, opens, closes) {
                    (true, Some(o), Some(c)) => vec![(o, c)],
                    _ => Vec::new(),
                }
            }
            Kind::Cron { cron, duration } => {
                if !cron.on(date) {
                    return Vec::new();
                }
                let mut out: Vec<(Timestamp, Timestamp)> = cron
                    .times()
                    .filter_map(|t| self.instant(date, t))
                    .filter_map(|o| Some((o, o.checked_add(*duration).ok()?)))
                    .collect();
                // Two times in a skipped hour land on one instant.
                out.dedup();
                out
            }
        }
    }

    /// Is `now` inside this window?
    pub fn contains(&self, now: Timestamp) -> bool {
        let today = now.to_zoned(self.zone.clone()).date();
        if self.blacked_out(today) {
            return false;
        }
        (0..=self.lookback()).any(|back| {
            today
                .checked_sub(back.days())
                .is_ok_and(|d| self.openings(d).iter().any(|(o, c)| *o <= now && now < *c))
        })
    }

    /// The first opening, closing, or blackout edge of this window after
    /// `now`.
    fn next_boundary(&self, now: Timestamp) -> Option<Timestamp> {
        let today = now.to_zoned(self.zone.clone()).date();
        let mut best: Option<Timestamp> = None;
        let consider = |best: &mut Option<Timestamp>, t: Timestamp| {
            if t > now && best.is_none_or(|b| t < b) {
                *best = Some(t);
            }
        };
        for (first, last) in &self.blackouts {
            for d in [Some(*first), last.tomorrow().ok()].into_iter().flatten() {
                if let Some(t) = self.instant(d, Time::midnight()) {
                    consider(&mut best, t);
                }
            }
        }
        for offset in -self.lookback()..=HORIZON_DAYS {
            let Ok(date) = today.checked_add(offset.days()) else {
                continue;
            };
            // Later days open later still; openings are sorted by day.
            if let Some(b) = best
                && offset > 1
                && self.instant(date, Time::midnight()).is_some_and(|t| t > b)
            {
                break;
            }
            for (o, c) in self.openings(date) {
                consider(&mut best, o);
                consider(&mut best, c);
            }
        }
        best
    }

    /// The instant a wall-clock time happens on `date` (a time skipped by
    /// daylight saving moves forward by the gap; a repeated one is its
    /// first occurrence).
    fn instant(&self, date: Date, t: Time) -> Option<Timestamp> {
        date.to_datetime(t)
            .to_zoned(self.zone.clone())
            .ok()
            .map(|z| z.timestamp())
    }
}

/// Is `date` one of these days of the month (none: any)?
fn month_day(date: Date, days: &[i32]) -> bool {
    let len = i32::from(date.days_in_month());
    let d = i32::from(date.day());
    days.is_empty()
        || days
            .iter()
            .any(|&k| if k > 0 { d == k } else { d == len + 1 + k })
}

/// Is `date` the k-th of its weekday in the month (negative: from the
/// end) for one of `weeks` (none: any)?
fn week_of_month(date: Date, weeks: &[i32]) -> bool {
    let d = i32::from(date.day());
    let from_end = (i32::from(date.days_in_month()) - d) / 7 + 1;
    weeks.is_empty()
        || weeks.iter().any(|&k| {
            if k > 0 {
                (d - 1) / 7 + 1 == k
            } else {
                from_end == -k
            }
        })
}

/// Is `now` inside any of `windows`? No windows means always.
pub fn open(windows: &[Parsed], now: Timestamp) -> bool {
    windows.is_empty() || windows.iter().any(|w| w.contains(now))
}

/// When `open` may change next: the earliest boundary of any window after
/// `now` (`None` without windows).
pub fn next_change(windows: &[Parsed], now: Timestamp) -> Option<Timestamp> {
    windows.iter().filter_map(|w| w.next_boundary(now)).min()
}

/// What a feature outside every one of its windows says: `outside every
/// reboot window; the next opens at T` (`what`: reboot, upgrade,
/// replacement), the opening when one is known.
pub fn closed_message(what: &str, opens: Option<Timestamp>) -> String {
    let next = opens
        .map(|t| format!("; the next opens at {t}"))
        .unwrap_or_default();
    format!("outside every {what} window{next}")
}

/// When the next window opens, if `now` is outside every one (`None`:
/// open now, no windows, or none opens within the horizon).
pub fn next_opening(windows: &[Parsed], now: Timestamp) -> Option<Timestamp> {
    if open(windows, now) {
        return None;
    }
    let mut t = now;
    // Each step is a boundary of some window; a few dozen at most reach
    // the next opening (a blackout's two edges, other windows' closings).
    for _ in 0..256 {
        t = next_change(windows, t)?;
        if open(windows, t) {
            return Some(t);
        }
    }
    None
}

#[cfg(test)]
mod tests;

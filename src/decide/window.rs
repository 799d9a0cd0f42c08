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
mod tests {
    use super::*;

    fn window(days: &[&str], start: &str, end: &str, tz: &str) -> Parsed {
        parse(&Window {
            days: days.iter().map(|d| d.to_string()).collect(),
            start: start.into(),
            end: end.into(),
            time_zone: tz.into(),
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn a_plain_window_is_half_open() {
        let w = window(&[], "02:00", "04:00", "UTC");
        assert!(!w.contains(at("2026-11-23T01:59:59Z")));
        assert!(w.contains(at("2026-11-23T02:00:00Z")));
        assert!(w.contains(at("2026-11-23T03:59:59Z")));
        assert!(!w.contains(at("2026-11-23T04:00:00Z")));
    }

    #[test]
    fn a_wrapping_window_belongs_to_the_day_it_starts() {
        // Friday 22:00 to Saturday 02:00; 2026-11-27 is a Friday.
        let w = window(&["fri"], "22:00", "02:00", "UTC");
        assert!(w.contains(at("2026-11-27T23:00:00Z")));
        assert!(
            w.contains(at("2026-11-28T01:30:00Z")),
            "Saturday early is Friday's"
        );
        assert!(
            !w.contains(at("2026-11-28T23:00:00Z")),
            "Saturday night is not"
        );
        assert!(
            !w.contains(at("2026-11-27T01:30:00Z")),
            "Friday early is Thursday's"
        );
    }

    #[test]
    fn equal_start_and_end_is_the_whole_day() {
        let w = window(&["mon"], "00:00", "00:00", "UTC");
        assert!(w.contains(at("2026-11-23T00:00:00Z")));
        assert!(w.contains(at("2026-11-23T23:59:00Z")));
        assert!(!w.contains(at("2026-11-24T00:00:00Z")));
    }

    #[test]
    fn days_are_read_as_kured_reads_them() {
        for d in ["Mo", "MON", "monday", "1"] {
            let w = window(&[d], "00:00", "00:00", "UTC");
            assert!(w.contains(at("2026-11-23T12:00:00Z")), "{d}");
            assert!(!w.contains(at("2026-11-24T12:00:00Z")), "{d}");
        }
    }

    #[test]
    fn time_zones_and_daylight_saving_are_followed() {
        // 01:00-04:00 Berlin. Winter: UTC+1. 2026-03-29 is the spring-forward
        // night (02:00 -> 03:00 local), so the window is 00:00-02:00 UTC.
        let w = window(&[], "01:00", "04:00", "Europe/Berlin");
        assert!(w.contains(at("2026-11-23T00:30:00Z")));
        assert!(!w.contains(at("2026-11-23T03:00:00Z")));
        assert!(w.contains(at("2026-03-29T01:30:00Z")), "03:30 CEST");
        assert!(!w.contains(at("2026-03-29T02:00:00Z")), "04:00 CEST");
        // Fall back (2026-10-25): 02:00-03:00 local happens twice; the
        // window runs 01:00 CEST (23:00Z) to 04:00 CET (03:00Z).
        assert!(w.contains(at("2026-10-25T02:30:00Z")));
        assert!(!w.contains(at("2026-10-25T03:00:00Z")));
    }

    #[test]
    fn a_window_starting_in_a_skipped_hour_opens_after_the_gap() {
        let w = window(&[], "02:30", "05:00", "Europe/Berlin");
        let next = next_change(std::slice::from_ref(&w), at("2026-03-28T23:00:00Z"));
        // 02:30 does not exist that night; the window opens at 03:30 CEST.
        assert_eq!(next, Some(at("2026-03-29T01:30:00Z")));
    }

    #[test]
    fn next_change_is_the_next_opening_or_closing() {
        let w = [window(&["fri"], "22:00", "02:00", "UTC")];
        // Monday: the next opening is Friday 22:00.
        assert_eq!(
            next_change(&w, at("2026-11-23T12:00:00Z")),
            Some(at("2026-11-27T22:00:00Z"))
        );
        // Inside it: the closing on Saturday.
        assert_eq!(
            next_change(&w, at("2026-11-27T23:00:00Z")),
            Some(at("2026-11-28T02:00:00Z"))
        );
        assert_eq!(next_change(&[], at("2026-11-23T12:00:00Z")), None);
    }

    #[test]
    fn no_windows_means_always_and_any_window_opens() {
        let now = at("2026-11-23T12:00:00Z");
        assert!(open(&[], now));
        let ws = [
            window(&[], "01:00", "02:00", "UTC"),
            window(&[], "11:00", "13:00", "UTC"),
        ];
        assert!(open(&ws, now));
        assert!(!open(&ws[..1], now));
    }

    #[test]
    fn unknown_zones_are_refused_with_the_name() {
        let e = parse(&Window {
            start: "01:00".into(),
            end: "02:00".into(),
            time_zone: "Mars/Olympus".into(),
            ..Default::default()
        });
        assert!(e.is_err_and(|e| e.contains("Mars/Olympus")));
    }

    fn scheduled(schedule: &str, duration: &str, tz: &str) -> Parsed {
        parse(&Window {
            schedule: Some(schedule.into()),
            duration: Some(duration.into()),
            time_zone: tz.into(),
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn days_of_the_month_count_from_either_end() {
        let w = parse(&Window {
            days_of_month: vec![1, -1],
            start: "02:00".into(),
            end: "04:00".into(),
            time_zone: "UTC".into(),
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(w.contains(at("2026-12-01T03:00:00Z")));
        assert!(w.contains(at("2026-11-30T03:00:00Z")), "November's last");
        assert!(w.contains(at("2027-02-28T03:00:00Z")), "February's last");
        assert!(!w.contains(at("2026-12-02T03:00:00Z")));
        assert_eq!(
            next_opening(std::slice::from_ref(&w), at("2026-12-02T03:00:00Z")),
            Some(at("2026-12-31T02:00:00Z"))
        );
    }

    #[test]
    fn the_nth_weekday_of_the_month() {
        // Patch Tuesday: the second Tuesday; and the last Friday.
        let w = |days: &[&str], weeks: Vec<i32>| {
            parse(&Window {
                days: days.iter().map(|d| d.to_string()).collect(),
                weeks_of_month: weeks,
                start: "00:00".into(),
                end: "00:00".into(),
                time_zone: "UTC".into(),
                ..Default::default()
            })
            .unwrap_or_else(|e| panic!("{e}"))
        };
        let second_tuesday = w(&["tue"], vec![2]);
        assert!(second_tuesday.contains(at("2026-12-08T12:00:00Z")));
        assert!(!second_tuesday.contains(at("2026-12-01T12:00:00Z")));
        assert!(!second_tuesday.contains(at("2026-12-15T12:00:00Z")));
        let last_friday = w(&["fri"], vec![-1]);
        assert!(last_friday.contains(at("2026-12-25T12:00:00Z")));
        assert!(!last_friday.contains(at("2026-12-18T12:00:00Z")));
        assert_eq!(
            next_opening(
                std::slice::from_ref(&second_tuesday),
                at("2026-12-09T00:00:00Z")
            ),
            Some(at("2027-01-12T00:00:00Z"))
        );
    }

    #[test]
    fn blackouts_close_whole_days_in_the_zone_and_cut_an_opening() {
        let w = parse(&Window {
            start: "22:00".into(),
            end: "04:00".into(),
            time_zone: "Europe/Berlin".into(),
            blackouts: vec![crate::api::common::Blackout {
                start: "2026-12-24".into(),
                end: Some("2026-12-26".into()),
            }],
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("{e}"));
        let ws = std::slice::from_ref(&w);
        // The 23rd's opening runs until midnight Berlin (23:00Z), not 04:00.
        assert!(w.contains(at("2026-12-23T22:30:00Z")));
        assert!(!w.contains(at("2026-12-23T23:30:00Z")));
        assert_eq!(
            next_change(ws, at("2026-12-23T22:30:00Z")),
            Some(at("2026-12-23T23:00:00Z"))
        );
        assert!(!w.contains(at("2026-12-25T22:00:00Z")));
        // The 27th opens again at 22:00 (21:00Z); its early hours are the
        // 26th's opening, which the blackout took.
        assert!(!w.contains(at("2026-12-27T01:00:00Z")));
        assert_eq!(
            next_opening(ws, at("2026-12-24T12:00:00Z")),
            Some(at("2026-12-27T21:00:00Z"))
        );
    }

    #[test]
    fn a_schedule_opens_for_its_duration() {
        let w = scheduled("30 2 * * 1-5", "90m", "UTC");
        let ws = std::slice::from_ref(&w);
        // 2026-11-30 is a Monday.
        assert!(!w.contains(at("2026-11-30T02:29:59Z")));
        assert!(w.contains(at("2026-11-30T02:30:00Z")));
        assert!(w.contains(at("2026-11-30T03:59:59Z")));
        assert!(!w.contains(at("2026-11-30T04:00:00Z")));
        assert_eq!(
            next_change(ws, at("2026-11-30T03:00:00Z")),
            Some(at("2026-11-30T04:00:00Z"))
        );
        // Saturday: the next opening is Monday's.
        assert_eq!(
            next_opening(ws, at("2026-12-05T12:00:00Z")),
            Some(at("2026-12-07T02:30:00Z"))
        );
        // An opening longer than a day still holds on the next.
        let long = scheduled("0 22 * * 5", "50h", "UTC");
        assert!(long.contains(at("2026-12-06T23:00:00Z")), "Sunday night");
        assert!(!long.contains(at("2026-12-07T00:00:00Z")));
    }

    #[test]
    fn schedules_follow_daylight_saving_in_both_directions_and_in_two_zones() {
        // 02:30 every day in Berlin. Spring forward, 2026-03-29: 02:30 does
        // not exist; it moves forward by the gap, to 03:30 CEST (01:30Z).
        let berlin = scheduled("30 2 * * *", "1h", "Europe/Berlin");
        let ws = std::slice::from_ref(&berlin);
        assert_eq!(
            next_opening(ws, at("2026-03-28T12:00:00Z")),
            Some(at("2026-03-29T01:30:00Z"))
        );
        assert!(berlin.contains(at("2026-03-29T02:29:00Z")));
        // Fall back, 2026-10-25: 02:30 happens twice; it opens once, at the
        // first (CEST, 00:30Z), and closes an hour later.
        assert_eq!(
            next_opening(ws, at("2026-10-24T12:00:00Z")),
            Some(at("2026-10-25T00:30:00Z"))
        );
        assert!(!berlin.contains(at("2026-10-25T01:30:00Z")));
        // New York, a different day: spring forward 2026-03-08, fall back
        // 2026-11-01. 04:00 local is after both changes: EDT then EST.
        let ny = scheduled("0 4 * * *", "30m", "America/New_York");
        let ws = std::slice::from_ref(&ny);
        assert_eq!(
            next_opening(ws, at("2026-03-07T12:00:00Z")),
            Some(at("2026-03-08T08:00:00Z"))
        );
        assert_eq!(
            next_opening(ws, at("2026-03-08T12:00:00Z")),
            Some(at("2026-03-09T08:00:00Z"))
        );
        assert_eq!(
            next_opening(ws, at("2026-10-31T12:00:00Z")),
            Some(at("2026-11-01T09:00:00Z"))
        );
    }

    #[test]
    fn a_schedule_needs_a_duration_it_can_read() {
        for (schedule, duration, says) in [
            ("0 3 * * *", None, "needs a duration"),
            ("0 3 * * *", Some("3 hours"), "Go duration"),
            ("0 3 * * *", Some("200h"), "168h"),
            ("0 3 * *", Some("1h"), "five"),
        ] {
            let e = parse(&Window {
                schedule: Some(schedule.into()),
                duration: duration.map(str::to_string),
                ..Default::default()
            })
            .err()
            .unwrap_or_default();
            assert!(e.contains(says), "{schedule} {duration:?}: {e}");
        }
    }
}

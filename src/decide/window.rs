//! Maintenance windows: is a moment inside any window, and when does that
//! answer change next (so the loop wakes exactly then instead of polling).
//!
//! A window is days, a start and an end (HH:MM) in an IANA time zone. It
//! belongs to the day it starts on; an end not after the start wraps past
//! midnight (kured's rule; start == end is a full day). Times are wall-clock
//! times in the zone, so daylight saving time is followed: a 01:00–04:00
//! window is three hours on most days, two on the spring-forward night.

use jiff::civil::{Date, Time, Weekday};
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

use crate::api::common::Window;

/// A [`Window`] checked and ready for arithmetic.
#[derive(Debug, Clone)]
pub struct Parsed {
    days: [bool; 7],
    start: Time,
    end: Time,
    zone: TimeZone,
}

/// Check a window against what the schema cannot: that its time zone
/// exists in the time zone database. The message names the field's value.
pub fn parse(w: &Window) -> Result<Parsed, String> {
    let zone = TimeZone::get(&w.time_zone).map_err(|_| {
        format!(
            "unknown time zone {:?} (an IANA name such as Europe/Berlin)",
            w.time_zone
        )
    })?;
    let mut days = [w.days.is_empty(); 7];
    for d in &w.days {
        let day = weekday(d).ok_or_else(|| format!("unknown day {d:?}"))?;
        days[day.to_monday_zero_offset() as usize] = true;
    }
    Ok(Parsed {
        days,
        start: hhmm(&w.start)?,
        end: hhmm(&w.end)?,
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
    fn on(&self, date: Date) -> bool {
        self.days[date.weekday().to_monday_zero_offset() as usize]
    }

    fn wraps(&self) -> bool {
        self.end <= self.start
    }

    /// Is `now` inside this window?
    pub fn contains(&self, now: Timestamp) -> bool {
        let local = now.to_zoned(self.zone.clone());
        let (date, t) = (local.date(), local.time());
        if self.wraps() {
            (self.on(date) && t >= self.start)
                || (date.yesterday().is_ok_and(|y| self.on(y)) && t < self.end)
        } else {
            self.on(date) && self.start <= t && t < self.end
        }
    }

    /// The first opening or closing of this window after `now`, within
    /// the next eight days.
    fn next_boundary(&self, now: Timestamp) -> Option<Timestamp> {
        let today = now.to_zoned(self.zone.clone()).date();
        let mut best: Option<Timestamp> = None;
        for offset in -1i64..=8 {
            let Ok(date) = today.checked_add(offset.days()) else {
                continue;
            };
            if !self.on(date) {
                continue;
            }
            let end_date = if self.wraps() {
                date.tomorrow().ok()
            } else {
                Some(date)
            };
            let opens = self.instant(date, self.start);
            let closes = end_date.and_then(|d| self.instant(d, self.end));
            for t in [opens, closes].into_iter().flatten() {
                if t > now && best.is_none_or(|b| t < b) {
                    best = Some(t);
                }
            }
        }
        best
    }

    /// The instant a wall-clock time happens on `date` (a time skipped by
    /// daylight saving resolves to the moment after the gap).
    fn instant(&self, date: Date, t: Time) -> Option<Timestamp> {
        date.to_datetime(t)
            .to_zoned(self.zone.clone())
            .ok()
            .map(|z| z.timestamp())
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn window(days: &[&str], start: &str, end: &str, tz: &str) -> Parsed {
        parse(&Window {
            days: days.iter().map(|d| d.to_string()).collect(),
            start: start.into(),
            end: end.into(),
            time_zone: tz.into(),
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
            days: vec![],
            start: "01:00".into(),
            end: "02:00".into(),
            time_zone: "Mars/Olympus".into(),
        });
        assert!(e.is_err_and(|e| e.contains("Mars/Olympus")));
    }
}

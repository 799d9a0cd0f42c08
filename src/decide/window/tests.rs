//! Unit tests of the windows: parsing, opening and closing across DST
//! transitions in two zones, schedules, blackouts and the next opening.

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

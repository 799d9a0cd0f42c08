//! Cron schedules for windows: five fields (minute, hour, day of month,
//! month, day of week) or one of the `@` shorthands, read as Vixie cron
//! and robfig/cron (which Karpenter's budget schedules use) read them:
//! `*`, numbers, ranges `a-b`, steps `*/n` and `a-b/n`, lists with commas,
//! month and day names (`JAN`, `MON`), Sunday as 0 or 7; and when both
//! day fields are restricted, a day matches if either does.
//!
//! Times are wall-clock times in the window's zone (`super`): a firing in
//! an hour daylight saving skips moves forward by the gap, and one in an
//! hour it repeats happens once, at its first occurrence.

use jiff::civil::{Date, Time};

/// A parsed schedule: which minutes, hours, days and months it fires on.
#[derive(Debug, Clone, PartialEq)]
pub struct Cron {
    minutes: Vec<i8>,
    hours: Vec<i8>,
    /// Days of the month, 1-31.
    dom: [bool; 32],
    /// Months, 1-12.
    months: [bool; 13],
    /// Days of the week, 0 = Sunday.
    dow: [bool; 7],
    dom_any: bool,
    dow_any: bool,
}

const MONTHS: [&str; 12] = [
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];
const WEEKDAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

/// Read a schedule; the error names the part that is wrong.
pub fn parse(spec: &str) -> Result<Cron, String> {
    let spec = spec.trim();
    let expanded = match spec.to_ascii_lowercase().as_str() {
        "@yearly" | "@annually" => "0 0 1 1 *".to_string(),
        "@monthly" => "0 0 1 * *".to_string(),
        "@weekly" => "0 0 * * 0".to_string(),
        "@daily" | "@midnight" => "0 0 * * *".to_string(),
        "@hourly" => "0 * * * *".to_string(),
        s if s.starts_with('@') => return Err(format!("unknown schedule {spec:?}")),
        _ => spec.to_string(),
    };
    let fields: Vec<&str> = expanded.split_whitespace().collect();
    let [minute, hour, dom, month, dow] = fields[..] else {
        return Err(format!(
            "schedule {spec:?} has {} fields; cron has five: minute hour day-of-month month day-of-week",
            fields.len()
        ));
    };
    let minutes = set(minute, 0, 59, &[], "minute")?;
    let hours = set(hour, 0, 23, &[], "hour")?;
    let doms = set(dom, 1, 31, &[], "day of month")?;
    let months_set = set(month, 1, 12, &MONTHS, "month")?;
    let dows = set(dow, 0, 7, &WEEKDAYS, "day of week")?;
    let mut c = Cron {
        minutes: minutes.iter().map(|&m| m as i8).collect(),
        hours: hours.iter().map(|&h| h as i8).collect(),
        dom: [false; 32],
        months: [false; 13],
        dow: [false; 7],
        dom_any: dom.starts_with('*'),
        dow_any: dow.starts_with('*'),
    };
    for d in doms {
        c.dom[d as usize] = true;
    }
    for m in months_set {
        c.months[m as usize] = true;
    }
    for d in dows {
        c.dow[(d % 7) as usize] = true;
    }
    Ok(c)
}

/// One field's values, sorted, within `lo..=hi`; `names` are the values
/// from `lo` on (months from 1, weekdays from 0).
fn set(field: &str, lo: u32, hi: u32, names: &[&str], what: &str) -> Result<Vec<u32>, String> {
    let bad = |why: &str| format!("cron {what} {field:?}: {why}");
    let mut out = Vec::new();
    for part in field.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => {
                let step: u32 = s.parse().map_err(|_| bad("a step is a number"))?;
                if step == 0 {
                    return Err(bad("a step of 0"));
                }
                (r, step)
            }
            None => (part, 1),
        };
        let (from, to) = if range == "*" {
            (lo, hi)
        } else if let Some((a, b)) = range.split_once('-') {
            (
                value(a, lo, names).ok_or_else(|| bad("not a value"))?,
                value(b, lo, names).ok_or_else(|| bad("not a value"))?,
            )
        } else {
            let v = value(range, lo, names).ok_or_else(|| bad("not a value"))?;
            // `5/15` counts from 5 to the field's end, as robfig/cron does.
            (v, if part.contains('/') { hi } else { v })
        };
        if from < lo || to > hi || from > to {
            return Err(bad(&format!("out of range ({lo}-{hi})")));
        }
        out.extend((from..=to).step_by(step as usize));
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

fn value(s: &str, lo: u32, names: &[&str]) -> Option<u32> {
    if let Ok(n) = s.parse() {
        return Some(n);
    }
    let i = names.iter().position(|n| n.eq_ignore_ascii_case(s))?;
    Some(i as u32 + lo)
}

impl Cron {
    /// Does the schedule fire on `date` (some time of that day)?
    pub fn on(&self, date: Date) -> bool {
        if !self.months[date.month() as usize] {
            return false;
        }
        let dom = self.dom[date.day() as usize];
        let dow = self.dow[date.weekday().to_sunday_zero_offset() as usize];
        match (self.dom_any, self.dow_any) {
            (true, true) => true,
            (true, false) => dow,
            (false, true) => dom,
            // Both restricted: either (Vixie cron, robfig/cron).
            (false, false) => dom || dow,
        }
    }

    /// The times of day it fires, in order.
    pub fn times(&self) -> impl Iterator<Item = Time> + '_ {
        self.hours.iter().flat_map(move |&h| {
            self.minutes
                .iter()
                .filter_map(move |&m| Time::new(h, m, 0, 0).ok())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::civil::date;

    #[test]
    fn fields_are_read_as_cron_reads_them() {
        let c = parse("*/15 2-4 * * MON-FRI").unwrap_or_else(|e| panic!("{e}"));
        let times: Vec<String> = c.times().map(|t| t.to_string()).take(5).collect();
        assert_eq!(
            times[..5],
            ["02:00:00", "02:15:00", "02:30:00", "02:45:00", "03:00:00"]
        );
        assert!(c.on(date(2026, 11, 30)), "a Monday");
        assert!(!c.on(date(2026, 11, 29)), "a Sunday");
        // Sunday as 7, and names in any case.
        let sun = parse("0 3 * * 7").unwrap_or_else(|e| panic!("{e}"));
        assert!(sun.on(date(2026, 11, 29)));
        let feb = parse("0 0 1 feb *").unwrap_or_else(|e| panic!("{e}"));
        assert!(feb.on(date(2027, 2, 1)) && !feb.on(date(2027, 3, 1)));
        assert_eq!(parse("@daily"), parse("0 0 * * *"));
        assert_eq!(
            parse("5/20 * * * *").map(|c| c.minutes),
            Ok(vec![5, 25, 45])
        );
    }

    #[test]
    fn both_day_fields_restricted_match_either() {
        // The 1st and 15th, and every Friday.
        let c = parse("0 4 1,15 * 5").unwrap_or_else(|e| panic!("{e}"));
        assert!(c.on(date(2026, 12, 1)), "the 1st, a Tuesday");
        assert!(c.on(date(2026, 12, 4)), "a Friday");
        assert!(!c.on(date(2026, 12, 2)));
    }

    #[test]
    fn mistakes_are_named() {
        for (spec, says) in [
            ("* * * *", "five"),
            ("60 * * * *", "minute"),
            ("* * 0 * *", "day of month"),
            ("* * * 13 *", "month"),
            ("*/0 * * * *", "step of 0"),
            ("* * * * funday", "day of week"),
            ("@often", "unknown schedule"),
        ] {
            let e = parse(spec).err().unwrap_or_default();
            assert!(e.contains(says), "{spec}: {e}");
        }
    }
}

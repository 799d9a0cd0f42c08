//! A NodeVersion's `windows`: when replacements may start, read as a
//! RebootPolicy's are (`decide::window`). Outside them no new surge node
//! is asked for and no obsolete node's drain begins; what started inside
//! one finishes (a recorded surge request, a joined heir's donor, a drain
//! under way), as a reboot admitted in a window finishes after it.

use std::time::Duration;

use super::*;
use crate::decide::window;

/// The windows as this round reads them.
pub(super) struct Windows {
    /// Replacements may start now (no windows, or inside one).
    pub open: bool,
    /// For the status message, when something waits for a window (or the
    /// windows cannot be used).
    pub note: Option<String>,
    /// When `open` may change.
    pub wake: Option<Duration>,
}

pub(super) fn read(s: &Snapshot, c: &Classes) -> Windows {
    let mut problems = Vec::new();
    let parsed: Vec<window::Parsed> =
        s.nv.spec
            .windows
            .iter()
            .filter_map(|w| window::parse(w).map_err(|e| problems.push(e)).ok())
            .collect();
    let waiting = !c.outdated.is_empty() || !c.obsolete.is_empty();
    if !problems.is_empty() {
        // A window the schema let through but that cannot be read (a time
        // zone this binary does not know): nothing starts, and it says so.
        return Windows {
            open: false,
            note: Some(format!(
                "the windows cannot be used: {}",
                problems.join("; ")
            )),
            wake: None,
        };
    }
    let open = window::open(&parsed, s.now);
    let wake = window::next_change(&parsed, s.now)
        .map(|t| crate::decide::duration_until(s.now, t).max(Duration::from_millis(50)));
    let note = (!open && waiting).then(|| {
        let opens = window::next_opening(&parsed, s.now);
        format!(
            "{}: no replacement starts",
            window::closed_message("replacement", opens)
        )
    });
    Windows { open, note, wake }
}

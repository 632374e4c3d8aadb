//! Output helpers shared by the CLI's commands: kubectl-style tables (comfy-table), ages
//! (`45s`, `3m`, `2h`, `4d`), RFC 3339 timestamps, and the names of protocol enums.

use std::time::Duration;

use comfy_table::{ContentArrangement, Table, presets};
use serde::Serialize;

/// A table as kubectl prints one: upper-case headers, no borders, columns three spaces
/// apart, no wrapping (a pipe gets whole lines), no trailing spaces (see [`render`]).
pub fn table<I, S>(header: I) -> Table
where
    I: IntoIterator<Item = S>,
    S: Into<comfy_table::Cell>,
{
    let mut t = plain();
    t.set_header(header);
    t
}

/// A table without a header (`Name:  value` lines, as `kubectl describe` prints them).
pub fn plain() -> Table {
    let mut t = Table::new();
    t.load_preset(presets::NOTHING).set_content_arrangement(ContentArrangement::Disabled);
    t
}

/// `t` as text: columns three spaces apart, nothing after the last.
pub fn render(t: &mut Table) -> String {
    for c in t.column_iter_mut() {
        c.set_padding((0, 3));
    }
    t.trim_fmt()
}

/// Prints `t` (see [`render`]); prints nothing for a table without header and rows.
pub fn print(mut t: Table) {
    if t.header().is_some() || !t.is_empty() {
        println!("{}", render(&mut t));
    }
}

/// How long ago `ms` (milliseconds since the epoch) was, relative to `now_ms`, as kubectl's
/// AGE column says it (`apimachinery`'s `HumanDuration`): two significant units at most,
/// coarser as the age grows.
pub fn age(now_ms: i64, ms: i64) -> String {
    human_duration(Duration::from_millis(now_ms.saturating_sub(ms).max(0) as u64))
}

/// kubectl's `HumanDuration`: `45s`, `3m20s`, `15m`, `2h5m`, `20h`, `4d6h`, `12d`, `2y30d`, `9y`.
pub fn human_duration(d: Duration) -> String {
    let s = d.as_secs();
    let (m, h) = (s / 60, s / 3600);
    if s < 60 * 2 {
        format!("{s}s")
    } else if m < 10 {
        match s % 60 {
            0 => format!("{m}m"),
            r => format!("{m}m{r}s"),
        }
    } else if m < 60 * 3 {
        format!("{m}m")
    } else if h < 8 {
        match m % 60 {
            0 => format!("{h}h"),
            r => format!("{h}h{r}m"),
        }
    } else if h < 48 {
        format!("{h}h")
    } else if h < 24 * 8 {
        match h % 24 {
            0 => format!("{}d", h / 24),
            r => format!("{}d{r}h", h / 24),
        }
    } else if h < 24 * 365 * 2 {
        format!("{}d", h / 24)
    } else if h < 24 * 365 * 8 {
        match h / 24 % 365 {
            0 => format!("{}y", h / 24 / 365),
            days => format!("{}y{days}d", h / 24 / 365),
        }
    } else {
        format!("{}y", h / 24 / 365)
    }
}

/// `ms` since the epoch as an RFC 3339 timestamp in UTC (`2026-11-26T01:45:12.345Z`);
/// `None` for a value outside the representable range.
pub fn rfc3339(ms: i64) -> Option<String> {
    jiff::Timestamp::from_millisecond(ms).ok().map(|t| t.to_string())
}

/// The wire name of a protocol enum value (`Running`, `StepSucceeded`): its serde name,
/// the same a JSON consumer sees.
pub fn name<T: Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_kubectl() {
        let cases = [
            (0, "0s"),
            (45, "45s"),
            (119, "119s"),
            (180, "3m"),
            (200, "3m20s"),
            (15 * 60, "15m"),
            (2 * 3600, "120m"),
            (3 * 3600 + 5 * 60, "3h5m"),
            (20 * 3600, "20h"),
            (4 * 86400, "4d"),
            (4 * 86400 + 6 * 3600, "4d6h"),
            (30 * 86400, "30d"),
            (3 * 365 * 86400 + 10 * 86400, "3y10d"),
            (9 * 365 * 86400, "9y"),
        ];
        for (secs, want) in cases {
            assert_eq!(human_duration(Duration::from_secs(secs)), want, "{secs}s");
        }
        assert_eq!(age(1_000, 5_000), "0s", "a clock skewed ahead is no negative age");
    }

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(rfc3339(1_700_000_000_123).as_deref(), Some("2023-11-14T22:13:20.123Z"));
        assert_eq!(rfc3339(0).as_deref(), Some("1970-01-01T00:00:00Z"));
    }

    #[test]
    fn tables_have_no_borders_and_no_trailing_spaces() {
        let mut t = table(["NAME", "STATE"]);
        t.add_row(["a-long-name", "Running"]).add_row(["b", "Failed"]);
        assert_eq!(render(&mut t), "NAME          STATE\na-long-name   Running\nb             Failed");
    }
}

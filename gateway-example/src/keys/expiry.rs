//! When a key expires: LiteLLM's `duration` (`"30s"`, `"10m"`, `"1h"`, `"1d"`, `"2w"`, `"1mo"`)
//! and `expires` (an ISO 8601 date and time), as Unix seconds, and back to text for `/key/info`.
//! Pure functions over numbers: the gateway's wall clock is given to them.

/// Seconds in a day.
const DAY: u64 = 86_400;

/// Why a `duration` or `expires` could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadTime(pub String);

impl std::fmt::Display for BadTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The Unix second `duration` after `now`: a whole number and a unit, `s`, `m`, `h`, `d`, `w`
/// or `mo` (calendar months: the same day of a later month, or its last day when shorter).
pub fn after_duration(now: u64, duration: &str) -> Result<u64, BadTime> {
    let bad = || {
        BadTime(format!(
            "'duration' {duration:?} is not a whole number followed by s, m, h, d, w or mo \
             (\"30s\", \"10m\", \"1h\", \"1d\", \"2w\", \"1mo\")"
        ))
    };
    let text = duration.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().map_err(|_| bad())?;
    let seconds = |s: Option<u64>| s.and_then(|s| now.checked_add(s));
    let end = match unit {
        "s" => seconds(Some(n)),
        "m" => seconds(n.checked_mul(60)),
        "h" => seconds(n.checked_mul(3_600)),
        "d" => seconds(n.checked_mul(DAY)),
        "w" => seconds(n.checked_mul(7 * DAY)),
        "mo" => add_months(now, n),
        _ => return Err(bad()),
    }
    .ok_or_else(bad)?;
    if end > LAST {
        // Shown as an ISO date, which has four digits of year: one past them reads back as
        // nothing (this gateway's `expires`, and clients').
        return Err(BadTime(format!(
            "'duration' {duration:?} ends after the year 9999; leave it out for no end"
        )));
    }
    Ok(end)
}

/// 9999-12-31T23:59:59Z: the last moment an ISO date with four digits of year names.
pub const LAST: u64 = 253_402_300_799;

/// The budget period of `duration` that `now` falls in, for periods laid end to end from
/// `anchor` (when the budget was set; all Unix seconds): its start and end. `None` for a
/// duration that cannot be read or a period of zero length.
pub fn budget_period(anchor: u64, duration: &str, now: u64) -> Option<(u64, u64)> {
    let first_end = after_duration(anchor, duration).ok()?;
    if first_end <= anchor {
        return None;
    }
    if now < first_end {
        return Some((anchor, first_end));
    }
    if duration.trim().ends_with("mo") {
        // Calendar months differ in length: step month by month (a few hundred steps at most for
        // years of periods), each from the anchor so the day of the month never drifts.
        let n: u64 = duration.trim().trim_end_matches("mo").parse().ok()?;
        let mut k = 1u64;
        loop {
            let start = after_duration(anchor, &format!("{}mo", n.checked_mul(k)?)).ok()?;
            let end = after_duration(anchor, &format!("{}mo", n.checked_mul(k + 1)?)).ok()?;
            if now < end {
                return Some((start, end));
            }
            k += 1;
        }
    }
    let length = first_end - anchor;
    let start = anchor + (now - anchor) / length * length;
    Some((start, start + length))
}

/// `now` moved `months` calendar months on, keeping the time of day.
fn add_months(now: u64, months: u64) -> Option<u64> {
    let (y, m, d) = civil(now / DAY);
    let total = (y as u64).checked_mul(12)? + (m as u64 - 1) + months;
    let (y, m) = ((total / 12) as i64, (total % 12) as u32 + 1);
    let d = d.min(days_in_month(y, m));
    let days = days_from_civil(y, m, d)?;
    days.checked_mul(DAY)?.checked_add(now % DAY)
}

fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a date (proleptic Gregorian), `None` before 1970.
fn days_from_civil(y: i64, m: u32, d: u32) -> Option<u64> {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    u64::try_from(era * 146_097 + doe - 719_468).ok()
}

/// The date of a day since 1970-01-01.
fn civil(days: u64) -> (i64, u32, u32) {
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// An ISO 8601 date and time as Unix seconds: `2026-12-01T10:00:00Z`, with a space for the `T`,
/// fractional seconds, a `+hh:mm` offset, or no zone (read as UTC); a date alone is its midnight.
pub fn parse_iso(text: &str) -> Result<u64, BadTime> {
    parse(text, false)
}

/// [`parse_iso`] with a fraction of a second rounded up: when a key expires, so that it lives at
/// least until the moment named (as a `duration` does).
pub fn parse_iso_rounded_up(text: &str) -> Result<u64, BadTime> {
    parse(text, true)
}

/// `text` as Unix seconds, a fraction of a second rounded up or dropped.
fn parse(text: &str, round_up: bool) -> Result<u64, BadTime> {
    let bad = || {
        BadTime(format!(
            "'expires' {text:?} is not an ISO 8601 date and time (e.g. \"2026-12-31T23:59:59Z\")"
        ))
    };
    let t = text.trim();
    let num = |s: &str| -> Result<u32, BadTime> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        s.parse().map_err(|_| bad())
    };
    let (date, time) = match t.find(['T', 't', ' ']) {
        Some(i) => (&t[..i], &t[i + 1..]),
        None => (t, ""),
    };
    let mut parts = date.split('-');
    let (y, m, d) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(y), Some(m), Some(d), None) if y.len() == 4 => (num(y)?, num(m)?, num(d)?),
        _ => return Err(bad()),
    };
    if !(1..=12).contains(&m) || d == 0 || d > days_in_month(i64::from(y), m) {
        return Err(bad());
    }
    let days = days_from_civil(i64::from(y), m, d).ok_or_else(bad)?;
    // The time, then the zone.
    let (clock, offset): (&str, i64) = if time.is_empty() {
        ("00:00:00", 0)
    } else if let Some(clock) = time.strip_suffix(['Z', 'z']) {
        (clock, 0)
    } else if let Some(i) = time.rfind(['+', '-']) {
        let (clock, zone) = time.split_at(i);
        let sign = if zone.starts_with('-') { -1 } else { 1 };
        let mut hm = zone[1..].split(':');
        let h = num(hm.next().ok_or_else(bad)?)?;
        let mm = hm.next().map_or(Ok(0), num)?;
        (clock, sign * i64::from(h * 3_600 + mm * 60))
    } else {
        (time, 0)
    };
    let (clock, fraction) = clock.split_once('.').unwrap_or((clock, ""));
    if !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let part_second = u64::from(round_up && fraction.bytes().any(|b| b != b'0'));
    let mut hms = clock.split(':');
    let h = num(hms.next().ok_or_else(bad)?)?;
    let mi = num(hms.next().ok_or_else(bad)?)?;
    let s = hms.next().map_or(Ok(0), num)?;
    if h > 23 || mi > 59 || s > 60 || hms.next().is_some() {
        return Err(bad());
    }
    let local = days * DAY + u64::from(h * 3_600 + mi * 60 + s) + part_second;
    u64::try_from(local as i64 - offset).map_err(|_| bad())
}

/// Unix seconds as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn format_iso(secs: u64) -> String {
    let (y, m, d) = civil(secs / DAY);
    let s = secs % DAY;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        s / 3_600,
        s / 60 % 60,
        s % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-12-01T21:00:00Z.
    const NOW: u64 = 1_796_158_800;

    #[test]
    fn a_duration_ends_by_the_year_9999() {
        assert_eq!(format_iso(LAST), "9999-12-31T23:59:59Z");
        assert_eq!(parse_iso("9999-12-31T23:59:59Z").unwrap(), LAST);
        let e = after_duration(NOW, "99999999999999d").unwrap_err();
        assert!(e.to_string().contains("after the year 9999"), "{e}");
        // In days and in calendar months alike (years are not a unit: "7000y" is refused as one).
        for long in ["3000000d", "96000mo"] {
            let e = after_duration(NOW, long).unwrap_err();
            assert!(e.to_string().contains("after the year 9999"), "{long}: {e}");
        }
        assert!(after_duration(NOW, "100000mo").is_err(), "8,333 years");
        assert!(after_duration(NOW, "2500000d").is_ok(), "about 6,800 years");
    }

    #[test]
    fn durations_in_every_unit() {
        assert_eq!(format_iso(NOW), "2026-12-01T21:00:00Z");
        for (duration, then) in [
            ("30s", "2026-12-01T21:00:30Z"),
            ("10m", "2026-12-01T21:10:00Z"),
            ("1h", "2026-12-01T22:00:00Z"),
            ("1d", "2026-12-02T21:00:00Z"),
            ("2w", "2026-12-15T21:00:00Z"),
            ("1mo", "2027-01-01T21:00:00Z"),
            ("3mo", "2027-03-01T21:00:00Z"),
        ] {
            assert_eq!(
                format_iso(after_duration(NOW, duration).unwrap()),
                then,
                "{duration}"
            );
        }
        // The 31st a month on is the month's last day.
        let jan31 = parse_iso("2027-01-31T08:00:00Z").unwrap();
        assert_eq!(
            format_iso(after_duration(jan31, "1mo").unwrap()),
            "2027-02-28T08:00:00Z"
        );
        for bad in ["", "10", "m", "1.5h", "1y", "-1d", "99999999999999999999s"] {
            assert!(after_duration(NOW, bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn budget_periods_follow_each_other_from_the_anchor() {
        assert_eq!(budget_period(NOW, "1h", NOW), Some((NOW, NOW + 3_600)));
        assert_eq!(
            budget_period(NOW, "1h", NOW + 7_300),
            Some((NOW + 7_200, NOW + 10_800))
        );
        assert_eq!(budget_period(NOW, "30s", NOW + 29), Some((NOW, NOW + 30)));
        assert_eq!(
            budget_period(NOW, "30s", NOW + 30),
            Some((NOW + 30, NOW + 60))
        );
        let (start, end) = budget_period(NOW, "1mo", NOW + 40 * 86_400).unwrap();
        assert_eq!(
            (format_iso(start), format_iso(end)),
            ("2027-01-01T21:00:00Z".into(), "2027-02-01T21:00:00Z".into())
        );
        let jan31 = parse_iso("2027-01-31T08:00:00Z").unwrap();
        let (start, end) = budget_period(jan31, "1mo", jan31 + 60 * 86_400).unwrap();
        assert_eq!(
            (format_iso(start), format_iso(end)),
            ("2027-03-31T08:00:00Z".into(), "2027-04-30T08:00:00Z".into()),
            "each period counted from the anchor: the 31st comes back"
        );
        assert_eq!(budget_period(NOW, "0s", NOW), None);
        assert_eq!(budget_period(NOW, "soon", NOW), None);
    }

    #[test]
    fn iso_dates_as_litellm_users_write_them() {
        for (text, want) in [
            ("2026-12-01T21:00:00Z", NOW),
            ("2026-12-01 21:00:00", NOW),
            ("2026-12-01T21:00:00.123456Z", NOW),
            ("2026-12-01T21:00:00.000Z", NOW),
            ("2026-12-01T22:00:00+01:00", NOW),
            ("2026-12-01T16:00:00-05:00", NOW),
            ("2026-12-01T21:00", NOW),
            ("2026-12-01", NOW - 21 * 3_600),
            ("2024-02-29T00:00:00Z", 1_709_164_800),
        ] {
            assert_eq!(parse_iso(text), Ok(want), "{text}");
        }
        for bad in [
            "",
            "tomorrow",
            "2026-13-01",
            "2026-02-30",
            "2023-02-29",
            "2026-12-01T25:00",
            "2026-12-01T21:00:00.5x",
            "1969-12-31",
        ] {
            assert!(parse_iso(bad).is_err(), "{bad:?}");
        }
        for secs in [0, NOW, 4_102_444_800] {
            assert_eq!(parse_iso(&format_iso(secs)), Ok(secs));
        }
        // A key's expiry rounds a fraction up: it lives at least until then.
        assert_eq!(parse_iso_rounded_up("2026-12-01T20:59:59.123456Z"), Ok(NOW));
        assert_eq!(parse_iso_rounded_up("2026-12-01T21:00:00.000Z"), Ok(NOW));
    }
}

//! `strftime_now(fmt)` for chat templates, without a date-time dependency.
//!
//! Llama 3.x templates write "Today Date: 26 Jul 2024" with `strftime_now("%d %b %Y")` and
//! gpt-oss writes "Current date: 2025-08-05" with `"%Y-%m-%d"`. transformers uses
//! `datetime.now()` (local time); we use **UTC** (no time-zone database needed, and the same on
//! every machine), so near midnight the date may differ from a local-time reference by one day.
//! Formatting follows C's strftime in the C locale; unknown directives are copied as written.

use std::time::{SystemTime, UNIX_EPOCH};

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] =
    ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

/// A broken-down UTC time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Civil {
    year: i64,
    month: u32, // 1..=12
    day: u32,   // 1..=31
    hour: u32,
    minute: u32,
    second: u32,
    weekday: u32, // 0 = Monday
    yday: u32,    // 1..=366
}

fn civil(t: SystemTime) -> Civil {
    let secs = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64) - i64::from(e.duration().subsec_nanos() > 0),
    };
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400) as u32;
    let (year, month, day) = civil_from_days(days);
    let jan1 = days_from_civil(year, 1, 1);
    Civil {
        year,
        month,
        day,
        hour: rem / 3600,
        minute: rem / 60 % 60,
        second: rem % 60,
        // 1970-01-01 was a Thursday (index 3).
        weekday: (days + 3).rem_euclid(7) as u32,
        yday: (days - jan1 + 1) as u32,
    }
}

/// Howard Hinnant's `civil_from_days`: days since 1970-01-01 → (year, month, day).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Formats `t` (as UTC) with a C-locale `strftime` format.
pub fn strftime(t: SystemTime, fmt: &str) -> String {
    let c = civil(t);
    let mut out = String::with_capacity(fmt.len() + 16);
    let mut chars = fmt.chars();
    while let Some(ch) = chars.next() {
        if ch != '%' {
            out.push(ch);
            continue;
        }
        let Some(d) = chars.next() else {
            out.push('%');
            break;
        };
        let hour12 = if c.hour.is_multiple_of(12) { 12 } else { c.hour % 12 };
        let month = MONTHS[(c.month - 1) as usize];
        let day = DAYS[c.weekday as usize];
        let s = match d {
            'Y' => c.year.to_string(),
            'y' => format!("{:02}", c.year.rem_euclid(100)),
            'C' => format!("{:02}", c.year.div_euclid(100)),
            'm' => format!("{:02}", c.month),
            'd' => format!("{:02}", c.day),
            'e' => format!("{:>2}", c.day),
            'H' => format!("{:02}", c.hour),
            'I' => format!("{hour12:02}"),
            'M' => format!("{:02}", c.minute),
            'S' => format!("{:02}", c.second),
            'p' => (if c.hour < 12 { "AM" } else { "PM" }).to_string(),
            'j' => format!("{:03}", c.yday),
            'B' => month.to_string(),
            'b' | 'h' => month[..3].to_string(),
            'A' => day.to_string(),
            'a' => day[..3].to_string(),
            'u' => (c.weekday + 1).to_string(),
            'w' => ((c.weekday + 1) % 7).to_string(),
            'F' => format!("{}-{:02}-{:02}", c.year, c.month, c.day),
            'D' => format!("{:02}/{:02}/{:02}", c.month, c.day, c.year.rem_euclid(100)),
            'T' => format!("{:02}:{:02}:{:02}", c.hour, c.minute, c.second),
            'R' => format!("{:02}:{:02}", c.hour, c.minute),
            'Z' => "UTC".to_string(),
            'z' => "+0000".to_string(),
            'n' => "\n".to_string(),
            't' => "\t".to_string(),
            '%' => "%".to_string(),
            other => format!("%{other}"),
        };
        out.push_str(&s);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn known_dates() {
        // 2024-07-26 16:51:49 UTC, a Friday.
        let t = at(1_722_012_709);
        assert_eq!(strftime(t, "%d %b %Y"), "26 Jul 2024");
        assert_eq!(strftime(t, "%Y-%m-%d %H:%M:%S"), "2024-07-26 16:51:49");
        assert_eq!(
            strftime(t, "%A %a %B %j %u %w %I%p %e|%y|%%|%Q"),
            "Friday Fri July 208 5 5 04PM 26|24|%|%Q"
        );
        assert_eq!(strftime(at(0), "%F %T %Z"), "1970-01-01 00:00:00 UTC");
        // Leap day and end of a leap year.
        assert_eq!(strftime(at(951_782_400), "%F %a %j"), "2000-02-29 Tue 060");
        assert_eq!(strftime(at(1_735_603_200), "%F %j"), "2024-12-31 366");
        // Before the epoch.
        assert_eq!(strftime(UNIX_EPOCH - Duration::from_secs(1), "%F %T"), "1969-12-31 23:59:59");
    }

    #[test]
    fn round_trip_days() {
        for z in (-800_000..800_000).step_by(997) {
            let (y, m, d) = civil_from_days(z);
            assert_eq!(days_from_civil(y, m, d), z);
        }
    }
}

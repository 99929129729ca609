//! Small helpers shared by commands: human-readable sizes and times, aligned tables.

pub mod table;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `1234567` -> `1.2 MB` (decimal units, as the Hub and most tools show sizes).
pub fn human_bytes(n: u64) -> String {
    scaled(n, 1000.0, &["B", "kB", "MB", "GB", "TB", "PB"])
}

/// `13_779_630_336` -> `12.8 GiB` (binary units, as GPU memory is usually quoted).
pub fn human_bytes_iec(n: u64) -> String {
    scaled(n, 1024.0, &["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"])
}

/// A size as people write it: `24G`, `24GiB`, `16 GB`, `1.5T`, `20000M`, `123456` (bytes). K, M, G
/// and T alone mean KiB, MiB, GiB and TiB (nvidia-smi's units); `kB`, `MB`, `GB`, `TB` are
/// decimal. `Err` with one line otherwise.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = (&t[..split], t[split..].trim());
    let value: f64 =
        number.parse().map_err(|_| format!("{text:?} is not a size (like 24G or 16GiB)"))?;
    let scale: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024f64.powi(2),
        "g" | "gib" => 1024f64.powi(3),
        "t" | "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return Err(format!("{text:?}: unknown unit {unit:?} (use K, M, G, T, KiB…, kB…)")),
    };
    let bytes = value * scale;
    if !bytes.is_finite() || bytes < 1.0 || bytes > u64::MAX as f64 {
        return Err(format!("{text:?} is not a size this GPU could have"));
    }
    Ok(bytes as u64)
}

/// `n` in the largest unit (each `step` times the previous) that keeps it at least 1.
fn scaled(n: u64, step: f64, units: &[&str]) -> String {
    let mut v = n as f64;
    let mut unit = 0;
    while v >= step && unit + 1 < units.len() {
        v /= step;
        unit += 1;
    }
    if unit == 0 { format!("{n} B") } else { format!("{v:.1} {}", units[unit]) }
}

/// How long ago `then` was, in the largest whole unit: `just now`, `5 minutes ago`,
/// `1 day ago`, `3 months ago` (a month is 30 days, a year 365). Future times (clock skew, a
/// file copied from another machine) read as `just now`.
pub fn human_age(then: SystemTime, now: SystemTime) -> String {
    let secs = now.duration_since(then).unwrap_or(Duration::ZERO).as_secs();
    const UNITS: [(u64, &str); 6] = [
        (365 * 86400, "year"),
        (30 * 86400, "month"),
        (7 * 86400, "week"),
        (86400, "day"),
        (3600, "hour"),
        (60, "minute"),
    ];
    for (size, name) in UNITS {
        let n = secs / size;
        if n >= 1 {
            return format!("{n} {name}{} ago", if n == 1 { "" } else { "s" });
        }
    }
    "just now".to_string()
}

/// Seconds since the Unix epoch now (0 on a clock before it).
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// `2024-05-01T12:00:00Z`; `None` for times RFC 3339 cannot show (before 1970, after 9999),
/// which a file's mtime can be.
pub fn rfc3339(t: SystemTime) -> Option<String> {
    let secs = t.duration_since(UNIX_EPOCH).ok()?.as_secs();
    (secs < 253_402_300_800).then(|| humantime::format_rfc3339_seconds(t).to_string())
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn sizes_as_people_write_them() {
        assert_eq!(super::parse_size("24G"), Ok(24 << 30));
        assert_eq!(super::parse_size("16GiB"), Ok(16 << 30));
        assert_eq!(super::parse_size(" 16 GB "), Ok(16_000_000_000));
        assert_eq!(super::parse_size("1.5g"), Ok(3 << 29));
        assert_eq!(super::parse_size("4096"), Ok(4096));
        for bad in ["", "G", "-1G", "12 apples", "0", "1e400"] {
            assert!(super::parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn human_bytes_iec() {
        assert_eq!(super::human_bytes_iec(512), "512 B");
        assert_eq!(super::human_bytes_iec(13_779_630_336), "12.8 GiB");
        assert_eq!(super::human_bytes_iec(3 << 20), "3.0 MiB");
        assert_eq!(super::human_bytes_iec(u64::MAX), "16.0 EiB");
    }

    #[test]
    fn human_age() {
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let ago = |s: u64| super::human_age(now - Duration::from_secs(s), now);
        assert_eq!(ago(0), "just now");
        assert_eq!(ago(59), "just now");
        assert_eq!(ago(60), "1 minute ago");
        assert_eq!(ago(3 * 3600 + 5), "3 hours ago");
        assert_eq!(ago(86400), "1 day ago");
        assert_eq!(ago(3 * 86400), "3 days ago");
        assert_eq!(ago(15 * 86400), "2 weeks ago");
        assert_eq!(ago(400 * 86400), "1 year ago");
        assert_eq!(super::human_age(now + Duration::from_secs(10), now), "just now");
    }

    #[test]
    fn rfc3339() {
        assert_eq!(
            super::rfc3339(UNIX_EPOCH + Duration::from_secs(1_518_563_312)).as_deref(),
            Some("2018-02-13T23:08:32Z")
        );
        assert_eq!(super::rfc3339(UNIX_EPOCH - Duration::from_secs(1)), None);
        assert_eq!(super::rfc3339(UNIX_EPOCH + Duration::from_secs(253_402_300_800)), None);
    }

    #[test]
    fn human_bytes() {
        assert_eq!(super::human_bytes(0), "0 B");
        assert_eq!(super::human_bytes(999), "999 B");
        assert_eq!(super::human_bytes(13_761_264_768), "13.8 GB");
    }
}

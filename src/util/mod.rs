//! Small helpers shared by commands: human-readable sizes and times.

/// `1234567` -> `1.2 MB` (decimal units, as the Hub and most tools show sizes).
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "kB", "MB", "GB", "TB", "PB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1000.0 && unit + 1 < UNITS.len() {
        v /= 1000.0;
        unit += 1;
    }
    if unit == 0 { format!("{n} B") } else { format!("{v:.1} {}", UNITS[unit]) }
}

#[cfg(test)]
mod tests {
    #[test]
    fn human_bytes() {
        assert_eq!(super::human_bytes(0), "0 B");
        assert_eq!(super::human_bytes(999), "999 B");
        assert_eq!(super::human_bytes(13_761_264_768), "13.8 GB");
    }
}

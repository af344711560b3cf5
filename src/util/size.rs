//! Human-readable byte sizes: `4096`, `512K`, `64M`, `2G`, `1T` (binary multiples; `KiB`/`KB`/`k` alike).

/// Parses a size; the suffix is a power of 1024. Errors are one phrase for the CLI.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, suffix) = t.split_at(digits);
    if number.is_empty() {
        return Err(format!("invalid size `{text}`: expected a number such as 512K, 64M or 2G"));
    }
    let shift = match suffix.trim().to_ascii_uppercase().trim_end_matches("IB").trim_end_matches('B') {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(format!("invalid size `{text}`: unknown unit `{suffix}` (use K, M, G or T)")),
    };
    let n: u64 = number.parse().map_err(|_| format!("invalid size `{text}`: number too large"))?;
    n.checked_mul(1u64 << shift).ok_or_else(|| format!("invalid size `{text}`: too large"))
}

/// Formats a byte count with the largest exact binary unit (`8M`, `1536K`, `100`).
pub fn format_size(n: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if n != 0 && n % (1u64 << shift) == 0 {
            return format!("{}{unit}", n >> shift);
        }
    }
    n.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        for (text, n) in [
            ("4096", 4096),
            ("512K", 512 << 10),
            ("64M", 64 << 20),
            ("2G", 2 << 30),
            ("1t", 1 << 40),
            ("8MiB", 8 << 20),
            ("3kb", 3072),
        ] {
            assert_eq!(parse_size(text), Ok(n), "{text}");
        }
        for bad in ["", "M", "12Q", "-1", "1.5G", "99999999999999999999", "20000000T"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes_format() {
        assert_eq!(format_size(8 << 20), "8M");
        assert_eq!(format_size(1536 << 10), "1536K");
        assert_eq!(format_size(100), "100");
        assert_eq!(format_size(0), "0");
    }
}

//! Human-readable byte sizes: `4096`, `512K`, `64M`, `1.5G`, `1T` (binary multiples; `KiB`/`KB`/`k`
//! alike; a decimal fraction is rounded down to whole bytes).

use std::fmt;

/// Why a size was refused. Each variant holds the text as given, quoted in the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SizeError {
    /// The text does not start with a digit.
    NotANumber {
        /// The text as given.
        text: String,
    },
    /// The suffix after the number is not a known unit.
    UnknownUnit {
        /// The text as given.
        text: String,
        /// The suffix.
        unit: String,
    },
    /// The number itself does not fit in 64 bits.
    NumberTooLarge {
        /// The text as given.
        text: String,
    },
    /// The number times its unit does not fit in 64 bits.
    TooLarge {
        /// The text as given.
        text: String,
    },
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SizeError::NotANumber { text } => {
                write!(f, "invalid size `{text}`: expected a number such as 512K, 64M or 2G")
            }
            SizeError::UnknownUnit { text, unit } => {
                write!(f, "invalid size `{text}`: unknown unit `{unit}` (use K, M, G or T)")
            }
            SizeError::NumberTooLarge { text } => write!(f, "invalid size `{text}`: number too large"),
            SizeError::TooLarge { text } => write!(f, "invalid size `{text}`: too large"),
        }
    }
}

impl std::error::Error for SizeError {}

/// Parses a size; the suffix is a power of 1024. The number may have a decimal fraction (`1.5G`
/// is 1536M), and the size is rounded down to whole bytes (`1.3K` is 1331).
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let t = text.trim();
    let whole_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (whole, rest) = t.split_at(whole_end);
    if whole.is_empty() {
        return Err(SizeError::NotANumber { text: text.to_string() });
    }
    // A fraction is a dot followed by at least one digit; anything else after the dot is the unit.
    let fraction_len = rest.strip_prefix('.').map_or(0, |r| r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len()));
    let (fraction, suffix) =
        if fraction_len > 0 { (&rest[1..=fraction_len], &rest[1 + fraction_len..]) } else { ("", rest) };
    let shift = match suffix.trim().to_ascii_uppercase().trim_end_matches("IB").trim_end_matches('B') {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(SizeError::UnknownUnit { text: text.to_string(), unit: suffix.to_string() }),
    };
    let n: u64 = whole.parse().map_err(|_| SizeError::NumberTooLarge { text: text.to_string() })?;
    let bytes = n.checked_mul(1u64 << shift).ok_or_else(|| SizeError::TooLarge { text: text.to_string() })?;
    // Digits past the 19th cannot change a size below 2^40 * 10 by a byte: drop them, so the
    // arithmetic stays within u128.
    let fraction = &fraction[..fraction.len().min(19)];
    let numerator: u128 = if fraction.is_empty() { 0 } else { fraction.parse().unwrap_or(0) };
    let part = (numerator << shift) / 10u128.pow(fraction.len() as u32);
    u64::try_from(part)
        .ok()
        .and_then(|part| bytes.checked_add(part))
        .ok_or_else(|| SizeError::TooLarge { text: text.to_string() })
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
        for (text, n) in [
            ("1.5G", 1536 << 20),
            ("0.75M", 768 << 10),
            ("1.3K", 1331),
            ("2.5", 2),
            ("1.0000000000000000000000001T", 1 << 40),
            ("0.5MiB", 512 << 10),
        ] {
            assert_eq!(parse_size(text), Ok(n), "{text}");
        }
        for bad in
            ["", "M", "12Q", "-1", "1.5.2G", ".5G", "1.G", "1,5G", "99999999999999999999", "20000000T", "16777216.5T"]
        {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        let refused = |text: &str| parse_size(text).unwrap_err().to_string();
        assert_eq!(refused("M"), "invalid size `M`: expected a number such as 512K, 64M or 2G");
        assert_eq!(refused("12Q"), "invalid size `12Q`: unknown unit `Q` (use K, M, G or T)");
        assert_eq!(refused("99999999999999999999"), "invalid size `99999999999999999999`: number too large");
        assert_eq!(refused("20000000T"), "invalid size `20000000T`: too large");
    }

    #[test]
    fn sizes_format() {
        assert_eq!(format_size(8 << 20), "8M");
        assert_eq!(format_size(1536 << 10), "1536K");
        assert_eq!(format_size(100), "100");
        assert_eq!(format_size(0), "0");
    }
}

//! Human-readable byte sizes: `4096`, `512K`, `64M`, `2G`, `1T` (binary multiples; `KiB`/`KB`/`k` alike).

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

/// Parses a size; the suffix is a power of 1024.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, suffix) = t.split_at(digits);
    if number.is_empty() {
        return Err(SizeError::NotANumber { text: text.to_string() });
    }
    let shift = match suffix.trim().to_ascii_uppercase().trim_end_matches("IB").trim_end_matches('B') {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(SizeError::UnknownUnit { text: text.to_string(), unit: suffix.to_string() }),
    };
    let n: u64 = number.parse().map_err(|_| SizeError::NumberTooLarge { text: text.to_string() })?;
    n.checked_mul(1u64 << shift).ok_or_else(|| SizeError::TooLarge { text: text.to_string() })
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

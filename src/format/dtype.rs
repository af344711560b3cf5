//! [`Dtype`]: the element types, spelled exactly as in the JSON header, with their bit sizes and
//! names, and [`UnknownDtype`] for a string that is none of them.

use std::fmt;
use std::str::FromStr;

use super::escape::Printable;

/// Element types, spelled exactly as in the JSON header, in the reference crate's enum order.
#[allow(non_camel_case_types, missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Deserialize, serde::Serialize)]
pub enum Dtype {
    BOOL,
    F4,
    F6_E2M3,
    F6_E3M2,
    U8,
    I8,
    F8_E5M2,
    F8_E4M3,
    F8_E8M0,
    F8_E4M3FNUZ,
    F8_E5M2FNUZ,
    I16,
    U16,
    F16,
    BF16,
    I32,
    U32,
    F32,
    C64,
    F64,
    I64,
    U64,
}

impl Dtype {
    /// Every dtype, in enum order.
    pub const ALL: [Dtype; 22] = [
        Dtype::BOOL,
        Dtype::F4,
        Dtype::F6_E2M3,
        Dtype::F6_E3M2,
        Dtype::U8,
        Dtype::I8,
        Dtype::F8_E5M2,
        Dtype::F8_E4M3,
        Dtype::F8_E8M0,
        Dtype::F8_E4M3FNUZ,
        Dtype::F8_E5M2FNUZ,
        Dtype::I16,
        Dtype::U16,
        Dtype::F16,
        Dtype::BF16,
        Dtype::I32,
        Dtype::U32,
        Dtype::F32,
        Dtype::C64,
        Dtype::F64,
        Dtype::I64,
        Dtype::U64,
    ];

    /// Bits per element (4 for F4, 6 for the F6 types).
    pub fn bitsize(self) -> u64 {
        use Dtype::*;
        match self {
            F4 => 4,
            F6_E2M3 | F6_E3M2 => 6,
            BOOL | U8 | I8 | F8_E5M2 | F8_E4M3 | F8_E8M0 | F8_E4M3FNUZ | F8_E5M2FNUZ => 8,
            I16 | U16 | F16 | BF16 => 16,
            I32 | U32 | F32 => 32,
            C64 | F64 | I64 | U64 => 64,
        }
    }

    /// The JSON spelling (`"BF16"`).
    pub fn name(self) -> &'static str {
        // Same order as the enum; a unit test checks each entry against serde's spelling.
        const NAMES: [&str; 22] = [
            "BOOL",
            "F4",
            "F6_E2M3",
            "F6_E3M2",
            "U8",
            "I8",
            "F8_E5M2",
            "F8_E4M3",
            "F8_E8M0",
            "F8_E4M3FNUZ",
            "F8_E5M2FNUZ",
            "I16",
            "U16",
            "F16",
            "BF16",
            "I32",
            "U32",
            "F32",
            "C64",
            "F64",
            "I64",
            "U64",
        ];
        NAMES[self as usize]
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A string that is not the exact, case-sensitive JSON spelling of a dtype.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownDtype {
    /// The string that was given.
    pub name: String,
}

impl fmt::Display for UnknownDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown dtype `{}`", Printable(&self.name))
    }
}

impl std::error::Error for UnknownDtype {}

impl FromStr for Dtype {
    type Err = UnknownDtype;

    /// Accepts only the exact JSON spelling (`"F32"`, not `"f32"`), like the header parser.
    fn from_str(s: &str) -> Result<Dtype, UnknownDtype> {
        Dtype::ALL.into_iter().find(|dtype| dtype.name() == s).ok_or_else(|| UnknownDtype { name: s.to_owned() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_bitsizes_match_the_reference_table() {
        let expected: [(Dtype, u64); 22] = [
            (Dtype::BOOL, 8),
            (Dtype::F4, 4),
            (Dtype::F6_E2M3, 6),
            (Dtype::F6_E3M2, 6),
            (Dtype::U8, 8),
            (Dtype::I8, 8),
            (Dtype::F8_E5M2, 8),
            (Dtype::F8_E4M3, 8),
            (Dtype::F8_E8M0, 8),
            (Dtype::F8_E4M3FNUZ, 8),
            (Dtype::F8_E5M2FNUZ, 8),
            (Dtype::I16, 16),
            (Dtype::U16, 16),
            (Dtype::F16, 16),
            (Dtype::BF16, 16),
            (Dtype::I32, 32),
            (Dtype::U32, 32),
            (Dtype::F32, 32),
            (Dtype::C64, 64),
            (Dtype::F64, 64),
            (Dtype::I64, 64),
            (Dtype::U64, 64),
        ];
        for (dtype, bits) in expected {
            assert_eq!(dtype.bitsize(), bits, "{dtype}");
        }
        assert_eq!(expected.map(|(d, _)| d), Dtype::ALL);
    }

    #[test]
    fn dtype_names_match_serde_and_parse_back() {
        for dtype in Dtype::ALL {
            assert_eq!(serde_json::to_string(&dtype).unwrap(), format!("\"{}\"", dtype.name()));
            assert_eq!(dtype.name().parse::<Dtype>(), Ok(dtype));
        }
        let err = "f32".parse::<Dtype>().unwrap_err();
        assert_eq!(err.name, "f32");
        assert_eq!(err.to_string(), "unknown dtype `f32`");
    }
}

//! Files that are not safetensors at all but something a user may well have in their place: a
//! PyTorch checkpoint (`pytorch_model.bin`, `model.pt`), told apart by its first bytes so that its
//! refusal can say what it is and how to convert it.

use std::fmt;

/// The kind of PyTorch checkpoint a file's first bytes show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PyTorchFormat {
    /// A zip archive (`PK\x03\x04`): what `torch.save` writes since PyTorch 1.6.
    Zip,
    /// A bare pickle of this protocol (`\x80` and 2 to 5): the legacy `torch.save` format.
    Pickle(u8),
}

impl PyTorchFormat {
    /// What the 8-byte length prefix of a file that failed as safetensors shows, if it is the start
    /// of a PyTorch checkpoint. Only asked once the prefix was refused as a header length, so a
    /// valid safetensors file whose length happens to begin with the same bytes is never refused.
    pub fn sniff(prefix: &[u8]) -> Option<PyTorchFormat> {
        match prefix {
            [b'P', b'K', 3, 4, ..] => Some(PyTorchFormat::Zip),
            [0x80, protocol @ 2..=5, ..] => Some(PyTorchFormat::Pickle(*protocol)),
            _ => None,
        }
    }
}

impl fmt::Display for PyTorchFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PyTorchFormat::Zip => f.write_str("a zip archive, as torch.save writes"),
            PyTorchFormat::Pickle(protocol) => {
                write!(f, "a pickle, protocol {protocol}, as the legacy torch.save wrote")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zips_and_pickles_are_recognised_and_nothing_else() {
        assert_eq!(PyTorchFormat::sniff(b"PK\x03\x04\x14\x00\x00\x00"), Some(PyTorchFormat::Zip));
        assert_eq!(PyTorchFormat::sniff(&[0x80, 2, 0x8a, 10, 0, 0, 0, 0]), Some(PyTorchFormat::Pickle(2)));
        assert_eq!(PyTorchFormat::sniff(&[0x80, 5]), Some(PyTorchFormat::Pickle(5)));
        for other in [&b"PK\x05\x06"[..], &[0x80, 1], &[0x80, 6], b"{\"a\"", b"", b"P"] {
            assert_eq!(PyTorchFormat::sniff(other), None, "{other:?}");
        }
    }
}

//! The safetensors format: pure bytes in, typed values or a [`FormatError`] out; no I/O of its own.
//!
//! The rules and their order follow safetensors 0.8 `SafeTensors::read_metadata`: an 8-byte
//! length, a length cap, the header within the file, UTF-8, JSON into the same serde shapes as the
//! reference (so serde's own messages match), offsets sorted and contiguous from 0, sizes from
//! checked arithmetic, and data ending exactly at the end of the file. Each broken rule has its own
//! [`FormatError`] variant; messages escape hostile names before they reach a terminal.
//!
//! - `dtype`: [`Dtype`], its bit sizes and JSON names;
//! - `header`: [`Header`] and [`TensorInfo`], the layout constants;
//! - `parse`: [`read_header`] and [`parse_header`], the fast serde path and the reference's shapes;
//! - `validate`: the reference crate's rules, in its order;
//! - `error`: [`FormatError`]; `escape`: how untrusted names are shown in messages;
//! - `foreign`: [`PyTorchFormat`], the PyTorch checkpoints told apart from a broken header;
//! - [`index`]: `*.index.json` files and the checks that make several shards one checkpoint;
//! - [`writer`]: files in the reference writer's layout (tests, the sample).

mod dtype;
mod error;
mod escape;
mod foreign;
mod header;
pub mod index;
mod parse;
#[cfg(test)]
mod tests;
mod validate;
pub mod writer;

pub use dtype::{Dtype, UnknownDtype};
pub use error::FormatError;
pub use escape::{prints_as_itself, PrintablePath};
pub use foreign::PyTorchFormat;
pub use header::{Header, TensorInfo, MAX_HEADER_SIZE, N_LEN};
pub use parse::{parse_header, read_header};

//! Views of a tensor's bytes other than the raw ones: a `.npy` file, the values as F32.

pub mod f32;
pub mod npy;

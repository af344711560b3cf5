//! The read dispatch: the bytes of each kind of file at an offset. A raw tensor file is a range of
//! its backing source read through the engine; an `as=f32` file maps output bytes back to whole
//! source elements and converts them; a `.npy` file is a synthesized header followed by what the
//! tensor's own file serves (raw or converted); a re-served checkpoint file is its whole source read through the engine; `metadata.json`,
//! index files and `stats.json` are bytes held in memory. Every range is clipped to the file: a read
//! at or past its end is empty. Only a raw read (a tensor file, the checkpoint file) whose reply goes
//! straight to the kernel may be served from the source's mapping; the views read their bytes in
//! user space, so they always go through the engine's blocks.

use crate::engine::readahead::Extent;
use crate::engine::Engine;
use crate::fs::control::StatsFile;
use crate::fs::error::FsError;
use crate::source::{KernelBytes, SourceId};
use crate::tree::namespace::{Content, Namespace, Tensor};
use crate::views::f32::{convert_to_f32, converted_len, source_byte_range, source_range_for};

/// Where a read's bytes come from, and whether its reply only goes to the kernel.
pub(crate) struct Source<'a> {
    pub(crate) ns: &'a Namespace,
    pub(crate) engine: &'a Engine,
    pub(crate) control: &'a StatsFile,
    /// The reply hands the bytes to a system call and never reads them (the FUSE adapter): a raw
    /// tensor may then be a slice of the source's mapping ([`Engine::read_for_kernel`]).
    pub(crate) to_kernel: bool,
}

impl Source<'_> {
    /// Hands up to `size` bytes of `content` at `offset` to `reply` (short only at end of file).
    pub(crate) fn read_content<R>(
        &self,
        content: &Content,
        offset: u64,
        size: u32,
        reply: impl FnOnce(KernelBytes<'_>) -> R,
    ) -> Result<R, FsError> {
        let (ns, engine, control) = (self.ns, self.engine, self.control);
        let tensor = |i: usize| ns.tensors().get(i).ok_or(FsError::NotFound);
        match content {
            Content::Tensor(i) => read_tensor(engine, self.to_kernel, tensor(*i)?, offset, size, reply),
            Content::Npy { tensor: i, header, converted } => {
                read_with_prefix(engine, header, *converted, tensor(*i)?, offset, size).map(|v| reply(v[..].into()))
            }
            Content::F32(i) => read_converted(engine, tensor(*i)?, offset, size).map(|v| reply(v[..].into())),
            Content::Checkpoint(s) => read_checkpoint(ns, engine, self.to_kernel, *s, offset, size, reply),
            Content::Bytes(bytes) => Ok(reply(slice_at(bytes, offset, size).into())),
            Content::Stats => Ok(reply(slice_at(&control.latest().bytes, offset, size).into())),
        }
    }
}

/// Bytes `[offset, offset+size)` of tensor `t`, clipped to its length, handed to `reply`.
fn read_tensor<R>(
    engine: &Engine,
    to_kernel: bool,
    t: &Tensor,
    offset: u64,
    size: u32,
    reply: impl FnOnce(KernelBytes<'_>) -> R,
) -> Result<R, FsError> {
    if offset >= t.len {
        return Ok(reply(KernelBytes::default()));
    }
    let n = (t.len - offset).min(u64::from(size)) as usize;
    read_source(engine, to_kernel, t.source, t.start..t.start + t.len, t.start + offset, n, reply)
}

/// `len` bytes of `source` at `offset`, inside the file's `extent`, handed to `reply`: from the
/// source's mapping when the reply only goes to the kernel (`to_kernel`) and the source has one,
/// else through the engine's blocks (a range inside one cached block reaches `reply` without a copy).
fn read_source<R>(
    engine: &Engine,
    to_kernel: bool,
    source: SourceId,
    extent: impl Into<Extent>,
    offset: u64,
    len: usize,
    reply: impl FnOnce(KernelBytes<'_>) -> R,
) -> Result<R, FsError> {
    let result = if to_kernel {
        engine.read_for_kernel(source, extent, offset, len, reply)
    } else {
        engine.read_in(source, extent, offset, len, |bytes| reply(bytes.into()))
    };
    result.map_err(FsError::Read)
}

/// Bytes `[offset, offset+size)` of shard `shard`'s whole file, handed to `reply`. The engine is
/// told which tensor (or the header) the read is in, so readahead stops at its end as for a read
/// of that tensor's file, and both share blocks and streams; but as a file loaders map, whose
/// every page fault's read-around takes in tensor starts ([`Extent::in_checkpoint_file`]): no read of it
/// jump-starts a tensor's prefetch. A reply to the kernel may come from the source's mapping, as a
/// tensor file's does.
fn read_checkpoint<R>(
    ns: &Namespace,
    engine: &Engine,
    to_kernel: bool,
    shard: usize,
    offset: u64,
    size: u32,
    reply: impl FnOnce(KernelBytes<'_>) -> R,
) -> Result<R, FsError> {
    let s = ns.shards().get(shard).ok_or(FsError::NotFound)?;
    let len = s.header.file_len;
    if offset >= len {
        return Ok(reply(KernelBytes::default()));
    }
    let n = (len - offset).min(u64::from(size));
    let extent = Extent::in_checkpoint_file(ns.checkpoint_extent(shard, offset..offset + n));
    read_source(engine, to_kernel, s.source, extent, offset, n as usize, reply)
}

/// Bytes `[offset, offset+size)` of tensor `t` converted to F32: the whole source elements that
/// cover the range are read through the engine, converted, and trimmed. A dtype that does not
/// convert or a range that overflows is [`FsError::Convert`] (EIO): the file exists.
pub(crate) fn read_converted(engine: &Engine, t: &Tensor, offset: u64, size: u32) -> Result<Vec<u8>, FsError> {
    let failed = || FsError::Convert { tensor: t.name.clone(), dtype: t.dtype, offset };
    let elements = t.shape.iter().product::<u64>();
    let out_len = converted_len(t.dtype, elements).ok_or_else(failed)?;
    if offset >= out_len {
        return Ok(Vec::new());
    }
    let size = (out_len - offset).min(u64::from(size));
    let (first, count) = source_range_for(t.dtype, offset, size);
    let count = count.min(elements.saturating_sub(first));
    let (byte_start, byte_len) = source_byte_range(t.dtype, first, count).ok_or_else(failed)?;
    let src = engine
        .read_in(t.source, t.start..t.start + t.len, t.start + byte_start, byte_len as usize, <[u8]>::to_vec)
        .map_err(FsError::Read)?;
    let mut out = Vec::with_capacity(count as usize * 4);
    convert_to_f32(t.dtype, &src, &mut out).map_err(|_| failed())?;
    let skip = (offset - 4 * first) as usize;
    out.drain(..skip.min(out.len()));
    out.truncate(size as usize);
    Ok(out)
}

/// A synthesized `prefix` followed by the bytes of tensor `t`, raw or (`converted`) as F32: the
/// `.npy` view.
fn read_with_prefix(
    engine: &Engine,
    prefix: &[u8],
    converted: bool,
    t: &Tensor,
    offset: u64,
    size: u32,
) -> Result<Vec<u8>, FsError> {
    let mut out = slice_at(prefix, offset, size).to_vec();
    let rest = size - out.len() as u32;
    if rest > 0 {
        let tensor_offset = offset.saturating_sub(prefix.len() as u64);
        if converted {
            out.extend_from_slice(&read_converted(engine, t, tensor_offset, rest)?);
        } else {
            read_tensor(engine, false, t, tensor_offset, rest, |bytes| out.extend_from_slice(bytes.slice()))?;
        }
    }
    Ok(out)
}

/// `bytes[offset..offset+size]`, clipped to the slice (empty past its end).
pub(crate) fn slice_at(bytes: &[u8], offset: u64, size: u32) -> &[u8] {
    let start = usize::try_from(offset).unwrap_or(usize::MAX).min(bytes.len());
    let end = start.saturating_add(size as usize).min(bytes.len());
    &bytes[start..end]
}

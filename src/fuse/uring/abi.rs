//! The kernel's FUSE-over-io_uring ABI, as `include/uapi/linux/fuse.h` of Linux 6.14 to 6.18
//! defines it: the per-entry header buffer (`struct fuse_uring_req_header`), the command in an
//! SQE's 80-byte area (`struct fuse_uring_cmd_req`), the two commands, and the one SQE field the
//! `io-uring` crate's `UringCmd80` builder does not set (`len`, the iovec count of a REGISTER).

use io_uring::{opcode, squeue, types};

/// `FUSE_IO_URING_CMD_REGISTER`: hand the kernel an entry's buffers; it completes when the
/// kernel puts a request in them.
pub const CMD_REGISTER: u32 = 1;
/// `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`: the reply in the entry goes to the kernel, and the entry
/// waits for the next request.
pub const CMD_COMMIT_AND_FETCH: u32 = 2;

/// Bytes of `struct fuse_in_header` (the request's header, at the start of `in_out`).
pub const IN_HEADER_BYTES: usize = 40;
/// Bytes of `struct fuse_out_header` (the reply's header, written to `in_out`).
pub const OUT_HEADER_BYTES: usize = 16;
/// `FUSE_URING_OP_IN_OUT_SZ`: room for an operation's fixed argument (`op_in`).
pub const OP_IN_BYTES: usize = 128;
/// `FUSE_MIN_READ_BUFFER`: the kernel's least payload buffer.
pub const MIN_PAYLOAD_BYTES: usize = 8192;

/// `struct fuse_uring_ent_in_out`: the kernel's word on the request in an entry, and ours on the
/// reply.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct EntInOut {
    /// Unused (0).
    pub flags: u64,
    /// The request's id, to name in COMMIT_AND_FETCH.
    pub commit_id: u64,
    /// Bytes of the payload buffer in use: the request's, then the reply's.
    pub payload_sz: u32,
    /// Unused.
    pub padding: u32,
    /// Unused.
    pub reserved: u64,
}

/// `struct fuse_uring_req_header`: an entry's header buffer (iovec 0 of its REGISTER).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ReqHeader {
    /// `struct fuse_in_header` of a request; `struct fuse_out_header` of its reply.
    pub in_out: [u8; 128],
    /// The operation's first argument (its fixed struct; empty for a name-only operation).
    pub op_in: [u8; OP_IN_BYTES],
    /// See [`EntInOut`].
    pub ent: EntInOut,
}

impl Default for ReqHeader {
    fn default() -> ReqHeader {
        ReqHeader { in_out: [0; 128], op_in: [0; OP_IN_BYTES], ent: EntInOut::default() }
    }
}

/// `struct fuse_uring_cmd_req` in an SQE's 80-byte command area: flags 0, `commit_id` (0 for
/// REGISTER), `qid`, the rest zero.
pub fn cmd_req(commit_id: u64, qid: u16) -> [u8; 80] {
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    cmd
}

/// Byte offset of `len` in `struct io_uring_sqe` (after opcode, flags, ioprio, fd, off, addr).
const SQE_LEN_OFFSET: usize = 24;

/// A REGISTER of the entry whose two iovecs (header, payload) are at `iovecs`, on queue `qid` of
/// the connection of `device`.
pub fn register(device: types::Fd, qid: u16, iovecs: *const libc::iovec, user_data: u64) -> squeue::Entry128 {
    let sqe = opcode::UringCmd80::new(device, CMD_REGISTER)
        .cmd(cmd_req(0, qid))
        .addr(Some(iovecs as u64))
        .build()
        .user_data(user_data);
    with_len(sqe, 2)
}

/// A COMMIT_AND_FETCH of request `commit_id` on queue `qid`.
pub fn commit_and_fetch(device: types::Fd, qid: u16, commit_id: u64, user_data: u64) -> squeue::Entry128 {
    opcode::UringCmd80::new(device, CMD_COMMIT_AND_FETCH).cmd(cmd_req(commit_id, qid)).build().user_data(user_data)
}

/// `sqe` with its `len` field set: the kernel checks that a REGISTER names exactly two iovecs.
pub fn with_len(sqe: squeue::Entry128, len: u32) -> squeue::Entry128 {
    const _: () = assert!(std::mem::size_of::<squeue::Entry128>() == 128);
    // SAFETY: Entry128 is `repr(C)`: the kernel's 64-byte `io_uring_sqe` and its 64 command bytes,
    // 128 plain bytes with no invalid values; `len` is a u32 at byte 24 of the SQE.
    let mut bytes: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    bytes[SQE_LEN_OFFSET..SQE_LEN_OFFSET + 4].copy_from_slice(&len.to_ne_bytes());
    // SAFETY: as above, any 128 bytes are a valid Entry128.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(bytes) }
}

/// The fields of a request's `fuse_in_header` that the transport needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InHeader {
    /// Bytes of the whole request as `/dev/fuse` would give it.
    pub len: u32,
    /// The operation.
    pub opcode: u32,
    /// The request's id.
    pub unique: u64,
}

impl InHeader {
    /// The header at the start of `in_out`.
    pub fn parse(in_out: &[u8; 128]) -> InHeader {
        let u32_at = |at: usize| u32::from_ne_bytes([in_out[at], in_out[at + 1], in_out[at + 2], in_out[at + 3]]);
        let mut unique = [0u8; 8];
        unique.copy_from_slice(&in_out[8..16]);
        InHeader { len: u32_at(0), opcode: u32_at(4), unique: u64::from_ne_bytes(unique) }
    }
}

/// A `fuse_out_header`: `total` bytes of reply (header included), `error` (0 or a negative
/// errno), for request `unique`.
pub fn out_header(total: u32, error: i32, unique: u64) -> [u8; OUT_HEADER_BYTES] {
    let mut h = [0u8; OUT_HEADER_BYTES];
    h[0..4].copy_from_slice(&total.to_ne_bytes());
    h[4..8].copy_from_slice(&error.to_ne_bytes());
    h[8..16].copy_from_slice(&unique.to_ne_bytes());
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// The layouts of include/uapi/linux/fuse.h (Linux 6.18).
    #[test]
    fn layouts_match_the_kernel_header() {
        assert_eq!(size_of::<EntInOut>(), 32);
        assert_eq!(offset_of!(EntInOut, commit_id), 8);
        assert_eq!(offset_of!(EntInOut, payload_sz), 16);
        assert_eq!(offset_of!(EntInOut, reserved), 24);
        assert_eq!(size_of::<ReqHeader>(), 288);
        assert_eq!(offset_of!(ReqHeader, op_in), 128);
        assert_eq!(offset_of!(ReqHeader, ent), 256);
        let cmd = cmd_req(0x0102_0304_0506_0708, 3);
        assert_eq!(cmd[0..8], [0; 8]);
        assert_eq!(cmd[8..16], 0x0102_0304_0506_0708u64.to_ne_bytes());
        assert_eq!(cmd[16..18], 3u16.to_ne_bytes());
        assert!(cmd[18..].iter().all(|&b| b == 0));
    }

    #[test]
    fn a_register_names_two_iovecs_and_its_command() {
        let iov = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; 2];
        let sqe = register(types::Fd(7), 1, iov.as_ptr(), 99);
        // SAFETY: as in `with_len`.
        let bytes: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        assert_eq!(bytes[0], io_uring::opcode::UringCmd80::CODE);
        assert_eq!(bytes[4..8], 7i32.to_ne_bytes());
        assert_eq!(bytes[8..12], CMD_REGISTER.to_ne_bytes(), "cmd_op shares the SQE's offset field");
        assert_eq!(bytes[16..24], (iov.as_ptr() as u64).to_ne_bytes());
        assert_eq!(bytes[24..28], 2u32.to_ne_bytes());
        assert_eq!(bytes[32..40], 99u64.to_ne_bytes());
        assert_eq!(bytes[48..50], [0, 0], "command area: flags");
        assert_eq!(bytes[64..66], 1u16.to_ne_bytes(), "command area: qid");
    }

    #[test]
    fn headers_round_trip() {
        let mut in_out = [0u8; 128];
        in_out[0..4].copy_from_slice(&80u32.to_ne_bytes());
        in_out[4..8].copy_from_slice(&15u32.to_ne_bytes());
        in_out[8..16].copy_from_slice(&42u64.to_ne_bytes());
        assert_eq!(InHeader::parse(&in_out), InHeader { len: 80, opcode: 15, unique: 42 });
        let h = out_header(16, -5, 42);
        assert_eq!(h[4..8], (-5i32).to_ne_bytes());
    }
}

//! Becoming an unprivileged user for good: who that is ([`Identity`], from a name or a number), and
//! [`Identity::become_it`], which leaves a process with that user's ids, no capability (bounding
//! and ambient sets emptied too) and `no_new_privs`, so that nothing it executes regains any.

use std::ffi::CString;
use std::fmt;
use std::io;

/// securebits(7): root's uid grants no capability on execve (and the bit is locked).
const SECBIT_NOROOT: libc::c_ulong = 1 << 0;
const SECBIT_NOROOT_LOCKED: libc::c_ulong = 1 << 1;
/// capset(2)'s header version for 64-bit capability sets.
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
/// The highest capability number this code drops when the kernel does not say
/// (`/proc/sys/kernel/cap_last_cap`); dropping a number the kernel lacks is refused harmlessly.
const CAP_LAST_CAP_FALLBACK: u32 = 63;

/// A user to run as: uid, primary gid, and supplementary groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The user id (real, effective and saved).
    pub uid: libc::uid_t,
    /// The group id (real, effective and saved).
    pub gid: libc::gid_t,
    /// Supplementary groups (empty: none).
    pub groups: Vec<libc::gid_t>,
}

/// Why a user could not be found, or not become.
#[derive(Debug)]
pub enum PrivilegeError {
    /// No such user in the user database.
    UnknownUser(String),
    /// Only root can change to another user and drop the bounding set.
    NotRoot,
    /// A system call failed.
    Call {
        /// Which.
        call: &'static str,
        /// Why.
        error: io::Error,
    },
}

impl fmt::Display for PrivilegeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PrivilegeError::UnknownUser(name) => write!(f, "no user `{name}` (not in the user database, not a number)"),
            PrivilegeError::NotRoot => f.write_str("dropping privileges to another user needs root"),
            PrivilegeError::Call { call, error } => {
                write!(f, "dropping privileges: {call}: {}", crate::util::describe_io(error))
            }
        }
    }
}

impl std::error::Error for PrivilegeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PrivilegeError::Call { error, .. } => Some(error),
            _ => None,
        }
    }
}

impl Identity {
    /// The user named `user` (a login name, or a numeric uid): its uid, primary gid and the groups
    /// the user database lists it in. A number not in the database is that uid with gid = uid and
    /// no supplementary group.
    pub fn of_user(user: &str) -> Result<Identity, PrivilegeError> {
        let unknown = || PrivilegeError::UnknownUser(user.to_string());
        let name = CString::new(user).map_err(|_| unknown())?;
        // SAFETY: `passwd` is a plain C struct, for which all-zero bytes are valid.
        let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let mut buf = vec![0 as libc::c_char; 16 * 1024];
        let numeric: Option<libc::uid_t> = user.parse().ok();
        // SAFETY: every pointer is valid for the call; buf outlives the use of `entry`'s strings.
        let rc = unsafe {
            match numeric {
                Some(uid) => libc::getpwuid_r(uid, &mut entry, buf.as_mut_ptr(), buf.len(), &mut result),
                None => libc::getpwnam_r(name.as_ptr(), &mut entry, buf.as_mut_ptr(), buf.len(), &mut result),
            }
        };
        if rc != 0 || result.is_null() {
            return match numeric {
                Some(uid) => Ok(Identity { uid, gid: uid, groups: Vec::new() }),
                None => Err(unknown()),
            };
        }
        let (uid, gid) = (entry.pw_uid, entry.pw_gid);
        let mut groups = vec![0 as libc::gid_t; 256];
        let mut count = groups.len() as libc::c_int;
        // SAFETY: pw_name points into buf, which is alive; groups holds `count` entries.
        let listed = unsafe { libc::getgrouplist(entry.pw_name, gid, groups.as_mut_ptr(), &mut count) };
        groups.truncate(if listed < 0 { 0 } else { count.max(0) as usize });
        groups.retain(|&g| g != gid);
        Ok(Identity { uid, gid, groups })
    }

    /// Root's uid and gid, with no supplementary group: what `mount.fuse3 -o drop_privileges`
    /// keeps (the capabilities go, the ids stay).
    pub fn root() -> Identity {
        Identity { uid: 0, gid: 0, groups: Vec::new() }
    }

    /// Makes the calling process this user for good: the capability bounding set emptied,
    /// securebits set so that uid 0 grants nothing on execve, supplementary groups, gid and uid
    /// set (real, effective, saved), every capability set (permitted, effective, inheritable,
    /// ambient) emptied, and `no_new_privs` set. Needs root (CAP_SETPCAP, CAP_SETUID, CAP_SETGID).
    ///
    /// Only system calls, no allocation: callable between fork and exec
    /// ([`std::os::unix::process::CommandExt::pre_exec`]). The process must be single-threaded
    /// (capability sets and `no_new_privs` are per thread). `last_cap` is [`last_capability`],
    /// read before forking.
    pub fn become_it(&self, last_cap: u32) -> Result<(), PrivilegeError> {
        let check = |call: &'static str, rc: libc::c_long| {
            if rc < 0 {
                Err(PrivilegeError::Call { call, error: io::Error::last_os_error() })
            } else {
                Ok(())
            }
        };
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(PrivilegeError::NotRoot);
        }
        for cap in 0..=last_cap {
            // SAFETY: prctl with integer arguments.
            let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
            // EINVAL: a capability this kernel does not have.
            if rc < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
                return check("PR_CAPBSET_DROP", -1);
            }
        }
        let bits = SECBIT_NOROOT | SECBIT_NOROOT_LOCKED;
        // SAFETY: prctl with integer arguments.
        check("PR_SET_SECUREBITS", unsafe { libc::prctl(libc::PR_SET_SECUREBITS, bits, 0, 0, 0) } as libc::c_long)?;
        // SAFETY: groups is a valid array of its length.
        check("setgroups", unsafe { libc::setgroups(self.groups.len(), self.groups.as_ptr()) } as libc::c_long)?;
        // SAFETY: plain integer arguments.
        check("setresgid", unsafe { libc::setresgid(self.gid, self.gid, self.gid) } as libc::c_long)?;
        // SAFETY: plain integer arguments.
        check("setresuid", unsafe { libc::setresuid(self.uid, self.uid, self.uid) } as libc::c_long)?;
        // Leaving uid 0 emptied the sets already; staying uid 0 needs it said.
        let mut header = CapHeader { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
        let data = [CapData::default(); 2];
        // SAFETY: a valid header and two data structs, as version 3 wants.
        check("capset", unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) })?;
        // SAFETY: prctl with integer arguments. EINVAL: a kernel before ambient capabilities (4.3).
        let rc = unsafe { libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong, 0, 0, 0) };
        if rc < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
            return check("PR_CAP_AMBIENT_CLEAR_ALL", -1);
        }
        // SAFETY: prctl with integer arguments.
        check("PR_SET_NO_NEW_PRIVS", unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } as libc::c_long)
    }
}

/// The highest capability number of this kernel (`/proc/sys/kernel/cap_last_cap`).
pub fn last_capability() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(CAP_LAST_CAP_FALLBACK)
}

/// capset(2)'s header.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// capset(2)'s data: one of two 32-bit halves of each set.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_are_found_by_name_or_number() {
        let root = Identity::of_user("root").unwrap();
        assert_eq!((root.uid, root.gid), (0, 0));
        assert_eq!(Identity::of_user("0").unwrap().uid, 0);
        let unlisted = Identity::of_user("4000000").unwrap();
        assert_eq!((unlisted.uid, unlisted.gid, unlisted.groups.len()), (4_000_000, 4_000_000, 0));
        let e = Identity::of_user("no-such-user-stfs").unwrap_err().to_string();
        assert_eq!(e, "no user `no-such-user-stfs` (not in the user database, not a number)");
        assert!(last_capability() >= 36, "CAP_LAST_CAP is at least CAP_BLOCK_SUSPEND on any kernel stfs runs on");
    }
}

//! The process's resource limits a mount raises before it opens anything: the soft limit on open
//! descriptors, up to the hard one, as servers do at start.

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (systemd and many shells start processes at a
/// soft 1,024 while allowing far more): a checkpoint of hundreds of shards, each read through a few
/// descriptors or connections, must not fail with `too many open files` when the system would
/// allow them. The engine still bounds what it keeps open (`engine::tuning::OPEN_SOURCES`); this
/// is headroom, not the budget. Returns the soft limit in force afterwards. Failing to raise it
/// changes nothing but the headroom, so it is only logged.
pub fn raise_open_files_limit() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit fills the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        log::debug!("getrlimit(RLIMIT_NOFILE): {}", std::io::Error::last_os_error());
        return 0;
    }
    if limit.rlim_cur >= limit.rlim_max {
        return limit.rlim_cur;
    }
    let before = limit.rlim_cur;
    limit.rlim_cur = limit.rlim_max;
    // SAFETY: setrlimit reads the struct we pass; a soft limit up to the hard one is always allowed.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        log::debug!("setrlimit(RLIMIT_NOFILE, {}): {}", limit.rlim_max, std::io::Error::last_os_error());
        return before;
    }
    log::debug!("open files limit raised from {before} to {}", limit.rlim_cur);
    limit.rlim_cur
}

#[cfg(test)]
mod tests {
    #[test]
    fn raises_the_soft_limit_to_the_hard_one() {
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: as above.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) }, 0);
        let hard = limit.rlim_max;
        assert_eq!(super::raise_open_files_limit(), hard);
        // SAFETY: as above.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) }, 0);
        assert_eq!(limit.rlim_cur, hard);
    }
}

//! Retry policy for transient HTTP failures: capped exponential backoff with full jitter.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, SystemTime};

/// How often and how patiently a failing request is repeated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Total tries per request, the first included (at least 1).
    pub attempts: u32,
    /// Backoff ceiling of the first retry; it doubles per retry.
    pub base_delay: Duration,
    /// Largest wait between two tries, also the cap on a server's `Retry-After`.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { attempts: 5, base_delay: Duration::from_millis(100), max_delay: Duration::from_secs(5) }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (0 for the first retry). Full jitter: uniform in
    /// `[0, min(max_delay, base_delay * 2^retry)]`, so that many streams failing together do not
    /// come back in lockstep. A server's `Retry-After` raises the wait, never above `max_delay`.
    pub fn delay(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        self.delay_with(retry, retry_after, random_u64())
    }

    fn delay_with(&self, retry: u32, retry_after: Option<Duration>, random: u64) -> Duration {
        let ceiling = self.base_delay.saturating_mul(1u32.checked_shl(retry).unwrap_or(u32::MAX)).min(self.max_delay);
        let ceiling_micros = u64::try_from(ceiling.as_micros()).unwrap_or(u64::MAX);
        let jittered = Duration::from_micros(random % ceiling_micros.saturating_add(1));
        jittered.max(retry_after.unwrap_or_default()).min(self.max_delay)
    }
}

/// A random number from the standard library's per-instance SipHash keys (no extra crate needed
/// for jitter, which only has to differ between threads and calls).
fn random_u64() -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u128(SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_nanos());
    hasher.finish()
}

/// Parses `Retry-After`: delay seconds, or an HTTP date (the wait until then).
pub(crate) fn parse_retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let when = super::pin::parse_http_date(value)?;
    Some(when.duration_since(SystemTime::now()).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy { attempts: 5, base_delay: Duration::from_millis(100), max_delay: Duration::from_secs(5) }
    }

    #[test]
    fn jitter_stays_under_the_doubling_ceiling() {
        let policy = policy();
        for retry in 0..40 {
            let ceiling = Duration::from_millis(100 * (1u64 << retry.min(20))).min(Duration::from_secs(5));
            for random in [0, 1, 12_345, u64::MAX / 3, u64::MAX] {
                assert!(policy.delay_with(retry, None, random) <= ceiling, "retry {retry}");
            }
        }
        assert_eq!(policy.delay_with(0, None, 100_000), Duration::from_micros(100_000));
        assert_eq!(policy.delay_with(0, None, 100_001), Duration::ZERO);
    }

    #[test]
    fn retry_after_raises_the_wait_up_to_the_cap() {
        let policy = policy();
        assert_eq!(policy.delay_with(0, Some(Duration::from_secs(2)), 0), Duration::from_secs(2));
        assert_eq!(policy.delay_with(0, Some(Duration::from_secs(60)), 0), Duration::from_secs(5));
    }

    #[test]
    fn random_delays_vary() {
        let policy = policy();
        let delays: std::collections::HashSet<_> = (0..20).map(|_| policy.delay(4, None)).collect();
        assert!(delays.len() > 1);
    }

    #[test]
    fn retry_after_forms() {
        assert_eq!(parse_retry_after(" 3 "), Some(Duration::from_secs(3)));
        assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT"), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon"), None);
    }
}

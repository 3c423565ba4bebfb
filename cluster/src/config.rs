//! How an instance uses the cluster index.

use std::time::Duration;

use crate::IndexError;

/// Settings of an instance's index client. See `docs/CONFIGURATION.md` (`IndexConfig`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexConfig {
    /// `redis://host:port[/db]` (or `rediss://`, `valkey://`: the same protocol).
    pub url: String,
    /// Prefix of every key this index writes, so several pools can share one Redis.
    pub prefix: String,
    /// The address this instance serves loads on: how others name it in the index.
    pub instance: String,
    /// How long a lease lasts unrenewed; it is renewed every third of this.
    pub lease: Duration,
    /// Time one Redis call may take before it fails with [`IndexError::Timeout`] (milliseconds: a lookup
    /// waits on it).
    pub timeout: Duration,
    /// Time to open a connection.
    pub connect_timeout: Duration,
    /// A block's entries expire this long after the last publish of any holder (re-syncs refresh them).
    pub entry_ttl: Duration,
    /// Events a publish carries at most (one pipeline).
    pub batch: usize,
    /// Events waiting to be published at most; beyond it they are dropped, counted, and a re-sync follows.
    pub queue: usize,
    /// Every this long the instance publishes all it holds under a new epoch (drift repair).
    pub resync_interval: Duration,
}

impl IndexConfig {
    /// Defaults for an index at `url`, this instance serving at `instance`.
    #[must_use]
    pub fn new(url: impl Into<String>, instance: impl Into<String>) -> IndexConfig {
        IndexConfig {
            url: url.into(),
            prefix: "kvt".into(),
            instance: instance.into(),
            lease: Duration::from_secs(5),
            timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_millis(500),
            entry_ttl: Duration::from_secs(600),
            batch: 512,
            queue: 65_536,
            resync_interval: Duration::from_secs(300),
        }
    }

    /// Checks every setting; the error names the first that cannot work.
    pub fn validate(&self) -> Result<(), IndexError> {
        let bad = |what: &str| Err(IndexError::Config(what.into()));
        if self.instance.is_empty() {
            return bad("`instance` is empty: other instances could not load from this one");
        }
        if self.prefix.is_empty() || self.prefix.contains(['{', '}']) {
            return bad(
                "`prefix` must be non-empty and hold no `{` or `}` (Redis Cluster hash tags)",
            );
        }
        if self.lease < Duration::from_millis(300) {
            return bad("`lease` must be at least 300 ms (renewed every third of it)");
        }
        if self.timeout.is_zero() || self.connect_timeout.is_zero() {
            return bad("`timeout` and `connect_timeout` must be above zero");
        }
        if self.entry_ttl <= self.lease {
            return bad("`entry_ttl` must be longer than `lease`");
        }
        if self.batch == 0 || self.queue < self.batch {
            return bad("`batch` must be above zero and `queue` at least `batch`");
        }
        if self.resync_interval <= self.lease {
            return bad("`resync_interval` must be longer than `lease`");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_hold_and_each_bad_setting_is_named() {
        let ok = IndexConfig::new("redis://127.0.0.1:6379", "10.0.0.1:7000");
        ok.validate().unwrap();
        type Spoil = fn(&mut IndexConfig);
        let cases: [(&str, Spoil); 6] = [
            ("instance", |c| c.instance.clear()),
            ("prefix", |c| c.prefix = "a{b}".into()),
            ("lease", |c| c.lease = Duration::from_millis(10)),
            ("timeout", |c| c.timeout = Duration::ZERO),
            ("entry_ttl", |c| c.entry_ttl = c.lease),
            ("batch", |c| c.queue = c.batch - 1),
        ];
        for (name, spoil) in cases {
            let mut c = ok.clone();
            spoil(&mut c);
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(name), "{name}: {e}");
        }
    }
}

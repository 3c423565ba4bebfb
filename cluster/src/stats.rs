//! What an instance's index client did: counters an operator watches.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Counters of one instance's index client and publisher, shared by both.
        #[derive(Debug, Default)]
        pub struct IndexStats {
            $($(#[$doc])* pub(crate) $name: AtomicU64,)*
        }

        /// A copy of [`IndexStats`] at one moment.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct IndexCounts {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl IndexStats {
            /// The counters now.
            #[must_use]
            pub fn counts(&self) -> IndexCounts {
                IndexCounts { $($name: self.$name.load(Ordering::Relaxed),)* }
            }
        }
    };
}

counters! {
    /// Lookups answered.
    lookups,
    /// Lookups that failed (Redis down, slow or refusing): the caller used its own store.
    lookup_failures,
    /// Entries lookups skipped because their instance's lease lapsed or their epoch was old.
    stale_entries,
    /// Events published.
    published,
    /// Events dropped: the queue was full or Redis failed; a re-sync repairs what they would have said.
    dropped,
    /// Publishes (pipelines) that failed.
    publish_failures,
    /// Lease renewals that succeeded.
    renewals,
    /// Lease renewals that failed.
    renew_failures,
    /// Re-syncs completed (at start, after Redis came back, after drops, and every `resync_interval`).
    resyncs,
    /// Blocks the re-syncs published.
    resync_blocks,
    /// Microseconds the last re-sync took.
    last_resync_micros,
}

impl IndexStats {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

//! The shapes of the budgets a lane's reader charges before it hands a frame on: control frames per lane
//! and per address, Data payload bytes per address and per peer. `reader_budgets.rs` charges them.

use std::sync::{Arc, Mutex};

use transfer_engine::TokenBucket;

/// A budget shared by several lanes (those of one address, or of one peer).
pub(crate) type SharedBudget = Arc<Mutex<TokenBucket>>;

/// A control-frame budget of `per_sec` frames a second, in bursts of a tenth of that (at least 64);
/// `None` for unlimited. A lane's own budget and its address's are both this shape.
pub(crate) fn control_budget(per_sec: u64) -> Option<TokenBucket> {
    if per_sec == 0 {
        return None;
    }
    TokenBucket::new(per_sec, (per_sec / 10).max(64), 1).ok()
}

/// A Data byte budget of `per_sec` payload bytes a second, in bursts of a tenth of that (at least 1 MiB),
/// metered in 4 KiB cells; `None` for unlimited. An address's budget and a peer's are both this shape.
pub(crate) fn data_budget(per_sec: u64) -> Option<TokenBucket> {
    if per_sec == 0 {
        return None;
    }
    TokenBucket::new(per_sec, (per_sec / 10).max(1 << 20), 4096).ok()
}

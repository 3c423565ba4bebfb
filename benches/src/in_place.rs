//! The one promise te-bench makes so that `te-bench run --backend rdma --in-place` registers host regions
//! as they are (zero-copy) rather than through mirrors; this module exists to hold it.
#![allow(unsafe_code)]

use backends::rdma::{HostMemoryAccess, InPlace};

/// Host regions registered in place.
pub(crate) fn host_memory_in_place() -> HostMemoryAccess {
    // SAFETY: `te-bench run` reads a destination only after every session into it is over at both ends
    // (its byte check), never writes a source while a transfer from it runs, and its two nodes, in one
    // process, are the only holders of each other's region keys.
    let granted = unsafe { InPlace::granted() };
    HostMemoryAccess::InPlace(granted)
}

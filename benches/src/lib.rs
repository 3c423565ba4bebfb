//! What `te-bench` and the examples beside it share that is not a subcommand: the machine's raw limits
//! that transfers are measured against.
#![forbid(unsafe_code)]

pub mod socket_copy;

pub use socket_copy::{SocketCopy, socket_copy_gbps};

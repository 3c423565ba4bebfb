//! Why a connection to a peer (a TCP lane) closed, as a value rather than a text to match.

use std::fmt;
use std::io;

/// Why a connection to a peer closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseReason {
    /// This node closed it (a disconnect, a shutdown).
    Local,
    /// It carried nothing for the idle timeout.
    Idle,
    /// The peer sent a frame this node refused (it was told why in a `Reject`).
    Refused(String),
    /// The peer made no progress for the stall timeout: it stopped reading, or stalled mid-frame.
    Stalled(String),
    /// The peer closed or reset the connection.
    PeerClosed(String),
    /// A read or write failed otherwise.
    Io(String),
    /// This node was at its lane bound and gave the lane's seat to a newcomer from an address holding
    /// fewer lanes (the peer was told why in a `Reject`).
    Shed(String),
}

impl CloseReason {
    /// The reason an I/O error (or an error caused by one) closed a connection.
    #[must_use]
    pub fn from_error(e: &(dyn std::error::Error + 'static)) -> Self {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
        while let Some(err) = source {
            if let Some(io) = err.downcast_ref::<io::Error>() {
                return match io.kind() {
                    io::ErrorKind::TimedOut => CloseReason::Stalled(e.to_string()),
                    io::ErrorKind::UnexpectedEof
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::BrokenPipe => CloseReason::PeerClosed(e.to_string()),
                    _ => CloseReason::Io(e.to_string()),
                };
            }
            source = err.source();
        }
        CloseReason::Io(e.to_string())
    }

    /// Whether the peer is to blame (it was refused, stalled or went away), as against this node.
    #[must_use]
    pub fn is_peer(&self) -> bool {
        matches!(
            self,
            CloseReason::Refused(_) | CloseReason::Stalled(_) | CloseReason::PeerClosed(_)
        )
    }
}

impl fmt::Display for CloseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CloseReason::Local => f.write_str("closed locally"),
            CloseReason::Idle => f.write_str("idle"),
            CloseReason::Refused(why) => write!(f, "refused: {why}"),
            CloseReason::Stalled(why) => write!(f, "stalled: {why}"),
            CloseReason::PeerClosed(why) => write!(f, "closed by the peer: {why}"),
            CloseReason::Io(why) => write!(f, "I/O failed: {why}"),
            CloseReason::Shed(why) => write!(f, "shed: {why}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_say_whose_fault_the_close_was() {
        let stall = io::Error::new(io::ErrorKind::TimedOut, "the peer did not read for 10 s");
        assert!(matches!(
            CloseReason::from_error(&stall),
            CloseReason::Stalled(_)
        ));
        let eof = io::Error::from(io::ErrorKind::UnexpectedEof);
        assert!(CloseReason::from_error(&eof).is_peer());
        let other = io::Error::from(io::ErrorKind::OutOfMemory);
        let reason = CloseReason::from_error(&other);
        assert!(matches!(reason, CloseReason::Io(_)) && !reason.is_peer());
        assert_eq!(CloseReason::Idle.to_string(), "idle");
    }
}

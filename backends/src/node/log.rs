//! A node's log: connection-level events, refusals and errors, one ring for every backend. Each entry is
//! structured (a [`LogKind`], the peer it concerns, the error it carries) and is a `tracing` event too
//! (target `backends::node`, with fields `backend`, `engine`, `kind`, `peer` and `fault`), so a program
//! with a `tracing` subscriber sees every node's entries as they happen. The ring keeps the newest
//! [`KEEP_LINES`] for [`crate::node::Node::log`] (as text) and [`crate::node::Node::log_entries`] (as
//! entries), numbered so a reader can take each once. An entry equal to the one before it is counted on
//! that entry instead ("(n times)") and renumbered, so a peer repeating one mistake cannot push the rest
//! out, and a reader still sees that it came again.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Mutex;

use transfer_engine::PeerId;

use crate::lock::lock;
use crate::transport::{CloseReason, Fault, TransportError};

/// Entries kept (oldest dropped first).
pub const KEEP_LINES: usize = 1024;

/// What a log entry is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LogKind {
    /// A peer was reached, or reached this node (a lane, a link, a route).
    Connected,
    /// A connection was refused in its handshake, by this node or by the peer.
    HandshakeRefused,
    /// A frame, message or unit from a peer was refused and dropped; the node serves on.
    Refused,
    /// A lane or link closed (its peer's doing, or a limit of this node's).
    Closed,
    /// A peer was declared unreachable: its sessions ended with recompute.
    Unreachable,
    /// A peer declared unreachable was heard from again.
    Reachable,
    /// A peer's sessions ended for another reason (a new process took its engine id, say).
    SessionsEnded,
    /// This node's own I/O failed (accepting, dialing, a provider call), or a frame was dropped unsent.
    Failed,
}

impl LogKind {
    /// The kind's name, as the `kind` field of its `tracing` event.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            LogKind::Connected => "connected",
            LogKind::HandshakeRefused => "handshake_refused",
            LogKind::Refused => "refused",
            LogKind::Closed => "closed",
            LogKind::Unreachable => "unreachable",
            LogKind::Reachable => "reachable",
            LogKind::SessionsEnded => "sessions_ended",
            LogKind::Failed => "failed",
        }
    }
}

/// One entry of a node's log.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LogEntry {
    /// Its number, counting from 1: the number of its latest time (an entry repeated in a row is
    /// renumbered each time it comes).
    pub number: u64,
    /// What it is about.
    pub kind: LogKind,
    /// The peer it concerns, when one is known.
    pub peer: Option<PeerId>,
    /// The error it reports, if any.
    pub error: Option<TransportError>,
    /// Why a connection closed, for a [`LogKind::Closed`] entry.
    pub closed: Option<CloseReason>,
    /// What happened, in words (without the error's own text).
    pub text: String,
    /// How many times it came in a row.
    pub times: u64,
}

impl LogEntry {
    /// Whose fault the entry's error is, if it carries one.
    #[must_use]
    pub fn fault(&self) -> Option<Fault> {
        self.error.as_ref().map(TransportError::fault)
    }

    /// The entry's text with its error, as one line.
    fn line(&self) -> String {
        match &self.error {
            Some(e) => format!("{}: {e}", self.text),
            None => self.text.clone(),
        }
    }

    fn same_as(&self, kind: LogKind, peer: Option<PeerId>, line: &str) -> bool {
        self.kind == kind && self.peer == peer && self.line() == line
    }
}

impl fmt::Display for LogEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.times {
            1 => f.write_str(&self.line()),
            n => write!(f, "{} ({n} times)", self.line()),
        }
    }
}

/// See the [module docs](self). Public only as an opaque part of a node's core.
#[derive(Debug)]
pub struct Log {
    backend: &'static str,
    engine: u32,
    entries: Mutex<(VecDeque<LogEntry>, u64)>,
}

impl Log {
    /// An empty log of the node with engine id `engine` on `backend`.
    pub(crate) fn new(backend: &'static str, engine: u32) -> Self {
        Self {
            backend,
            engine,
            entries: Mutex::new((VecDeque::new(), 0)),
        }
    }

    /// Records an entry (and hands it to `tracing`).
    pub(crate) fn record(
        &self,
        kind: LogKind,
        peer: Option<PeerId>,
        error: Option<TransportError>,
        text: impl Into<String>,
    ) {
        self.push(LogEntry {
            number: 0,
            kind,
            peer,
            error,
            closed: None,
            text: text.into(),
            times: 1,
        });
    }

    /// Records that a connection to `peer` closed for `reason`; `text` says which, and why.
    pub(crate) fn closed(&self, peer: PeerId, text: impl Into<String>, reason: CloseReason) {
        self.push(LogEntry {
            number: 0,
            kind: LogKind::Closed,
            peer: Some(peer),
            error: None,
            closed: Some(reason),
            text: text.into(),
            times: 1,
        });
    }

    fn push(&self, entry: LogEntry) {
        let (kind, peer) = (entry.kind, entry.peer);
        let line = entry.line();
        self.trace(&entry, &line);
        let mut guard = lock(&self.entries);
        let (entries, numbered) = &mut *guard;
        *numbered += 1;
        if let Some(last) = entries.back_mut()
            && last.same_as(kind, peer, &line)
        {
            last.times += 1;
            last.number = *numbered;
            return;
        }
        if entries.len() >= KEEP_LINES {
            entries.pop_front();
        }
        entries.push_back(LogEntry {
            number: *numbered,
            ..entry
        });
    }

    /// An entry of `kind` about `peer`, without an error.
    pub(crate) fn note(&self, kind: LogKind, peer: Option<PeerId>, text: impl Into<String>) {
        self.record(kind, peer, None, text);
    }

    /// An entry of `kind` about `peer` that reports `error`, after `text` (what was being done).
    pub(crate) fn error(
        &self,
        kind: LogKind,
        peer: Option<PeerId>,
        text: impl Into<String>,
        error: impl Into<TransportError>,
    ) {
        self.record(kind, peer, Some(error.into()), text);
    }

    fn trace(&self, entry: &LogEntry, line: &str) {
        let peer = entry.peer.map(|p| p.0);
        let fault = entry.fault().map(Fault::name);
        let kind = entry.kind.name();
        if matches!(entry.kind, LogKind::Unreachable | LogKind::Failed) {
            tracing::warn!(target: "backends::node", backend = self.backend, engine = self.engine, kind,
                peer, fault, "{line}");
        } else {
            tracing::info!(target: "backends::node", backend = self.backend, engine = self.engine, kind,
                peer, fault, "{line}");
        }
    }

    /// Every kept entry, oldest first.
    pub(crate) fn entries(&self) -> Vec<LogEntry> {
        self.entries_after(0).0
    }

    /// The kept entries numbered after `seen`, and the newest entry's number (`seen` when there is none):
    /// call again with it to take each entry once.
    pub(crate) fn entries_after(&self, seen: u64) -> (Vec<LogEntry>, u64) {
        let guard = lock(&self.entries);
        let entries = guard
            .0
            .iter()
            .filter(|e| e.number > seen)
            .cloned()
            .collect();
        (entries, guard.0.back().map_or(seen, |e| e.number))
    }

    /// The newest entry's number (0 before the first).
    pub(crate) fn newest(&self) -> u64 {
        lock(&self.entries).1
    }

    /// The kept entries numbered after `seen` as lines, and the newest entry's number.
    pub(crate) fn lines_after(&self, seen: u64) -> (Vec<String>, u64) {
        let (entries, newest) = self.entries_after(seen);
        (entries.iter().map(ToString::to_string).collect(), newest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_numbered_folded_and_bounded() {
        let log = Log::new("tcp", 1);
        log.note(LogKind::Connected, Some(PeerId(2)), "a");
        log.note(LogKind::Closed, None, "b");
        log.note(LogKind::Closed, None, "b");
        log.note(LogKind::Refused, None, "b");
        let lines: Vec<String> = log.entries().iter().map(ToString::to_string).collect();
        assert_eq!(lines, ["a", "b (2 times)", "b"]);
        assert_eq!(log.entries()[0].peer, Some(PeerId(2)));
        let (new, seen) = log.lines_after(1);
        assert_eq!((new, seen), (vec!["b (2 times)".into(), "b".into()], 4));
        assert_eq!(log.lines_after(4), (vec![], 4));
        assert_eq!(log.newest(), 4);
        // A repeat after a reader's mark is seen again, with its count.
        log.note(LogKind::Refused, None, "b");
        assert_eq!(log.lines_after(4), (vec!["b (2 times)".into()], 5));
        for i in 0..2 * KEEP_LINES {
            log.note(LogKind::Connected, None, format!("line {i}"));
        }
        let entries = log.entries();
        assert_eq!(entries.len(), KEEP_LINES);
        assert_eq!(
            entries.last().unwrap().text,
            format!("line {}", 2 * KEEP_LINES - 1)
        );
        assert_eq!(entries.last().unwrap().number, 5 + 2 * KEEP_LINES as u64);
    }

    #[test]
    fn an_entry_carries_its_error_and_fault() {
        let log = Log::new("shm", 1);
        log.error(
            LogKind::Refused,
            Some(PeerId(3)),
            "refused a frame",
            TransportError::protocol("shm", "garbage"),
        );
        let entry = &log.entries()[0];
        assert_eq!(entry.fault(), Some(Fault::Peer));
        assert_eq!(
            entry.to_string(),
            "refused a frame: the peer broke the shm protocol: garbage"
        );
    }
}

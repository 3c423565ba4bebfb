//! A node's log: connection-level events, refusals and errors, one ring for every backend. Each line is a
//! `tracing` event too (target `backends::node`, with the node's `backend` and `engine` as fields), so a
//! program with a `tracing` subscriber sees every node's lines as they happen; the ring keeps the newest
//! [`KEEP_LINES`] for [`crate::node::Node::log`] and [`crate::node::Node::log_after`], numbered so a reader
//! can print each once. A line equal to the one before it is counted on that line instead ("(n times)"),
//! so a peer repeating one mistake cannot push the rest out.

use std::collections::VecDeque;
use std::sync::Mutex;

use crate::lock::lock;

/// Lines kept (oldest dropped first).
pub const KEEP_LINES: usize = 1024;

/// One kept line: its number (counting from 1), its text, how many times it came in a row.
#[derive(Debug)]
struct Line {
    number: u64,
    text: String,
    times: u64,
}

impl Line {
    fn show(&self) -> String {
        match self.times {
            1 => self.text.clone(),
            n => format!("{} ({n} times)", self.text),
        }
    }
}

/// See the [module docs](self). Public only as an opaque part of [`super::Driver`].
#[derive(Debug)]
pub struct Log {
    backend: &'static str,
    engine: u32,
    lines: Mutex<(VecDeque<Line>, u64)>,
}

impl Log {
    /// An empty log of the node with engine id `engine` on `backend`.
    pub(crate) fn new(backend: &'static str, engine: u32) -> Self {
        Self {
            backend,
            engine,
            lines: Mutex::new((VecDeque::new(), 0)),
        }
    }

    /// Records `text` (and hands it to `tracing`).
    pub(crate) fn note(&self, text: String) {
        tracing::info!(
            target: "backends::node",
            backend = self.backend,
            engine = self.engine,
            "{text}"
        );
        let mut guard = lock(&self.lines);
        let (lines, numbered) = &mut *guard;
        if let Some(last) = lines.back_mut()
            && last.text == text
        {
            last.times += 1;
            return;
        }
        if lines.len() >= KEEP_LINES {
            lines.pop_front();
        }
        *numbered += 1;
        lines.push_back(Line {
            number: *numbered,
            text,
            times: 1,
        });
    }

    /// Every kept line, oldest first.
    pub(crate) fn lines(&self) -> Vec<String> {
        self.after(0).0
    }

    /// The kept lines numbered after `seen`, and the newest line's number (`seen` when there is none):
    /// call again with it to read each line once.
    pub(crate) fn after(&self, seen: u64) -> (Vec<String>, u64) {
        let guard = lock(&self.lines);
        let lines = guard
            .0
            .iter()
            .filter(|l| l.number > seen)
            .map(Line::show)
            .collect();
        (lines, guard.0.back().map_or(seen, |l| l.number))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_numbered_folded_and_bounded() {
        let log = Log::new("tcp", 1);
        log.note("a".into());
        log.note("b".into());
        log.note("b".into());
        log.note("c".into());
        assert_eq!(log.lines(), ["a", "b (2 times)", "c"]);
        let (new, seen) = log.after(1);
        assert_eq!((new, seen), (vec!["b (2 times)".into(), "c".into()], 3));
        assert_eq!(log.after(3), (vec![], 3));
        for i in 0..2 * KEEP_LINES {
            log.note(format!("line {i}"));
        }
        let lines = log.lines();
        assert_eq!(lines.len(), KEEP_LINES);
        assert_eq!(
            lines.last().unwrap(),
            &format!("line {}", 2 * KEEP_LINES - 1)
        );
    }
}

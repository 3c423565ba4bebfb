//! Mooncake-format request traces (JSON lines; see `data/traces/README.md`).

use std::collections::HashSet;
use std::path::Path;

use serde::Deserialize;

use crate::error::PolicyError;

/// One request of a trace.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Request {
    /// Arrival, milliseconds from the start.
    pub timestamp: u64,
    /// Prompt tokens.
    pub input_length: u64,
    /// Generated tokens.
    pub output_length: u64,
    /// Prefix block hashes, one per 512-token block: equal ids at the same position share KV.
    pub hash_ids: Vec<u64>,
}

/// A loaded trace, requests in file order.
#[derive(Debug, Clone)]
pub struct Trace {
    name: String,
    requests: Vec<Request>,
}

impl Trace {
    /// Reads a trace file; its name is the file name.
    pub fn load(path: impl AsRef<Path>) -> Result<Trace, PolicyError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| PolicyError::TraceIo {
            path: path.to_path_buf(),
            source,
        })?;
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into(),
        );
        Trace::parse(&name, &text)
    }

    /// Parses JSON lines (blank lines are skipped).
    pub fn parse(name: &str, text: &str) -> Result<Trace, PolicyError> {
        let requests = text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| {
                serde_json::from_str(l).map_err(|e| PolicyError::TraceFormat {
                    trace: name.to_owned(),
                    line: i + 1,
                    message: e.to_string(),
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Trace {
            name: name.to_owned(),
            requests,
        })
    }

    /// A trace from requests already in memory.
    #[must_use]
    pub fn from_requests(name: &str, requests: Vec<Request>) -> Trace {
        Trace {
            name: name.to_owned(),
            requests,
        }
    }

    /// The trace's name (its file name when loaded).
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The requests, in file order.
    #[must_use]
    pub fn requests(&self) -> &[Request] {
        &self.requests
    }

    /// Sum of `len(hash_ids)` over all requests: the hit ratio's denominator.
    #[must_use]
    pub fn total_blocks(&self) -> u64 {
        self.requests.iter().map(|r| r.hash_ids.len() as u64).sum()
    }

    /// Distinct block ids (size caches as a fraction of this).
    #[must_use]
    pub fn distinct_blocks(&self) -> usize {
        self.requests
            .iter()
            .flat_map(|r| &r.hash_ids)
            .collect::<HashSet<_>>()
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lines_and_counts_blocks() {
        let t = Trace::parse(
            "t",
            "{\"timestamp\": 27482, \"input_length\": 6955, \"output_length\": 52, \"hash_ids\": [46, 47]}\n\n\
             {\"timestamp\": 27490, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [46]}\n",
        )
        .unwrap();
        assert_eq!(t.requests().len(), 2);
        assert_eq!(t.total_blocks(), 3);
        assert_eq!(t.distinct_blocks(), 2);
        assert_eq!(t.requests()[0].timestamp, 27482);
    }

    #[test]
    fn bad_lines_name_the_line_and_the_fix() {
        let err = Trace::parse("t", "{\"timestamp\": 1}\nnot json\n").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("line 1") && msg.contains("hash_ids"), "{msg}");
    }

    #[test]
    fn a_missing_file_says_where_to_look() {
        let msg = Trace::load("/nonexistent/trace.jsonl")
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("/nonexistent/trace.jsonl") && msg.contains("data/traces"),
            "{msg}"
        );
    }
}

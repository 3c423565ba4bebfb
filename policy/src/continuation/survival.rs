//! Learned return-time distributions per class of request, and the eviction index they give.
//!
//! Time since a request is cut into [`BINS`] geometric bins (2 s, then ×1.5 each, up to about three
//! hours). For each class, the hazard of bin `b` is the share of requests that, having not continued
//! before `b`, continue within it; it is estimated from requests observed through the whole bin only
//! (open conversations are censored, not counted as gone). Thin classes borrow from coarser ones: the
//! estimate of each level is shrunk toward its parent's with a prior of [`SurvivalConfig::prior`]
//! requests (levels: all requests; turn; + blocks added; + output length; + gap since the previous
//! turn).
//!
//! The eviction index of a group of blocks whose request is `a` old is the best ratio, over holding
//! times `T`, of "chance the conversation continues within `T`" to "expected time the blocks are held
//! if kept up to `T`" (a Gittins-style index per block-second), both conditional on no return before
//! `a`.

/// Number of age bins.
pub const BINS: usize = 22;

/// First bin edge after zero, in milliseconds.
const FIRST_EDGE_MS: f64 = 2_000.0;
/// Growth of the bin widths.
const GROWTH: f64 = 1.5;

/// Start of bin `b` in milliseconds (`b == BINS` gives the end of the last bin).
#[must_use]
pub fn edge_ms(b: usize) -> u64 {
    if b == 0 {
        0
    } else {
        (FIRST_EDGE_MS * GROWTH.powi(b as i32 - 1)) as u64
    }
}

/// The bin an age in milliseconds falls into, or `None` beyond the last.
#[must_use]
pub fn bin_of(age_ms: u64) -> Option<usize> {
    bin_in(&edges(), age_ms)
}

/// Every bin edge, `edges()[b] == edge_ms(b)`.
#[must_use]
pub fn edges() -> [u64; BINS + 1] {
    std::array::from_fn(edge_ms)
}

fn bin_in(edges: &[u64; BINS + 1], age_ms: u64) -> Option<usize> {
    let b = edges[1..].partition_point(|&e| e <= age_ms);
    (b < BINS).then_some(b)
}

/// What a request's class is made of (each field already bucketed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Class {
    /// Turn in the conversation: 0 (first), 1 (second), 2 (third or later).
    pub turn: u8,
    /// Blocks the request added beyond its already-seen prefix: 0 (≤ 1), 1 (2–3), 2 (4–7), 3 (8–15),
    /// 4 (16 or more).
    pub added: u8,
    /// Output tokens: 0 (< 64), 1 (< 256), 2 (< 1024), 3 (more); 0 when output length is not used.
    pub output: u8,
    /// Gap since the previous turn: 0 (first turn or < 15 s), 1 (< 1 min), 2 (< 4 min), 3 (more).
    pub gap: u8,
}

const RADIX: [usize; 4] = [3, 5, 4, 4];
/// Number of classes at each level, coarsest first.
const LEVEL_SIZES: [usize; 5] = [1, 3, 15, 60, 240];
const LEVEL_OFFSETS: [usize; 5] = [0, 1, 4, 19, 79];
const TABLES: usize = 319;
/// Hazard per bin assumed before any observation (all classes alike, so it only sets the scale).
const PRIOR_HAZARD: f64 = 0.05;

impl Class {
    /// Buckets a request's features.
    #[must_use]
    pub fn new(turn: u32, added: usize, output_tokens: Option<u64>, gap_ms: Option<u64>) -> Class {
        let log_bucket = |x: u64, step_bits: u32, first: u64, max: u8| -> u8 {
            let mut b = 0;
            let mut edge = first;
            while x >= edge && b < max {
                b += 1;
                edge <<= step_bits;
            }
            b
        };
        Class {
            turn: turn.saturating_sub(1).min(2) as u8,
            added: log_bucket(added as u64, 1, 2, 4),
            output: output_tokens.map_or(0, |o| log_bucket(o, 2, 64, 3)),
            gap: gap_ms.map_or(0, |g| log_bucket(g, 2, 15_000, 3)),
        }
    }

    /// The table index of this class at each level, coarsest first.
    fn tables(self) -> [usize; 5] {
        let digits = [self.turn, self.added, self.output, self.gap].map(usize::from);
        let mut out = [0; 5];
        let mut code = 0;
        for level in 1..5 {
            code = code * RADIX[level - 1] + digits[level - 1].min(RADIX[level - 1] - 1);
            out[level] = LEVEL_OFFSETS[level] + code;
        }
        out
    }

    fn finest(self) -> usize {
        self.tables()[4] - LEVEL_OFFSETS[4]
    }
}

/// Learning settings.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct SurvivalConfig {
    /// Requests' worth of weight a class's estimate gives its parent level's (shrinkage).
    pub prior: f64,
    /// Use the class hierarchy; off: one distribution for all requests.
    pub classes: bool,
}

impl Default for SurvivalConfig {
    fn default() -> SurvivalConfig {
        SurvivalConfig {
            prior: 20.0,
            classes: true,
        }
    }
}

/// Continuation counts per class and bin, and the index table fitted from them.
#[derive(Debug, Clone)]
pub struct Survival {
    cfg: SurvivalConfig,
    /// Per table and bin: (continued within the bin, observed through the bin without continuing).
    counts: Vec<[(u32, u32); BINS]>,
    /// Per finest class and age bin: the eviction index.
    index: Vec<[f64; BINS]>,
    edges: [u64; BINS + 1],
}

impl Survival {
    /// No observations yet: every class has the same index.
    #[must_use]
    pub fn new(cfg: SurvivalConfig) -> Survival {
        let mut s = Survival {
            cfg,
            counts: vec![[(0, 0); BINS]; TABLES],
            index: vec![[0.0; BINS]; LEVEL_SIZES[4]],
            edges: edges(),
        };
        s.refit();
        s
    }

    /// A request of class `class` was observed through bin `bin`: it continued within it or not.
    pub fn observe(&mut self, class: Class, bin: usize, continued: bool) {
        for t in class.tables() {
            let c = &mut self.counts[t][bin];
            if continued {
                c.0 += 1;
            } else {
                c.1 += 1;
            }
        }
    }

    /// The eviction index of blocks whose request (of class `class`) is `age_ms` old and has not
    /// continued yet (0 beyond the last bin).
    #[must_use]
    pub fn index(&self, class: Class, age_ms: u64) -> f64 {
        bin_in(&self.edges, age_ms).map_or(0.0, |b| self.index[class.finest()][b])
    }

    /// Recomputes the index table from the counts.
    pub fn refit(&mut self) {
        let levels = if self.cfg.classes { 5 } else { 1 };
        // Hazards per table, coarse levels first so children can shrink toward their parent.
        let mut hazard = vec![[0.0; BINS]; TABLES];
        for level in 0..5 {
            for i in 0..LEVEL_SIZES[level] {
                let t = LEVEL_OFFSETS[level] + i;
                let parent = match level {
                    0 => None,
                    1 => Some(0),
                    _ => Some(LEVEL_OFFSETS[level - 1] + i / RADIX[level - 1]),
                };
                let base = parent.map_or([PRIOR_HAZARD; BINS], |p| hazard[p]);
                let counts = if level < levels {
                    self.counts[t]
                } else {
                    [(0, 0); BINS]
                };
                for ((h, base), (d, s)) in hazard[t].iter_mut().zip(base).zip(counts) {
                    let (d, s) = (f64::from(d), f64::from(s));
                    *h = (d + self.cfg.prior * base) / (d + s + self.cfg.prior);
                }
            }
        }
        for (i, row) in self.index.iter_mut().enumerate() {
            *row = gittins(&hazard[LEVEL_OFFSETS[4] + i], &self.edges);
        }
    }
}

/// For each age bin `k`: max over `j >= k` of P(return in bins k..=j) / E[time held up to bin j end],
/// both given survival to bin `k` (per second).
fn gittins(hazard: &[f64; BINS], edges: &[u64; BINS + 1]) -> [f64; BINS] {
    let mut surv = [1.0; BINS + 1];
    for b in 0..BINS {
        surv[b + 1] = surv[b] * (1.0 - hazard[b]);
    }
    let width = |b: usize| (edges[b + 1] - edges[b]) as f64 / 1000.0;
    let mut out = [0.0; BINS];
    for k in 0..BINS {
        let (mut held, mut best) = (0.0, 0.0f64);
        for j in k..BINS {
            held += width(j) * (surv[j] + surv[j + 1]) / 2.0;
            if held > 0.0 {
                best = best.max((surv[k] - surv[j + 1]) / held);
            }
        }
        out[k] = best;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bins_and_classes_bucket_as_documented() {
        assert_eq!(bin_of(0), Some(0));
        assert_eq!(bin_of(1_999), Some(0));
        assert_eq!(bin_of(2_000), Some(1));
        assert_eq!(bin_of(u64::MAX), None);
        let c = Class::new(5, 9, Some(300), Some(20_000));
        assert_eq!((c.turn, c.added, c.output, c.gap), (2, 3, 2, 1));
        let c = Class::new(1, 0, None, None);
        assert_eq!((c.turn, c.added, c.output, c.gap), (0, 0, 0, 0));
        let all: std::collections::BTreeSet<_> = (0..3u32)
            .flat_map(|t| (0..5).map(move |a| (t, a)))
            .flat_map(|(t, a)| {
                (0..4).flat_map(move |o| {
                    (0..4).map(move |g| {
                        Class {
                            turn: t as u8,
                            added: a,
                            output: o,
                            gap: g,
                        }
                        .finest()
                    })
                })
            })
            .collect();
        assert_eq!(all.len(), 240);
    }

    #[test]
    fn a_class_that_comes_back_soon_outranks_one_that_does_not() {
        let mut s = Survival::new(SurvivalConfig::default());
        let soon = Class::new(2, 1, None, None);
        let never = Class::new(1, 20, None, None);
        for _ in 0..200 {
            s.observe(soon, 3, true);
            for b in 0..BINS {
                s.observe(never, b, false);
            }
        }
        s.refit();
        assert!(s.index(soon, 0) > 2.0 * s.index(never, 0));
        // Past the bin where it returns, a `soon` group is worth little.
        assert!(s.index(soon, edge_ms(6)) < s.index(soon, 0));
        assert_eq!(s.index(soon, u64::MAX), 0.0);
    }
}

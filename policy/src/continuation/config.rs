//! The continuation policy's settings.

use super::survival::SurvivalConfig;

/// Settings; [`Default`] is the evaluated policy, the switches exist for the ablation.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct ContinuationConfig {
    /// Learning of the return-time distributions.
    pub survival: SurvivalConfig,
    /// Use the output length in the class (known once the response ends).
    pub use_output: bool,
    /// Evict partial last blocks and dead tails first.
    pub tails_first: bool,
    /// Index multiplier for blocks at or above a branch point (1: off).
    pub shared_boost: f64,
    /// Requests remembered, as a multiple of the capacity in blocks.
    pub history_factor: usize,
    /// Seen keys remembered (to find a request's already-seen prefix), as a multiple of the capacity.
    pub seen_factor: usize,
    /// Requests between refits of the index table.
    pub refit_every: u64,
}

impl Default for ContinuationConfig {
    fn default() -> ContinuationConfig {
        ContinuationConfig {
            survival: SurvivalConfig::default(),
            use_output: true,
            tails_first: true,
            shared_boost: 10.0,
            history_factor: 2,
            seen_factor: 8,
            refit_every: 16,
        }
    }
}

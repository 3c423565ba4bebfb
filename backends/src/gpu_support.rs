//! Whether this build and this machine can use a GPU: one answer for every backend and for the connector.

/// What a GPU entry point says in a build without feature `cuda`.
pub const NO_GPU_SUPPORT: &str = "this build has no GPU support (feature `cuda`)";

/// Checks that GPU `ordinal` can be used here: a build with feature `cuda`, a CUDA driver, and that GPU.
/// The error says which is missing.
pub fn check_gpu(ordinal: u32) -> Result<(), String> {
    #[cfg(feature = "cuda")]
    {
        crate::cuda::Gpu::open(ordinal)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = ordinal;
        Err(NO_GPU_SUPPORT.into())
    }
}

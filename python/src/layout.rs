//! `KvLayout`: where every (layer, block) of a KV region lies, built as the engine's layouts are.

use pyo3::prelude::*;
use transfer_engine::{BlockId, Dtype, KvKind, KvLayout, TensorView};

use crate::err;

/// The dtype called `name` (`"bf16"`, `"f16"`, `"f32"`, `"f8"`).
pub(crate) fn dtype(name: &str) -> PyResult<Dtype> {
    Ok(match name {
        "bf16" | "bfloat16" => Dtype::Bf16,
        "f16" | "float16" => Dtype::F16,
        "f32" | "float32" => Dtype::F32,
        "f8" | "fp8" | "float8" => Dtype::Fp8,
        _ => {
            return Err(crate::errors::config(format!(
                "unknown dtype {name:?}: use bf16, f16, f32 or f8"
            )));
        }
    })
}

fn dtype_name(d: Dtype) -> &'static str {
    match d {
        Dtype::Bf16 => "bf16",
        Dtype::F16 => "f16",
        Dtype::F32 => "f32",
        Dtype::Fp8 => "f8",
    }
}

/// A view as vLLM reports it: `(shape, strides, storage_offset)`, strides and offset in elements.
type ViewTuple = (Vec<u64>, Vec<u64>, u64);

fn views(views: Vec<ViewTuple>, element_size: u64) -> Vec<TensorView> {
    views
        .into_iter()
        .map(|(shape, strides, offset)| TensorView::new(&shape, &strides, offset, element_size))
        .collect()
}

/// Where every (layer, block) of a KV region lies: `layers` x `blocks_per_layer` blocks of `block_bytes`
/// bytes, layer-major unless built from a serving engine's tensor views.
#[pyclass(name = "KvLayout", module = "kv_transfer", frozen, eq, from_py_object)]
#[derive(Clone, PartialEq)]
pub(crate) struct PyKvLayout(pub(crate) KvLayout);

#[pymethods]
impl PyKvLayout {
    /// A layer-major layout: layer 0's blocks, then layer 1's, each block one contiguous run.
    #[new]
    #[pyo3(signature = (layers, blocks_per_layer, block_bytes, tokens_per_block = 16, dtype = "bf16"))]
    fn new(
        layers: u32,
        blocks_per_layer: u32,
        block_bytes: u64,
        tokens_per_block: u32,
        dtype: &str,
    ) -> PyResult<Self> {
        KvLayout::new(
            layers,
            blocks_per_layer,
            block_bytes,
            tokens_per_block,
            self::dtype(dtype)?,
        )
        .map(Self)
        .map_err(err)
    }

    /// vLLM 0.33's caches: one `[num_blocks, num_kv_heads, block_size, head_size]` view per layer over
    /// one buffer, as `(shape, stride, storage_offset)` (LBNHC and BLNHC alike).
    #[staticmethod]
    fn from_vllm(views: Vec<ViewTuple>, element_size: u64, dtype: &str) -> PyResult<Self> {
        KvLayout::from_vllm(&self::views(views, element_size), self::dtype(dtype)?)
            .map(Self)
            .map_err(err)
    }

    /// Older vLLM's `(2, num_blocks, block_size, num_kv_heads, head_size)` caches: K and V apart.
    #[staticmethod]
    fn from_kv_apart(views: Vec<ViewTuple>, element_size: u64, dtype: &str) -> PyResult<Self> {
        KvLayout::from_kv_apart(&self::views(views, element_size), self::dtype(dtype)?)
            .map(Self)
            .map_err(err)
    }

    /// MLA caches: one `[num_blocks, block_size, latent_size]` view per layer.
    #[staticmethod]
    fn from_mla(views: Vec<ViewTuple>, element_size: u64, dtype: &str) -> PyResult<Self> {
        KvLayout::from_mla(&self::views(views, element_size), self::dtype(dtype)?)
            .map(Self)
            .map_err(err)
    }

    /// Transformer layers.
    #[getter]
    fn layers(&self) -> u32 {
        self.0.layers
    }

    /// Blocks per layer.
    #[getter]
    fn blocks_per_layer(&self) -> u32 {
        self.0.blocks_per_layer
    }

    /// Bytes of one block of one layer.
    #[getter]
    fn block_bytes(&self) -> u64 {
        self.0.block_bytes
    }

    /// Tokens per block.
    #[getter]
    fn tokens_per_block(&self) -> u32 {
        self.0.tokens_per_block
    }

    /// The element type's name.
    #[getter]
    fn dtype(&self) -> &'static str {
        dtype_name(self.0.dtype)
    }

    /// What a block holds: `"bytes"`, `"kv_together"`, `"kv_together_head_major"`, `"kv_apart"` or
    /// `"mla"`.
    #[getter]
    fn kind(&self) -> &'static str {
        match self.0.heads.kind {
            KvKind::Bytes => "bytes",
            KvKind::KvTogether => "kv_together",
            KvKind::KvTogetherHeadMajor => "kv_together_head_major",
            KvKind::KvApart => "kv_apart",
            KvKind::Mla => "mla",
        }
    }

    /// Bytes of memory the layout reaches into (a buffer must hold at least this many).
    #[getter]
    fn total_bytes(&self) -> u64 {
        self.0.total_bytes()
    }

    /// The `(offset, length)` ranges of block `block` of layer `layer`, in logical order.
    fn chunks(&self, layer: u32, block: u32) -> PyResult<Vec<(u64, u64)>> {
        let id = BlockId::new(layer, block);
        if !self.0.contains(id) {
            return Err(pyo3::exceptions::PyIndexError::new_err(format!(
                "block {block} of layer {layer} is outside {} layers x {} blocks",
                self.0.layers, self.0.blocks_per_layer
            )));
        }
        Ok(self.0.chunks(id))
    }

    fn __repr__(&self) -> String {
        format!(
            "KvLayout(layers={}, blocks_per_layer={}, block_bytes={}, tokens_per_block={}, dtype={:?}, kind={:?})",
            self.0.layers,
            self.0.blocks_per_layer,
            self.0.block_bytes,
            self.0.tokens_per_block,
            self.dtype(),
            self.kind()
        )
    }
}

//! Layouts built from what a serving engine reports about its KV tensors: one view per layer over one
//! shared buffer, with shapes and strides in elements (PyTorch's `shape`, `stride()`, `storage_offset()`
//! and `element_size()`).

use super::{BlockPlacement, ChunkSplit, Dtype, KvHeads, KvKind, KvLayout};
use crate::Error;

/// One layer's KV tensor as its engine reports it. Every view of a layout must lie in the same storage
/// (the region), `storage_offset` elements from its start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorView {
    /// Size of each dimension.
    pub shape: Vec<u64>,
    /// Stride of each dimension, in elements.
    pub strides: Vec<u64>,
    /// Where the view starts in the storage, in elements.
    pub storage_offset: u64,
    /// Bytes per element.
    pub element_size: u64,
}

impl TensorView {
    /// A view of `shape` with `strides` (elements) at `storage_offset` (elements).
    #[must_use]
    pub fn new(shape: &[u64], strides: &[u64], storage_offset: u64, element_size: u64) -> Self {
        Self {
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            storage_offset,
            element_size,
        }
    }
}

fn bad(what: String) -> Error {
    Error::InvalidLayout(what)
}

/// Checks the views against each other and `dtype`, returning the first view; `dims` names the
/// dimensions the layout expects, for errors.
fn common<'a>(views: &'a [TensorView], dtype: Dtype, dims: &str) -> Result<&'a TensorView, Error> {
    let first = views
        .first()
        .ok_or_else(|| bad("no layer views given".into()))?;
    let rank = dims.split(',').count();
    if first.shape.len() != rank || first.strides.len() != rank {
        return Err(bad(format!(
            "a view of shape {:?} and strides {:?} is not of the expected shape [{dims}]",
            first.shape, first.strides
        )));
    }
    if first.element_size != dtype.size() {
        return Err(bad(format!(
            "elements of {} bytes are not {:?} ({} bytes)",
            first.element_size,
            dtype,
            dtype.size()
        )));
    }
    if let Some((i, v)) = views.iter().enumerate().find(|(_, v)| {
        v.shape != first.shape || v.strides != first.strides || v.element_size != first.element_size
    }) {
        return Err(bad(format!(
            "layer {i}'s view (shape {:?}, strides {:?}) differs from layer 0's (shape {:?}, strides {:?})",
            v.shape, v.strides, first.shape, first.strides
        )));
    }
    for v in views {
        let last = v
            .shape
            .iter()
            .zip(&v.strides)
            .try_fold(v.storage_offset, |at, (&n, &s)| {
                n.checked_sub(1)?.checked_mul(s)?.checked_add(at)
            })
            .and_then(|at| at.checked_add(1)?.checked_mul(v.element_size));
        if last.is_none() {
            return Err(bad(format!(
                "a view of shape {:?}, strides {:?} at element {} reaches past 2^64 bytes",
                v.shape, v.strides, v.storage_offset
            )));
        }
    }
    if let Some(d) = first.shape.iter().position(|&n| n == 0) {
        return Err(bad(format!(
            "dimension {d} of shape {:?} is empty",
            first.shape
        )));
    }
    Ok(first)
}

/// The views' base offset and layer stride in bytes: layers must follow one another at one fixed step.
/// A single layer gets `one_layer` as its stride.
fn layer_steps(views: &[TensorView], one_layer: u64) -> Result<(u64, u64), Error> {
    let e = views[0].element_size;
    let base = views[0].storage_offset * e;
    let Some(second) = views.get(1) else {
        return Ok((base, one_layer));
    };
    let step = second
        .storage_offset
        .checked_sub(views[0].storage_offset)
        .filter(|&s| s > 0)
        .ok_or_else(|| {
            bad(format!(
                "layer 1 starts at element {}, not after layer 0 at {}",
                second.storage_offset, views[0].storage_offset
            ))
        })?;
    for (i, pair) in views.windows(2).enumerate() {
        if pair[1].storage_offset != pair[0].storage_offset + step {
            return Err(bad(format!(
                "layer {} starts at element {}, not {} after layer {i} at {}: layers must be one stride apart",
                i + 1,
                pair[1].storage_offset,
                step,
                pair[0].storage_offset
            )));
        }
    }
    Ok((base, step * e))
}

/// Checks that the dimensions `inner` (indices into the view, outermost first) are packed densely in that
/// order, ignoring dimensions of size 1; returns the elements they span.
fn dense(view: &TensorView, inner: &[usize], names: &[&str]) -> Result<u64, Error> {
    let mut expected = 1;
    for (&d, name) in inner.iter().zip(names).rev() {
        if view.shape[d] > 1 && view.strides[d] != expected {
            return Err(bad(format!(
                "the {name} dimension has stride {} where a dense block needs {expected} (shape {:?}, \
                 strides {:?}): only dense blocks (token-major or head-major) are supported",
                view.strides[d], view.shape, view.strides
            )));
        }
        expected *= view.shape[d];
    }
    Ok(expected)
}

fn dim(value: u64, what: &str) -> Result<u32, Error> {
    u32::try_from(value).map_err(|_| bad(format!("{what} of {value} does not fit in 32 bits")))
}

impl KvLayout {
    /// vLLM 0.33's caches: one view per layer of shape `[num_blocks, num_kv_heads, block_size,
    /// head_size + head_size_v]`, K and V side by side, each block dense, token-major
    /// ([`KvKind::KvTogether`]) or head-major ([`KvKind::KvTogetherHeadMajor`]). Covers the
    /// layer-major ("LBNHC": layer *l* starts *l* layers' bytes in) and block-major ("BLNHC": the block
    /// stride spans every layer) layouts over one buffer.
    pub fn from_vllm(views: &[TensorView], dtype: Dtype) -> Result<Self, Error> {
        let v = common(
            views,
            dtype,
            "num_blocks, num_kv_heads, block_size, head_size",
        )?;
        // Dense inside a block: token-major (tokens, then heads, then channels; vLLM's GPU backends) or
        // head-major (heads, then tokens; its CPU attention). Both are one chunk; the kind says which.
        let (block_elems, kind) =
            match dense(v, &[2, 1, 3], &["block_size", "num_kv_heads", "head_size"]) {
                Ok(n) => (n, KvKind::KvTogether),
                Err(token_major) => {
                    match dense(v, &[1, 2, 3], &["num_kv_heads", "block_size", "head_size"]) {
                        Ok(n) => (n, KvKind::KvTogetherHeadMajor),
                        Err(_) => return Err(token_major),
                    }
                }
            };
        let (blocks, heads, tokens, head) = (v.shape[0], v.shape[1], v.shape[2], v.shape[3]);
        let heads = KvHeads {
            kv_heads: dim(heads, "num_kv_heads")?,
            head_size: dim(head, "head_size")?,
            kind,
        };
        one_chunk(views, dtype, (blocks, tokens, block_elems), heads)
    }

    /// Older vLLM FlashAttention caches: one view per layer of shape `[2, num_blocks, block_size,
    /// num_kv_heads, head_size]`, K in the first half and V in the second, so a block is two chunks.
    pub fn from_kv_apart(views: &[TensorView], dtype: Dtype) -> Result<Self, Error> {
        let v = common(
            views,
            dtype,
            "2, num_blocks, block_size, num_kv_heads, head_size",
        )?;
        if v.shape[0] != 2 {
            return Err(bad(format!(
                "the first dimension of shape {:?} is {}, not 2 (K and V)",
                v.shape, v.shape[0]
            )));
        }
        let e = v.element_size;
        let chunk_elems = dense(v, &[2, 3, 4], &["block_size", "num_kv_heads", "head_size"])?;
        let (blocks, tokens, heads, head) = (v.shape[1], v.shape[2], v.shape[3], v.shape[4]);
        let block_stride = v.strides[1] * e;
        let second_offset = v.strides[0] * e;
        let (base, layer_stride) =
            layer_steps(views, 2 * second_offset.max(block_stride * blocks))?;
        Self::placed(
            dim(views.len() as u64, "layer count")?,
            dim(blocks, "num_blocks")?,
            2 * chunk_elems * e,
            dim(tokens, "block_size")?,
            dtype,
            KvHeads {
                kv_heads: dim(heads, "num_kv_heads")?,
                head_size: dim(2 * head, "head_size (K and V)")?,
                kind: KvKind::KvApart,
            },
            BlockPlacement {
                base,
                layer_stride,
                block_stride,
                split: Some(ChunkSplit {
                    first_len: chunk_elems * e,
                    second_offset,
                }),
            },
        )
    }

    /// MLA caches: one view per layer of shape `[num_blocks, block_size, latent_size]`, one latent vector
    /// per token, the same on every tensor-parallel rank.
    pub fn from_mla(views: &[TensorView], dtype: Dtype) -> Result<Self, Error> {
        let v = common(views, dtype, "num_blocks, block_size, latent_size")?;
        let block_elems = dense(v, &[1, 2], &["block_size", "latent_size"])?;
        let (blocks, tokens, latent) = (v.shape[0], v.shape[1], v.shape[2]);
        let heads = KvHeads {
            kv_heads: 1,
            head_size: dim(latent, "latent_size")?,
            kind: KvKind::Mla,
        };
        one_chunk(views, dtype, (blocks, tokens, block_elems), heads)
    }
}

/// A layout whose blocks are one chunk of `block_elems` elements each, `stride(0)` apart, its layers one
/// storage step apart (vLLM's views and MLA's).
fn one_chunk(
    views: &[TensorView],
    dtype: Dtype,
    (blocks, tokens, block_elems): (u64, u64, u64),
    heads: KvHeads,
) -> Result<KvLayout, Error> {
    let e = views[0].element_size;
    let block_stride = views[0].strides[0] * e;
    let (base, layer_stride) = layer_steps(views, block_stride * blocks)?;
    KvLayout::placed(
        dim(views.len() as u64, "layer count")?,
        dim(blocks, "num_blocks")?,
        block_elems * e,
        dim(tokens, "block_size")?,
        dtype,
        heads,
        BlockPlacement {
            base,
            layer_stride,
            block_stride,
            split: None,
        },
    )
}

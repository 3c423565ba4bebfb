//! `te-bench run --backend tcp`: two TCP nodes in this process, over real loopback sockets, beside a plain
//! socket copy of the same bytes.

use std::time::Duration;

use anyhow::{Context, bail};

use crate::placement::check_blocks;
use backends::tcp::{BlockingNode, TcpConfig, TcpNode};
use benches::SocketCopy;
use transfer_engine::{
    KvLayout, MemoryRegion, RegionHandle, SHARD_BYTES, TransferMode, TransferRequest,
};

/// Bytes per write of the raw socket copy: large, so the limit is the socket's, not the syscall rate's.
const LIMIT_WRITE_BYTES: usize = 4 << 20;

/// What a TCP run measured.
pub(crate) struct TcpRun {
    /// Seconds of each measured transfer (submit until the sender learned every block was applied).
    pub(crate) seconds: Vec<f64>,
    /// GB/s of a plain socket copy of the same bytes (a blocking thread per end), over as many
    /// connections as the lane pool holds, with 4 MiB writes: the median of one copy before each transfer
    /// of the run.
    pub(crate) limit_gbps: f64,
    /// Slices sent again, over every transfer.
    pub(crate) retransmits: u64,
    /// Blocks handed back for recompute, over every transfer.
    pub(crate) recompute_blocks: usize,
}

/// Runs one warm-up and `iterations` measured transfers of every block of `layouts.0` into `layouts.1`
/// in `mode` between two TCP nodes, checks every destination block is byte-identical to its source, and
/// measures the socket-copy limit. `staged`: both nodes stage every payload through their lanes'
/// buffers (`stage_host_memory`).
pub(crate) fn run_tcp(
    layouts: (KvLayout, KvLayout),
    mode: TransferMode,
    iterations: usize,
    staged: bool,
) -> anyhow::Result<TcpRun> {
    let receiver = BlockingNode::start({
        let mut cfg = TcpConfig::with_engine_id(2);
        cfg.buffers.stage_host_memory = staged;
        cfg
    })?;
    let mut sender_cfg = TcpConfig::with_engine_id(1);
    sender_cfg.listen = None;
    sender_cfg.buffers.stage_host_memory = staged;
    let lanes = sender_cfg.limits.max_lanes_per_peer;
    let sender = BlockingNode::start_beside(&receiver, sender_cfg)?;
    let (layout, dst_layout) = layouts;
    let src = sender.kv_region(layout)?;
    let dst = receiver.kv_region(dst_layout)?;
    fill(sender.node(), &src, 1)?;
    let addr = receiver
        .node()
        .local_addr()
        .context("the receiver has no listener")?;
    let peer = sender.connect(addr, None)?.peer;
    let bytes = layout.total_bytes();
    let limit = Duration::from_secs(600);
    let mut seconds = Vec::with_capacity(iterations);
    let mut limits = Vec::with_capacity(iterations + 1);
    let mut copy = SocketCopy::new(bytes, LIMIT_WRITE_BYTES, lanes)?;
    let mut recompute_blocks = 0;
    for i in 0..=iterations {
        // The limit is measured before every transfer, warm-up included, and its median reported: one
        // copy alone swings with whatever else the machine does in that second.
        limits.push(copy.run()?);
        let req = TransferRequest::whole(peer, &src, &dst)?.with_mode(mode);
        let out = sender.transfer(req, limit)?;
        if let Some(reason) = out.reason {
            bail!("the receiver refused the transfer: {reason}");
        }
        recompute_blocks += out.recompute.len();
        if i > 0 {
            seconds.push(out.elapsed.as_secs_f64());
        }
    }
    if recompute_blocks == 0 {
        check_blocks(
            &sender.node().memory(src.id)?,
            &layout,
            &receiver.node().memory(dst.id)?,
            &dst_layout,
        )?;
    }
    if staged {
        let moved = bytes * (iterations as u64 + 1);
        let (sent, received) = (
            sender.node().stats().staged_bytes_sent,
            receiver.node().stats().staged_bytes_received,
        );
        anyhow::ensure!(
            sent >= moved && received >= moved,
            "a staged run staged {sent} bytes sending and {received} receiving, of {moved}"
        );
    }
    Ok(TcpRun {
        seconds,
        limit_gbps: crate::report::quantile(&mut limits, 0.5),
        retransmits: sender.node().stats().engine.retransmits,
        recompute_blocks,
    })
}

/// Fills a region with the pseudo-random pattern of `seed` (xorshift, restarted at every 1 MiB piece so
/// any piece can be checked on its own).
pub(crate) fn fill(node: &TcpNode, region: &RegionHandle, seed: u64) -> anyhow::Result<()> {
    node.memory(region.id)?
        .fill_with(|offset, bytes| pattern(seed, offset, bytes))?;
    Ok(())
}

/// Writes the pattern of `seed` for the piece at `offset` into `bytes`.
pub(crate) fn pattern(seed: u64, offset: usize, bytes: &mut [u8]) {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ seed.wrapping_mul(0xD1B5_4A32_D192_ED03) ^ offset as u64;
    for chunk in bytes.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}

/// Whether `memory` holds exactly the pattern of `seed` (checked a 1 MiB piece at a time).
pub(crate) fn holds_pattern(memory: &MemoryRegion, seed: u64) -> anyhow::Result<bool> {
    let mut want = vec![0u8; SHARD_BYTES];
    let mut offset = 0;
    while offset < memory.len() {
        let end = (offset + SHARD_BYTES).min(memory.len());
        let want = &mut want[..end - offset];
        pattern(seed, offset, want);
        if *memory.read(offset..end)? != *want {
            return Ok(false);
        }
        offset = end;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::pattern;

    /// docs/PROTOCOL.md §15 gives the first bytes of seed 7's pattern; they are what clients fill.
    #[test]
    fn the_documented_pattern_is_the_one_clients_fill() {
        let doc =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/PROTOCOL.md"))
                .expect("docs/PROTOCOL.md");
        let section = &doc[doc.find("## 15. Testing a peer").expect("§15")..];
        let quoted = |after: &str| -> Vec<u8> {
            let at = section.find(after).expect(after) + after.len();
            let rest = &section[at..];
            let start = rest.find('`').unwrap() + 1;
            let end = start + rest[start..].find('`').unwrap();
            rest[start..end]
                .split_whitespace()
                .map(|h| u8::from_str_radix(h, 16).unwrap())
                .collect()
        };
        let first = quoted("the piece at offset 0 begins");
        let second = quoted("the piece at offset 1048576 begins");
        let mut got = vec![0u8; first.len()];
        pattern(7, 0, &mut got);
        assert_eq!(got, first);
        let mut got = vec![0u8; second.len()];
        pattern(7, 1 << 20, &mut got);
        assert_eq!(got, second);
    }
}

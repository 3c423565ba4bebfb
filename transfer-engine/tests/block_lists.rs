//! Transfers of explicit block lists: a serving engine's block tables hand out arbitrary ids.

mod common;

use std::time::Duration;

use common::{B, KvZeroed, Pair, layout};
use transfer_engine::{Error, TransferMode, TransferRequest};

#[test]
fn scattered_source_blocks_land_in_the_named_destination_blocks() {
    let mut pair = Pair::new();
    let l = layout(4, 64, 4096);
    let (src, dst) = pair.regions(l, 11);
    let (from, to) = (vec![3, 17, 42, 5], vec![60, 0, 9, 33]);
    let req = TransferRequest::blocks(B, &src, from.clone(), &dst, to.clone(), 1..3)
        .unwrap()
        .with_mode(TransferMode::Packetized { slice_bytes: 1024 });
    pair.a.submit(pair.now, req).unwrap();
    pair.run(Duration::from_secs(5));
    let (a, b) = (pair.bytes_a(src.id), pair.bytes_b(dst.id));
    let block = |bytes: &[u8], layer: u32, block: u32| {
        let at = l.block_offset(transfer_engine::BlockId::new(layer, block)) as usize;
        bytes[at..at + 4096].to_vec()
    };
    for layer in 0..4 {
        for b_id in 0..64 {
            let sent = from
                .iter()
                .zip(&to)
                .find(|(_, d)| **d == b_id)
                .map(|(s, _)| *s);
            match sent {
                Some(s) if (1..3).contains(&layer) => {
                    assert_eq!(
                        block(&b, layer, b_id),
                        block(&a, layer, s),
                        "layer {layer} block {b_id}"
                    );
                }
                _ => assert!(
                    block(&b, layer, b_id).iter().all(|&x| x == 0),
                    "layer {layer} block {b_id} was not part of the transfer"
                ),
            }
        }
    }
}

#[test]
fn malformed_block_lists_are_refused_with_clear_errors() {
    let mut pair = Pair::new();
    let l = layout(4, 16, 4096);
    let src = pair.a.kv_zeroed(l).unwrap();
    let dst = pair.b.kv_zeroed(l).unwrap();
    let err = |r: Result<TransferRequest, Error>| r.unwrap_err().to_string();
    assert!(
        err(TransferRequest::blocks(
            B,
            &src,
            vec![1, 2],
            &dst,
            vec![1],
            0..4
        ))
        .contains("2 source blocks but 1 destination blocks")
    );
    assert!(
        err(TransferRequest::blocks(B, &src, vec![], &dst, vec![], 0..4))
            .contains("at least one block")
    );
    assert!(
        err(TransferRequest::blocks(
            B,
            &src,
            vec![1, 2],
            &dst,
            vec![7, 7],
            0..4
        ))
        .contains("destination block 7 is named twice")
    );
    assert!(
        err(TransferRequest::blocks(
            B,
            &src,
            vec![16],
            &dst,
            vec![1],
            0..4
        ))
        .contains("source block 16 is beyond")
    );
    assert!(
        err(TransferRequest::blocks(
            B,
            &src,
            vec![1],
            &dst,
            vec![1],
            2..5
        ))
        .contains("layers 2..5")
    );
    // A request edited after construction is checked again at submit.
    let mut req = TransferRequest::blocks(B, &src, vec![1, 2], &dst, vec![3, 4], 0..4).unwrap();
    req.dst_blocks.pop();
    assert!(matches!(
        pair.a.submit(pair.now, req),
        Err(Error::InvalidBlocks(_))
    ));
    assert_eq!(pair.a.live_sessions(), 0);
}

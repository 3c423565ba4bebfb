use super::*;

fn req(t: u64, ids: &[u64], input: u64) -> Request {
    Request {
        timestamp: t,
        input_length: input,
        output_length: 100,
        hash_ids: ids.to_vec(),
    }
}

fn step(c: &mut Continuation, r: &Request) {
    c.on_request(r);
    c.evict_to_capacity();
}

/// A random trace of conversations sharing a few system prompts (deterministic LCG).
fn random_trace(n: usize, seed: u64) -> Vec<Request> {
    let mut x = seed;
    let mut rnd = move |m: u64| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) % m
    };
    let mut convs: Vec<Vec<u64>> = Vec::new();
    let mut next_id = 1000;
    let mut out = Vec::new();
    for i in 0..n {
        let c = rnd(convs.len() as u64 + 3) as usize;
        if c >= convs.len() {
            convs.push(vec![rnd(4)]);
        }
        let at = c.min(convs.len() - 1);
        let conv = &mut convs[at];
        for _ in 0..=rnd(5) {
            conv.push(next_id);
            next_id += 1;
        }
        let input = conv.len() as u64 * BLOCK_TOKENS - rnd(2) * 100;
        out.push(req(i as u64 * 3_000, conv, input));
    }
    out
}

#[test]
fn capacity_chains_and_metadata_stay_bounded() {
    for cap in [0, 1, 5, 40] {
        let mut c = Continuation::new(cap, ContinuationConfig::default());
        for r in random_trace(400, cap as u64 + 7) {
            step(&mut c, &r);
            assert!(c.len() <= cap, "capacity {cap}: {}", c.len());
            for b in c.blocks.values() {
                if let Some(p) = b.parent {
                    assert!(c.contains(p), "a resident block's parent is resident");
                }
            }
            let m = c.metadata();
            let scale = cap.max(64);
            assert!(m.groups <= m.blocks.max(1));
            assert!(m.group_keys <= 2 * m.blocks + r.hash_ids.len());
            assert!(m.requests <= 2 * scale && m.seen <= 8 * scale, "{m:?}");
        }
    }
}

#[test]
fn the_partial_last_block_goes_first() {
    let mut c = Continuation::new(3, ContinuationConfig::default());
    step(&mut c, &req(0, &[1, 2], 1024));
    step(&mut c, &req(10, &[3, 4], 700));
    // Four blocks, room for three: the partial tail of the second request goes, not the first's blocks.
    assert!(!c.contains(BlockKey(4)));
    assert!(c.contains(BlockKey(1)) && c.contains(BlockKey(2)) && c.contains(BlockKey(3)));
}

#[test]
fn a_continued_conversation_leaves_its_dead_tail_first() {
    let mut c = Continuation::new(7, ContinuationConfig::default());
    step(&mut c, &req(0, &[1, 2, 3], 1500)); // 3 is partial
    step(&mut c, &req(10, &[7, 8], 1024)); // an open conversation
    // The next turn of the first rewrites its partial block 3 and adds two.
    step(&mut c, &req(20_000, &[1, 2, 4, 5], 2048));
    assert_eq!(c.len(), 7, "nothing evicted yet");
    step(&mut c, &req(30_000, &[9], 512));
    assert!(!c.contains(BlockKey(3)), "the dead tail went first");
    assert!(c.contains(BlockKey(7)) && c.contains(BlockKey(8)));
}

#[test]
fn blocks_above_a_branch_point_are_shared() {
    let mut c = Continuation::new(100, ContinuationConfig::default());
    step(&mut c, &req(0, &[1, 2, 3], 1536));
    step(&mut c, &req(10, &[1, 2, 4], 1536));
    assert!(c.blocks[&BlockKey(1)].shared && c.blocks[&BlockKey(2)].shared);
    assert!(!c.blocks[&BlockKey(4)].shared);
    // A partial child replaced by the next turn is not a branch.
    step(&mut c, &req(20, &[5, 6], 700));
    step(&mut c, &req(30, &[5, 7, 8], 1536));
    assert!(!c.blocks[&BlockKey(5)].shared);
}

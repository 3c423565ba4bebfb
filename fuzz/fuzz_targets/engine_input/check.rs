//! The invariants checked once the run has drained.

use super::*;

impl World {
    pub(super) fn check(&self) {
        assert_eq!(
            self.a_completed, 1,
            "sender completed {} times",
            self.a_completed
        );
        assert_eq!(self.a.live_sessions(), 0);
        assert_eq!(self.b.live_sessions(), 0);
        if self.b_incoming {
            assert_eq!(
                self.b_completed, 1,
                "receiver accepted the session but never completed it"
            );
        }
        let s = &self.s;
        for layer in s.layers.clone() {
            for (&sb, &db) in s.src_blocks.iter().zip(&s.dst_blocks) {
                let (src, dst) = (BlockId::new(layer, sb), BlockId::new(layer, db));
                let delivered = self.b_delivered.contains(&dst);
                if self.open_forged {
                    continue;
                }
                if !self.ack_forged {
                    assert!(
                        delivered || self.a_recompute.contains(&src),
                        "sender neither recomputes {src:?} nor did the receiver deliver {dst:?}"
                    );
                }
                if self.a_refused {
                    assert!(
                        self.a_recompute.contains(&src),
                        "refused but {src:?} not recomputed"
                    );
                }
                if delivered && !self.tainted.contains(&dst) {
                    let bb = s.src_layout.block_bytes as usize;
                    let so = s.src_layout.block_offset(src) as usize;
                    let doff = s.dst_layout.block_offset(dst) as usize;
                    let want = self.src_mem.read(so..so + bb).unwrap();
                    let got = self.dst_mem.read(doff..doff + bb).unwrap();
                    assert!(
                        *want == *got,
                        "block {dst:?} reported delivered but does not hold source block {src:?}'s bytes"
                    );
                }
            }
        }
    }
}

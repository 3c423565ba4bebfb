//! What the fuzzed network does to frames: mutated deliveries and forged frames for the live session.

use super::*;

impl World {
    pub(super) fn deliver_mutated(&mut self, dir: usize, how: u8, inp: &mut Input<'_>) {
        let Some(mut f) = self.wire[dir].pop_front() else {
            return;
        };
        let repair = how & 0x80 != 0;
        match how % 16 {
            // Dropped.
            0 => return,
            // Duplicated: delivered now and again later.
            1 => self.wire[dir].push_back(f.clone()),
            // Reordered: delivered later.
            2 => {
                let at = usize::from(inp.u8()) % (self.wire[dir].len() + 1);
                self.wire[dir].insert(at, f);
                return;
            }
            // A bit flipped in the header.
            3 => {
                let bit = usize::from(inp.u16()) % (HEADER_LEN.min(f.bytes.len()) * 8).max(1);
                if let Some(b) = f.bytes.get_mut(bit / 8) {
                    *b ^= 1 << (bit % 8);
                }
                f.mutated = true;
                if repair {
                    reseal_header(&mut f.bytes);
                }
            }
            // Bits flipped in the payload.
            4 => {
                let payload_len = f.bytes.len().saturating_sub(HEADER_LEN);
                if payload_len > 0 {
                    let at = HEADER_LEN + usize::from(inp.u16()) % payload_len;
                    f.bytes[at] ^= inp.u8() | 1;
                    f.mutated = true;
                    if repair {
                        reseal_payload(&mut f.bytes);
                    }
                }
            }
            // Truncated (length and checksums repaired some of the time).
            5 => {
                let len = usize::from(inp.u16()) % (f.bytes.len() + 1);
                f.bytes.truncate(len);
                f.mutated = true;
                if repair {
                    reseal_payload(&mut f.bytes);
                } else if how & 0x40 != 0 {
                    reseal_header(&mut f.bytes);
                }
            }
            // A header field set to a fuzz-chosen value.
            6 => {
                if f.bytes.len() >= HEADER_LEN {
                    let field = inp.u8();
                    let v = inp.u32();
                    let (at, width) = [
                        (3, 1),
                        (4, 2),
                        (8, 8),
                        (16, 4),
                        (20, 4),
                        (24, 8),
                        (32, 4),
                        (36, 4),
                    ][usize::from(field % 8)];
                    let old = &mut f.bytes[at..at + width];
                    if field & 0x80 != 0 {
                        // Small delta: stays plausible.
                        old[0] = old[0].wrapping_add((v as u8 % 5).wrapping_sub(2));
                    } else {
                        old.copy_from_slice(&v.to_le_bytes().repeat(2)[..width]);
                    }
                    f.mutated = true;
                    if how & 0x40 != 0 {
                        reseal_header(&mut f.bytes);
                    }
                }
            }
            // Bytes appended.
            7 => {
                let n = 1 + usize::from(inp.u8() % 16);
                f.bytes.extend(inp.bytes(n));
                f.mutated = true;
                if repair {
                    reseal_payload(&mut f.bytes);
                }
            }
            // Delivered to the wrong engine (a reflection).
            8 => {
                let other = 1 - dir;
                self.deliver(other, &Frame { mutated: true, ..f });
                return;
            }
            _ => {}
        }
        self.deliver(dir, &f);
    }

    /// A frame built from the input for the live session (or a neighbour), with valid checksums.
    pub(super) fn inject(&mut self, inp: &mut Input<'_>) {
        let k = inp.u8();
        let kind = KINDS[usize::from(k % 9)];
        let mut session = self.session.0;
        if k & 0x80 != 0 {
            session ^= u64::from(inp.u8());
        }
        let mut h = Header::new(kind, session);
        h.attempt = u16::from(inp.u8() % 4);
        let small = inp.u8();
        h.layer = u32::from(small % 4);
        h.block = u32::from(small / 4 % 8);
        h.offset = if small & 0x80 != 0 {
            u64::from(inp.u32())
        } else {
            256 * u64::from(inp.u8() % 16)
        };
        h.sequence = if small & 0x40 != 0 {
            inp.u32()
        } else {
            u32::from(inp.u8() % 64)
        };
        let payload = match kind {
            FrameKind::Ack => {
                let n = inp.u8() % 4;
                let mut p = u32::from(n).to_le_bytes().to_vec();
                for _ in 0..n {
                    let s = u32::from(inp.u8() % 64);
                    p.extend_from_slice(&s.to_le_bytes());
                    p.extend_from_slice(&(s + 1 + u32::from(inp.u8() % 8)).to_le_bytes());
                }
                p
            }
            FrameKind::Data => {
                let n = 256 * usize::from(inp.u8() % 17);
                let fill = inp.u8();
                vec![fill; n]
            }
            FrameKind::Open | FrameKind::Reject => {
                let n = usize::from(inp.u8() % 64);
                inp.bytes(n)
            }
            _ => Vec::new(),
        };
        let bytes = wire::encode_frame(&h, &payload);
        let dir = usize::from(kind.is_from_receiver() ^ (k & 0x40 != 0));
        self.deliver(
            dir,
            &Frame {
                bytes,
                mutated: true,
            },
        );
    }
}

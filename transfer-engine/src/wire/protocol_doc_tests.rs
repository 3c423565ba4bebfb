//! `docs/PROTOCOL.md` checked against the code, so the document cannot drift from the encoders: the
//! frame version it states, and every byte of its worked examples (§14), recomputed here.

use std::time::Duration;

use super::control::{OpenRequest, encode_ranges};
use super::{FrameKind, Header, VERSION};
use crate::{AccessKey, Dtype, KvLayout, RegionId, TrafficClass, TransferMode};

/// The session of the worked examples: engine 1, counter 2.
const SESSION: u64 = 0x0000_0001_0000_0002;

fn document() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/PROTOCOL.md");
    std::fs::read_to_string(path).expect("docs/PROTOCOL.md")
}

/// The hex dumps of one part of the document (```text blocks), in order: each line `NN: hh hh ...`
/// with an annotation after three spaces.
fn dumps(section: &str) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut current: Option<Vec<u8>> = None;
    for line in section.lines() {
        match (line.trim(), current.as_mut()) {
            ("```text", None) => current = Some(Vec::new()),
            ("```", Some(_)) => out.extend(current.take()),
            (text, Some(bytes)) => {
                let Some((_, rest)) = text.split_once(": ") else {
                    continue;
                };
                let hex = rest.split("   ").next().unwrap_or("");
                for word in hex.split_whitespace() {
                    bytes.push(u8::from_str_radix(word, 16).expect("a hex byte"));
                }
            }
            _ => {}
        }
    }
    out
}

/// Bytes as the document writes them, 16 to a line.
fn dump(bytes: &[u8]) -> String {
    bytes
        .chunks(16)
        .enumerate()
        .map(|(i, line)| {
            let hex: Vec<_> = line.iter().map(|b| format!("{b:02x}")).collect();
            format!("{:02x}: {}\n", i * 16, hex.join(" "))
        })
        .collect()
}

fn header(kind: FrameKind, edit: impl FnOnce(&mut Header)) -> Vec<u8> {
    let mut h = Header::new(kind, SESSION);
    edit(&mut h);
    h.encode().to_vec()
}

/// The worked examples' frames, in the document's order.
fn examples() -> Vec<(&'static str, Vec<u8>)> {
    let layout = KvLayout::new(2, 8, 4096, 16, Dtype::Bf16).unwrap();
    let open = OpenRequest {
        dst_layout: layout,
        src_layout: layout,
        dst_region: RegionId(1),
        dst_key: AccessKey(0x1122_3344_5566_7788),
        mode: TransferMode::Packetized { slice_bytes: 1024 },
        class: TrafficClass::BulkKv,
        layers: 0..2,
        deadline: Duration::from_secs(10),
        src_blocks: vec![0, 1],
        dst_blocks: vec![5, 6],
    }
    .encode();
    let open_header = header(FrameKind::Open, |h| {
        h.length = open.len() as u32;
        h.crc = crate::crc32c(&open);
    });
    let data = header(FrameKind::Data, |h| {
        (h.layer, h.block, h.offset, h.length, h.sequence) = (1, 5, 1024, 1024, 9);
        h.crc = crate::crc32c(&[7u8; 1024]);
    });
    let ack = encode_ranges(&[0..4, 5..10]);
    let ack_header = header(FrameKind::Ack, |h| {
        h.set_consumer(0, false);
        h.length = ack.len() as u32;
        h.crc = crate::crc32c(&ack);
    });
    let nack = header(FrameKind::Nack, |h| h.sequence = 9);
    let progress = header(FrameKind::Progress, |h| h.set_consumer(1, true));
    let close = header(FrameKind::Close, |_| {});
    vec![
        ("Open payload", open),
        ("Open header", open_header),
        ("Data header", data),
        ("Ack payload", ack),
        ("Ack header", ack_header),
        ("Nack", nack),
        ("Progress", progress),
        ("Close", close),
    ]
}

#[test]
fn the_worked_examples_are_the_bytes_the_encoders_make() {
    let doc = document();
    let start = doc.find("## 14. Worked examples").expect("§14");
    let found = dumps(&doc[start..]);
    let want = examples();
    assert_eq!(found.len(), want.len(), "hex dumps in §14");
    for ((what, bytes), got) in want.iter().zip(&found) {
        assert!(
            got == bytes,
            "§14 {what}: the document has\n{}the encoder makes\n{}",
            dump(got),
            dump(bytes)
        );
    }
}

#[test]
fn the_frame_version_the_document_states_is_the_codes() {
    let doc = document();
    let check = format!("`version == {VERSION}` (the frame format version");
    assert!(doc.contains(&check), "§2.1 must say {check}");
    for stated in [
        format!("frame format version {VERSION})"),
        format!("frame format version, `{VERSION}`"),
    ] {
        assert!(doc.contains(&stated), "the document must say {stated}");
    }
}

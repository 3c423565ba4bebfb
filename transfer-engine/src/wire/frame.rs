//! Whole frames: a header followed by exactly its payload.

use super::{HEADER_LEN, Header, WireError};

/// Decodes one whole frame (header and exactly its payload) from `bytes`.
pub fn decode_frame(bytes: &[u8]) -> Result<(Header, &[u8]), WireError> {
    let header = Header::decode(bytes)?;
    let body = &bytes[HEADER_LEN..];
    let length = header.length as usize;
    if body.len() < length {
        return Err(WireError::Truncated {
            needed: HEADER_LEN + length,
            got: bytes.len(),
        });
    }
    if body.len() > length {
        return Err(WireError::TrailingBytes {
            extra: body.len() - length,
        });
    }
    Ok((header, body))
}

/// Encodes a whole frame: the header with `length` and `crc` set from `payload`, then the payload.
#[must_use]
pub fn encode_frame(header: &Header, payload: &[u8]) -> Vec<u8> {
    let mut header = *header;
    header.length = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    header.crc = crate::crc32c(payload);
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(payload);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{FrameKind, MAX_CONTROL_PAYLOAD, VERSION};

    #[test]
    fn reserved_bytes_must_be_zero() {
        // A CloseAck with reserved = 0xBEEF and a valid header checksum (the header of issue 13, in this
        // frame format version).
        let mut bytes = Header::new(FrameKind::CloseAck, 42).encode();
        bytes[6..8].copy_from_slice(&0xBEEFu16.to_le_bytes());
        let hcrc = crate::crc32c(&bytes[..44]);
        bytes[44..48].copy_from_slice(&hcrc.to_le_bytes());
        assert_eq!(Header::decode(&bytes), Err(WireError::Reserved(0xBEEF)));
        // Decode then encode is the identity for every header that decodes.
        let h = Header::new(FrameKind::CloseAck, 42);
        let encoded = h.encode();
        assert_eq!(Header::decode(&encoded).unwrap().encode(), encoded);
    }

    /// Rewrites the word at byte 24 of `h`'s encoding and repairs the header checksum.
    fn with_word_24(h: Header, word: u64) -> [u8; HEADER_LEN] {
        let mut bytes = h.encode();
        bytes[24..32].copy_from_slice(&word.to_le_bytes());
        let hcrc = crate::crc32c(&bytes[..44]);
        bytes[44..48].copy_from_slice(&hcrc.to_le_bytes());
        bytes
    }

    #[test]
    fn the_word_at_24_is_an_offset_in_data_and_a_blocked_flag_in_acks_and_progress() {
        for kind in [FrameKind::Ack, FrameKind::Progress] {
            let mut h = Header::new(kind, 3);
            h.set_consumer(4, true);
            let bytes = h.encode();
            assert_eq!(bytes[24..32], 1u64.to_le_bytes(), "{kind:?}");
            let back = Header::decode(&bytes).unwrap();
            assert_eq!((back.consumer(), back.offset), ((4, true), 0), "{kind:?}");
            // An offset set on an ack does not reach the wire: the flag does.
            h.offset = 77;
            assert_eq!(Header::decode(&h.encode()).unwrap().offset, 0, "{kind:?}");
            // Only 0 and 1 are flags.
            assert_eq!(
                Header::decode(&with_word_24(h, 2)),
                Err(WireError::ConsumerFlag(2)),
                "{kind:?}"
            );
        }
        let mut data = Header::new(FrameKind::Data, 3);
        (data.offset, data.consumer_blocked) = (1 << 40, true);
        let back = Header::decode(&data.encode()).unwrap();
        assert_eq!((back.offset, back.consumer_blocked), (1 << 40, false));
        assert_eq!(
            Header::decode(&with_word_24(Header::new(FrameKind::Close, 3), 2))
                .unwrap()
                .offset,
            2
        );
    }
    use proptest::prelude::*;

    fn kind() -> impl Strategy<Value = FrameKind> {
        (1u8..=9).prop_map(|c| FrameKind::from_code(c).unwrap())
    }

    fn header() -> impl Strategy<Value = Header> {
        (
            kind(),
            any::<u16>(),
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
        )
            .prop_map(
                |(kind, attempt, session, layer, block, offset, sequence, crc)| Header {
                    kind,
                    attempt,
                    session,
                    layer,
                    block,
                    offset: if kind.reports_consumer() { 0 } else { offset },
                    consumer_blocked: kind.reports_consumer() && offset & 1 == 1,
                    length: 0,
                    sequence,
                    crc,
                },
            )
    }

    proptest! {
        #[test]
        fn header_round_trips(h in header()) {
            prop_assert_eq!(Header::decode(&h.encode()), Ok(h));
        }

        #[test]
        fn frame_round_trips(h in header(), payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut h = h;
            h.kind = FrameKind::Data;
            let bytes = encode_frame(&h, &payload);
            let (got, body) = decode_frame(&bytes).unwrap();
            prop_assert_eq!(body, &payload[..]);
            prop_assert!(got.payload_verifies(body));
            prop_assert_eq!(got.session, h.session);
        }

        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_frame(&bytes);
        }

        #[test]
        fn any_single_bit_flip_in_a_header_is_caught(h in header(), bit in 0usize..(HEADER_LEN * 8)) {
            let mut bytes = h.encode();
            bytes[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(Header::decode(&bytes).is_err());
        }
    }

    #[test]
    fn bad_inputs_give_clear_errors() {
        let h = Header::new(FrameKind::Data, 1);
        let bytes = encode_frame(&h, b"hello");
        assert!(matches!(
            decode_frame(&bytes[..10]),
            Err(WireError::Truncated { .. })
        ));
        assert!(matches!(
            decode_frame(&bytes[..50]),
            Err(WireError::Truncated { .. })
        ));
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(
            decode_frame(&long),
            Err(WireError::TrailingBytes { extra: 1 })
        );
        let mut other = bytes.clone();
        other[2] = VERSION + 1;
        let err = decode_frame(&other).unwrap_err();
        assert_eq!(
            err,
            WireError::UnsupportedVersion {
                got: VERSION + 1,
                supported: VERSION
            }
        );
        assert!(
            err.to_string()
                .contains(&format!("version {}", VERSION + 1))
        );
        let mut magic = bytes;
        magic[0] = 0;
        assert!(matches!(decode_frame(&magic), Err(WireError::BadMagic(_))));
        let mut big = Header::new(FrameKind::Ack, 1);
        big.length = MAX_CONTROL_PAYLOAD + 1;
        assert!(matches!(
            Header::decode(&big.encode()),
            Err(WireError::Oversized { .. })
        ));
    }
}

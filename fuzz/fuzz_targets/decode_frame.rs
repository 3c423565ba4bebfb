//! Decoding any byte string returns a frame or an error, never panics; a decoded frame re-encodes to
//! the same header bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use transfer_engine::wire::{decode_frame, Header, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    if let Ok(header) = Header::decode(data) {
        assert_eq!(&header.encode()[..], &data[..HEADER_LEN]);
    }
    let _ = decode_frame(data);
});

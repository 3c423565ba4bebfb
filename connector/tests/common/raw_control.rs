//! A control connection spoken byte by byte, as a stranger would: frames of a head and a key part
//! (docs/CONTROL.md), and the handshake of a consumer without a secret (MACs of zeros).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use connector::control::frame::VERSION;

/// A frame of `head` (JSON bytes) and `keys` (the key part's bytes).
pub(crate) fn frame(head: &[u8], keys: &[u8]) -> Vec<u8> {
    let mut f = vec![VERSION];
    f.extend_from_slice(&(head.len() as u32).to_le_bytes());
    f.extend_from_slice(head);
    f.extend_from_slice(&(keys.len() as u32).to_le_bytes());
    f.extend_from_slice(keys);
    f
}

/// The head of the next reply (its key part read and dropped).
pub(crate) fn answer(s: &mut TcpStream) -> String {
    let mut len = [0u8; 5];
    s.read_exact(&mut len).unwrap();
    assert_eq!(len[0], VERSION);
    let mut head = vec![0u8; u32::from_le_bytes(len[1..5].try_into().unwrap()) as usize];
    s.read_exact(&mut head).unwrap();
    let mut keys_len = [0u8; 4];
    s.read_exact(&mut keys_len).unwrap();
    let mut keys = vec![0u8; u32::from_le_bytes(keys_len) as usize];
    s.read_exact(&mut keys).unwrap();
    String::from_utf8_lossy(&head).into_owned()
}

/// A connection to the control server at `addr`, whose reads give up after 10 s.
pub(crate) fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Passes the handshake on `s` as a consumer without a secret in lane namespace `ns`, claiming to
/// receive on `engines`.
pub(crate) fn handshake(s: &mut TcpStream, ns: u64, engines: &[u32]) {
    let hello =
        format!(r#"{{"op":"hello","ns":{ns},"engines":{engines:?},"authenticated":false}}"#);
    s.write_all(&frame(hello.as_bytes(), &[1u8; 32])).unwrap();
    assert!(answer(s).contains("challenge"));
    s.write_all(&frame(br#"{"op":"auth"}"#, &[0u8; 32]))
        .unwrap();
    assert!(answer(s).contains("welcome"));
}

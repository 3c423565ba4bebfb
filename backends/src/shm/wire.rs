//! What travels on a connection's Unix socket: a tag, a u32 length and a body. Handshake messages, the
//! engine's control frames (header and payload), data headers with the payload's address in the sender,
//! and seals (the data header with the sender's CRC). Reading checks every length before it allocates,
//! so a peer cannot make a reader hold more than one control payload.

use std::io::{self, Read, Write};

use transfer_engine::wire::{HEADER_LEN, Header, MAX_CONTROL_PAYLOAD};

/// Largest handshake message.
pub(crate) const MAX_HANDSHAKE: usize = 64 << 10;

const HELLO: u8 = 1;
const WELCOME: u8 = 2;
const REFUSE: u8 = 3;
const CONTROL: u8 = 4;
const DATA: u8 = 5;
const SEAL: u8 = 6;
const GRANT: u8 = 7;
const GPU_GRANT: u8 = 8;
const AUTH: u8 = 9;
const ADMITTED: u8 = 10;

/// Bytes of a handshake MAC.
pub(crate) const MAC_LEN: usize = crate::node::handshake::MAC_LEN;

/// Bytes of a CUDA IPC memory handle (the driver's `CUipcMemHandle`).
pub(crate) const GPU_HANDLE_LEN: usize = 64;

/// One message on a connection.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Envelope {
    /// The dialer's hello (encoded by `handshake`).
    Hello(Vec<u8>),
    /// The listener's answer (encoded by `handshake`).
    Welcome(Vec<u8>),
    /// A refusal and its reason, before the close.
    Refuse(String),
    /// A control frame: header and payload.
    Control(Header, Vec<u8>),
    /// A data unit's header (unsealed when checksums are on) and its payload's address in the sender.
    Data(Header, u64),
    /// The data unit's header sealed with the sender's CRC of its payload.
    Seal(Header),
    /// The sender grants a region of its shared memory: its address there and its length. The memfd
    /// travels with the message's first byte (`SCM_RIGHTS`).
    Grant(u64, u64),
    /// The sender grants a GPU allocation: its device address there, its length and its CUDA IPC
    /// handle (opened by a receiver built with the `cuda` feature).
    GpuGrant(u64, u64, Box<[u8; GPU_HANDLE_LEN]>),
    /// A side's MAC over the handshake's transcript (the hello's and the welcome's bodies): the
    /// listener's follows its welcome, the dialer's answers it.
    Auth([u8; MAC_LEN]),
    /// The listener admitted the dialer (after its auth verified): the link is up.
    Admitted,
}

impl Envelope {
    /// Writes the envelope to `out` (one `write_all` of a buffer built here).
    pub(crate) fn write_to(&self, out: &mut impl Write) -> io::Result<()> {
        let mut buf = Vec::with_capacity(64);
        let (tag, body): (u8, &[u8]) = match self {
            Envelope::Hello(b) => (HELLO, b),
            Envelope::Welcome(b) => (WELCOME, b),
            Envelope::Refuse(r) => (REFUSE, r.as_bytes()),
            Envelope::Auth(mac) => (AUTH, &mac[..]),
            Envelope::Admitted => (ADMITTED, &[][..]),
            Envelope::Control(h, payload) => {
                buf.extend_from_slice(&[CONTROL, 0, 0, 0, 0]);
                buf.extend_from_slice(&h.encode());
                buf.extend_from_slice(payload);
                return finish(buf, out);
            }
            Envelope::Data(h, address) => {
                buf.extend_from_slice(&[DATA, 0, 0, 0, 0]);
                buf.extend_from_slice(&h.encode());
                buf.extend_from_slice(&address.to_le_bytes());
                return finish(buf, out);
            }
            Envelope::Seal(h) => {
                buf.extend_from_slice(&[SEAL, 0, 0, 0, 0]);
                buf.extend_from_slice(&h.encode());
                return finish(buf, out);
            }
            Envelope::Grant(address, len) => {
                buf.extend_from_slice(&[GRANT, 0, 0, 0, 0]);
                buf.extend_from_slice(&address.to_le_bytes());
                buf.extend_from_slice(&len.to_le_bytes());
                return finish(buf, out);
            }
            Envelope::GpuGrant(address, len, handle) => {
                buf.extend_from_slice(&[GPU_GRANT, 0, 0, 0, 0]);
                buf.extend_from_slice(&address.to_le_bytes());
                buf.extend_from_slice(&len.to_le_bytes());
                buf.extend_from_slice(&handle[..]);
                return finish(buf, out);
            }
        };
        buf.push(tag);
        buf.extend_from_slice(&[0; 4]);
        buf.extend_from_slice(&body[..body.len().min(MAX_HANDSHAKE)]);
        finish(buf, out)
    }

    /// Reads one envelope. A malformed one is an `InvalidData` error naming what is wrong; the end of the
    /// stream is `UnexpectedEof`.
    pub(crate) fn read_from(input: &mut impl Read) -> io::Result<Self> {
        let mut head = [0u8; 5];
        input.read_exact(&mut head)?;
        let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
        let limit = match head[0] {
            HELLO | WELCOME | REFUSE => MAX_HANDSHAKE,
            CONTROL => HEADER_LEN + MAX_CONTROL_PAYLOAD as usize,
            DATA => HEADER_LEN + 8,
            SEAL => HEADER_LEN,
            GRANT => 16,
            GPU_GRANT => 16 + GPU_HANDLE_LEN,
            AUTH => MAC_LEN,
            ADMITTED => 0,
            t => return Err(bad(format!("unknown message tag {t}"))),
        };
        if len > limit || ((CONTROL..=SEAL).contains(&head[0]) && len < HEADER_LEN) {
            return Err(bad(format!(
                "a message of tag {} is {len} bytes long (limit {limit})",
                head[0]
            )));
        }
        let mut body = vec![0; len];
        input.read_exact(&mut body)?;
        let header = || Header::decode(&body[..HEADER_LEN]).map_err(|e| bad(e.to_string()));
        let word = |i: usize| {
            let mut a = [0; 8];
            a.copy_from_slice(&body[i..i + 8]);
            u64::from_le_bytes(a)
        };
        Ok(match head[0] {
            HELLO => Envelope::Hello(body),
            WELCOME => Envelope::Welcome(body),
            REFUSE => Envelope::Refuse(String::from_utf8_lossy(&body).into_owned()),
            CONTROL => Envelope::Control(header()?, body[HEADER_LEN..].to_vec()),
            DATA if len == HEADER_LEN + 8 => {
                let mut a = [0; 8];
                a.copy_from_slice(&body[HEADER_LEN..]);
                Envelope::Data(header()?, u64::from_le_bytes(a))
            }
            SEAL if len == HEADER_LEN => Envelope::Seal(header()?),
            AUTH if len == MAC_LEN => {
                Envelope::Auth(body[..].try_into().expect("a MAC's length was checked"))
            }
            ADMITTED => Envelope::Admitted,
            GRANT if len == 16 => Envelope::Grant(word(0), word(8)),
            GPU_GRANT if len == 16 + GPU_HANDLE_LEN => {
                let mut handle = Box::new([0; GPU_HANDLE_LEN]);
                handle.copy_from_slice(&body[16..]);
                Envelope::GpuGrant(word(0), word(8), handle)
            }
            t => return Err(bad(format!("a message of tag {t} is {len} bytes long"))),
        })
    }
}

fn finish(mut buf: Vec<u8>, out: &mut impl Write) -> io::Result<()> {
    let len = u32::try_from(buf.len() - 5).map_err(|_| bad("message too long".into()))?;
    buf[1..5].copy_from_slice(&len.to_le_bytes());
    out.write_all(&buf)
}

/// Writes a refusal and its reason, then drains what the peer already sent (briefly, boundedly) before
/// the caller closes: a socket closed with unread bytes is reset, and the reason would be lost.
pub(crate) fn refuse(stream: &mut std::os::unix::net::UnixStream, why: &str) {
    use std::time::Duration;
    let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
    let _ = Envelope::Refuse(why.to_owned()).write_to(stream);
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(100)));
    let mut sink = [0u8; 4096];
    for _ in 0..16 {
        match stream.read(&mut sink) {
            Ok(n) if n > 0 => {}
            _ => break,
        }
    }
}

/// A malformed-message error.
pub(crate) fn bad(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why)
}

#[cfg(test)]
mod tests {
    use super::*;
    use transfer_engine::wire::{FrameKind, Header};

    fn header() -> Header {
        Header::new(FrameKind::Data, 7)
    }

    #[test]
    fn envelopes_round_trip_and_garbage_is_refused() {
        let all = [
            Envelope::Hello(vec![1, 2, 3]),
            Envelope::Welcome(vec![]),
            Envelope::Refuse("no".into()),
            Envelope::Control(header(), vec![9; 100]),
            Envelope::Data(header(), 0xdead_beef),
            Envelope::Seal(header()),
            Envelope::Grant(0x7000_0000, 1 << 30),
            Envelope::GpuGrant(0x7f00_0000_0000, 1 << 32, Box::new([5; GPU_HANDLE_LEN])),
            Envelope::Auth([3; MAC_LEN]),
            Envelope::Admitted,
        ];
        let mut bytes = Vec::new();
        for e in &all {
            e.write_to(&mut bytes).unwrap();
        }
        let mut input = &bytes[..];
        for e in &all {
            assert_eq!(&Envelope::read_from(&mut input).unwrap(), e);
        }
        assert_eq!(
            Envelope::read_from(&mut input).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
        for garbage in [
            &[0x7Eu8, 0, 0, 0, 0][..],
            &[AUTH, 4, 0, 0, 0, 1, 2, 3, 4],
            &[ADMITTED, 1, 0, 0, 0, 0],
            &[DATA, 4, 0, 0, 0, 1, 2, 3, 4],
            &[CONTROL, 0xff, 0xff, 0xff, 0x7f],
            &[HELLO, 0, 0, 2, 0],
            &[GRANT, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            &[
                GPU_GRANT, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            ],
        ] {
            let e = Envelope::read_from(&mut &garbage[..]).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{garbage:?}: {e}");
        }
    }
}

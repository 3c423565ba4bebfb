//! The hello and welcome of the shm handshake: protocol version, engine id, whether this end wants
//! checksums, its listening path, a probe word for cross-memory attach, the KV namespace it serves,
//! whether it authenticates with a shared secret, a fresh nonce for the MACs, and the segments it offers.

use std::path::PathBuf;

use transfer_engine::{Dtype, Namespace, PeerId};

use crate::codec::{ByteReader, put_bytes, put_named_handle};
use crate::transport::Segment;

/// Version of this backend's protocol (the envelopes and these messages). 2: the namespace, the
/// authentication flag and the nonce, and the MAC exchange after the welcome.
pub(crate) const VERSION: u16 = 2;

/// Bytes of a hello's nonce.
pub(crate) const NONCE_LEN: usize = 16;

/// A hello or a welcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hello {
    pub(crate) engine_id: u32,
    pub(crate) checksum: bool,
    /// Where the sender of the message listens, if it does.
    pub(crate) path: Option<PathBuf>,
    /// Address and value of a word in the sender's memory: the other end reads it back to prove that it
    /// may copy from this process, and that the process the kernel names is the one that sent it.
    pub(crate) probe: (u64, u64),
    /// The KV namespace the sender serves.
    pub(crate) namespace: Namespace,
    /// Whether the sender authenticates with a shared secret.
    pub(crate) authenticated: bool,
    /// Fresh for every handshake, so a recorded one cannot be replayed.
    pub(crate) nonce: [u8; NONCE_LEN],
    pub(crate) segments: Vec<Segment>,
}

impl Hello {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&self.engine_id.to_le_bytes());
        out.push(u8::from(self.checksum));
        let path = self.path.as_ref().map(|p| p.to_string_lossy().into_owned());
        put_bytes(&mut out, path.unwrap_or_default().as_bytes());
        out.extend_from_slice(&self.probe.0.to_le_bytes());
        out.extend_from_slice(&self.probe.1.to_le_bytes());
        put_bytes(&mut out, self.namespace.model.as_bytes());
        out.extend_from_slice(&self.namespace.weight_version.to_le_bytes());
        out.extend_from_slice(&self.namespace.block_size.to_le_bytes());
        out.push(self.namespace.dtype.code());
        out.push(u8::from(self.authenticated));
        out.extend_from_slice(&self.nonce);
        let n = self.segments.len().min(usize::from(u16::MAX));
        out.extend_from_slice(&(n as u16).to_le_bytes());
        for s in &self.segments[..n] {
            put_named_handle(&mut out, &s.name, &s.handle);
        }
        out
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, String> {
        let mut r = ByteReader::new(bytes, "shm handshake message");
        let version = r.u16()?;
        if version != VERSION {
            return Err(format!(
                "shm protocol version {version}, this node speaks {VERSION}"
            ));
        }
        let engine_id = r.u32()?;
        let checksum = match r.u8()? {
            0 => false,
            1 => true,
            f => return Err(format!("checksum flag {f} is neither 0 nor 1")),
        };
        let path = r.str()?;
        let probe = (r.u64()?, r.u64()?);
        let namespace = Namespace {
            model: r.str()?,
            weight_version: r.u64()?,
            block_size: r.u32()?,
            dtype: Dtype::from_code(r.u8()?).ok_or("unknown dtype code in the namespace")?,
        };
        let authenticated = match r.u8()? {
            0 => false,
            1 => true,
            f => return Err(format!("authentication flag {f} is neither 0 nor 1")),
        };
        let nonce = r.take(NONCE_LEN)?.try_into().expect("took NONCE_LEN bytes");
        let n = r.u16()?;
        let mut segments = Vec::with_capacity(usize::from(n));
        for _ in 0..n {
            let (name, handle) = r.named_handle()?;
            segments.push(Segment { name, handle });
        }
        if r.remaining() != 0 {
            return Err(format!("{} bytes after the segments", r.remaining()));
        }
        Ok(Self {
            engine_id,
            checksum,
            path: (!path.is_empty()).then(|| PathBuf::from(path)),
            probe,
            namespace,
            authenticated,
            nonce,
            segments,
        })
    }
}

/// The peer a hello names.
pub(crate) fn peer_of(hello: &Hello) -> PeerId {
    PeerId(u64::from(hello.engine_id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use transfer_engine::{AccessKey, RegionHandle, RegionId};

    #[test]
    fn hellos_round_trip_and_bad_ones_are_refused() {
        let hello = Hello {
            engine_id: 9,
            checksum: true,
            path: Some("/tmp/x.sock".into()),
            probe: (0x1000, 42),
            namespace: Namespace::default(),
            authenticated: true,
            nonce: [7; NONCE_LEN],
            segments: vec![Segment {
                name: "kv".into(),
                handle: RegionHandle {
                    id: RegionId(3),
                    key: AccessKey(77),
                    len: 4096,
                    layout: None,
                },
            }],
        };
        assert_eq!(Hello::decode(&hello.encode()), Ok(hello.clone()));
        let mut wrong = hello.encode();
        wrong[0] = 9;
        assert!(Hello::decode(&wrong).unwrap_err().contains("version 9"));
        let mut long = hello.encode();
        long.push(0);
        assert!(
            Hello::decode(&long)
                .unwrap_err()
                .contains("after the segments")
        );
        let short = hello.encode();
        assert!(
            Hello::decode(&short[..10])
                .unwrap_err()
                .contains("truncated")
        );
    }
}

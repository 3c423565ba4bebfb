//! The byte layout the backends' own messages share (the TCP lane handshake and the RDMA messages):
//! little-endian integers, strings with a u16 length, and a named region handle (what a node offers its
//! peers). Every read checks the length first, so decoding never panics; errors are text the caller wraps.

use transfer_engine::{AccessKey, KvLayout, RegionHandle, RegionId};

/// Reads fields in order from a received message.
pub(crate) struct ByteReader<'a> {
    rest: &'a [u8],
    /// What is being read, for error text ("handshake message", "RDMA message").
    what: &'static str,
}

impl<'a> ByteReader<'a> {
    pub(crate) fn new(bytes: &'a [u8], what: &'static str) -> Self {
        Self { rest: bytes, what }
    }

    /// The bytes not read yet.
    pub(crate) fn remaining(&self) -> usize {
        self.rest.len()
    }

    /// Every byte not read yet.
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))] // only the RDMA messages carry a tail
    pub(crate) fn take_rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.rest)
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.rest.len() < n {
            return Err(format!(
                "truncated {}: {n} bytes needed, {} left",
                self.what,
                self.rest.len()
            ));
        }
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut a = [0; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, String> {
        Ok(self.array::<1>()?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// Bytes with a u16 length before them.
    pub(crate) fn bytes(&mut self) -> Result<&'a [u8], String> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }

    /// A UTF-8 string with a u16 length before it.
    pub(crate) fn str(&mut self) -> Result<String, String> {
        String::from_utf8(self.bytes()?.to_vec())
            .map_err(|_| format!("a string in a {} is not UTF-8", self.what))
    }

    /// A region handle offered under a name (see [`put_named_handle`]); the layout is validated.
    pub(crate) fn named_handle(&mut self) -> Result<(String, RegionHandle), String> {
        let name = self.str()?;
        let id = RegionId(self.u32()?);
        let key = AccessKey(self.u64()?);
        let len = self.u64()?;
        let layout = match self.u8()? {
            0 => None,
            1 => {
                let layout = KvLayout::decode_from(self.take(KvLayout::ENCODED_LEN)?)
                    .ok_or("a region layout's dtype or KV kind is unknown")?;
                layout
                    .validate()
                    .map_err(|e| format!("a region layout: {e}"))?;
                Some(layout)
            }
            f => return Err(format!("unknown layout flag {f}")),
        };
        Ok((
            name,
            RegionHandle {
                id,
                key,
                len,
                layout,
            },
        ))
    }
}

/// The bytes a text of hex digit pairs names (either case); `None` for an odd length or another
/// character.
pub(crate) fn from_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) || !hex.is_ascii() {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok())
        .collect()
}

/// Appends `bytes` with a u16 length before them (cut at 65,535 bytes).
pub(crate) fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u16::try_from(bytes.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&bytes[..usize::from(len)]);
}

/// Appends a region handle offered under `name`: the name, region id u32, access key u64, length u64, then
/// the layout (u8 0, or 1 and the core's layout encoding).
pub(crate) fn put_named_handle(out: &mut Vec<u8>, name: &str, handle: &RegionHandle) {
    put_bytes(out, name.as_bytes());
    out.extend_from_slice(&handle.id.0.to_le_bytes());
    out.extend_from_slice(&handle.key.0.to_le_bytes());
    out.extend_from_slice(&handle.len.to_le_bytes());
    match &handle.layout {
        Some(l) => {
            out.push(1);
            l.encode_into(out);
        }
        None => out.push(0),
    }
}

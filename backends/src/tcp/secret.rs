//! The shared secret of the HMAC handshake, kept out of logs.

use std::fmt;

/// A shared secret for the HMAC-SHA256 handshake. Its `Debug` says only that one is set, so a
/// configuration printed to a log does not leak it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// A secret of these bytes.
    #[must_use]
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        Self(bytes.into())
    }

    /// Its bytes.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Self {
        Self::new(s.as_bytes())
    }
}

impl From<Vec<u8>> for Secret {
    fn from(bytes: Vec<u8>) -> Self {
        Self(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_never_prints_its_bytes() {
        let secret = Secret::from("hunter2");
        assert_eq!(format!("{secret:?}"), "Secret(..)");
        assert_eq!(secret.as_bytes(), b"hunter2");
    }
}

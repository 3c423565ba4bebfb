//! Registry records that prove who wrote them: a client with the cluster's shared secret appends a MAC
//! (HMAC-SHA256 over the record's key and text) to every record it writes, and reads only records whose
//! MAC verifies, so whoever can write to the registry (etcd) without the secret cannot point peers at an
//! address of its choosing. Records carry no secret and no access key: a region's key travels only in the
//! authenticated handshake ([`crate::Transport::connect`]).

use crate::node::handshake::{MAC_LEN, auth_mac, verify_mac};
use crate::tcp::Secret;

/// The MAC's role label (the handshakes' MACs use others, so a MAC from one never passes for the other).
const ROLE: &str = "discovery-record";
/// The line that carries the MAC, last in a sealed record.
const FIELD: &str = "mac=";

fn transcript(key: &str, text: &str) -> Vec<u8> {
    [key.as_bytes(), b"\n", text.as_bytes()].concat()
}

/// `text` (stored under `key`) with its MAC line when there is a secret; `text` unchanged otherwise.
pub(super) fn seal(key: &str, text: &str, secret: Option<&Secret>) -> String {
    let Some(secret) = secret else {
        return text.to_owned();
    };
    let mac = auth_mac(Some(secret.as_bytes()), ROLE, &transcript(key, text));
    let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
    format!("{text}{FIELD}{hex}\n")
}

/// The text of record `stored` (under `key`), its MAC checked when there is a secret: a record without
/// one, or whose MAC does not verify, is refused with the reason.
pub(super) fn open<'a>(
    key: &str,
    stored: &'a str,
    secret: Option<&Secret>,
) -> Result<&'a str, String> {
    let Some(secret) = secret else {
        return Ok(stored);
    };
    let unsigned = || {
        format!(
            "record {key} is not signed with this cluster's secret (written by a client without it, \
             or forged)"
        )
    };
    let body = stored.strip_suffix('\n').unwrap_or(stored);
    let at = body.rfind('\n').map_or(0, |i| i + 1);
    let hex = body[at..].strip_prefix(FIELD).ok_or_else(unsigned)?;
    let mac: [u8; MAC_LEN] = crate::codec::from_hex(hex)
        .and_then(|bytes| bytes.try_into().ok())
        .ok_or_else(unsigned)?;
    let text = &stored[..at];
    if verify_mac(Some(secret.as_bytes()), ROLE, &transcript(key, text), &mac) {
        Ok(text)
    } else {
        Err(unsigned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_record_opens_only_under_its_key_and_secret() {
        let secret = Secret::from("s3cret");
        let text = "engine_id=3\naddr=10.0.0.1:7400\nnamespace=m\n";
        let sealed = seal("k/3", text, Some(&secret));
        assert!(sealed.starts_with(text) && !sealed.contains("s3cret"));
        assert_eq!(open("k/3", &sealed, Some(&secret)), Ok(text));
        // Another key, another secret, an altered field, no MAC: each refused.
        assert!(open("k/4", &sealed, Some(&secret)).is_err());
        assert!(open("k/3", &sealed, Some(&Secret::from("other"))).is_err());
        let altered = sealed.replace("10.0.0.1", "10.0.0.66");
        assert!(open("k/3", &altered, Some(&secret)).is_err());
        let why = open("k/3", text, Some(&secret)).unwrap_err();
        assert!(
            why.contains("not signed with this cluster's secret"),
            "{why}"
        );
        // Without a secret nothing is added or checked.
        assert_eq!(seal("k/3", text, None), text);
        assert_eq!(open("k/3", &sealed, None), Ok(sealed.as_str()));
    }
}

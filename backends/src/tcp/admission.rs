//! Admission of inbound connections: how many one IP address may hold, and how a connection refused at a
//! limit (this one or the node-wide lane limit) is told why before it closes.
//!
//! A connection from an address holds a [`ConnectionSlot`] from accept until its lane ends, so one
//! address can hold at most `TcpConfig::max_connections_per_address` of the node's lanes and handshakes
//! together, and the rest stay for everyone else.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use super::context::lock;
use super::handshake::{self, Message};

/// Connections held per address.
#[derive(Debug, Default)]
pub(crate) struct Admission {
    by_address: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection of an address, released when dropped.
#[derive(Debug)]
pub(crate) struct ConnectionSlot {
    admission: Arc<Admission>,
    ip: IpAddr,
}

impl Admission {
    /// A slot for a connection from `ip`, unless the address already holds `limit`.
    pub(crate) fn admit(
        self: &Arc<Self>,
        ip: IpAddr,
        limit: usize,
    ) -> Result<ConnectionSlot, String> {
        let mut held = lock(&self.by_address);
        let n = held.entry(ip).or_insert(0);
        if *n >= limit {
            return Err(format!(
                "address {ip} already holds {n} connections here, the most this node allows one address"
            ));
        }
        *n += 1;
        Ok(ConnectionSlot {
            admission: self.clone(),
            ip,
        })
    }

    /// Connections `ip` holds now.
    #[cfg(test)]
    fn held(&self, ip: IpAddr) -> usize {
        lock(&self.by_address).get(&ip).copied().unwrap_or(0)
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut held = lock(&self.admission.by_address);
        if let Some(n) = held.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.ip);
            }
        }
    }
}

/// Tells a connection refused at admission why, then closes it: what the dialer already sent (its Hello)
/// is read first and the rest drained briefly, since a socket closed with unread bytes is reset and the
/// reason would be lost. Bounded: a peer that sends nothing or reads nothing costs at most about 1 s.
pub(crate) async fn refuse(mut stream: TcpStream, reason: String) {
    let brief = Duration::from_millis(200);
    let mut sink = [0u8; 4096];
    let _ = tokio::time::timeout(brief, stream.read(&mut sink)).await;
    let _ = tokio::time::timeout(
        Duration::from_millis(500),
        handshake::send(&mut stream, &Message::Reject(reason)),
    )
    .await;
    let _ = tokio::io::AsyncWriteExt::shutdown(&mut stream).await;
    let drain = async {
        while let Ok(n) = stream.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(brief, drain).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_holds_at_most_its_limit_and_slots_return_when_dropped() {
        let admission = Arc::new(Admission::default());
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let first = admission.admit(a, 2).unwrap();
        let _second = admission.admit(a, 2).unwrap();
        let refused = admission.admit(a, 2).unwrap_err();
        assert!(refused.contains("already holds 2 connections"), "{refused}");
        // Another address is not affected.
        let _other = admission.admit(b, 2).unwrap();
        drop(first);
        assert_eq!(admission.held(a), 1);
        admission.admit(a, 2).unwrap();
        assert_eq!(admission.held(a), 1, "the slot just made was dropped");
    }
}

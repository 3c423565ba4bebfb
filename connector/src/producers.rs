//! The control connections a connector half keeps to producers, one per producer address, at most
//! [`MAX_PRODUCERS`] (the oldest is closed beyond it).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::control::{ControlClient, ControlIdentity};
use crate::producer::lock;

/// Most producers a half keeps a control connection to.
pub(crate) const MAX_PRODUCERS: usize = 256;

/// See the [module docs](self).
#[derive(Debug)]
pub(crate) struct Producers {
    /// Longest one control call may take.
    timeout: Duration,
    /// What this half says of itself to producers.
    identity: ControlIdentity,
    clients: Mutex<Vec<(SocketAddr, Arc<ControlClient>)>>,
}

impl Producers {
    pub(crate) fn new(timeout: Duration, identity: ControlIdentity) -> Producers {
        Producers {
            timeout,
            identity,
            clients: Mutex::new(Vec::new()),
        }
    }

    /// The control client of the producer at `addr`, connected on its first call.
    pub(crate) fn client(&self, addr: SocketAddr) -> Arc<ControlClient> {
        let mut clients = lock(&self.clients);
        if let Some((_, c)) = clients.iter().find(|(a, _)| *a == addr) {
            return c.clone();
        }
        if clients.len() >= MAX_PRODUCERS {
            clients.remove(0);
        }
        let c = Arc::new(ControlClient::new(
            addr,
            self.timeout,
            self.identity.clone(),
        ));
        clients.push((addr, c.clone()));
        c
    }
}

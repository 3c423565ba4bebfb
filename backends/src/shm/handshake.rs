//! Reaching a peer and being reached: the hello and welcome (protocol version, engine id, whether this end
//! wants checksums, its listening path, the segments it offers, a probe word for cross-memory attach,
//! the KV namespace and a fresh nonce), the MACs both ways, the credential rule on both ends, and the
//! listener that answers hellos on threads of their own, a bounded number at once.
//!
//! ```text
//! dialer                                   listener
//!   Hello(h_d)                      ->       credentials, identity, probe checked
//!                                   <-       Welcome(h_l), Auth(mac_l)
//!   identity, probe, mac_l checked
//!   Auth(mac_d)                     ->       mac_d checked, then admitted
//!                                   <-       Admitted (or Refuse(reason))
//! ```
//!
//! `mac_l` and `mac_d` are HMAC-SHA256 under the shared secret, with the roles `shm-listener` and
//! `shm-dialer`, over `h_d || h_l` (both carry fresh nonces, so a recorded handshake does not verify
//! again); without a secret on either side they are zeros and not checked. The identity check
//! ([`crate::node::handshake::Identity`]) refuses a peer of another protocol version, namespace or
//! engine id of this node's, and one that authenticates when this node does not, or the other way round.

use std::io;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::cma::{self, Credentials};
use super::hello::{Hello, VERSION};
use super::io;
use super::shared::Shared;
use super::wire::Envelope;
use crate::TransportError;
use crate::node::LogKind;
use crate::node::handshake::{Identity, Mismatch, auth_mac, verify_mac};

/// How often the listener looks for connections (it also looks at the stop flag).
const LISTEN_POLL: Duration = Duration::from_millis(20);
/// The MAC roles of the two ends.
const LISTENER: &str = "shm-listener";
const DIALER: &str = "shm-dialer";

fn identity(hello: &Hello) -> Identity {
    Identity {
        protocol: VERSION,
        wire: 0,
        engine_id: hello.engine_id,
        namespace: hello.namespace.clone(),
        authenticated: hello.authenticated,
    }
}

/// Checks the peer's `hello` against this node's (`ours`), then `creds` against the node's rule, and
/// proves cross-memory attach into that process with the probe word of its `hello`.
fn check_peer(
    shared: &Shared,
    ours: &Hello,
    creds: Credentials,
    hello: &Hello,
) -> Result<(), String> {
    if let Some(mismatch) = identity(ours).mismatch(&identity(hello)) {
        return Err(mismatch.to_string());
    }
    if !shared.cfg.allowed.allows(creds.uid) {
        return Err(format!(
            "process {} of user {} is not allowed by this node's credential rule ({:?})",
            creds.pid, creds.uid, shared.cfg.allowed
        ));
    }
    let mut word = [0u8; 8];
    cma::pull(creds.pid, hello.probe.0, &mut word).map_err(|e| {
        format!(
            "cannot copy from process {} (cross-memory attach, process_vm_readv: {e}); it needs \
             ptrace access: the same user, kernel.yama.ptrace_scope 0, or CAP_SYS_PTRACE",
            creds.pid
        )
    })?;
    if u64::from_le_bytes(word) != hello.probe.1 {
        return Err(format!(
            "process {} does not hold the probe word its hello names",
            creds.pid
        ));
    }
    Ok(())
}

/// The bytes both MACs cover: the dialer's hello, then the listener's welcome, as sent.
fn transcript(hello: &[u8], welcome: &[u8]) -> Vec<u8> {
    [hello, welcome].concat()
}

fn secret(shared: &Shared) -> Option<&[u8]> {
    shared.cfg.secret.as_ref().map(crate::tcp::Secret::as_bytes)
}

fn timeouts(stream: &UnixStream, limit: Option<Duration>) -> io::Result<()> {
    stream.set_read_timeout(limit)?;
    stream.set_write_timeout(limit)
}

/// The listener's next handshake message, a refusal turned into this node's error.
fn next(stream: &mut UnixStream, path: &Path, what: &str) -> Result<Envelope, TransportError> {
    match Envelope::read_from(stream) {
        Ok(Envelope::Refuse(reason)) => Err(TransportError::Refused(format!(
            "{} refused this node: {reason}",
            path.display()
        ))),
        Ok(envelope) => Ok(envelope),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            Err(TransportError::Refused(format!(
                "{} closed the connection during the handshake (waiting for its {what})",
                path.display()
            )))
        }
        Err(e) => Err(io(e)),
    }
}

/// Dials the node listening at `path`: sends this node's hello, reads its welcome and MAC, checks them,
/// answers with this node's MAC and waits to be admitted. Returns the connection (its timeouts
/// cleared), the peer's credentials and its welcome.
pub(crate) fn dial(
    shared: &Shared,
    path: &Path,
) -> Result<(UnixStream, Credentials, Hello), TransportError> {
    let mut stream = UnixStream::connect(path).map_err(|e| {
        TransportError::Unreachable(format!("cannot connect to {}: {e}", path.display()))
    })?;
    timeouts(&stream, Some(shared.cfg.liveness.handshake_timeout)).map_err(io)?;
    let creds = cma::peer_credentials(&stream).map_err(io)?;
    // The listener's user is checked before this node says anything to it.
    if !shared.cfg.allowed.allows(creds.uid) {
        return Err(TransportError::Refused(format!(
            "the node at {} runs as user {} (process {}), which is not allowed by this node's \
             credential rule ({:?})",
            path.display(),
            creds.uid,
            creds.pid,
            shared.cfg.allowed
        )));
    }
    let ours = shared
        .hello()
        .map_err(|e| TransportError::io("shm", &io::Error::other(e)))?;
    let hello = ours.encode();
    Envelope::Hello(hello.clone())
        .write_to(&mut stream)
        .map_err(io)?;
    let protocol = |what: String| TransportError::protocol("shm", what);
    let body = match next(&mut stream, path, "welcome")? {
        Envelope::Welcome(body) => body,
        other => {
            return Err(protocol(format!(
                "{} answered a hello with {other:?}",
                path.display()
            )));
        }
    };
    let welcome = Hello::decode(&body).map_err(protocol)?;
    let refuse = |stream: &mut UnixStream, why: String| {
        super::wire::refuse(stream, &why);
        TransportError::Refused(why)
    };
    if let Err(why) = check_peer(shared, &ours, creds, &welcome) {
        return Err(refuse(&mut stream, why));
    }
    let transcript = transcript(&hello, &body);
    let mac = match next(&mut stream, path, "MAC")? {
        Envelope::Auth(mac) => mac,
        other => {
            return Err(protocol(format!(
                "{} sent {other:?} where its MAC belongs",
                path.display()
            )));
        }
    };
    if !verify_mac(secret(shared), LISTENER, &transcript, &mac) {
        let why = Mismatch::Authentication { role: "listener" }.to_string();
        return Err(refuse(&mut stream, why));
    }
    Envelope::Auth(auth_mac(secret(shared), DIALER, &transcript))
        .write_to(&mut stream)
        .map_err(io)?;
    match next(&mut stream, path, "admission")? {
        Envelope::Admitted => {}
        other => {
            return Err(protocol(format!(
                "{} answered the MAC with {other:?}",
                path.display()
            )));
        }
    }
    timeouts(&stream, None).map_err(io)?;
    Ok((stream, creds, welcome))
}

/// Answers one connection: credentials, hello, identity and probe, the welcome and this node's MAC, the
/// dialer's MAC, then admission (the engine id must not be connected already) and the link's threads.
fn answer(shared: &Arc<Shared>, mut stream: UnixStream) -> Result<(), String> {
    timeouts(&stream, Some(shared.cfg.liveness.handshake_timeout)).map_err(|e| e.to_string())?;
    let creds = cma::peer_credentials(&stream).map_err(|e| e.to_string())?;
    let refuse = |stream: &mut UnixStream, why: String| {
        super::wire::refuse(stream, &why);
        why
    };
    if !shared.cfg.allowed.allows(creds.uid) {
        let why = format!("process {} of user {} is not allowed", creds.pid, creds.uid);
        return Err(refuse(&mut stream, why));
    }
    let body = match Envelope::read_from(&mut stream) {
        Ok(Envelope::Hello(body)) => Ok(body),
        Ok(other) => Err(format!("expected a hello, got {other:?}")),
        Err(e) => Err(format!("reading the hello: {e}")),
    }
    .map_err(|why| refuse(&mut stream, why))?;
    let ours = shared.hello().map_err(|why| refuse(&mut stream, why))?;
    let hello = Hello::decode(&body)
        .and_then(|h| check_peer(shared, &ours, creds, &h).map(|()| h))
        .map_err(|why| refuse(&mut stream, why))?;
    let welcome = ours.encode();
    let transcript = transcript(&body, &welcome);
    Envelope::Welcome(welcome)
        .write_to(&mut stream)
        .and_then(|()| {
            Envelope::Auth(auth_mac(secret(shared), LISTENER, &transcript)).write_to(&mut stream)
        })
        .map_err(|e| format!("writing the welcome: {e}"))?;
    match Envelope::read_from(&mut stream) {
        Ok(Envelope::Auth(mac)) if verify_mac(secret(shared), DIALER, &transcript, &mac) => {}
        Ok(Envelope::Auth(_)) => {
            let why = Mismatch::Authentication { role: "dialer" }.to_string();
            return Err(refuse(&mut stream, why));
        }
        Ok(Envelope::Refuse(why)) => return Err(format!("the dialer refused this node: {why}")),
        Ok(other) => {
            return Err(refuse(
                &mut stream,
                format!("expected a MAC, got {other:?}"),
            ));
        }
        Err(e) => return Err(format!("reading the dialer's MAC: {e}")),
    }
    shared
        .admit(stream, creds, hello, |s| {
            Envelope::Admitted.write_to(s).map_err(|e| e.to_string())?;
            timeouts(s, None).map_err(|e| e.to_string())
        })
        .map(|_| ())
}

/// Creates the listening socket at `path` (owner only), replacing a stale socket file there.
pub(crate) fn listen(path: &Path) -> Result<UnixListener, TransportError> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(TransportError::config(
                "shm",
                format!("{} exists and is not a socket", path.display()),
            ));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(TransportError::config(
                "shm",
                format!("a node is already listening at {}", path.display()),
            ));
        }
        std::fs::remove_file(path).map_err(io)?;
    }
    let listener = UnixListener::bind(path).map_err(io)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
    listener.set_nonblocking(true).map_err(io)?;
    Ok(listener)
}

/// The listener's loop: accepts connections until the node stops, each answered on a thread of its own
/// while fewer than `max_handshakes` are in progress, refused at once otherwise.
pub(crate) fn serve(shared: &Arc<Shared>, listener: &UnixListener) {
    while !shared.stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((mut stream, _)) => {
                let _ = stream.set_nonblocking(false);
                if shared.handshakes.fetch_add(1, Ordering::AcqRel) >= shared.cfg.max_handshakes {
                    shared.handshakes.fetch_sub(1, Ordering::AcqRel);
                    let _ = stream.set_write_timeout(Some(LISTEN_POLL));
                    let why = "too many handshakes in progress; try again".to_owned();
                    let _ = Envelope::Refuse(why.clone()).write_to(&mut stream);
                    shared.refused(
                        LogKind::HandshakeRefused,
                        None,
                        format!("refused a connection: {why}"),
                        None,
                    );
                    continue;
                }
                let answering = shared.clone();
                let spawned = std::thread::Builder::new()
                    .name("shm-handshake".into())
                    .spawn(move || {
                        if let Err(why) = answer(&answering, stream) {
                            answering.refused(
                                LogKind::HandshakeRefused,
                                None,
                                format!("refused a connection: {why}"),
                                None,
                            );
                        }
                        answering.handshakes.fetch_sub(1, Ordering::AcqRel);
                    });
                if spawned.is_err() {
                    shared.handshakes.fetch_sub(1, Ordering::AcqRel);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(LISTEN_POLL),
            Err(e) => {
                shared.core.log.error(
                    LogKind::Failed,
                    None,
                    "accept failed",
                    TransportError::io("shm", &e),
                );
                std::thread::sleep(LISTEN_POLL);
            }
        }
    }
}

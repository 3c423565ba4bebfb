//! Reaching a peer and being reached: the hello and welcome (protocol version, engine id, whether this end
//! wants checksums, its listening path, the segments it offers, and a probe word for cross-memory
//! attach), the credential rule on both ends, and the listener that answers hellos on threads of their
//! own, a bounded number at once.

use std::io;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::cma::{self, Credentials};
use super::hello::Hello;
use super::io;
use super::shared::Shared;
use super::wire::Envelope;
use crate::TransportError;
use crate::node::LogKind;

/// How often the listener looks for connections (it also looks at the stop flag).
const LISTEN_POLL: Duration = Duration::from_millis(20);

/// Checks `creds` against the node's rule and proves cross-memory attach into that process with the
/// probe word of its `hello`.
fn check_peer(shared: &Shared, creds: Credentials, hello: &Hello) -> Result<(), String> {
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
    if hello.engine_id == shared.engine_id() {
        return Err(format!(
            "the peer claims this node's own engine id {}",
            hello.engine_id
        ));
    }
    Ok(())
}

fn timeouts(stream: &UnixStream, limit: Option<Duration>) -> io::Result<()> {
    stream.set_read_timeout(limit)?;
    stream.set_write_timeout(limit)
}

/// Dials the node listening at `path`: sends this node's hello, reads its welcome, checks it. Returns the
/// connection (its timeouts cleared), the peer's credentials and its welcome.
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
    Envelope::Hello(shared.hello().encode())
        .write_to(&mut stream)
        .map_err(io)?;
    let welcome = match Envelope::read_from(&mut stream) {
        Ok(Envelope::Welcome(body)) => {
            Hello::decode(&body).map_err(|e| TransportError::protocol("shm", e))?
        }
        Ok(Envelope::Refuse(reason)) => {
            return Err(TransportError::Refused(format!(
                "{} refused this node: {reason}",
                path.display()
            )));
        }
        Ok(other) => {
            return Err(TransportError::protocol(
                "shm",
                format!("{} answered a hello with {other:?}", path.display()),
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            return Err(TransportError::Refused(format!(
                "{} closed the connection during the handshake",
                path.display()
            )));
        }
        Err(e) => return Err(io(e)),
    };
    if let Err(why) = check_peer(shared, creds, &welcome) {
        super::wire::refuse(&mut stream, &why);
        return Err(TransportError::Refused(why));
    }
    timeouts(&stream, None).map_err(io)?;
    Ok((stream, creds, welcome))
}

/// Answers one connection: credentials, hello, probe, then admission (the engine id must not be
/// connected already), welcome and the link's threads.
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
    let hello = match Envelope::read_from(&mut stream) {
        Ok(Envelope::Hello(body)) => Hello::decode(&body),
        Ok(other) => Err(format!("expected a hello, got {other:?}")),
        Err(e) => Err(format!("reading the hello: {e}")),
    };
    let hello = hello
        .and_then(|h| check_peer(shared, creds, &h).map(|()| h))
        .map_err(|why| refuse(&mut stream, why))?;
    let welcome = Envelope::Welcome(shared.hello().encode());
    shared
        .admit(stream, creds, hello, |s| {
            welcome.write_to(s).map_err(|e| e.to_string())?;
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

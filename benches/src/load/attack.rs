//! The attackers of `te-bench load --attackers`: hostile clients, each from its own loopback address
//! (127.0.0.2, as another host would be), run beside the honest clients. Each does what the protocol
//! lets a stranger try, without a secret:
//!
//! - `flood`: lanes that send Close frames for unknown sessions as fast as the server reads them and
//!   never read the Rejects that answer them; a lane the server closes is replaced at once;
//! - `lanes`: as many lanes as the server admits, each under an engine id of its own, held, and refused
//!   ones retried;
//! - `takeover`: once every honest client has a session running, handshakes claiming the engine id of
//!   each honest client still running, and Close frames for its sessions whenever one is admitted;
//! - `half-open`: 100 connections that send the first bytes of a Hello and then nothing, each replaced
//!   when the server closes it;
//! - `data-flood`: a lane served a region of its own that floods it with Data frames whose payload
//!   checksums fail, never reading the answers (see [`super::data_flood`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use backends::tcp::Namespace;
use backends::tcp::handshake::{self, Hello};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio::time::timeout;
use transfer_engine::wire::{FrameKind, Header};

use super::attacker::{LIMIT, Tally, connect};

/// The engine ids of the honest clients still running.
pub(crate) type Running = Arc<std::sync::Mutex<std::collections::BTreeSet<u32>>>;

/// One kind of attacker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum AttackKind {
    /// No attacker: the baseline.
    None,
    /// Close frames of unknown sessions on one lane, as fast as the server reads, never reading.
    Flood,
    /// Lanes under new engine ids, as many as the server admits, held.
    Lanes,
    /// Handshakes claiming each running client's engine id, with Close frames for its sessions.
    Takeover,
    /// 100 connections that send 5 bytes of a Hello and then nothing.
    HalfOpen,
    /// Data frames with failing payload CRCs into a region of its own, never reading the answers.
    DataFlood,
}

impl AttackKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Flood => "flood",
            Self::Lanes => "lanes",
            Self::Takeover => "takeover",
            Self::HalfOpen => "half-open",
            Self::DataFlood => "data-flood",
        }
    }
}

/// A running attacker; [`Attack::stop`] ends it and says what it did.
pub(crate) struct Attack {
    kind: AttackKind,
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Attack {
    /// Starts `kind` against `server`; `victims` are the honest clients still running.
    pub(crate) fn start(
        kind: AttackKind,
        server: SocketAddr,
        victims: Running,
    ) -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let stop = Arc::new(AtomicBool::new(false));
        let tally = Arc::new(Tally::default());
        let (s, t) = (stop.clone(), tally.clone());
        match kind {
            AttackKind::None => {}
            AttackKind::Flood => drop(runtime.spawn(flood(server, s, t))),
            AttackKind::Lanes => drop(runtime.spawn(lanes(server, s, t))),
            AttackKind::Takeover => drop(runtime.spawn(takeover(server, victims, s, t))),
            AttackKind::HalfOpen => drop(runtime.spawn(half_open(server, s, t))),
            AttackKind::DataFlood => {
                drop(runtime.spawn(super::data_flood::data_flood(server, s, t)))
            }
        }
        let attack = Self {
            kind,
            stop,
            tally,
            runtime: Some(runtime),
        };
        attack.wait_in_place(Duration::from_secs(10));
        Ok(attack)
    }

    /// Waits (at most `limit`) until the attacker is at full strength: the flood writing, the lane taker
    /// refused at a limit, the takeover past its first claim, all 100 half-open connections made.
    fn wait_in_place(&self, limit: Duration) {
        let t = &self.tally;
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let ready = || match self.kind {
            AttackKind::None => true,
            AttackKind::Flood | AttackKind::DataFlood => n(&t.frames) > 0,
            AttackKind::Lanes => n(&t.refused) > 0,
            AttackKind::Takeover => n(&t.admitted) + n(&t.refused) > 0,
            AttackKind::HalfOpen => n(&t.admitted) >= 100,
        };
        let started = std::time::Instant::now();
        while !ready() && started.elapsed() < limit {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Stops the attacker (its connections close) and summarises what it did.
    pub(crate) fn stop(mut self) -> String {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(2));
        }
        let t = &self.tally;
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let reason = t.reason.lock().unwrap().clone();
        let mut s = match self.kind {
            AttackKind::None => return String::new(),
            AttackKind::Flood | AttackKind::DataFlood => format!(
                "{} frames on {} lanes, {} closed by the server",
                n(&t.frames),
                n(&t.admitted),
                n(&t.closed)
            ),
            AttackKind::Lanes | AttackKind::Takeover => {
                format!("{} admitted, {} refused", n(&t.admitted), n(&t.refused))
            }
            AttackKind::HalfOpen => format!(
                "{} connections, {} closed by the server",
                n(&t.admitted),
                n(&t.closed)
            ),
        };
        if let Some(r) = reason {
            s.push_str(&format!(" (first refusal: {r})"));
        }
        s
    }
}

/// A lane under engine `id` (no served region, no token), or the server's reason for refusing it.
async fn lane(server: SocketAddr, id: u32) -> anyhow::Result<Result<TcpStream, String>> {
    let mut stream = connect(server).await?;
    let hello = Hello::new(id, Namespace::default())?;
    Ok(handshake::dial(&mut stream, &hello, None, None, LIMIT)
        .await
        .map(|_| stream)
        .map_err(|e| e.to_string()))
}

fn close_frame(session: u64) -> Vec<u8> {
    let mut h = Header::new(FrameKind::Close, session);
    h.crc = transfer_engine::crc32c(&[]);
    h.encode().to_vec()
}

async fn flood(server: SocketAddr, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
    let burst: Vec<u8> = (0..4096u64)
        .flat_map(|i| close_frame((66 << 32) | i))
        .collect();
    while !stop.load(Ordering::Relaxed) {
        let Ok(Ok(mut stream)) = lane(server, 66).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        tally.admitted.fetch_add(1, Ordering::Relaxed);
        while !stop.load(Ordering::Relaxed) {
            match timeout(Duration::from_millis(200), stream.write_all(&burst)).await {
                Ok(Ok(())) => drop(tally.frames.fetch_add(4096, Ordering::Relaxed)),
                Ok(Err(_)) => {
                    tally.closed.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                // The server is not reading (its budget for this lane is spent): keep pressing.
                Err(_) => {}
            }
        }
    }
}

async fn lanes(server: SocketAddr, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
    let mut held = Vec::new();
    let mut next_id = 1000u32;
    while !stop.load(Ordering::Relaxed) {
        match lane(server, next_id).await {
            Ok(Ok(stream)) => {
                tally.admitted.fetch_add(1, Ordering::Relaxed);
                held.push(stream);
            }
            Ok(Err(why)) => {
                tally.refuse(why);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
        next_id = if next_id >= 1000 + 4096 {
            1000
        } else {
            next_id + 1
        };
    }
}

async fn takeover(server: SocketAddr, victims: Running, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
    while !stop.load(Ordering::Relaxed) {
        let live: Vec<u32> = victims.lock().unwrap().iter().copied().collect();
        for id in live {
            match lane(server, id).await {
                Ok(Ok(mut stream)) => {
                    // Admitted under a live client's id: try to end its sessions (the counter is not
                    // known, so a spread of guesses).
                    tally.admitted.fetch_add(1, Ordering::Relaxed);
                    let closes: Vec<u8> = (0..1024u64)
                        .flat_map(|c| close_frame((u64::from(id) << 32) | (c << 20)))
                        .collect();
                    let _ = timeout(LIMIT, stream.write_all(&closes)).await;
                    tally.frames.fetch_add(1024, Ordering::Relaxed);
                }
                Ok(Err(why)) => tally.refuse(why),
                Err(_) => {}
            }
            if stop.load(Ordering::Relaxed) {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn half_open(server: SocketAddr, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
    let mut set = JoinSet::new();
    for _ in 0..100 {
        let (stop, tally) = (stop.clone(), tally.clone());
        set.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let Ok(mut stream) = connect(server).await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                tally.admitted.fetch_add(1, Ordering::Relaxed);
                // The length prefix and tag of a Hello, and nothing more.
                let _ = stream.write_all(&[200, 0, 0, 0, 1]).await;
                let mut sink = [0u8; 256];
                loop {
                    match timeout(Duration::from_millis(200), stream.read(&mut sink)).await {
                        Ok(Ok(0) | Err(_)) => {
                            tally.closed.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                        Ok(Ok(_)) => {}
                        Err(_) if stop.load(Ordering::Relaxed) => return,
                        Err(_) => {}
                    }
                }
            }
        });
    }
    while set.join_next().await.is_some() {}
}

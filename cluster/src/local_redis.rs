//! A Redis server of one's own on a loopback port, for tests, benches and a first look: started from the
//! `redis-server` on the PATH (Debian's `redis-server`, or Valkey's `valkey-server`), without
//! persistence, killed on drop.

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// A running `redis-server` this process started.
pub struct LocalRedis {
    child: Child,
    port: u16,
}

impl LocalRedis {
    /// Starts one on a free loopback port and waits (at most 10 s) until it accepts connections.
    pub fn start() -> Result<LocalRedis, String> {
        Self::start_on(free_port()?)
    }

    /// Starts one on `port` (to bring a killed one back where its clients look for it).
    pub fn start_on(port: u16) -> Result<LocalRedis, String> {
        let binary = ["redis-server", "valkey-server"]
            .into_iter()
            .find(|b| which(b))
            .ok_or("no redis-server or valkey-server on the PATH (scripts/install-deps.sh installs Debian's redis-server)")?;
        let child = Command::new(binary)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting {binary}: {e}"))?;
        let mut server = LocalRedis { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(format!("{binary} on port {port} exited at start: {status}"));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{binary} on port {port} did not accept connections in 10 s"
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(server)
    }

    /// Its URL.
    #[must_use]
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Its port.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills it now (what a crashed Redis looks like to its clients).
    pub fn kill(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        self.stop();
    }
}

fn which(binary: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(binary).is_file()))
}

/// A loopback port below the kernel's ephemeral range (32768 up), so no port the kernel hands out
/// before the server binds it can be this one; each call tries the next, from one this process id picks.
fn free_port() -> Result<u16, String> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let offset = std::process::id() % 6_000 * 2 + 1;
    for _ in 0..1_000 {
        let port = 20_000 + (offset + NEXT.fetch_add(1, Ordering::Relaxed)) % 12_000;
        let port = u16::try_from(port).map_err(|e| e.to_string())?;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err("no free loopback port in 20000..32000".into())
}

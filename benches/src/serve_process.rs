//! A `te-bench serve` child process on a free loopback port, for the subcommands that need a real server
//! in another process (`peer-death`, `load`).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, ChildStdout, Command, Stdio};

use anyhow::Context;

/// The server process; killed when dropped, so a failed run leaves no process behind.
pub(crate) struct ServeProcess {
    pub(crate) child: Child,
    /// Its output after the first line. Keep it open (or read it): the server prints a line per session,
    /// and a closed pipe would end it early.
    pub(crate) stdout: Option<BufReader<ChildStdout>>,
    /// Where it listens.
    pub(crate) addr: SocketAddr,
}

impl ServeProcess {
    /// Starts `te-bench serve --listen 127.0.0.1:0` with `args` besides, and reads where it listens from
    /// its first line.
    pub(crate) fn start(args: &[&str]) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("finding te-bench's own path")?;
        let mut child = Command::new(exe)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting te-bench serve")?;
        let mut stdout = BufReader::new(child.stdout.take().context("no stdout")?);
        let mut line = String::new();
        let read = stdout.read_line(&mut line);
        let mut server = Self {
            child,
            stdout: Some(stdout),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        read?;
        server.addr = line
            .split_whitespace()
            .skip_while(|w| *w != "on")
            .nth(1)
            .map(|a| a.trim_end_matches(','))
            .context("te-bench serve did not say where it listens")?
            .parse()
            .with_context(|| format!("reading the server's address from {line:?}"))?;
        Ok(server)
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

//! `te-bench serve` prints each log line once (it used to reprint its whole refusal log every 200 ms).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};

#[test]
fn each_refusal_is_printed_once() {
    let mut serve = Command::new(env!("CARGO_BIN_EXE_te-bench"))
        .args(["serve", "--listen", "127.0.0.1:0", "--seconds", "3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting te-bench serve");
    let mut out = BufReader::new(serve.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let addr = line
        .split_whitespace()
        .skip_while(|w| *w != "on")
        .nth(1)
        .unwrap()
        .trim_end_matches(',')
        .to_string();
    for _ in 0..5 {
        let mut s = TcpStream::connect(&addr).unwrap();
        // Not a handshake: a length prefix far beyond the limit.
        s.write_all(&[0xFF; 16]).unwrap();
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer);
    }
    let mut stderr = String::new();
    serve
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(serve.wait().unwrap().success());
    let refusals = stderr
        .lines()
        .filter(|l| l.contains("refused connection from"))
        .count();
    assert_eq!(refusals, 5, "{stderr}");
}

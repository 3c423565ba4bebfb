//! Two processes over TCP, as a decode and a prefill instance on two hosts would be: `serve` listens and
//! gives each client a KV region of the layout it asks for in the handshake; `push` asks for one, fills
//! its own KV with a pattern, pushes all of it there, and prints the outcome; the
//! server prints each session it received and whether the bytes match.
//!
//! ```text
//! cargo run -p backends --example tcp_push -- serve 127.0.0.1:7500
//! cargo run -p backends --example tcp_push -- push 127.0.0.1:7500
//! ```

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use backends::tcp::{TcpConfig, TcpNode};
use transfer_engine::{Dtype, KvLayout, MemoryRegion, TransferRequest};

/// 8 layers x 64 blocks x 64 KiB: 32 MiB.
fn layout() -> Result<KvLayout, transfer_engine::Error> {
    KvLayout::new(8, 64, 64 << 10, 16, Dtype::Bf16)
}

fn pattern(i: usize) -> u8 {
    (i % 253) as u8
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match (args.first().map(String::as_str), args.get(1)) {
        (Some("serve"), Some(addr)) => serve(addr.parse()?).await,
        (Some("push"), Some(addr)) => push(addr.parse()?).await,
        _ => Err("usage: tcp_push serve ADDR | tcp_push push ADDR".into()),
    }
}

async fn serve(listen: SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
    let node = TcpNode::start({
        let mut cfg = TcpConfig::with_engine_id(2);
        cfg.listen = Some(listen);
        cfg.serving.serve_bytes = 4 * layout()?.total_bytes();
        cfg
    })
    .await?;
    println!("serving on {}", node.local_addr().ok_or("no listener")?);
    loop {
        let incoming = node.next_incoming().await?;
        let received = node.wait_received(incoming.session).await?;
        let bytes = node.memory(incoming.region)?.to_vec()?;
        let intact = bytes.iter().enumerate().all(|(i, &b)| b == pattern(i));
        println!(
            "session {:#x} from engine {}: {} blocks delivered, {} to recompute, bytes intact: {intact}",
            incoming.session.0,
            incoming.peer.0,
            received.stats.blocks_delivered,
            received.recompute.len()
        );
    }
}

async fn push(server: SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
    let layout = layout()?;
    let node = TcpNode::start({
        let mut cfg = TcpConfig::with_engine_id(1);
        cfg.listen = None;
        cfg
    })
    .await?;
    let kv = (0..layout.total_bytes() as usize).map(pattern).collect();
    let src = node.register_kv_region(layout, MemoryRegion::from_vec(kv))?;
    let peer = node.connect(server, Some(layout)).await?;
    let dst = *peer
        .segment("served")
        .ok_or("the server served no region")?;
    let started = Instant::now();
    let req = TransferRequest::whole(peer.peer, &src, &dst)?;
    let out = node.transfer(req, Duration::from_secs(30)).await?;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "pushed {} MiB in {:.1} ms ({:.2} GB/s), {} blocks to recompute",
        layout.total_bytes() >> 20,
        secs * 1e3,
        layout.total_bytes() as f64 / secs / 1e9,
        out.recompute.len()
    );
    Ok(())
}

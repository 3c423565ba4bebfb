//! Throughput of the RDMA backend on one machine, beside the provider's own ceiling and the raw limit,
//! measured in the same run:
//!
//! ```text
//! cargo run --release -p benches --features rdma --example rdma_bench -- --provider tcp --domain lo
//! cargo run --release -p benches --features rdma --example rdma_bench -- --provider shm [--json]
//! ```
//!
//! For each block size (256 KiB, 4 MiB, 64 MiB) and mode (packetized, exclusive) it moves `--mib` MiB
//! between two nodes in this process (median of `--iterations`) and prints: GB/s; `provider_limit_gbps`,
//! a plain loop of `fi_writedata`s of the same unit size with the same window and no engine;
//! `limit_gbps`, memcpy for `shm` and a plain loopback socket copy for `tcp`; both ratios; recompute
//! blocks; and the CPU time the process spent per unit (both ends, all threads). Slices are sent one a
//! frame here (`coalesce_bytes` 0), so the per-unit cost is that of a frame.

#[cfg(not(feature = "rdma"))]
fn main() {
    eprintln!("rdma_bench needs the `rdma` feature: add --features rdma");
    std::process::exit(2);
}

#[cfg(feature = "rdma")]
fn main() {
    if let Err(e) = bench::main() {
        eprintln!("rdma_bench: {e}");
        std::process::exit(1);
    }
}

#[cfg(feature = "rdma")]
mod bench {
    use std::time::{Duration, Instant};

    use backends::rdma::{Provider, RdmaConfig, RdmaNode, provider_limit_gbps};
    use transfer_engine::{
        DEFAULT_SLICE_BYTES, Dtype, KvLayout, MemoryRegion, TransferMode, TransferRequest,
    };

    type Error = Box<dyn std::error::Error>;

    struct Args {
        provider: String,
        domain: Option<String>,
        mib: u64,
        iterations: usize,
        json: bool,
    }

    fn args() -> Result<Args, Error> {
        let mut a = Args {
            provider: "tcp".into(),
            domain: None,
            mib: 1024,
            iterations: 3,
            json: false,
        };
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            let mut value = || it.next().ok_or(format!("{flag} needs a value"));
            match flag.as_str() {
                "--provider" => a.provider = value()?,
                "--domain" => a.domain = Some(value()?),
                "--mib" => a.mib = value()?.parse()?,
                "--iterations" => a.iterations = value()?.parse()?,
                "--json" => a.json = true,
                other => return Err(format!("unknown argument {other}").into()),
            }
        }
        if a.provider == "tcp" && a.domain.is_none() {
            a.domain = Some("lo".into());
        }
        Ok(a)
    }

    /// CPU seconds this process has used (user + system, all threads).
    fn cpu_seconds() -> f64 {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map_or(vec![], |(_, r)| r.split_whitespace().collect());
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        // Fields 14 and 15 of the whole line (utime, stime) are 11 and 12 after the command name.
        (ticks(11) + ticks(12)) / 100.0
    }

    fn median(v: &mut [f64]) -> f64 {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    }

    fn memcpy_gbps(bytes: usize, block: usize, iterations: usize) -> f64 {
        let src = vec![7u8; bytes];
        let mut dst = vec![0u8; bytes];
        let mut secs = Vec::new();
        for i in 0..=iterations {
            let start = Instant::now();
            for (d, s) in dst.chunks_mut(block).zip(src.chunks(block)) {
                d.copy_from_slice(s);
            }
            std::hint::black_box(&mut dst);
            if i > 0 {
                secs.push(start.elapsed().as_secs_f64());
            }
        }
        bytes as f64 / median(&mut secs) / 1e9
    }

    struct Row {
        block: u64,
        mode: &'static str,
        gbps: f64,
        provider_limit: f64,
        limit: f64,
        recompute: usize,
        units: u64,
        cpu_us_per_unit: f64,
        retransmits: u64,
    }

    pub(super) fn main() -> Result<(), Error> {
        let a = args()?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let provider = Provider::Named(a.provider.clone());
        let config = |id| {
            let mut c = RdmaConfig::new(id, provider.clone());
            c.domain.clone_from(&a.domain);
            // One slice a frame: this measures the cost of each unit (te-bench measures the node's
            // default, coalesced frames).
            c.engine.coalesce_bytes = 0;
            c
        };
        let producer = RdmaNode::start(config(1))?;
        let consumer = RdmaNode::start(config(2))?;
        let total = a.mib << 20;
        let mut rows = Vec::new();
        for block in [256u64 << 10, 4 << 20, 64 << 20] {
            let layers = 8u32;
            let blocks = u32::try_from((total / (block * u64::from(layers))).max(1))?;
            let layout = KvLayout::new(layers, blocks, block, 16, Dtype::Bf16)?;
            let bytes = usize::try_from(layout.total_bytes())?;
            let src =
                producer.register_kv_region(layout, MemoryRegion::from_vec(vec![5; bytes]))?;
            let dst = consumer.kv_region(layout)?;
            consumer.publish_segment("kv", dst)?;
            let peer = rt.block_on(producer.connect(consumer.address()))?;
            let dst = *peer.segment("kv").ok_or("no segment")?;
            let limit = if a.provider == "shm" {
                memcpy_gbps(bytes, block as usize, a.iterations)
            } else {
                rt.block_on(benches::socket_copy_gbps(total, 4 << 20, 1))?
            };
            for (mode, unit) in [
                (TransferMode::packetized(), u64::from(DEFAULT_SLICE_BYTES)),
                (TransferMode::Exclusive, block),
            ] {
                let cfg = config(1);
                eprintln!("block {} KiB {}: provider limit", block >> 10, mode.name());
                let provider_limit = provider_limit_gbps(
                    &provider,
                    a.domain.as_deref(),
                    usize::try_from(unit)?,
                    cfg.window_units
                        .min(usize::try_from(cfg.window_bytes / unit)?.max(1)),
                    total,
                    cfg.delivery_complete,
                )?;
                eprintln!("  {provider_limit:.2} GB/s; transfers");
                let mut secs = Vec::new();
                let mut recompute = 0;
                let before = producer.stats().engine.retransmits;
                let cpu0 = cpu_seconds();
                for i in 0..=a.iterations {
                    let req = TransferRequest::whole(peer.peer, &src, &dst)?
                        .with_mode(mode)
                        .with_deadline(Duration::from_secs(120));
                    let start = Instant::now();
                    let out = rt.block_on(producer.transfer(req, Duration::from_secs(300)))?;
                    let took = start.elapsed().as_secs_f64();
                    rt.block_on(consumer.wait_received(out.session))?;
                    recompute += out.recompute.len();
                    if i > 0 {
                        secs.push(took);
                    }
                }
                let cpu = cpu_seconds() - cpu0;
                let units = total.div_ceil(unit) * (a.iterations as u64 + 1);
                rows.push(Row {
                    block,
                    mode: mode.name(),
                    gbps: bytes as f64 / median(&mut secs) / 1e9,
                    provider_limit,
                    limit,
                    recompute,
                    units,
                    cpu_us_per_unit: cpu * 1e6 / units as f64,
                    retransmits: producer.stats().engine.retransmits - before,
                });
            }
            let settle = Instant::now();
            while (producer.live_sessions() > 0 || consumer.live_sessions() > 0)
                && settle.elapsed() < Duration::from_secs(10)
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            producer.unregister_region(src.id)?;
            consumer.unregister_region(dst.id)?;
        }
        // What the two idle nodes cost: both drivers block on their queues.
        let idle0 = cpu_seconds();
        std::thread::sleep(Duration::from_secs(2));
        let idle_cpu = (cpu_seconds() - idle0) / 2.0;
        let name = producer.provider().provider.clone();
        if !a.json {
            println!(
                "provider {name} (domain {}), {} MiB a run, median of {}",
                producer.provider().domain,
                a.mib,
                a.iterations
            );
            println!(
                "{:>8} {:>11} {:>7} {:>10} {:>8} {:>7} {:>7} {:>9} {:>11} {:>8}",
                "block",
                "mode",
                "gbps",
                "prov_lim",
                "prov_r",
                "limit",
                "ratio",
                "recomp",
                "cpu_us/unit",
                "retrans"
            );
        }
        if a.json {
            println!(
                "{{\"backend\":\"rdma\",\"provider\":\"{name}\",\"idle_cpu_share\":{idle_cpu:.4}}}"
            );
        } else {
            println!("two idle nodes: {:.2}% of a core", idle_cpu * 100.0);
        }
        for r in &rows {
            if a.json {
                println!(
                    "{{\"backend\":\"rdma\",\"provider\":\"{name}\",\"block_bytes\":{},\"mode\":\"{}\",\"gbps\":{:.3},\"provider_limit_gbps\":{:.3},\"provider_ratio\":{:.3},\"limit_gbps\":{:.3},\"ratio\":{:.3},\"recompute_blocks\":{},\"units\":{},\"cpu_us_per_unit\":{:.2},\"retransmits\":{}}}",
                    r.block,
                    r.mode,
                    r.gbps,
                    r.provider_limit,
                    r.gbps / r.provider_limit,
                    r.limit,
                    r.gbps / r.limit,
                    r.recompute,
                    r.units,
                    r.cpu_us_per_unit,
                    r.retransmits
                );
            } else {
                println!(
                    "{:>7}K {:>11} {:>7.2} {:>10.2} {:>8.2} {:>7.2} {:>7.2} {:>9} {:>11.1} {:>8}",
                    r.block >> 10,
                    r.mode,
                    r.gbps,
                    r.provider_limit,
                    r.gbps / r.provider_limit,
                    r.limit,
                    r.gbps / r.limit,
                    r.recompute,
                    r.cpu_us_per_unit,
                    r.retransmits
                );
            }
        }
        Ok(())
    }
}

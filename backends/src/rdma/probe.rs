//! Provider probes, outside the engine and its nodes: the provider's own ceiling for a window of RMA writes
//! (what `te-bench` sets an RDMA figure beside) and whether it refuses writes with a wrong key or outside a
//! region (what the tests check before trusting a provider's bounds). They live here, not in the bench,
//! because they drive the FFI endpoint directly.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use transfer_engine::MemoryRegion;

use super::ffi::{Completion, Endpoint, guarded_region};
use super::provider::{Provider, resolve};
use super::wait::Waiter;
use crate::TransportError;

fn pair(provider: &Provider, domain: Option<&str>) -> Result<(Endpoint, Endpoint), TransportError> {
    let (name, domain) = resolve(provider, domain, false)?;
    let a = Endpoint::open(&name, domain.as_deref(), 16, 16, 4096, false)?;
    let b = Endpoint::open(&name, domain.as_deref(), 16, 16, 4096, false)?;
    Ok((a, b))
}

/// GB/s of a plain loop of `fi_writedata`s of `unit_bytes` each, `window` in flight, moving `total_bytes`
/// from one endpoint's registered memory into another's (both in this process; the target is progressed
/// by its own thread, as a node's driver would). The provider's ceiling for the engine's data path.
pub fn provider_limit_gbps(
    provider: &Provider,
    domain: Option<&str>,
    unit_bytes: usize,
    window: usize,
    total_bytes: u64,
    delivery_complete: bool,
) -> Result<f64, TransportError> {
    let (mut a, mut b) = pair(provider, domain)?;
    let span = unit_bytes.max(1) * window.max(1);
    let src = MemoryRegion::from_vec((0..span).map(|i| i as u8).collect());
    let dst = MemoryRegion::zeroed(span);
    let (src_mr, _) = a.register(&src)?;
    let (dst_mr, key) = b.register(&dst)?;
    let base = b.remote_base(dst_mr)?;
    let dest = a.insert(&b.name()?)?;
    let units = total_bytes.div_ceil(unit_bytes as u64);
    let landed = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let target = {
        let (landed, stop) = (landed.clone(), stop.clone());
        std::thread::spawn(move || -> Result<Endpoint, TransportError> {
            let mut done = Vec::new();
            let mut waiter = Waiter::default();
            while !stop.load(Ordering::Relaxed) {
                done.clear();
                waiter.wait(&mut b, true, Duration::ZERO, &mut done)?;
                let n = done
                    .iter()
                    .filter(|c| matches!(c, Completion::RemoteWrite { .. }))
                    .count();
                landed.fetch_add(n as u64, Ordering::Relaxed);
            }
            Ok(b)
        })
    };
    let start = Instant::now();
    let (mut posted, mut in_flight) = (0u64, 0usize);
    let mut done = Vec::new();
    let limit = Duration::from_secs(60);
    let mut failure = None;
    while landed.load(Ordering::Relaxed) < units {
        while posted < units && in_flight < window {
            let slot = (posted % window as u64) as usize * unit_bytes;
            if !a.write(
                dest,
                src_mr,
                slot,
                unit_bytes,
                base + slot as u64,
                key,
                Some(posted),
                posted,
                delivery_complete,
            )? {
                break;
            }
            posted += 1;
            in_flight += 1;
        }
        done.clear();
        a.poll(&mut done)?;
        for c in &done {
            if let Completion::Written { error, .. } = c {
                in_flight -= 1;
                if let Some(e) = error {
                    failure = Some(e.clone());
                }
            }
        }
        if failure.is_some() || start.elapsed() > limit {
            break;
        }
    }
    let elapsed = start.elapsed();
    // Drain our completions while the target still runs, and close our endpoint before the target's:
    // a provider may still progress a connection to the target while we poll.
    while in_flight > 0 && start.elapsed() < limit {
        done.clear();
        a.poll(&mut done)?;
        in_flight -= done
            .iter()
            .filter(|c| matches!(c, Completion::Written { .. }))
            .count();
    }
    drop(a);
    stop.store(true, Ordering::Relaxed);
    let target_result = target.join();
    if let Some(e) = failure {
        return Err(super::own(format!("a write failed: {e}")));
    }
    match target_result {
        Ok(r) => drop(r?),
        Err(_) => {
            return Err(super::own("the target thread panicked"));
        }
    }
    if landed.load(Ordering::Relaxed) < units {
        return Err(TransportError::Timeout {
            what: "the provider limit run".into(),
            waited: limit,
        });
    }
    Ok(units as f64 * unit_bytes as f64 / elapsed.as_secs_f64() / 1e9)
}

/// How a provider answered one write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteAnswer {
    /// The write completed without error at the sender.
    Completed,
    /// The sender got an error: refused at posting or completed with an error.
    Refused(String),
    /// No completion within the probe's wait (the target dropped the write without telling the sender).
    NoCompletion,
}

/// What a provider did with writes it must refuse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeReport {
    /// The provider and domain probed.
    pub provider: String,
    /// A valid write completed and its bytes read back.
    pub valid_write_landed: bool,
    /// The sender's answer for a write with a wrong key.
    pub wrong_key: WriteAnswer,
    /// The sender's answer for a write that runs past the region's end.
    pub out_of_region: WriteAnswer,
    /// Errors the target's queue reported meanwhile.
    pub target_errors: Vec<String>,
    /// The region and the guard bytes around it hold only what the valid write put there.
    pub nothing_else_written: bool,
}

/// Writes into a peer's registered region once correctly, once with a wrong key and once past its end
/// (each refused write on a fresh pair of endpoints, as a provider may drop the connection after one), and
/// reports how the provider answered each and whether any byte outside the valid write changed.
pub fn probe_refusals(
    provider: &Provider,
    domain: Option<&str>,
) -> Result<ProbeReport, TransportError> {
    const LEN: usize = 4096;
    let (whole, region) = guarded_region(LEN);
    let src = MemoryRegion::from_vec(vec![0xAB; 2 * LEN]);
    let mut answers = Vec::new();
    let mut target_errors = Vec::new();
    let mut name = String::new();
    for case in 0..3 {
        let (mut a, mut b) = pair(provider, domain)?;
        name.clone_from(&a.info().provider);
        let (src_mr, _) = a.register(&src)?;
        let (dst_mr, key) = b.register(&region)?;
        let base = b.remote_base(dst_mr)?;
        let dest = a.insert(&b.name()?)?;
        let (offset, len, k) = match case {
            0 => (0u64, 256usize, key),
            1 => (256, 256, key ^ 0x5A5A_0000_DEAD_0000),
            _ => (LEN as u64 - 128, 1024, key),
        };
        let mut collect = |b: &mut Endpoint| -> Result<(), TransportError> {
            let mut done = Vec::new();
            b.poll(&mut done)?;
            for c in done {
                if let Completion::Received { error: Some(e), .. }
                | Completion::Sent { error: Some(e) } = c
                {
                    target_errors.push(e);
                }
            }
            Ok(())
        };
        // The first operation to a peer may ask to try again while the provider connects.
        let start = Instant::now();
        let posted = loop {
            match a.write(dest, src_mr, 0, len, base + offset, k, Some(0), 0, true) {
                Ok(false) if start.elapsed() < Duration::from_secs(2) => {
                    a.poll(&mut Vec::new())?;
                    collect(&mut b)?;
                }
                other => break other,
            }
        };
        let answer = match posted {
            Err(e) => WriteAnswer::Refused(e.to_string()),
            Ok(false) => WriteAnswer::Refused("the provider kept asking to try again".into()),
            Ok(true) => {
                let start = Instant::now();
                let mut answer = WriteAnswer::NoCompletion;
                let mut done = Vec::new();
                while answer == WriteAnswer::NoCompletion
                    && start.elapsed() < Duration::from_secs(2)
                {
                    done.clear();
                    a.poll(&mut done)?;
                    collect(&mut b)?;
                    for c in &done {
                        if let Completion::Written { error, .. } = c {
                            answer = error
                                .clone()
                                .map_or(WriteAnswer::Completed, WriteAnswer::Refused);
                        }
                    }
                }
                answer
            }
        };
        // Let the target progress any late arrival before looking at the bytes.
        let settle = Instant::now();
        while settle.elapsed() < Duration::from_millis(50) {
            collect(&mut b)?;
            a.poll(&mut Vec::new())?;
        }
        answers.push(answer);
    }
    let bytes = whole.to_vec()?;
    let nothing_else_written = bytes.iter().enumerate().all(|(i, &v)| {
        let valid = (LEN..LEN + 256).contains(&i);
        v == if valid { 0xAB } else { 0 }
    });
    Ok(ProbeReport {
        provider: name,
        valid_write_landed: answers[0] == WriteAnswer::Completed
            && bytes[LEN..LEN + 256].iter().all(|&v| v == 0xAB),
        wrong_key: answers[1].clone(),
        out_of_region: answers[2].clone(),
        target_errors,
        nothing_else_written,
    })
}

//! TCP sends (loopback) of one region in units: straight from plain host memory, beside the same units
//! staged through two alternating buffers (copied and checksummed in one pass, as the TCP writer's staging
//! would), and, with a GPU, staged from GPU memory through the `cuda` stager's pinned buffers. Each run's
//! receiver compares every byte it gets with the source.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::Instant;

use anyhow::ensure;
use serde::Serialize;
use transfer_engine::MemoryRegion;

use super::{GpuArgs, fill_pattern};
use crate::report::{print_rows, quantile};

/// Sends one region's units into a socket.
type Sender<'a> = Box<dyn FnMut(&mut TcpStream) -> anyhow::Result<()> + 'a>;

const COLUMNS: &[&str] = &[
    "source",
    "unit_bytes",
    "gb_s",
    "ratio_to_plain",
    "verified_bytes",
];

/// One source and unit size.
#[derive(Debug, Serialize)]
struct Row {
    source: &'static str,
    unit_bytes: u64,
    bytes: u64,
    gb_s: f64,
    /// Throughput over the plain host-memory send of the same unit size in the same run.
    ratio_to_plain: f64,
    /// Bytes the receiver checksummed and found equal to the source.
    verified_bytes: u64,
}

/// Sends through `send(stream)` to a receiver on a loopback socket that compares every byte it gets with
/// `src`; returns the seconds from the first byte to the receiver's last, and the bytes it found equal.
fn one_run(
    src: &MemoryRegion,
    send: &mut dyn FnMut(&mut TcpStream) -> anyhow::Result<()>,
) -> anyhow::Result<(f64, u64)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let expected = src.clone();
    let receiver = thread::spawn(move || -> anyhow::Result<u64> {
        let (mut s, _) = listener.accept()?;
        let mut buf = vec![0u8; 4 << 20];
        let mut at = 0usize;
        loop {
            let n = s.read(&mut buf)?;
            if n == 0 {
                return Ok(at as u64);
            }
            ensure!(at + n <= expected.len(), "more bytes than were sent");
            ensure!(
                buf[..n] == expected.read(at..at + n)?[..],
                "bytes differ near {at}"
            );
            at += n;
        }
    });
    let mut stream = TcpStream::connect(addr)?;
    stream.set_nodelay(true)?;
    let start = Instant::now();
    let sent = send(&mut stream);
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let got = receiver
        .join()
        .map_err(|_| anyhow::anyhow!("the receiver panicked"))??;
    sent?;
    Ok((start.elapsed().as_secs_f64(), got))
}

/// Plain host memory: each unit written straight from the region (checksummed first, as sealing a frame
/// does).
fn send_plain(src: &MemoryRegion, unit: usize, s: &mut TcpStream) -> anyhow::Result<()> {
    for at in (0..src.len()).step_by(unit) {
        let view = src.read(at..(at + unit).min(src.len()))?;
        std::hint::black_box(transfer_engine::crc32c(&view));
        s.write_all(&view)?;
    }
    Ok(())
}

/// Staged through two alternating host buffers: each unit copied and checksummed in one pass, then sent.
fn send_staged(src: &MemoryRegion, unit: usize, s: &mut TcpStream) -> anyhow::Result<()> {
    let mut buffers = [vec![0u8; unit], vec![0u8; unit]];
    for (i, at) in (0..src.len()).step_by(unit).enumerate() {
        let view = src.read(at..(at + unit).min(src.len()))?;
        let buffer = &mut buffers[i % 2][..view.len()];
        std::hint::black_box(transfer_engine::copy_and_crc32c(buffer, &view));
        drop(view);
        s.write_all(buffer)?;
    }
    Ok(())
}

/// Runs the TCP staging comparison.
pub(super) fn main(args: &GpuArgs) -> anyhow::Result<()> {
    let len = usize::try_from(args.bytes)?;
    let src = MemoryRegion::zeroed(len);
    fill_pattern(&src)?;
    let gpu_source = gpu_source(args, &src)?;
    let mut rows = Vec::new();
    for &unit in &args.blocks {
        let u = usize::try_from(unit)?;
        let mut plain_gb_s = 0.0;
        let mut sources: Vec<(&'static str, Sender<'_>)> = vec![
            (
                "host memory, plain",
                Box::new(|s: &mut TcpStream| send_plain(&src, u, s)),
            ),
            (
                "host memory, staged through 2 host buffers",
                Box::new(|s: &mut TcpStream| send_staged(&src, u, s)),
            ),
        ];
        if let Some(stage) = gpu_source.as_ref() {
            sources.push((
                "GPU memory, staged through 2 pinned buffers",
                stage.sender(u)?,
            ));
        }
        for (source, mut send) in sources {
            let (mut seconds, mut verified) = (Vec::new(), 0u64);
            for _ in 0..args.repeats {
                let (s, got) = one_run(&src, &mut *send)?;
                ensure!(
                    got == len as u64,
                    "{source}: the receiver got {got} of {len} bytes"
                );
                seconds.push(s);
                verified += got;
            }
            let gb_s = len as f64 / quantile(&mut seconds, 0.5) / 1e9;
            if source == "host memory, plain" {
                plain_gb_s = gb_s;
            }
            rows.push(Row {
                source,
                unit_bytes: unit,
                bytes: len as u64,
                gb_s,
                ratio_to_plain: gb_s / plain_gb_s,
                verified_bytes: verified,
            });
        }
    }
    print_rows(&rows, args.json, COLUMNS)?;
    if gpu_source.is_none() {
        let line = "not run: GPU memory staged through pinned buffers: no CUDA driver (pinned memory comes from \
                    cuMemHostAlloc); the staged row above uses ordinary host buffers";
        if args.json {
            println!("{}", serde_json::json!({ "not_run": line }));
        } else {
            println!("{line}");
        }
    }
    Ok(())
}

#[cfg(feature = "cuda")]
use gpu_stage::gpu_source;

#[cfg(feature = "cuda")]
mod gpu_stage {
    use std::io::Write;
    use std::net::TcpStream;

    use backends::cuda::{CopyEngine, DeviceMemory, Gpu, driver_present};
    use backends::staging::Stager;
    use transfer_engine::MemoryRegion;

    use super::GpuArgs;

    /// The pattern in GPU memory, for the pinned staging row.
    pub(super) struct GpuSource {
        gpu: Gpu,
        region: MemoryRegion,
    }

    /// The GPU copy of `src`, or `None` without a driver.
    pub(super) fn gpu_source(
        args: &GpuArgs,
        src: &MemoryRegion,
    ) -> anyhow::Result<Option<GpuSource>> {
        if !driver_present() {
            return Ok(None);
        }
        let gpu = Gpu::open(args.device)?;
        let region = DeviceMemory::alloc(&gpu, src.len())?.into_region();
        CopyEngine::new(&gpu, 4 << 20)?.copy(src, 0..src.len(), &region, 0, |_| {})?;
        Ok(Some(GpuSource { gpu, region }))
    }

    impl GpuSource {
        /// Sends the GPU bytes unit by unit, the next unit's device copy in flight while one is sent.
        pub(super) fn sender(&self, unit: usize) -> anyhow::Result<super::Sender<'_>> {
            let mut stager = Stager::pinned(&self.gpu, unit)?;
            let len = self.region.len();
            Ok(Box::new(move |s: &mut TcpStream| {
                let units: Vec<_> = (0..len)
                    .step_by(unit)
                    .map(|a| a..(a + unit).min(len))
                    .collect();
                stager.prefetch(&self.region, units[0].clone())?;
                for i in 0..units.len() {
                    if let Some(next) = units.get(i + 1) {
                        stager.prefetch(&self.region, next.clone())?;
                    }
                    let staged = stager.take()?;
                    s.write_all(staged.bytes())?;
                }
                Ok(())
            }))
        }
    }
}

#[cfg(not(feature = "cuda"))]
use no_gpu::gpu_source;

#[cfg(not(feature = "cuda"))]
mod no_gpu {
    use transfer_engine::MemoryRegion;

    use super::GpuArgs;

    /// Never made: this build has no GPU support.
    pub(super) enum GpuSource {}

    pub(super) fn gpu_source(_: &GpuArgs, _: &MemoryRegion) -> anyhow::Result<Option<GpuSource>> {
        Ok(None)
    }

    impl GpuSource {
        pub(super) fn sender(&self, _: usize) -> anyhow::Result<super::Sender<'_>> {
            match *self {}
        }
    }
}

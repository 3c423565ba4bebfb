//! The stager's ordering and checksums over host memory: `LoggingSlot` stands in for a pinned buffer and
//! copies at once where the GPU would copy later, and records what it was asked in which order. The
//! GPU itself is exercised by the `#[ignore]`d tests in `tests/cuda.rs`, on a machine with a GPU.
use super::*;
use std::sync::{Arc, Mutex};

struct LoggingSlot {
    id: usize,
    bytes: Vec<u8>,
    log: Arc<Mutex<Vec<String>>>,
}

impl StageSlot for LoggingSlot {
    fn capacity(&self) -> usize {
        self.bytes.len()
    }
    fn fetch(&mut self, src: &MemoryRegion, range: Range<usize>) -> Result<(), StagingError> {
        self.log
            .lock()
            .unwrap()
            .push(format!("fetch {} {range:?}", self.id));
        let len = range.len();
        self.bytes[..len].copy_from_slice(&src.read(range)?);
        Ok(())
    }
    fn push(&mut self, dst: &MemoryRegion, offset: usize, len: usize) -> Result<(), StagingError> {
        self.log
            .lock()
            .unwrap()
            .push(format!("push {} {offset}", self.id));
        dst.copy_from(offset, &self.bytes[..len])?;
        Ok(())
    }
    fn bytes(&mut self) -> Result<&[u8], StagingError> {
        Ok(&self.bytes)
    }
    fn bytes_mut(&mut self) -> Result<&mut [u8], StagingError> {
        Ok(&mut self.bytes)
    }
    fn settle(&mut self) -> Result<(), StagingError> {
        self.log.lock().unwrap().push(format!("settle {}", self.id));
        Ok(())
    }
    fn busy(&mut self) -> Result<bool, StagingError> {
        Ok(false)
    }
}

fn stager(unit: usize) -> (Stager<LoggingSlot>, Arc<Mutex<Vec<String>>>) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let slot = |id| LoggingSlot {
        id,
        bytes: vec![0; unit],
        log: Arc::clone(&log),
    };
    (Stager::with_slots([slot(0), slot(1)]), log)
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 + i / 251) as u8).collect()
}

#[test]
fn sending_prefetches_the_next_unit_into_the_other_buffer_before_the_current_one_is_sent() {
    let (mut stager, log) = stager(1000);
    let data = pattern(3500);
    let src = MemoryRegion::from_vec(data.clone());
    let units: Vec<Range<usize>> = (0..4)
        .map(|i| i * 1000..(i * 1000 + 1000).min(3500))
        .collect();
    let mut sent = Vec::new();
    stager.prefetch(&src, units[0].clone()).unwrap();
    for i in 0..units.len() {
        if let Some(next) = units.get(i + 1) {
            stager.prefetch(&src, next.clone()).unwrap();
        }
        let unit = stager.take().unwrap();
        assert_eq!(
            unit.crc32c(),
            transfer_engine::crc32c(&data[units[i].clone()])
        );
        sent.extend_from_slice(unit.bytes());
        log.lock().unwrap().push(format!("send {i}"));
    }
    assert_eq!(sent, data);
    let log = log.lock().unwrap().join(", ");
    assert!(
        log.starts_with("fetch 0 0..1000, fetch 1 1000..2000, send 0, fetch 0 2000..3000, send 1"),
        "{log}"
    );
}

#[test]
fn receiving_alternates_buffers_and_checksums_what_arrived() {
    let (mut stager, log) = stager(1000);
    let data = pattern(2500);
    let dst = MemoryRegion::zeroed(2500);
    for (i, chunk) in data.chunks(1000).enumerate() {
        let mut landing = stager.receive().unwrap();
        landing.buffer().unwrap()[..chunk.len()].copy_from_slice(chunk);
        let crc = landing.place(&dst, i * 1000, chunk.len()).unwrap();
        assert_eq!(crc, transfer_engine::crc32c(chunk));
    }
    stager.flush().unwrap();
    assert_eq!(dst.to_vec().unwrap(), data);
    let log = log.lock().unwrap().join(", ");
    assert!(
        log.starts_with("settle 0, push 0 0, settle 1, push 1 1000, settle 0, push 0 2000"),
        "{log}"
    );
}

#[test]
fn misuse_is_refused_with_a_clear_error_and_loses_nothing() {
    let (mut stager, _) = stager(100);
    let src = MemoryRegion::from_vec(pattern(1000));
    assert!(matches!(stager.take(), Err(StagingError::Invalid(_))));
    assert!(
        !stager.ready().unwrap(),
        "nothing prefetched, nothing to take"
    );
    let too_big = stager.prefetch(&src, 0..101).unwrap_err();
    assert!(too_big.to_string().contains("does not fit"), "{too_big}");
    stager.prefetch(&src, 0..100).unwrap();
    stager.prefetch(&src, 100..200).unwrap();
    assert!(
        stager.prefetch(&src, 200..300).is_err(),
        "both buffers are taken"
    );
    assert!(stager.ready().unwrap());
    assert!(
        stager.receive().is_err(),
        "the receive buffer holds a unit not yet sent"
    );
    assert_eq!(stager.take().unwrap().bytes(), &pattern(1000)[..100]);
    assert_eq!(stager.take().unwrap().bytes(), &pattern(1000)[100..200]);
    let mut landing = stager.receive().unwrap();
    assert!(landing.crc32c(101).is_err());
    let dst = MemoryRegion::zeroed(10);
    assert!(landing.push(&dst, 0, 101).is_err());
}

#[test]
fn host_buffers_stage_units_with_the_checksum_taken_while_copying() {
    let data = pattern(5000);
    let src = MemoryRegion::from_vec(data.clone());
    let mut stager = Stager::with_slots([HostSlot::new(2048), HostSlot::new(2048)]);
    stager.prefetch(&src, 0..2048).unwrap();
    stager.prefetch(&src, 2048..4096).unwrap();
    for range in [0..2048, 2048..4096] {
        let unit = stager.take().unwrap();
        assert_eq!(unit.bytes(), &data[range.clone()]);
        assert_eq!(unit.crc32c(), transfer_engine::crc32c(&data[range]));
    }
    // Receiving overwrites the buffer: the CRC of the last fetch no longer stands for its bytes.
    let dst = MemoryRegion::zeroed(5000);
    let mut landing = stager.receive().unwrap();
    landing.buffer().unwrap()[..904].copy_from_slice(&data[4096..]);
    assert_eq!(
        landing.place(&dst, 4096, 904).unwrap(),
        transfer_engine::crc32c(&data[4096..])
    );
    stager.prefetch(&src, 4096..5000).unwrap();
    assert_eq!(
        stager.take().unwrap().crc32c(),
        transfer_engine::crc32c(&data[4096..])
    );
    assert_eq!(&dst.to_vec().unwrap()[4096..], &data[4096..]);
}

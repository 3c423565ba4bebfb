//! CRC-32C (Castagnoli), hardware accelerated where the CPU allows.

/// Chunk of a copy that is checksummed while it is still in the nearest cache.
const COPY_CHUNK: usize = 32 << 10;

/// CRC-32C of `bytes`.
#[must_use]
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(bytes)
}

/// CRC-32C of `a ++ b` from the CRC-32C of `a` and that of `b` (`b_len` bytes long): the checksum of a
/// whole from the checksums of its pieces, without reading the bytes again.
#[must_use]
pub fn crc32c_combine(a: u32, b: u32, b_len: usize) -> u32 {
    let algorithm = crc_fast::CrcAlgorithm::Crc32Iscsi;
    crc_fast::checksum_combine(algorithm, u64::from(a), u64::from(b), b_len as u64) as u32
}

/// Copies `src` into `dst` (same length) and returns the CRC-32C of the bytes now in `dst`, reading each
/// chunk back while it is still in cache: one pass over memory instead of two.
///
/// # Panics
/// If the lengths differ.
pub fn copy_and_crc32c(dst: &mut [u8], src: &[u8]) -> u32 {
    assert_eq!(dst.len(), src.len(), "copy_and_crc32c needs equal lengths");
    let mut digest = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    for (d, s) in dst.chunks_mut(COPY_CHUNK).zip(src.chunks(COPY_CHUNK)) {
        d.copy_from_slice(s);
        digest.update(d);
    }
    digest.finalize() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_answer_and_chunked_copy_agree() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        let src: Vec<u8> = (0..200_000u32).map(|i| (i * 7 + i / 300) as u8).collect();
        let mut dst = vec![0; src.len()];
        assert_eq!(copy_and_crc32c(&mut dst, &src), crc32c(&src));
        assert_eq!(dst, src);
        let (a, b) = src.split_at(77_777);
        assert_eq!(crc32c_combine(crc32c(a), crc32c(b), b.len()), crc32c(&src));
        assert_eq!(crc32c_combine(crc32c(&[]), crc32c(a), a.len()), crc32c(a));
    }
}

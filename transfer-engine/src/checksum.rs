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
///
/// Shifts `a` past `b_len` zero bytes by one multiplication modulo the polynomial (by `x^(8 b_len)`, made
/// from a table of `x^(2^k)`), then adds `b`: well under a microsecond. `crc_fast::checksum_combine` was
/// used before and took 30-90 µs a call (a 64-bit matrix method), which capped every path that combines
/// a CRC per block (2.3 GB/s for the GPU copy engine at 256 KiB blocks on an H200 host); no maintained
/// crate offered a fast one for CRC-32C.
#[must_use]
pub fn crc32c_combine(a: u32, b: u32, b_len: usize) -> u32 {
    multiply(x_pow_8n(b_len as u64), a) ^ b
}

/// The CRC-32C polynomial, bit-reversed: bit 31 holds `x^0`, bit 0 holds `x^31`.
const POLY: u32 = 0x82F6_3B78;
/// `x^0`, the polynomial 1, in that bit order.
const ONE: u32 = 1 << 31;

/// `a * b` modulo the polynomial.
const fn multiply(a: u32, mut b: u32) -> u32 {
    let mut product = 0;
    let mut bit = ONE;
    while bit != 0 {
        if a & bit != 0 {
            product ^= b;
        }
        // b * x: a shift toward the high powers, reduced by the polynomial when x^31 falls off.
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
        bit >>= 1;
    }
    product
}

/// `X_POW_2K[k]` is `x^(2^k)` modulo the polynomial, for every `k` that `x^(8 n)` of a 64-bit `n` needs.
const X_POW_2K: [u32; 67] = {
    let mut table = [0; 67];
    table[0] = ONE >> 1; // x^1
    let mut k = 1;
    while k < 67 {
        table[k] = multiply(table[k - 1], table[k - 1]);
        k += 1;
    }
    table
};

/// `x^(8 n)` modulo the polynomial: the factor that moves a CRC past `n` zero bytes.
fn x_pow_8n(mut n: u64) -> u32 {
    let mut result = ONE;
    let mut k = 3; // 8 n = n * 2^3
    while n != 0 {
        if n & 1 != 0 {
            result = multiply(X_POW_2K[k], result);
        }
        n >>= 1;
        k += 1;
    }
    result
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

    #[test]
    fn combine_agrees_with_the_crc_of_the_whole_at_every_kind_of_length() {
        let src: Vec<u8> = (0..70_000u32).map(|i| (i * 31 + i / 251) as u8).collect();
        let cuts = [
            0, 1, 2, 3, 7, 8, 9, 255, 256, 4095, 4096, 4097, 65_535, 65_536, 69_999, 70_000,
        ];
        for &cut in &cuts {
            let (a, b) = src.split_at(cut);
            assert_eq!(
                crc32c_combine(crc32c(a), crc32c(b), b.len()),
                crc32c(&src),
                "cut at {cut}"
            );
        }
        // Lengths too large to checksum here: the old combine (crc_fast's) as the reference.
        for len in [1usize << 20, (1 << 30) + 12_345, 1 << 40, usize::MAX] {
            let want = crc_fast::checksum_combine(
                crc_fast::CrcAlgorithm::Crc32Iscsi,
                0xDEAD_BEEF,
                0x0BAD_F00D,
                len as u64,
            ) as u32;
            assert_eq!(
                crc32c_combine(0xDEAD_BEEF, 0x0BAD_F00D, len),
                want,
                "length {len}"
            );
        }
    }
}

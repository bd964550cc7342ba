//! Host copies of the staging pipeline: ordinary (`memcpy`) or with streaming stores.
//!
//! Streaming (non-temporal) stores write whole cache lines to memory without first reading
//! them into the cache, and leave nothing behind in the copying core's cache. To the device,
//! that means the copy engine reads a slot from memory instead of snooping the lines out of
//! the private caches of the threads that just filled it; to the host, the destination's
//! lines are not read before they are overwritten. Only x86_64 has them here (SSE2, part of
//! its baseline); elsewhere a streaming copy is an ordinary one.

/// Copies `len` bytes from `src` to `dst`, with streaming stores if `streaming` (and the
/// target has them). Every byte is visible to other threads and devices once the caller
/// publishes the copy with a release store (streaming stores are fenced before return).
///
/// # Safety
///
/// As for [`std::ptr::copy_nonoverlapping`]: `src` readable and `dst` writable for `len`
/// bytes, the two ranges disjoint.
pub(crate) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize, streaming: bool) {
    #[cfg(target_arch = "x86_64")]
    if streaming && len >= STREAMING_MIN {
        // SAFETY: the caller's contract is the one `streaming_copy` asks for.
        unsafe { streaming_copy(dst, src, len) };
        return;
    }
    let _ = streaming;
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

/// Below this, a streaming copy is not worth its fence.
#[cfg(target_arch = "x86_64")]
const STREAMING_MIN: usize = 4096;

/// The streaming copy: ordinary stores up to the first 16-byte boundary of `dst`, streaming
/// stores of 64 then 16 bytes, ordinary stores for the tail, then a store fence.
///
/// # Safety
///
/// As for [`copy`].
#[cfg(target_arch = "x86_64")]
unsafe fn streaming_copy(dst: *mut u8, src: *const u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    // `align_offset` may answer "can't" (usize::MAX): then everything goes the ordinary way.
    let head = dst.align_offset(16).min(len);
    // SAFETY: `head <= len`: inside both ranges (the caller's contract).
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    let mut at = head;
    while at + 64 <= len {
        // SAFETY: `at + 64 <= len`: the 64 bytes at `at` lie inside both ranges; `dst + at`
        // is 16-byte aligned (`head` made it so and `at` moves in multiples of 16), as
        // `_mm_stream_si128` requires; the loads are unaligned loads. SSE2 is part of the
        // x86_64 baseline.
        unsafe {
            let s = src.add(at).cast::<__m128i>();
            let d = dst.add(at).cast::<__m128i>();
            let a = _mm_loadu_si128(s);
            let b = _mm_loadu_si128(s.add(1));
            let c = _mm_loadu_si128(s.add(2));
            let e = _mm_loadu_si128(s.add(3));
            _mm_stream_si128(d, a);
            _mm_stream_si128(d.add(1), b);
            _mm_stream_si128(d.add(2), c);
            _mm_stream_si128(d.add(3), e);
        }
        at += 64;
    }
    while at + 16 <= len {
        // SAFETY: as above, for the 16 bytes at `at`.
        unsafe {
            let v = _mm_loadu_si128(src.add(at).cast::<__m128i>());
            _mm_stream_si128(dst.add(at).cast::<__m128i>(), v);
        }
        at += 16;
    }
    // SAFETY: `at <= len`: the tail lies inside both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src.add(at), dst.add(at), len - at) };
    // SAFETY: SSE2 (baseline). Orders the streaming stores before the caller's later stores,
    // the release store that publishes the copy included.
    unsafe { _mm_sfence() };
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Both kinds of copy move exactly the bytes asked for, at any alignment.
        #[test]
        fn copies_move_exactly_the_range(
            len in 0usize..20_000,
            src_off in 0usize..64,
            dst_off in 0usize..64,
            streaming in any::<bool>(),
        ) {
            let src: Vec<u8> = (0..len + 64).map(|i| (i * 7 + 3) as u8).collect();
            let mut dst = vec![0xAAu8; len + 128];
            // SAFETY: both ranges lie inside their vectors, which are distinct.
            unsafe {
                copy(dst.as_mut_ptr().add(dst_off), src.as_ptr().add(src_off), len, streaming);
            }
            prop_assert!(dst[..dst_off].iter().all(|&b| b == 0xAA));
            prop_assert_eq!(&dst[dst_off..dst_off + len], &src[src_off..src_off + len]);
            prop_assert!(dst[dst_off + len..].iter().all(|&b| b == 0xAA));
        }
    }
}

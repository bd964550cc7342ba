//! GPU, alone in its process (a kernel fault kills the context for every later test): a
//! staged transfer whose fence wait fails leaks its staging slots instead of returning them
//! to the cache (issue 26, item 6), so a DMA still in flight can never target reused memory.
//!
//! The failure is provoked by a kernel that spins, then writes to an invalid address: the
//! staged copy to the host is queued behind it, and the wait for its first chunk reports the
//! fault.
#![cfg(feature = "gpu")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use cudars_core::Stream;
use cudars_xfer::staging::{self, route_stats};
use cudars_xfer::DeviceBuffer;
use workspace_tests::gpu::dev0;
use workspace_tests::kernels::Kernels;

/// About 0.5 s of SM clocks: the transfer's DMAs are queued well before the fault.
const SLOW: u64 = 1_000_000_000;

#[test]
fn a_staged_transfer_whose_wait_fails_leaks_its_slots() {
    let dev = dev0();
    let k = Kernels::load(&dev).expect("kernels");
    let stream = Stream::new(&dev).unwrap();
    let len = 64 << 20;
    let src = DeviceBuffer::<u8>::zeroed(&dev, len).unwrap();
    // Exactly one idle staging set in the cache, which the transfer below checks out
    // without a driver call.
    staging::release_cached();
    staging::prepare(&dev).unwrap();
    let staged_before = route_stats().staged;

    // SAFETY: deliberately invalid: the kernel faults, which is what this test is about; it
    // touches no host memory and nothing of this process's but the (then dead) context.
    unsafe { k.spin_then_fill_raw(&stream, 0x10, 7, 1, SLOW) }.unwrap();
    let result = cudars_xfer::to_host_async(&src, vec![0u8; len], &stream);

    assert_eq!(route_stats().staged, staged_before + 1, "the staged route");
    assert!(result.is_err(), "the fault is reported by the transfer");
    assert_eq!(
        staging::release_cached(),
        0,
        "the failed transfer's staging set was not recycled into the cache (it holds one \
         set otherwise)"
    );
}

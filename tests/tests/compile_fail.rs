//! Compile-fail tests (trybuild): each program in `tests/compile_fail/` breaks a promise
//! the workspace's docs make ("cannot be touched", "is not `Send`", "needs `unsafe`"), and
//! must be rejected by the compiler for that reason; its `.stderr` holds the expected
//! diagnostic. Regenerate those with `TRYBUILD=overwrite cargo test -p tests --test
//! compile_fail`, then read each one.
//!
//! The promises, by file:
//!
//! | promise | programs |
//! | --- | --- |
//! | a host buffer cannot be touched before its async copy completes | `xfer_to_host_async_rejects_borrow`, `xfer_pending_owns_host_buffer`, `xfer_scope_slice_untouchable`, `xfer_to_device_async_source_untouchable`, `copy_to_host_async_needs_unsafe`, `copy_from_host_async_needs_unsafe`, `host_registration_holds_buffer` |
//! | a view (block) cannot outlive its pool; a capture cannot outlive its stream | `allocation_outlives_pool`, `device_pool_allocation_outlives_pool`, `graph_capture_outlives_stream` |
//! | a non-`Send` type cannot cross threads | `device_scope_not_send`, `stream_scope_not_send`, `context_binding_not_send`, `allocator_guard_not_send`, `hook_guard_not_send`, `graph_capture_not_send`, `relaxed_capture_mode_not_send`, `nvtx_range_not_send`, `profile_guard_not_send`, `graph_handle_ref_not_send` |
//! | a non-`Sync` type cannot be shared between threads | `graph_capture_not_sync`, `graph_not_sync`, `graph_exec_not_sync`, `core_graph_handle_not_sync`, `core_graph_exec_handle_not_sync`, `nvtx_range_not_sync`, `profile_guard_not_sync` |
//! | a host callback cannot borrow from its caller, nor drop its captures inside the driver's callback | `add_callback_rejects_borrow`, `add_callback_cannot_drop_capture` |
//! | a conditional node's body builder cannot leave its closure, nor trade places with another builder | `graph_body_escapes_closure`, `graph_body_swapped_with_root` |
//! | a raw pool allocation cannot be freed twice | `raw_allocation_double_free` |
//! | safe code cannot free, unmap or release pool memory through the pool's backend | `pool_backend_free_needs_unsafe` |
//! | a pool fence's event cannot be taken out, and a fence cannot be cloned or forged | `pool_fence_event_private`, `pool_fence_not_clone`, `pool_fence_not_constructible` |
//! | a private pool's hold is released once | `pool_private_hold_not_clone` |
//! | an FFT geometry is only made by its checked constructors | `fft_geometry_not_constructible`, `fft_geometry_fields_private` |
//! | an IPC-exported block goes back to the pool at once only on an `unsafe` word | `pool_exported_block_release_needs_unsafe` |
//! | image bytes reach the driver's loader or nvJitLink only on an `unsafe` word | `module_image_load_needs_unsafe`, `rtc_linker_bytes_need_unsafe` |
//! | memory is marked and kernels are launched only with an `Issue` (the capture gate held from the mark to the launch) | `launch_needs_an_issue`, `record_stream_needs_an_issue`, `kernel_arg_prepare_needs_an_issue`, `issue_not_send` |
//!
//! (`cuda-nccl` keeps its own suite, `cuda-nccl/tests/ui`: a communicator cannot be shared
//! between threads, a group guard cannot cross them.)
//!
//! CPU only: the programs are compiled, never run. Left out of GPU builds (`gpu` feature):
//! the GPU bundle ships test binaries to a machine without cargo or the sources.
#![cfg(not(feature = "gpu"))]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

#[test]
fn soundness_promises_are_enforced_by_the_compiler() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("compile_fail/*.rs");
}

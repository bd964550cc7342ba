//! CUDA graphs for Rust: capture the work issued on streams once, then replay it with one
//! launch (CuPy's `cupy.cuda.Graph`: `capture_begin`, `capture_end`, `launch`).
//!
//! | item | what | CuPy / driver |
//! | --- | --- | --- |
//! | [`capture`], [`capture_with`] | closure form: capture what the closure issues; always ends the capture (error, panic) | `capture_begin` … `capture_end` |
//! | [`capture_begin`] → [`Capture`] → [`Capture::end`] | explicit form; the guard ends a forgotten capture on drop | `Graph.capture_begin` / `capture_end` |
//! | [`Capture::fork`], [`Capture::join`] | bring other streams into the capture through events | `cuEventRecord` + `cuStreamWaitEvent` |
//! | [`capture_status`] | none / active / invalidated, and the capture id | `cuStreamGetCaptureInfo` |
//! | [`GraphBuilder`] | graphs built node by node: kernel, copy, memset, host, event, child, memory nodes; typed [`NodeId`] dependencies | `cuGraphCreate`, `cuGraphAdd*Node` |
//! | [`GraphBuilder::add_if`], [`add_if_else`](GraphBuilder::add_if_else), [`add_while`](GraphBuilder::add_while), [`add_switch`](GraphBuilder::add_switch) | conditional nodes, the condition set on the device | `cuGraphConditionalHandleCreate`, `cuGraphAddNode` |
//! | [`Graph`] | instantiate (flags, upload, device launch), clone, node count, DOT file | `cuGraphInstantiate`, `cuGraphClone`, `cuGraphDebugDotPrint` |
//! | [`GraphExec`] | launch on any stream, upload, node updates, whole-graph update (typed refusals, or re-instantiation) | `Graph.launch`, `cuGraphUpload`, `cuGraphExec*NodeSetParams`, `cuGraphExecUpdate` |
//! | [`Error`] | every failure; capture errors name the capture | |
//!
//! The driver calls go through `cudars_core::graph`; this crate adds the guards, the error
//! reporting, the node validation, the keep-alive rules and the update policy. It depends on
//! `cuda-core` only; the `rtc` feature adds typed kernel nodes through `cuda-rtc`'s checked
//! arguments (`GraphBuilder::add_kernel_typed`, `GraphExec::set_kernel_typed`).
//!
//! Captured and built graphs mix: a captured [`Graph`] is a child node of a built one
//! ([`GraphBuilder::add_child`]), and both instantiate and update the same way. See the
//! [`builder`] module for dependencies, what a graph keeps alive, memory nodes and
//! conditional nodes, and `examples/while_solver.rs` for a solver whose loop is a while node.
//!
//! # Capture modes
//!
//! [`CaptureMode::ThreadLocal`] (the default) refuses calls that could implicitly synchronise
//! with the capture only on the capturing thread; [`CaptureMode::Global`] refuses them on every
//! thread; [`CaptureMode::Relaxed`] refuses nothing.
//!
//! # What breaks a capture
//!
//! While a stream is captured its work is recorded, not run. Operations that would need the
//! work to have run are illegal: synchronizing the stream or the device, querying it, work on
//! the legacy null stream when the captured stream is a blocking one, synchronous copies and
//! memsets, `cuMemAlloc`. The driver refuses the call (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`,
//! `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`, ...) and invalidates the capture. The closure form
//! then ends the capture and returns [`Error::Body`] naming the capture, with status
//! `Invalidated`; [`Capture::end`] returns [`Error::Invalidated`]. Either way the stream leaves
//! capture mode and works normally afterwards.
//!
//! # Allocation inside a capture
//!
//! Stream-ordered allocations made on a captured stream (`cuMemAllocAsync` /
//! `cuMemFreeAsync`, as `cuda-core`'s async pool does) are not performed: they become graph
//! memory nodes: each launch of the graph allocates the memory, at the same address every
//! time, from the driver's graph memory pool. An allocation freed inside the same graph is transient; one that is not
//! must be freed before the next launch, or the graph instantiated with
//! [`InstantiateFlags::AUTO_FREE_ON_LAUNCH`]. A pointer returned by such an allocation during
//! capture is a virtual address valid for the graph's launches only. `cuMemAlloc` (the
//! synchronous allocator) is illegal during capture. Whether `cuda-mempool`'s `MemoryPool`
//! hands out memory during a capture (a private pool per capture, or an error) is decided in
//! that crate; this one does not depend on it.
//!
//! # Example
//!
//! ```no_run
//! use cudars_core::{memory::DevicePtr, Device, Stream};
//! use cudars_graph::CaptureMode;
//!
//! let dev = Device::new(0)?;
//! let stream = Stream::new(&dev)?;
//! let (a, b) = (DevicePtr::alloc(&dev, 1 << 20)?, DevicePtr::alloc(&dev, 1 << 20)?);
//!
//! // Record once ...
//! let graph = cudars_graph::capture(&stream, CaptureMode::ThreadLocal, |s| {
//!     a.memset_u32_async(42, s)?;
//!     b.copy_from_device_async(&a, s)?;
//!     Ok(())
//! })?;
//! let exec = graph.instantiate()?;
//! exec.upload(&stream)?;
//!
//! // ... replay many times, on any stream of the device.
//! for _ in 0..100 {
//!     exec.launch(&stream)?;
//! }
//! stream.synchronize()?;
//! # Ok::<(), cudars_graph::Error>(())
//! ```

pub mod builder;
mod capture;
mod error;
mod graph;
mod node_update;

pub use builder::{
    ConditionalHandle, DeviceMem, Extent, GraphAlloc, GraphBuilder, HostBuffer, Mem, NodeId,
    NodeKind, Pitched, SET_CONDITIONAL_PRELUDE,
};
pub use capture::{capture, capture_begin, capture_status, capture_with, Capture};
pub use cudars_core::graph::explicit::ConditionalKind;
pub use cudars_core::graph::{
    CaptureInfo, CaptureMode, CaptureStatus, InstantiateFlags, UpdateRefusal,
};
pub use error::{BoxError, BuildError, CaptureId, Error, Result};
pub use graph::{Graph, GraphExec, GraphHandleRef, UpdateOutcome};

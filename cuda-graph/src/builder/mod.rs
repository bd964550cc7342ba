//! Graphs built node by node ([`GraphBuilder`]): kernel, copy, memset, host function, event,
//! child graph, memory and conditional nodes, with typed dependencies ([`NodeId`]).
//!
//! # Dependencies
//!
//! Every `add_*` method takes the nodes the new node depends on and returns the new node's
//! [`NodeId`]. A node id names its graph: passing a node of another graph (another builder,
//! or a conditional node's body) is [`BuildError::ForeignNode`], before the driver is called.
//! Dependencies can only name nodes that exist already, so a graph built this way has no
//! cycle. Repeated dependencies count once. A graph may be empty.
//!
//! # What a graph keeps alive
//!
//! Every buffer a node uses ([`DevicePtr`](cudars_core::DevicePtr)s, [`HostBuffer`]s), every host closure, every
//! event and every child graph's own buffers are kept alive by the built [`Graph`](crate::Graph) and by
//! every [`GraphExec`](crate::GraphExec) made from it, until the last launch that can use them has completed.
//! Raw kernel arguments ([`GraphBuilder::add_kernel`]) are the exception: the buffers passed
//! in its `keep` list are kept, anything else the kernel reaches is the caller's promise.
//!
//! # Memory nodes
//!
//! [`GraphBuilder::add_mem_alloc`] returns a [`GraphAlloc`]: an address that each launch
//! allocates when the node runs, valid only for nodes ordered after the allocation node and
//! before its free node. The builder checks what it can see: a copy or memset on the
//! allocation must depend (directly or not) on the allocation node, and the free node must
//! depend on every node that used it through this builder; after the free, the allocation
//! cannot be used. A kernel that receives the address as a raw argument is not seen: ordering
//! it is the caller's part of [`add_kernel`](GraphBuilder::add_kernel)'s contract. An
//! allocation the graph does not free is freed at the start of the next launch (the graph is
//! then instantiated with [`InstantiateFlags::AUTO_FREE_ON_LAUNCH`](crate::InstantiateFlags::AUTO_FREE_ON_LAUNCH)); its address is never
//! handed out as owned memory, so nothing outside the graph can use it.
//!
//! # Conditional nodes
//!
//! [`GraphBuilder::add_if`], [`add_if_else`](GraphBuilder::add_if_else),
//! [`add_while`](GraphBuilder::add_while) and [`add_switch`](GraphBuilder::add_switch) take a
//! [`ConditionalHandle`] made by [`GraphBuilder::conditional_handle`] on the same graph, and
//! closures that fill the bodies. A kernel sets the condition on the device with
//! `cudaGraphSetConditional(handle, value)`, the handle passed as an `unsigned long long`
//! argument ([`SET_CONDITIONAL_PRELUDE`] declares it for NVRTC sources). Bodies may hold
//! kernel, copy (device to device), memset, empty, child graph and conditional nodes: other
//! kinds are [`BuildError::NotAllowedInBody`]. If and while need a CUDA 12.3 driver, if/else
//! and switch 12.8: an older one is `cudars_core::Error::DriverTooOld`.
//!
//! ```no_run
//! use std::ffi::c_void;
//! use cudars_core::{Device, DevicePtr, LaunchConfig, Stream};
//! use cudars_graph::{GraphBuilder, SET_CONDITIONAL_PRELUDE};
//!
//! // Count down on the device: the body runs while *left > 0.
//! let source = format!("{SET_CONDITIONAL_PRELUDE}{}", r#"
//! extern "C" __global__ void step(unsigned* left, cudaGraphConditionalHandle h) {
//!     *left -= 1;
//!     cudaGraphSetConditional(h, *left > 0);
//! }"#);
//! let dev = Device::new(0)?;
//! let step = cudars_rtc::Program::new(source).device(&dev)?.compile()?.load(&dev)?.kernel("step")?;
//! let left = DevicePtr::alloc(&dev, 4)?;
//! let mut g = GraphBuilder::new(&dev)?;
//! let reset = g.add_memset_u32(&[], &left, 100)?;
//! let h = g.conditional_handle(Some(1))?; // enter the loop at each launch
//! g.add_while(&[reset], h, |body| {
//!     let (mut p, mut raw) = (left.as_raw(), h.raw());
//!     let mut params = [&mut p as *mut u64 as *mut c_void, &mut raw as *mut u64 as *mut c_void];
//!     // SAFETY: step's parameters; one thread touches the one u32 of `left`, kept by the graph.
//!     unsafe { body.add_kernel(&[], step.function(), &LaunchConfig::new((1, 1, 1), (1, 1, 1)), &mut params, &[&left]) }?;
//!     Ok(())
//! })?;
//! let exec = g.finish()?.instantiate()?;
//! let stream = Stream::new(&dev)?;
//! exec.launch(&stream)?; // 100 iterations, one launch
//! stream.synchronize()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! | module | what |
//! | --- | --- |
//! | `graph_builder` | [`GraphBuilder`]: the graph being built, its id, device and nodes; `finish` |
//! | `node` | [`NodeId`], [`NodeKind`] |
//! | `nodes` | kernel, copy, memset, host, event, child-graph and memory nodes |
//! | `operands` | what nodes read and write: [`DeviceMem`], [`Mem`], [`Pitched`] |
//! | `extent` | [`Extent`], the size of a pitched copy |
//! | `validate` | the checks a node's operands pass before the driver sees them (shared with executable-graph updates) |
//! | `registry` | what the builder knows of its nodes: owners kept alive, allocation lifetimes, bodies; typed arguments' owners |
//! | `memory` | [`GraphAlloc`]: the address a memory node allocates at each launch |
//! | `host` | what host nodes run (closures behind one trampoline) and [`HostBuffer`], pinned host memory |
//! | `conditional` | conditional nodes: [`ConditionalHandle`], if, if/else, while, switch, bodies |
//! | `typed` | (feature `rtc`) kernel nodes with checked arguments |
//!
//! [`BuildError`], the builder's refusals, lives in the crate's `error` module.

mod conditional;
pub(crate) mod extent;
mod graph_builder;
pub(crate) mod host;
pub(crate) mod memory;
pub(crate) mod node;
mod nodes;
pub(crate) mod operands;
pub(crate) mod registry;
#[cfg(test)]
mod tests;
#[cfg(feature = "rtc")]
mod typed;
pub(crate) mod validate;

pub use crate::error::BuildError;
pub use conditional::{ConditionalHandle, SET_CONDITIONAL_PRELUDE};
pub use extent::Extent;
pub use graph_builder::GraphBuilder;
pub use host::HostBuffer;
pub use memory::GraphAlloc;
pub use node::{NodeId, NodeKind};
pub use operands::{DeviceMem, Mem, Pitched};

//! Kernel nodes with arguments checked against the kernel's parameters (feature `rtc`).

use cudars_core::graph::explicit as ex;
use cudars_core::module::LaunchConfig;
use cudars_rtc::{Kernel, KernelArg, KernelArgs};

use super::conditional::ConditionalHandle;
use super::graph_builder::GraphBuilder;
use super::memory::GraphAlloc;
use super::node::{NodeId, NodeKind};
use super::registry::arg_owners;
use crate::error::{wrong_device, Error, Result};

impl KernelArg for ConditionalHandle {
    type Raw = u64;
    fn raw(&self) -> u64 {
        self.raw
    }
}

impl KernelArg for &GraphAlloc {
    type Raw = u64;
    fn raw(&self) -> u64 {
        self.ptr
    }
}

impl GraphBuilder<'_> {
    /// A kernel node with typed arguments ([`cudars_rtc::KernelArgs`]): checked against
    /// the kernel's parameters like [`Kernel::launch`] (a mismatch is a `cudars_rtc`
    /// error in [`Error::Other`], before the driver call); every [`DevicePtr`](cudars_core::DevicePtr) argument
    /// is kept alive by the graph (a `&DeviceMemory` argument is refused: nothing could
    /// keep it alive).
    ///
    /// # Safety
    ///
    /// [`Kernel::launch`]'s contract, at every launch of the graph: the kernel is free of
    /// undefined behaviour with these arguments on this grid, and a [`GraphAlloc`]
    /// argument is used only between its allocation and free nodes.
    pub unsafe fn add_kernel_typed<A: KernelArgs>(
        &mut self,
        deps: &[NodeId],
        kernel: &Kernel,
        config: &LaunchConfig,
        args: A,
    ) -> Result<NodeId> {
        kernel.check::<A>().map_err(Error::other)?;
        let function = kernel.function();
        if function.device() != self.device {
            return Err(wrong_device("kernel", self.device, function.device()));
        }
        let owners = arg_owners(&args, self.device)?;
        let (idx, raw) = self.prepare(deps, NodeKind::Kernel)?;
        let _ctx = self.device.bind()?;
        let graph = self.graph();
        // SAFETY: a live graph and nodes of it; the arguments match the parameters
        // (checked above) and point at values alive for the call; the buffers are kept
        // by the graph (owners); the caller upholds the kernel's contract.
        let node = args.with_params(|params| unsafe {
            ex::add_kernel_node(graph, &raw, function, config, params)
        })?;
        Ok(self.record(idx, node, NodeKind::Kernel, owners))
    }
}

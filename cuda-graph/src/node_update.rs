//! In-place updates of an executable graph's nodes ([`GraphExec::set_memcpy`],
//! [`set_memset_u32`](GraphExec::set_memset_u32), [`set_host`](GraphExec::set_host),
//! [`set_kernel`](GraphExec::set_kernel), ...): each new operand passes the same checks as the
//! builder's nodes (`builder::validate`) before the driver sees it, and the graph keeps the
//! new operands alive.

use std::ffi::c_void;

use cudars_core::graph::explicit as ex;
use cudars_core::graph::UpdateRefusal;
use cudars_core::module::{Function, LaunchConfig};
use cudars_core::sys::CUresult;
use cudars_core::{Device, DevicePtr};

use crate::builder::extent::Extent;
use crate::builder::host::{host_callback, host_owner, HOST_TRAMPOLINE};
use crate::builder::node::{NodeId, NodeKind};
use crate::builder::operands::{DeviceMem, Mem, Pitched};
use crate::builder::registry::Owner;
use crate::builder::validate::{check_pitched, copy_size, memset_target};
use crate::error::{BuildError, Error, Result};
use crate::graph::GraphExec;

impl GraphExec {
    /// Points copy node `node` at new buffers for later launches
    /// (`cuGraphExecMemcpyNodeSetParams`): same kinds of memory at each end (the driver
    /// refuses a change of kind), any length. A [`GraphAlloc`](crate::GraphAlloc) is refused here
    /// (its ordering was checked against the graph's own nodes only when the node was added).
    /// The new buffers are kept alive; the old ones are let go once no launch uses them.
    pub fn set_memcpy<'m>(
        &mut self,
        node: NodeId,
        dst: impl Into<Mem<'m>>,
        src: impl Into<Mem<'m>>,
    ) -> Result<()> {
        let (dst, src) = (dst.into(), src.into());
        let raw = self.node(node, NodeKind::Memcpy)?;
        for m in [&dst, &src] {
            if let Mem::Device(DeviceMem::Alloc(a)) = m {
                return Err(BuildError::ForeignAllocation {
                    alloc: a.node(),
                    graph: node.graph(),
                }
                .into());
            }
        }
        let bytes = copy_size(&dst, &src)?;
        let owners = owners_of(&[&dst, &src], self.device())?;
        let params = ex::memcpy_1d_params(end_of(&dst), end_of(&src), bytes);
        let ctx = self.ctx()?;
        // The update names a node of the source graph: its calls serialised.
        let source = self.source.lock();
        // SAFETY: a memcpy node of the graph this was made from (checked above); the new
        // ranges are kept allocated by this executable graph (owners, installed below).
        unsafe { self.handle.set_memcpy_params(raw, &params, ctx) }?;
        drop(source);
        self.replace_owners(Some(node), owners);
        Ok(())
    }

    /// Points copy node `node` at new pitched ends and extent for later launches, checked as
    /// [`GraphBuilder::add_memcpy_3d`](crate::GraphBuilder::add_memcpy_3d) checks them; a
    /// [`GraphAlloc`](crate::GraphAlloc) end is refused as in [`set_memcpy`](Self::set_memcpy).
    /// When the driver will not change the node in place (driver 580 refuses new ends for a
    /// 3-D pitched node), the result is [`Error::UpdateRefused`] with
    /// [`UpdateRefusal::ParametersChanged`] and the node keeps its old parameters: use
    /// [`update`](Self::update) with a graph built with the new ends.
    pub fn set_memcpy_3d(
        &mut self,
        node: NodeId,
        dst: Pitched<'_>,
        src: Pitched<'_>,
        extent: Extent,
    ) -> Result<()> {
        let raw = self.node(node, NodeKind::Memcpy)?;
        for m in [&dst.mem, &src.mem] {
            if let Mem::Device(DeviceMem::Alloc(a)) = m {
                return Err(BuildError::ForeignAllocation {
                    alloc: a.node(),
                    graph: node.graph(),
                }
                .into());
            }
        }
        check_pitched(&dst, &src, extent)?;
        let owners = owners_of(&[&dst.mem, &src.mem], self.device())?;
        let rows = |p: &Pitched<'_>| {
            if extent.depth == 1 {
                p.rows.max(extent.height)
            } else {
                p.rows
            }
        };
        let params = ex::memcpy_3d_params(
            (end_of(&dst.mem), dst.pitch, rows(&dst)),
            (end_of(&src.mem), src.pitch, rows(&src)),
            extent.width,
            extent.height,
            extent.depth,
        );
        let ctx = self.ctx()?;
        // The update names a node of the source graph: its calls serialised.
        let source = self.source.lock();
        // SAFETY: a memcpy node of the graph this was made from; every byte copied lies in
        // both buffers (checked), which this executable graph keeps (installed below).
        let set = unsafe { self.handle.set_memcpy_params(raw, &params, ctx) };
        drop(source);
        match set {
            Ok(()) => {}
            // The ranges were checked above: what the driver refuses now is the in-place
            // change itself (driver 580 refuses it for 3-D pitched nodes). The node keeps its
            // old parameters; a whole-graph update or a new instantiation takes the change.
            Err(e)
                if e.driver()
                    .is_some_and(|d| d.result() == CUresult::CUDA_ERROR_INVALID_VALUE) =>
            {
                return Err(Error::UpdateRefused {
                    refusal: UpdateRefusal::ParametersChanged,
                    node: Some(node),
                    from: None,
                });
            }
            Err(e) => return Err(e.into()),
        }
        self.replace_owners(Some(node), owners);
        Ok(())
    }

    fn set_memset(
        &mut self,
        node: NodeId,
        dst: &DevicePtr,
        value: u32,
        element: usize,
    ) -> Result<()> {
        let raw = self.node(node, NodeKind::Memset)?;
        let (addr, count) = memset_target(&DeviceMem::Ptr(dst), element)?;
        let owners = owners_of(&[&Mem::from(dst)], self.device())?;
        let params = ex::memset_params(addr, value, element as u32, count);
        let ctx = self.ctx()?;
        // The update names a node of the source graph: its calls serialised.
        let source = self.source.lock();
        // SAFETY: a memset node of the graph this was made from; the new range is kept
        // allocated by this executable graph.
        unsafe { self.handle.set_memset_params(raw, &params, ctx) }?;
        drop(source);
        self.replace_owners(Some(node), owners);
        Ok(())
    }

    /// Points memset node `node` at `dst` with `value` (bytes) for later launches
    /// (`cuGraphExecMemsetNodeSetParams`; the element size must stay the node's).
    pub fn set_memset_u8(&mut self, node: NodeId, dst: &DevicePtr, value: u8) -> Result<()> {
        self.set_memset(node, dst, u32::from(value), 1)
    }

    /// [`set_memset_u8`](Self::set_memset_u8) with 2-byte elements.
    pub fn set_memset_u16(&mut self, node: NodeId, dst: &DevicePtr, value: u16) -> Result<()> {
        self.set_memset(node, dst, u32::from(value), 2)
    }

    /// [`set_memset_u8`](Self::set_memset_u8) with 4-byte elements.
    pub fn set_memset_u32(&mut self, node: NodeId, dst: &DevicePtr, value: u32) -> Result<()> {
        self.set_memset(node, dst, value, 4)
    }

    /// Makes host node `node` run `f` at later launches (`cuGraphExecHostNodeSetParams`);
    /// the old closure is dropped once no launch can call it. The rules of
    /// [`GraphBuilder::add_host`](crate::GraphBuilder::add_host) apply.
    pub fn set_host(&mut self, node: NodeId, f: impl FnMut() + Send + 'static) -> Result<()> {
        let raw = self.node(node, NodeKind::Host)?;
        let (cb, data) = host_callback(f);
        // The update names a node of the source graph: its calls serialised.
        let source = self.source.lock();
        // SAFETY: a host node of the graph this was made from; the trampoline is sound for
        // `data`, kept alive by this executable graph (installed below) until its launches
        // complete.
        unsafe { self.handle.set_host_params(raw, HOST_TRAMPOLINE, data) }?;
        drop(source);
        self.replace_owners(Some(node), vec![Owner::Host(cb)]);
        Ok(())
    }

    /// Sets kernel node `node`'s launch and arguments for later launches
    /// (`cuGraphExecKernelNodeSetParams`); `keep` replaces the buffers kept for the node.
    ///
    /// # Safety
    ///
    /// [`GraphBuilder::add_kernel`](crate::GraphBuilder::add_kernel)'s contract for the new
    /// arguments; `function` is the node's kernel or one the driver accepts in its place.
    pub unsafe fn set_kernel(
        &mut self,
        node: NodeId,
        function: &Function,
        config: &LaunchConfig,
        params: &mut [*mut c_void],
        keep: &[&DevicePtr],
    ) -> Result<()> {
        let raw = self.node(node, NodeKind::Kernel)?;
        if function.device() != self.device() {
            return Err(crate::error::wrong_device(
                "kernel",
                self.device(),
                function.device(),
            ));
        }
        let mems: Vec<Mem<'_>> = keep.iter().map(|p| Mem::from(*p)).collect();
        let owners = owners_of(&mems.iter().collect::<Vec<_>>(), self.device())?;
        // The update names a node of the source graph: its calls serialised.
        let source = self.source.lock();
        // SAFETY: a kernel node of the graph this was made from; the caller upholds the
        // argument contract; the kept buffers are installed below.
        unsafe { self.handle.set_kernel_params(raw, function, config, params) }?;
        drop(source);
        self.replace_owners(Some(node), owners);
        Ok(())
    }

    /// Sets kernel node `node`'s launch and typed arguments for later launches, checked
    /// like [`GraphBuilder::add_kernel_typed`](crate::GraphBuilder::add_kernel_typed); the
    /// new buffers are kept, the old ones let go once no launch uses them.
    ///
    /// # Safety
    ///
    /// As [`GraphBuilder::add_kernel_typed`](crate::GraphBuilder::add_kernel_typed).
    #[cfg(feature = "rtc")]
    pub unsafe fn set_kernel_typed<A: cudars_rtc::KernelArgs>(
        &mut self,
        node: NodeId,
        kernel: &cudars_rtc::Kernel,
        config: &LaunchConfig,
        args: A,
    ) -> Result<()> {
        kernel.check::<A>().map_err(Error::other)?;
        let raw = self.node(node, NodeKind::Kernel)?;
        let function = kernel.function();
        if function.device() != self.device() {
            return Err(crate::error::wrong_device(
                "kernel",
                self.device(),
                function.device(),
            ));
        }
        let owners = crate::builder::registry::arg_owners(&args, self.device())?;
        let handle = &self.handle;
        // SAFETY: a kernel node of the graph this was made from; arguments checked against
        // the parameters; buffers kept (installed below); the caller upholds the rest.
        args.with_params(|params| unsafe {
            handle.set_kernel_params(raw, function, config, params)
        })?;
        self.replace_owners(Some(node), owners);
        Ok(())
    }
}

fn end_of(m: &Mem<'_>) -> ex::CopyEnd {
    match m {
        Mem::Device(DeviceMem::Ptr(p)) => ex::CopyEnd::Device(p.as_raw()),
        Mem::Device(DeviceMem::Alloc(a)) => ex::CopyEnd::Device(a.as_raw()),
        Mem::Host(h) => ex::CopyEnd::Host(h.as_ptr().cast_mut().cast()),
    }
}

fn owners_of(mems: &[&Mem<'_>], device: Device) -> Result<Vec<Owner>> {
    let mut out = Vec::new();
    for m in mems {
        match m {
            Mem::Device(DeviceMem::Ptr(p)) => {
                if p.device() != device {
                    return Err(cudars_core::Error::WrongDevice {
                        what: "buffer",
                        expected: device.ordinal(),
                        actual: p.device().ordinal(),
                    }
                    .into());
                }
                out.push(Owner::Device((*p).clone()));
            }
            Mem::Device(DeviceMem::Alloc(_)) => {}
            Mem::Host(h) => out.push(host_owner(h)),
        }
    }
    Ok(out)
}

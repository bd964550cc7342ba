//! Typed collectives on a cuda-core [`Stream`].
//!
//! Every call checks before it issues anything: the communicator is usable, the stream and the
//! buffers belong to the communicator's device, the buffers hold `count` elements of `T` and
//! are aligned for `T`. Bad input is a typed error and nothing is issued. `count == 0` issues
//! nothing (every rank passes the same count, so every rank skips). The work is stream-ordered
//! like any other on `stream`: wait for it with [`Communicator::wait`] (which times out and
//! aborts) or any stream synchronisation.
//!
//! Multi-GPU programs with one thread issue each rank's call inside a
//! [`group`](crate::group::group).

use std::ffi::c_void;

use cuda_core::memory::DevicePtr;
use cuda_core::Stream;
use cuda_nccl_sys::cudaStream_t;

use crate::comm::Communicator;
use crate::dtype::{NcclType, ReduceOp};
use crate::error::{library, Error, Result};
use crate::group::GroupGuard;

/// Tells the buffer's owner that `stream` used it, so that a pool does not hand the memory out
/// again before the collective is done, and a graph capturing `stream` keeps it alive.
fn used_on(buf: &DevicePtr, stream: &Stream) -> Result<()> {
    buf.record_stream(stream)?;
    Ok(())
}

fn raw_stream(stream: &Stream) -> cudaStream_t {
    stream.raw() as cudaStream_t
}

fn bytes_of<T: NcclType>(count: usize, what: &'static str) -> Result<usize> {
    count
        .checked_mul(std::mem::size_of::<T>())
        .ok_or(Error::SizeOverflow(what))
}

impl Communicator {
    /// Checks one buffer; returns its address offset by `elem_offset` elements of `T`.
    fn buffer<T: NcclType>(
        &self,
        what: &'static str,
        buf: &DevicePtr,
        elems: usize,
        elem_offset: usize,
    ) -> Result<u64> {
        let actual = buf.device().ordinal();
        if actual != self.device().ordinal() {
            return Err(Error::WrongDevice {
                what,
                expected: self.device().ordinal(),
                actual,
            });
        }
        let needed = bytes_of::<T>(elems, what)?;
        if buf.len() < needed {
            return Err(Error::BufferTooSmall {
                what,
                needed,
                len: buf.len(),
            });
        }
        let align = std::mem::align_of::<T>();
        if !buf.as_raw().is_multiple_of(align as u64) {
            return Err(Error::Misaligned {
                what,
                address: buf.as_raw(),
                align,
            });
        }
        Ok(buf.as_raw() + bytes_of::<T>(elem_offset, what)? as u64)
    }

    fn precheck(&self, stream: &Stream) -> Result<()> {
        self.check_usable()?;
        self.check_stream(stream)
    }

    fn check_rank(&self, what: &str, r: usize) -> Result<i32> {
        if r >= self.size() {
            return Err(Error::InvalidArgument(format!(
                "{what} {r} is not a rank of this communicator of {}",
                self.size()
            )));
        }
        Ok(r as i32)
    }

    fn ranks_times(&self, count: usize, what: &'static str) -> Result<usize> {
        count
            .checked_mul(self.size())
            .ok_or(Error::SizeOverflow(what))
    }

    fn finish(&self, bufs: &[&DevicePtr], stream: &Stream) -> Result<()> {
        for b in bufs {
            used_on(b, stream)?;
        }
        Ok(())
    }

    /// All-reduce: every rank's `recv` gets `op` over all ranks' `send`, `count` elements each.
    ///
    /// ```no_run
    /// # use cuda_core::{memory::DevicePtr, Stream};
    /// # use cuda_nccl::{Communicator, ReduceOp};
    /// # fn f(comm: &Communicator, grads: &DevicePtr, out: &DevicePtr, s: &Stream) -> cuda_nccl::Result<()> {
    /// comm.all_reduce::<f32>(grads, out, grads.len() / 4, ReduceOp::Avg, s)?;
    /// comm.wait(s, std::time::Duration::from_secs(60))?;
    /// # Ok(()) }
    /// ```
    pub fn all_reduce<T: NcclType>(
        &self,
        send: &DevicePtr,
        recv: &DevicePtr,
        count: usize,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        self.precheck(stream)?;
        let s = self.buffer::<T>("send buffer", send, count, 0)?;
        let r = self.buffer::<T>("receive buffer", recv, count, 0)?;
        self.all_reduce_raw::<T>(s, r, count, op, stream)?;
        self.finish(&[send, recv], stream)
    }

    /// All-reduce in place: `buf` holds this rank's input and receives the result.
    pub fn all_reduce_in_place<T: NcclType>(
        &self,
        buf: &DevicePtr,
        count: usize,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        self.precheck(stream)?;
        let b = self.buffer::<T>("buffer", buf, count, 0)?;
        self.all_reduce_raw::<T>(b, b, count, op, stream)?;
        self.finish(&[buf], stream)
    }

    fn all_reduce_raw<T: NcclType>(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let nccl = library()?;
        // SAFETY: both buffers were checked to hold `count` elements of T on this
        // communicator's device, the stream belongs to it and the handle is live.
        let r = unsafe {
            nccl.ncclAllReduce(
                send as *const c_void,
                recv as *mut c_void,
                count,
                T::DATA_TYPE.to_raw(),
                op.to_raw(),
                self.as_raw(),
                raw_stream(stream),
            )
        }?;
        self.settle(r, "ncclAllReduce")
    }

    /// Broadcast: every rank's `recv` gets `root`'s `send` (`send` is read on `root` only, but
    /// checked everywhere).
    pub fn broadcast<T: NcclType>(
        &self,
        send: &DevicePtr,
        recv: &DevicePtr,
        count: usize,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.precheck(stream)?;
        let root = self.check_rank("root", root)?;
        let s = self.buffer::<T>("send buffer", send, count, 0)?;
        let r = self.buffer::<T>("receive buffer", recv, count, 0)?;
        self.broadcast_raw::<T>(s, r, count, root, stream)?;
        self.finish(&[send, recv], stream)
    }

    /// Broadcast in place: `root`'s `buf` is copied into every other rank's `buf`.
    pub fn broadcast_in_place<T: NcclType>(
        &self,
        buf: &DevicePtr,
        count: usize,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.precheck(stream)?;
        let root = self.check_rank("root", root)?;
        let b = self.buffer::<T>("buffer", buf, count, 0)?;
        self.broadcast_raw::<T>(b, b, count, root, stream)?;
        self.finish(&[buf], stream)
    }

    fn broadcast_raw<T: NcclType>(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        root: i32,
        stream: &Stream,
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let nccl = library()?;
        // SAFETY: buffers checked for `count` elements on this device; live handle; the
        // stream belongs to the device.
        let r = unsafe {
            nccl.ncclBroadcast(
                send as *const c_void,
                recv as *mut c_void,
                count,
                T::DATA_TYPE.to_raw(),
                root,
                self.as_raw(),
                raw_stream(stream),
            )
        }?;
        self.settle(r, "ncclBroadcast")
    }

    /// Reduce: `root`'s `recv` gets `op` over all ranks' `send` (`recv` is written on `root`
    /// only, but checked everywhere).
    pub fn reduce<T: NcclType>(
        &self,
        send: &DevicePtr,
        recv: &DevicePtr,
        count: usize,
        op: ReduceOp,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.precheck(stream)?;
        let root = self.check_rank("root", root)?;
        let s = self.buffer::<T>("send buffer", send, count, 0)?;
        let r = self.buffer::<T>("receive buffer", recv, count, 0)?;
        self.reduce_raw::<T>(s, r, count, op, root, stream)?;
        self.finish(&[send, recv], stream)
    }

    /// Reduce in place: `root`'s `buf` receives the result.
    pub fn reduce_in_place<T: NcclType>(
        &self,
        buf: &DevicePtr,
        count: usize,
        op: ReduceOp,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.precheck(stream)?;
        let root = self.check_rank("root", root)?;
        let b = self.buffer::<T>("buffer", buf, count, 0)?;
        self.reduce_raw::<T>(b, b, count, op, root, stream)?;
        self.finish(&[buf], stream)
    }

    fn reduce_raw<T: NcclType>(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        op: ReduceOp,
        root: i32,
        stream: &Stream,
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let nccl = library()?;
        // SAFETY: buffers checked for `count` elements on this device; live handle.
        let r = unsafe {
            nccl.ncclReduce(
                send as *const c_void,
                recv as *mut c_void,
                count,
                T::DATA_TYPE.to_raw(),
                op.to_raw(),
                root,
                self.as_raw(),
                raw_stream(stream),
            )
        }?;
        self.settle(r, "ncclReduce")
    }

    /// All-gather: `recv` (`size() * send_count` elements) gets every rank's `send` in rank
    /// order.
    pub fn all_gather<T: NcclType>(
        &self,
        send: &DevicePtr,
        recv: &DevicePtr,
        send_count: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.precheck(stream)?;
        let total = self.ranks_times(send_count, "all_gather receive count")?;
        let s = self.buffer::<T>("send buffer", send, send_count, 0)?;
        let r = self.buffer::<T>("receive buffer", recv, total, 0)?;
        self.all_gather_raw::<T>(s, r, send_count, stream)?;
        self.finish(&[send, recv], stream)
    }

    /// All-gather in place: this rank's part is already at `buf[rank * send_count ..]`.
    pub fn all_gather_in_place<T: NcclType>(
        &self,
        buf: &DevicePtr,
        send_count: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.precheck(stream)?;
        let total = self.ranks_times(send_count, "all_gather receive count")?;
        let r = self.buffer::<T>("buffer", buf, total, 0)?;
        let s = self.buffer::<T>("buffer", buf, total, self.rank() * send_count)?;
        self.all_gather_raw::<T>(s, r, send_count, stream)?;
        self.finish(&[buf], stream)
    }

    fn all_gather_raw<T: NcclType>(
        &self,
        send: u64,
        recv: u64,
        send_count: usize,
        stream: &Stream,
    ) -> Result<()> {
        if send_count == 0 {
            return Ok(());
        }
        let nccl = library()?;
        // SAFETY: send holds `send_count`, recv `size * send_count` elements on this device.
        let r = unsafe {
            nccl.ncclAllGather(
                send as *const c_void,
                recv as *mut c_void,
                send_count,
                T::DATA_TYPE.to_raw(),
                self.as_raw(),
                raw_stream(stream),
            )
        }?;
        self.settle(r, "ncclAllGather")
    }

    /// Reduce-scatter: `op` over all ranks' `send` (`size() * recv_count` elements); this rank's
    /// `recv` gets block `rank` of the result.
    pub fn reduce_scatter<T: NcclType>(
        &self,
        send: &DevicePtr,
        recv: &DevicePtr,
        recv_count: usize,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        self.precheck(stream)?;
        let total = self.ranks_times(recv_count, "reduce_scatter send count")?;
        let s = self.buffer::<T>("send buffer", send, total, 0)?;
        let r = self.buffer::<T>("receive buffer", recv, recv_count, 0)?;
        self.reduce_scatter_raw::<T>(s, r, recv_count, op, stream)?;
        self.finish(&[send, recv], stream)
    }

    /// Reduce-scatter in place: the result lands at `buf[rank * recv_count ..]`.
    pub fn reduce_scatter_in_place<T: NcclType>(
        &self,
        buf: &DevicePtr,
        recv_count: usize,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        self.precheck(stream)?;
        let total = self.ranks_times(recv_count, "reduce_scatter send count")?;
        let s = self.buffer::<T>("buffer", buf, total, 0)?;
        let r = self.buffer::<T>("buffer", buf, total, self.rank() * recv_count)?;
        self.reduce_scatter_raw::<T>(s, r, recv_count, op, stream)?;
        self.finish(&[buf], stream)
    }

    fn reduce_scatter_raw<T: NcclType>(
        &self,
        send: u64,
        recv: u64,
        recv_count: usize,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        if recv_count == 0 {
            return Ok(());
        }
        let nccl = library()?;
        // SAFETY: send holds `size * recv_count`, recv `recv_count` elements on this device.
        let r = unsafe {
            nccl.ncclReduceScatter(
                send as *const c_void,
                recv as *mut c_void,
                recv_count,
                T::DATA_TYPE.to_raw(),
                op.to_raw(),
                self.as_raw(),
                raw_stream(stream),
            )
        }?;
        self.settle(r, "ncclReduceScatter")
    }

    /// Sends `count` elements of `buf` to rank `peer`, which must post a matching
    /// [`recv`](Self::recv). Pairs that depend on each other go in one group.
    pub fn send<T: NcclType>(
        &self,
        buf: &DevicePtr,
        count: usize,
        peer: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.precheck(stream)?;
        let peer = self.check_rank("peer", peer)?;
        let b = self.buffer::<T>("send buffer", buf, count, 0)?;
        self.send_raw::<T>(b, count, peer, stream)?;
        self.finish(&[buf], stream)
    }

    fn send_raw<T: NcclType>(
        &self,
        b: u64,
        count: usize,
        peer: i32,
        stream: &Stream,
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let nccl = library()?;
        // SAFETY: buf holds `count` elements on this device; peer is a rank; live handle.
        let r = unsafe {
            nccl.ncclSend(
                b as *const c_void,
                count,
                T::DATA_TYPE.to_raw(),
                peer,
                self.as_raw(),
                raw_stream(stream),
            )
        }?;
        self.settle(r, "ncclSend")
    }

    /// Receives `count` elements from rank `peer` into `buf`.
    pub fn recv<T: NcclType>(
        &self,
        buf: &DevicePtr,
        count: usize,
        peer: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.precheck(stream)?;
        let peer = self.check_rank("peer", peer)?;
        let b = self.buffer::<T>("receive buffer", buf, count, 0)?;
        self.recv_raw::<T>(b, count, peer, stream)?;
        self.finish(&[buf], stream)
    }

    fn recv_raw<T: NcclType>(
        &self,
        b: u64,
        count: usize,
        peer: i32,
        stream: &Stream,
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let nccl = library()?;
        // SAFETY: buf holds `count` elements on this device; peer is a rank; live handle.
        let r = unsafe {
            nccl.ncclRecv(
                b as *mut c_void,
                count,
                T::DATA_TYPE.to_raw(),
                peer,
                self.as_raw(),
                raw_stream(stream),
            )
        }?;
        self.settle(r, "ncclRecv")
    }

    /// All-to-all from grouped send/recv: block `j` of `send` (`count` elements) goes to rank
    /// `j`, and block `j` of `recv` comes from rank `j`. Both hold `size() * count` elements.
    pub fn all_to_all<T: NcclType>(
        &self,
        send: &DevicePtr,
        recv: &DevicePtr,
        count: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.precheck(stream)?;
        let total = self.ranks_times(count, "all_to_all count")?;
        let s = self.buffer::<T>("send buffer", send, total, 0)?;
        let r = self.buffer::<T>("receive buffer", recv, total, 0)?;
        if count == 0 {
            return Ok(());
        }
        let block = bytes_of::<T>(count, "all_to_all block")? as u64;
        let group = GroupGuard::begin()?;
        for peer in 0..self.size() {
            let off = block * peer as u64;
            self.send_raw::<T>(s + off, count, peer as i32, stream)?;
            self.recv_raw::<T>(r + off, count, peer as i32, stream)?;
        }
        group.end()?;
        self.finish(&[send, recv], stream)
    }
}

//! Typed collectives on a cuda-core [`Stream`].
//!
//! Every call goes through one path, in this order:
//!
//! 1. checks, before anything is issued: the communicator is usable (not aborted, not held by
//!    an open [group] of another thread), the stream and the buffers belong to
//!    the communicator's device, the buffers hold the elements the call touches and are
//!    aligned for `T`, and the bytes it reads and the bytes it writes are either apart or
//!    NCCL's in-place form ([`Error::Overlap`] otherwise: NCCL leaves partial overlap
//!    undefined). Bad input is a typed error and nothing is issued. `count == 0` issues
//!    nothing (every rank passes the same count, so every rank skips);
//! 2. every buffer is marked on the stream ([`DevicePtr::record_stream`]), so that its owner
//!    (a pool block, stream-ordered memory, a graph capture) does not hand the memory out
//!    again before the collective is done. A failure to mark is returned with nothing issued;
//! 3. inside an open group, the group keeps clones of the buffers and of the stream, and holds
//!    the communicator, until its outermost end (NCCL issues grouped calls there, not at the
//!    call): a buffer dropped inside the group is not reused before NCCL has queued the work
//!    on it;
//! 4. the NCCL call.
//!
//! The work is stream-ordered like any other on `stream`: wait for it with
//! [`Communicator::wait`] (which times out and aborts) or any stream synchronisation.
//!
//! Multi-GPU programs with one thread issue each rank's call inside a
//! [`group`](crate::group::group).

use std::any::Any;
use std::ffi::c_void;
use std::ops::Range;

use cudars_core::memory::DevicePtr;
use cudars_core::{Stream, StreamKind};
use cudars_nccl_sys::{cudaStream_t, Nccl};

use crate::comm::Communicator;
use crate::dtype::{NcclType, ReduceOp};
use crate::error::{library, Error, Result};
use crate::group::{self, GroupGuard};

/// Whether `stream` is being captured (asked of the driver only when a capture may run).
pub(crate) fn captured(stream: &Stream) -> Result<bool> {
    use cudars_core::graph::{self, CaptureStatus};
    Ok(
        graph::may_be_captured(stream)
            && graph::capture_info(stream)?.status != CaptureStatus::None,
    )
}

fn raw_stream(stream: &Stream) -> cudaStream_t {
    stream.raw() as cudaStream_t
}

fn bytes_of<T: NcclType>(count: usize, what: &'static str) -> Result<usize> {
    count
        .checked_mul(std::mem::size_of::<T>())
        .ok_or(Error::SizeOverflow(what))
}

/// A collective's in-place form, as NCCL recognises it (by the two addresses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InPlace {
    /// None (`all_to_all`, send/recv).
    Never,
    /// The same address (`all_reduce`, `broadcast`, `reduce`).
    Same,
    /// The send address is the receive address plus this many bytes (`all_gather`: this
    /// rank's block of the receive buffer).
    SendAt(u64),
    /// The receive address is the send address plus this many bytes (`reduce_scatter`: this
    /// rank's block of the send buffer).
    RecvAt(u64),
}

/// NCCL's rule for the bytes a collective reads (`send`) and writes (`recv`): they are apart,
/// or the call is exactly in its in-place form. Anything else is partial overlap, which NCCL
/// leaves undefined: [`Error::Overlap`].
pub(crate) fn check_overlap(send: Range<u64>, recv: Range<u64>, in_place: InPlace) -> Result<()> {
    let apart =
        send.is_empty() || recv.is_empty() || send.end <= recv.start || recv.end <= send.start;
    let exactly_in_place = match in_place {
        InPlace::Never => false,
        InPlace::Same => send.start == recv.start,
        InPlace::SendAt(off) => recv.start.checked_add(off) == Some(send.start),
        InPlace::RecvAt(off) => send.start.checked_add(off) == Some(recv.start),
    };
    if apart || exactly_in_place {
        return Ok(());
    }
    Err(Error::Overlap {
        send: send.start,
        send_len: (send.end - send.start) as usize,
        recv: recv.start,
        recv_len: (recv.end - recv.start) as usize,
    })
}

/// `start .. start + len` without overflow.
fn range(start: u64, len: usize) -> Result<Range<u64>> {
    let end = start
        .checked_add(len as u64)
        .ok_or(Error::SizeOverflow("buffer range"))?;
    Ok(start..end)
}

/// The collectives with a send and a receive buffer.
#[derive(Debug, Clone, Copy)]
enum Collective {
    AllReduce(ReduceOp),
    Broadcast { root: usize },
    Reduce { op: ReduceOp, root: usize },
    AllGather,
    ReduceScatter(ReduceOp),
}

impl Collective {
    fn name(self) -> &'static str {
        match self {
            Collective::AllReduce(_) => "ncclAllReduce",
            Collective::Broadcast { .. } => "ncclBroadcast",
            Collective::Reduce { .. } => "ncclReduce",
            Collective::AllGather => "ncclAllGather",
            Collective::ReduceScatter(_) => "ncclReduceScatter",
        }
    }
}

/// A collective's buffers: two, or one in place.
#[derive(Clone, Copy)]
enum Buffers<'a> {
    Apart {
        send: &'a DevicePtr,
        recv: &'a DevicePtr,
    },
    InPlace(&'a DevicePtr),
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

    fn precheck(&self, stream: &Stream, call: &'static str) -> Result<()> {
        self.check_usable()?;
        self.hold().check_here(call)?;
        self.check_stream(stream)?;
        // Registrations retired since the last call, deregistered once their work is done.
        self.registry().drain(self);
        Ok(())
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

    /// Steps 2 to 4 of the [module](self)'s path, for checked input: marks every view on the
    /// stream, lets an open group hold the views, the stream and the communicator, then runs
    /// `calls` (inside a group of its own when `own_group`). `count == 0` does nothing.
    fn issue(
        &self,
        views: &[&DevicePtr],
        count: usize,
        stream: &Stream,
        own_group: bool,
        calls: impl FnOnce(&'static Nccl, cudaStream_t) -> Result<()>,
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let nccl = library()?;
        // No reset of the device until the NCCL call has returned (ContextLost when it is
        // lost: nothing is issued).
        let _held = cudars_core::health::hold(&self.device())?;
        // From the marks (which decide by the stream's capture status) to the NCCL call, a
        // capture begun meanwhile through cuda-core waits.
        let issue = stream.issue_any();
        for view in views {
            view.record_stream(&issue)?;
        }
        let is_captured = captured(stream)?;
        if is_captured {
            // The capture's graphs keep the communicator alive (see Communicator), and its
            // registrations (see crate::register).
            self.keep_in_capture(&issue)?;
            self.registry().keep_in_capture(&issue)?;
        }
        // With registrations live or retired, every eager collective leaves a fence on its
        // stream: a retired registration is deregistered only once they have completed.
        let fence = !is_captured && self.registry().tracking();
        let own = if own_group {
            Some(GroupGuard::begin()?)
        } else {
            None
        };
        let grouped = group::in_group();
        if grouped {
            let mut keep: Vec<Box<dyn Any>> = Vec::with_capacity(views.len() + 2);
            keep.extend(views.iter().map(|v| Box::new((*v).clone()) as Box<dyn Any>));
            keep.push(Box::new(stream.clone()));
            if fence {
                // Recorded after the outermost end, where NCCL queues the work.
                keep.push(Box::new(self.registry().group_fence(stream)));
            }
            let config = self.config();
            let settle = config
                .is_nonblocking()
                .then(|| (self.raw() as usize, config.get_timeout()));
            group::hold(self.hold(), settle, keep);
        }
        if stream.kind() == StreamKind::PerThread {
            self.note_per_thread_issue();
        }
        let issued = {
            let _calls = self.hold().lock_calls();
            calls(nccl, raw_stream(stream))
        };
        let result = match own {
            Some(g) => {
                let ended = g.end();
                issued.and(ended)
            }
            None => issued,
        };
        if fence && !grouped && self.registry().fence(stream).is_err() {
            // Without the fence nothing tells when this work is done: the retired
            // registrations stay until the communicator ends.
            self.registry().poison();
        }
        match result {
            // NCCL reports a faulted context as an unhandled CUDA error: ask the driver, and
            // return the workspace's one error for it, `ContextLost`.
            Err(Error::Nccl(e)) => match cudars_core::health::probe(stream) {
                Err(lost) => Err(Error::Cuda(lost)),
                Ok(()) => Err(Error::Nccl(e)),
            },
            other => other,
        }
    }

    /// Every collective with a send and a receive buffer: checks, the overlap rule, [`issue`](Self::issue).
    fn collective<T: NcclType>(
        &self,
        op: Collective,
        buffers: Buffers<'_>,
        count: usize,
        stream: &Stream,
    ) -> Result<()> {
        let call = op.name();
        self.precheck(stream, call)?;
        let root = match op {
            Collective::Broadcast { root } | Collective::Reduce { root, .. } => {
                self.check_rank("root", root)?
            }
            _ => 0,
        };
        // Elements read from the send buffer and written to the receive buffer.
        let (send_elems, recv_elems) = match op {
            Collective::AllGather => (count, self.ranks_times(count, "all_gather receive count")?),
            Collective::ReduceScatter(_) => {
                (self.ranks_times(count, "reduce_scatter send count")?, count)
            }
            _ => (count, count),
        };
        // This rank's block of the larger buffer of all_gather / reduce_scatter (no larger
        // than that buffer, whose size was computed without overflow above).
        let rank_block = match op {
            Collective::AllGather | Collective::ReduceScatter(_) => {
                let elems = count
                    .checked_mul(self.rank())
                    .ok_or(Error::SizeOverflow(call))?;
                bytes_of::<T>(elems, call)? as u64
            }
            _ => 0,
        };
        let (send, recv, views) = match buffers {
            Buffers::Apart { send, recv } => (
                self.buffer::<T>("send buffer", send, send_elems, 0)?,
                self.buffer::<T>("receive buffer", recv, recv_elems, 0)?,
                [send, recv],
            ),
            Buffers::InPlace(buf) => {
                let base = self.buffer::<T>("buffer", buf, send_elems.max(recv_elems), 0)?;
                // NCCL's in-place forms: the same address, or this rank's block of the
                // larger buffer.
                match op {
                    Collective::AllGather => (base + rank_block, base, [buf, buf]),
                    Collective::ReduceScatter(_) => (base, base + rank_block, [buf, buf]),
                    _ => (base, base, [buf, buf]),
                }
            }
        };
        let in_place = match op {
            Collective::AllGather => InPlace::SendAt(rank_block),
            Collective::ReduceScatter(_) => InPlace::RecvAt(rank_block),
            _ => InPlace::Same,
        };
        check_overlap(
            range(send, bytes_of::<T>(send_elems, call)?)?,
            range(recv, bytes_of::<T>(recv_elems, call)?)?,
            in_place,
        )?;
        let views: &[&DevicePtr] = match buffers {
            Buffers::Apart { .. } => &views,
            Buffers::InPlace(_) => &views[..1],
        };
        let comm = self.raw();
        let dtype = T::DATA_TYPE.to_raw();
        let (sp, rp) = (send as *const c_void, recv as *mut c_void);
        self.issue(views, count, stream, false, |nccl, s| {
            // SAFETY: (every arm) both buffers were checked to hold what the call reads and
            // writes (`send_elems` / `recv_elems` elements of T) on this communicator's
            // device, aligned for T, apart or exactly in place; they were marked on the
            // stream, which belongs to the device, and are kept alive by the caller or the
            // open group; `root` is a rank; the handle is live and usable on this thread.
            let r = unsafe {
                match op {
                    Collective::AllReduce(o) => {
                        nccl.ncclAllReduce(sp, rp, count, dtype, o.to_raw(), comm, s)
                    }
                    Collective::Broadcast { .. } => {
                        nccl.ncclBroadcast(sp, rp, count, dtype, root, comm, s)
                    }
                    Collective::Reduce { op: o, .. } => {
                        nccl.ncclReduce(sp, rp, count, dtype, o.to_raw(), root, comm, s)
                    }
                    Collective::AllGather => nccl.ncclAllGather(sp, rp, count, dtype, comm, s),
                    Collective::ReduceScatter(o) => {
                        nccl.ncclReduceScatter(sp, rp, count, dtype, o.to_raw(), comm, s)
                    }
                }
            }?;
            self.settle(r, call)
        })
    }

    /// All-reduce: every rank's `recv` gets `op` over all ranks' `send`, `count` elements each.
    /// `send` and `recv` may be the same range (in place), not partly overlap.
    ///
    /// ```no_run
    /// # use cudars_core::{memory::DevicePtr, Stream};
    /// # use cudars_nccl::{Communicator, ReduceOp};
    /// # fn f(comm: &Communicator, grads: &DevicePtr, out: &DevicePtr, s: &Stream) -> cudars_nccl::Result<()> {
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
        let buffers = Buffers::Apart { send, recv };
        self.collective::<T>(Collective::AllReduce(op), buffers, count, stream)
    }

    /// All-reduce in place: `buf` holds this rank's input and receives the result.
    pub fn all_reduce_in_place<T: NcclType>(
        &self,
        buf: &DevicePtr,
        count: usize,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        let buffers = Buffers::InPlace(buf);
        self.collective::<T>(Collective::AllReduce(op), buffers, count, stream)
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
        let buffers = Buffers::Apart { send, recv };
        self.collective::<T>(Collective::Broadcast { root }, buffers, count, stream)
    }

    /// Broadcast in place: `root`'s `buf` is copied into every other rank's `buf`.
    pub fn broadcast_in_place<T: NcclType>(
        &self,
        buf: &DevicePtr,
        count: usize,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        let buffers = Buffers::InPlace(buf);
        self.collective::<T>(Collective::Broadcast { root }, buffers, count, stream)
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
        let buffers = Buffers::Apart { send, recv };
        self.collective::<T>(Collective::Reduce { op, root }, buffers, count, stream)
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
        let buffers = Buffers::InPlace(buf);
        self.collective::<T>(Collective::Reduce { op, root }, buffers, count, stream)
    }

    /// All-gather: `recv` (`size() * send_count` elements) gets every rank's `send` in rank
    /// order. `send` may be exactly this rank's block of `recv` (in place), not overlap it
    /// otherwise.
    pub fn all_gather<T: NcclType>(
        &self,
        send: &DevicePtr,
        recv: &DevicePtr,
        send_count: usize,
        stream: &Stream,
    ) -> Result<()> {
        let buffers = Buffers::Apart { send, recv };
        self.collective::<T>(Collective::AllGather, buffers, send_count, stream)
    }

    /// All-gather in place: this rank's part is already at `buf[rank * send_count ..]`.
    pub fn all_gather_in_place<T: NcclType>(
        &self,
        buf: &DevicePtr,
        send_count: usize,
        stream: &Stream,
    ) -> Result<()> {
        let buffers = Buffers::InPlace(buf);
        self.collective::<T>(Collective::AllGather, buffers, send_count, stream)
    }

    /// Reduce-scatter: `op` over all ranks' `send` (`size() * recv_count` elements); this rank's
    /// `recv` gets block `rank` of the result. `recv` may be exactly this rank's block of
    /// `send` (in place), not overlap it otherwise.
    pub fn reduce_scatter<T: NcclType>(
        &self,
        send: &DevicePtr,
        recv: &DevicePtr,
        recv_count: usize,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        let buffers = Buffers::Apart { send, recv };
        self.collective::<T>(Collective::ReduceScatter(op), buffers, recv_count, stream)
    }

    /// Reduce-scatter in place: the result lands at `buf[rank * recv_count ..]`.
    pub fn reduce_scatter_in_place<T: NcclType>(
        &self,
        buf: &DevicePtr,
        recv_count: usize,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        let buffers = Buffers::InPlace(buf);
        self.collective::<T>(Collective::ReduceScatter(op), buffers, recv_count, stream)
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
        self.precheck(stream, "ncclSend")?;
        let peer = self.check_rank("peer", peer)?;
        let b = self.buffer::<T>("send buffer", buf, count, 0)?;
        self.issue(&[buf], count, stream, false, |nccl, s| {
            self.send_raw::<T>(nccl, b, count, peer, s)
        })
    }

    /// Receives `count` elements from rank `peer` into `buf`.
    pub fn recv<T: NcclType>(
        &self,
        buf: &DevicePtr,
        count: usize,
        peer: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.precheck(stream, "ncclRecv")?;
        let peer = self.check_rank("peer", peer)?;
        let b = self.buffer::<T>("receive buffer", buf, count, 0)?;
        self.issue(&[buf], count, stream, false, |nccl, s| {
            self.recv_raw::<T>(nccl, b, count, peer, s)
        })
    }

    /// All-to-all from grouped send/recv: block `j` of `send` (`count` elements) goes to rank
    /// `j`, and block `j` of `recv` comes from rank `j`. Both hold `size() * count` elements
    /// and must not overlap (there is no in-place form).
    pub fn all_to_all<T: NcclType>(
        &self,
        send: &DevicePtr,
        recv: &DevicePtr,
        count: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.precheck(stream, "all_to_all")?;
        let total = self.ranks_times(count, "all_to_all count")?;
        let s = self.buffer::<T>("send buffer", send, total, 0)?;
        let r = self.buffer::<T>("receive buffer", recv, total, 0)?;
        let bytes = bytes_of::<T>(total, "all_to_all")?;
        check_overlap(range(s, bytes)?, range(r, bytes)?, InPlace::Never)?;
        let block = bytes_of::<T>(count, "all_to_all block")? as u64;
        self.issue(&[send, recv], count, stream, true, |nccl, st| {
            for peer in 0..self.size() {
                let off = block * peer as u64;
                self.send_raw::<T>(nccl, s + off, count, peer as i32, st)?;
                self.recv_raw::<T>(nccl, r + off, count, peer as i32, st)?;
            }
            Ok(())
        })
    }

    fn send_raw<T: NcclType>(
        &self,
        nccl: &Nccl,
        b: u64,
        count: usize,
        peer: i32,
        stream: cudaStream_t,
    ) -> Result<()> {
        // SAFETY: `b` holds `count` elements of T on this device, marked on the stream and
        // kept alive; `peer` is a rank; the handle is live and usable on this thread.
        let r = unsafe {
            nccl.ncclSend(
                b as *const c_void,
                count,
                T::DATA_TYPE.to_raw(),
                peer,
                self.raw(),
                stream,
            )
        }?;
        self.settle(r, "ncclSend")
    }

    fn recv_raw<T: NcclType>(
        &self,
        nccl: &Nccl,
        b: u64,
        count: usize,
        peer: i32,
        stream: cudaStream_t,
    ) -> Result<()> {
        // SAFETY: as in `send_raw`; the receive range overlaps no range this call reads.
        let r = unsafe {
            nccl.ncclRecv(
                b as *mut c_void,
                count,
                T::DATA_TYPE.to_raw(),
                peer,
                self.raw(),
                stream,
            )
        }?;
        self.settle(r, "ncclRecv")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn overlap(send: Range<u64>, recv: Range<u64>, in_place: InPlace) -> bool {
        match check_overlap(send, recv, in_place) {
            Ok(()) => false,
            Err(Error::Overlap { .. }) => true,
            Err(e) => panic!("unexpected {e}"),
        }
    }

    #[test]
    fn apart_ranges_pass_whatever_the_in_place_form() {
        for form in [
            InPlace::Never,
            InPlace::Same,
            InPlace::SendAt(8),
            InPlace::RecvAt(8),
        ] {
            assert!(!overlap(0..100, 100..200, form));
            assert!(!overlap(100..200, 0..100, form));
            // Empty ranges touch nothing.
            assert!(!overlap(50..50, 0..100, form));
            assert!(!overlap(0..100, 50..50, form));
        }
    }

    #[test]
    fn the_same_range_is_in_place_for_the_reductions_only() {
        // all_reduce / broadcast / reduce: in place means the same address.
        assert!(!overlap(0x1000..0x2000, 0x1000..0x2000, InPlace::Same));
        // all_to_all has no in-place form.
        assert!(overlap(0x1000..0x2000, 0x1000..0x2000, InPlace::Never));
        // all_gather's in-place send is this rank's block, not the start (rank > 0).
        assert!(overlap(
            0x1000..0x1100,
            0x1000..0x1400,
            InPlace::SendAt(0x200)
        ));
    }

    #[test]
    fn partial_overlap_is_refused() {
        // all_reduce of 1024 bytes, the receive range shifted by one element either way.
        assert!(overlap(0x1000..0x1400, 0x1004..0x1404, InPlace::Same));
        assert!(overlap(0x1004..0x1404, 0x1000..0x1400, InPlace::Same));
        // One range inside the other.
        assert!(overlap(0x1100..0x1200, 0x1000..0x1400, InPlace::Same));
        let e = check_overlap(0x10..0x20, 0x18..0x28, InPlace::Same).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Overlap {
                    send: 0x10,
                    send_len: 0x10,
                    recv: 0x18,
                    recv_len: 0x10
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn all_gather_and_reduce_scatter_are_in_place_only_at_this_ranks_block() {
        // 4 ranks, blocks of 0x100 bytes, rank 2: the in-place send is recv + 2 blocks.
        let recv = 0x1000..0x1400;
        let form = InPlace::SendAt(0x200);
        assert!(!overlap(0x1200..0x1300, recv.clone(), form));
        assert!(overlap(0x1100..0x1200, recv.clone(), form));
        assert!(overlap(0x1280..0x1380, recv, form));
        // reduce_scatter: the in-place receive is send + 2 blocks.
        let send = 0x1000..0x1400;
        let form = InPlace::RecvAt(0x200);
        assert!(!overlap(send.clone(), 0x1200..0x1300, form));
        assert!(overlap(send.clone(), 0x1100..0x1200, form));
        assert!(overlap(send, 0x1000..0x1100, form));
        // No overflow near the top of the address space.
        assert!(overlap(
            u64::MAX - 0x100..u64::MAX,
            u64::MAX - 0x80..u64::MAX,
            InPlace::SendAt(u64::MAX)
        ));
    }

    #[test]
    fn ranges_do_not_overflow() {
        assert!(range(u64::MAX - 4, 8).is_err());
        assert_eq!(range(16, 8).unwrap(), 16..24);
    }
}

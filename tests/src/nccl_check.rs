//! Shared by the NCCL GPU tests (single- and multi-process): deterministic random inputs per
//! rank, the CPU reference of every collective, and one function that runs a case on the
//! ranks this process drives and checks each against the reference.
//!
//! Every process can compute every rank's input (it depends only on the seed and the rank), so
//! a rank of a multi-process job checks its own output without talking to the others.

use std::time::Duration;

use cudars_core::memory::DevicePtr;
use cudars_core::Stream;
use cudars_nccl::{group, Communicator, NcclType, ReduceOp};
use half::{bf16, f16};

/// How long a test waits for one collective before calling it hung.
pub const WAIT: Duration = Duration::from_secs(120);

/// An element type of the tests: NCCL's, plus CPU arithmetic that matches it.
pub trait El: NcclType + bytemuck::Pod + PartialEq + std::fmt::Debug {
    /// Floating point (compared with a tolerance; `Avg` allowed).
    const FLOAT: bool;
    /// Signed.
    const SIGNED: bool;
    /// From a small integer.
    fn from_i64(v: i64) -> Self;
    /// As f64, for tolerant comparison.
    fn to_f64(self) -> f64;
    /// `op` of two values as NCCL computes it (integers wrap).
    fn combine(op: ReduceOp, a: Self, b: Self) -> Self;
    /// Divides a sum by the rank count (`Avg`).
    fn div(self, n: usize) -> Self;
    /// Relative tolerance.
    const TOL: f64;
}

macro_rules! int_el {
    ($($t:ty => $signed:expr),*) => {$(
        impl El for $t {
            const FLOAT: bool = false;
            const SIGNED: bool = $signed;
            const TOL: f64 = 0.0;
            fn from_i64(v: i64) -> Self { v as $t }
            fn to_f64(self) -> f64 { self as f64 }
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(b),
                    ReduceOp::Prod => a.wrapping_mul(b),
                    ReduceOp::Min => a.min(b),
                    ReduceOp::Max => a.max(b),
                }
            }
            fn div(self, n: usize) -> Self { self / (n as $t) }
        }
    )*};
}
int_el!(i8 => true, u8 => false, i32 => true, u32 => false, i64 => true, u64 => false);

macro_rules! float_el {
    ($($t:ty => $tol:expr, $to:expr, $from:expr),*) => {$(
        impl El for $t {
            const FLOAT: bool = true;
            const SIGNED: bool = true;
            const TOL: f64 = $tol;
            fn from_i64(v: i64) -> Self { $from(v as f64) }
            fn to_f64(self) -> f64 { $to(self) }
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                let (x, y) = ($to(a), $to(b));
                $from(match op {
                    ReduceOp::Sum | ReduceOp::Avg => x + y,
                    ReduceOp::Prod => x * y,
                    ReduceOp::Min => x.min(y),
                    ReduceOp::Max => x.max(y),
                })
            }
            fn div(self, n: usize) -> Self { $from($to(self) / n as f64) }
        }
    )*};
}
float_el!(
    f32 => 1e-6, |v: f32| v as f64, |v: f64| v as f32,
    f64 => 1e-12, |v: f64| v, |v: f64| v,
    f16 => 2e-3, |v: f16| v.to_f64(), f16::from_f64,
    bf16 => 1e-2, |v: bf16| v.to_f64(), bf16::from_f64
);

/// A small, fast, deterministic generator (xorshift64*).
pub struct Rng(u64);

impl Rng {
    /// Seeded; never zero.
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// Next value in `lo..=hi`.
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        lo + (x % (hi - lo + 1) as u64) as i64
    }
}

/// Values for `op` that reduce exactly in every type (so only `Avg` needs a tolerance).
pub fn input<T: El>(seed: u64, rank: usize, len: usize, op: Option<ReduceOp>) -> Vec<T> {
    let mut rng = Rng::new(seed ^ ((rank as u64 + 1) << 32));
    let (lo, hi) = match (op, T::SIGNED) {
        (Some(ReduceOp::Prod), true) => (-1, 2),
        (Some(ReduceOp::Prod), false) => (1, 2),
        (_, true) => (-20, 20),
        (_, false) => (0, 20),
    };
    (0..len)
        .map(|_| {
            let v = rng.range(lo, hi);
            // Prod: avoid zeros, which would hide errors.
            T::from_i64(if v == 0 && op == Some(ReduceOp::Prod) {
                1
            } else {
                v
            })
        })
        .collect()
}

/// What a case runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    /// all_reduce with the op.
    AllReduce(ReduceOp),
    /// broadcast from root.
    Broadcast(usize),
    /// reduce to root.
    Reduce(ReduceOp, usize),
    /// all_gather.
    AllGather,
    /// reduce_scatter with the op.
    ReduceScatter(ReduceOp),
    /// ring: send to rank+1, receive from rank-1.
    SendRecv,
    /// all_to_all.
    AllToAll,
}

impl Kind {
    fn op(self) -> Option<ReduceOp> {
        match self {
            Kind::AllReduce(op) | Kind::Reduce(op, _) | Kind::ReduceScatter(op) => Some(op),
            _ => None,
        }
    }

    /// Elements of a rank's input for `count`.
    fn input_len(self, count: usize, n: usize) -> usize {
        match self {
            Kind::ReduceScatter(_) | Kind::AllToAll => count * n,
            _ => count,
        }
    }

    /// Elements of a rank's output.
    fn output_len(self, count: usize, n: usize) -> usize {
        match self {
            Kind::AllGather | Kind::AllToAll => count * n,
            _ => count,
        }
    }

    /// Whether an in-place form exists.
    pub fn has_in_place(self) -> bool {
        !matches!(self, Kind::SendRecv | Kind::AllToAll)
    }
}

fn reduce<T: El>(op: ReduceOp, inputs: &[Vec<T>], range: std::ops::Range<usize>) -> Vec<T> {
    let n = inputs.len();
    range
        .map(|i| {
            let mut acc = inputs[0][i];
            for inp in &inputs[1..] {
                acc = T::combine(op, acc, inp[i]);
            }
            if op == ReduceOp::Avg {
                acc.div(n)
            } else {
                acc
            }
        })
        .collect()
}

/// The CPU reference: what `rank` must hold after the case (None: nothing to check there).
pub fn expected<T: El>(kind: Kind, inputs: &[Vec<T>], rank: usize, count: usize) -> Option<Vec<T>> {
    let n = inputs.len();
    Some(match kind {
        Kind::AllReduce(op) => reduce(op, inputs, 0..count),
        Kind::Broadcast(root) => inputs[root].clone(),
        Kind::Reduce(op, root) => {
            if rank != root {
                return None;
            }
            reduce(op, inputs, 0..count)
        }
        Kind::AllGather => inputs.concat(),
        Kind::ReduceScatter(op) => reduce(op, inputs, rank * count..(rank + 1) * count),
        Kind::SendRecv => inputs[(rank + n - 1) % n].clone(),
        Kind::AllToAll => (0..n)
            .flat_map(|j| inputs[j][rank * count..(rank + 1) * count].to_vec())
            .collect(),
    })
}

/// One rank this process drives.
pub struct Local<'a> {
    /// Its communicator.
    pub comm: &'a Communicator,
    /// The stream the case runs on.
    pub stream: &'a Stream,
}

fn upload<T: El>(comm: &Communicator, data: &[T], len: usize) -> DevicePtr {
    let buf = DevicePtr::alloc(&comm.device(), len.max(1) * std::mem::size_of::<T>())
        .expect("device memory");
    buf.memset(0xA5).expect("memset");
    if !data.is_empty() {
        buf.slice(..std::mem::size_of_val(data))
            .expect("slice")
            .copy_from_host(data)
            .expect("upload");
    }
    buf
}

/// Runs `kind` on `count` elements of `T` on the ranks of `locals` (all ranks of the
/// communicator, or the one of this process), `in_place` or not, and checks each rank's result
/// against the CPU reference. Panics with the case on a mismatch.
pub fn run_case<T: El>(locals: &[Local<'_>], kind: Kind, count: usize, in_place: bool, seed: u64) {
    let n = locals[0].comm.size();
    let in_len = kind.input_len(count, n);
    let out_len = kind.output_len(count, n);
    let inputs: Vec<Vec<T>> = (0..n).map(|r| input(seed, r, in_len, kind.op())).collect();
    let esz = std::mem::size_of::<T>();
    let case = format!(
        "{kind:?} {} x{count} {} on {n} ranks",
        std::any::type_name::<T>(),
        if in_place { "in-place" } else { "out-of-place" }
    );
    // Buffers: in place, one buffer laid out as the in-place call expects it.
    let bufs: Vec<(DevicePtr, DevicePtr)> = locals
        .iter()
        .map(|l| {
            let r = l.comm.rank();
            if in_place {
                let buf = match kind {
                    Kind::AllGather => {
                        let mut v = vec![T::from_i64(0); out_len];
                        v[r * count..(r + 1) * count].copy_from_slice(&inputs[r]);
                        upload(l.comm, &v, out_len)
                    }
                    _ => upload(l.comm, &inputs[r], in_len.max(out_len)),
                };
                (buf.clone(), buf)
            } else {
                (
                    upload(l.comm, &inputs[r], in_len),
                    upload::<T>(l.comm, &[], out_len),
                )
            }
        })
        .collect();
    group::group(|| {
        for (l, (send, recv)) in locals.iter().zip(&bufs) {
            let (c, s) = (l.comm, l.stream);
            match (kind, in_place) {
                (Kind::AllReduce(op), false) => c.all_reduce::<T>(send, recv, count, op, s)?,
                (Kind::AllReduce(op), true) => c.all_reduce_in_place::<T>(send, count, op, s)?,
                (Kind::Broadcast(root), false) => c.broadcast::<T>(send, recv, count, root, s)?,
                (Kind::Broadcast(root), true) => c.broadcast_in_place::<T>(send, count, root, s)?,
                (Kind::Reduce(op, root), false) => c.reduce::<T>(send, recv, count, op, root, s)?,
                (Kind::Reduce(op, root), true) => {
                    c.reduce_in_place::<T>(send, count, op, root, s)?
                }
                (Kind::AllGather, false) => c.all_gather::<T>(send, recv, count, s)?,
                (Kind::AllGather, true) => c.all_gather_in_place::<T>(send, count, s)?,
                (Kind::ReduceScatter(op), false) => {
                    c.reduce_scatter::<T>(send, recv, count, op, s)?
                }
                (Kind::ReduceScatter(op), true) => {
                    c.reduce_scatter_in_place::<T>(send, count, op, s)?
                }
                (Kind::SendRecv, _) => {
                    let r = c.rank();
                    c.send::<T>(send, count, (r + 1) % n, s)?;
                    c.recv::<T>(recv, count, (r + n - 1) % n, s)?;
                }
                (Kind::AllToAll, _) => c.all_to_all::<T>(send, recv, count, s)?,
            }
        }
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{case}: issue failed: {e}"));
    for (l, (_, recv)) in locals.iter().zip(&bufs) {
        l.comm
            .wait(l.stream, WAIT)
            .unwrap_or_else(|e| panic!("{case}: rank {}: {e}", l.comm.rank()));
        let r = l.comm.rank();
        let Some(want) = expected(kind, &inputs, r, count) else {
            continue;
        };
        let mut got = vec![T::from_i64(0); out_len];
        let offset = match (kind, in_place) {
            (Kind::ReduceScatter(_), true) => r * count,
            _ => 0,
        };
        let view = recv
            .slice(offset * esz..(offset + want.len()) * esz)
            .expect("result view");
        got.truncate(want.len());
        view.copy_to_host(&mut got[..]).expect("download");
        compare(&case, r, &got, &want);
    }
}

fn compare<T: El>(case: &str, rank: usize, got: &[T], want: &[T]) {
    assert_eq!(got.len(), want.len(), "{case}: rank {rank}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = if T::FLOAT {
            let (g, w) = (g.to_f64(), w.to_f64());
            (g - w).abs() <= T::TOL * w.abs().max(1.0)
        } else {
            g == w
        };
        assert!(
            ok,
            "{case}: rank {rank}: element {i}: got {g:?}, want {w:?}"
        );
    }
}

/// Every collective, in place and out of place, for `T` and each of `counts`.
pub fn every_collective<T: El>(locals: &[Local<'_>], counts: &[usize], seed: u64) {
    let n = locals[0].comm.size();
    let mut kinds = vec![
        Kind::AllReduce(ReduceOp::Sum),
        Kind::AllReduce(ReduceOp::Prod),
        Kind::AllReduce(ReduceOp::Min),
        Kind::AllReduce(ReduceOp::Max),
        Kind::Broadcast(n - 1),
        Kind::Reduce(ReduceOp::Sum, 0),
        Kind::Reduce(ReduceOp::Max, n - 1),
        Kind::AllGather,
        Kind::ReduceScatter(ReduceOp::Sum),
        Kind::SendRecv,
        Kind::AllToAll,
    ];
    if T::FLOAT {
        kinds.push(Kind::AllReduce(ReduceOp::Avg));
        kinds.push(Kind::ReduceScatter(ReduceOp::Avg));
    }
    for (ci, &count) in counts.iter().enumerate() {
        for (ki, &kind) in kinds.iter().enumerate() {
            for in_place in [false, true] {
                if in_place && !kind.has_in_place() {
                    continue;
                }
                let s = seed ^ ((ci as u64) << 16) ^ ((ki as u64) << 8) ^ in_place as u64;
                run_case::<T>(locals, kind, count, in_place, s);
            }
        }
    }
}

/// The element types and sizes every suite runs: all ten types at 1, 7, 4099 and 2^20 + 3
/// elements.
pub fn every_type(locals: &[Local<'_>]) {
    const COUNTS: &[usize] = &[1, 7, 4099, (1 << 20) + 3];
    every_collective::<i8>(locals, COUNTS, 1);
    every_collective::<u8>(locals, COUNTS, 2);
    every_collective::<i32>(locals, COUNTS, 3);
    every_collective::<u32>(locals, COUNTS, 4);
    every_collective::<i64>(locals, COUNTS, 5);
    every_collective::<u64>(locals, COUNTS, 6);
    every_collective::<f16>(locals, COUNTS, 7);
    every_collective::<bf16>(locals, COUNTS, 8);
    every_collective::<f32>(locals, COUNTS, 9);
    every_collective::<f64>(locals, COUNTS, 10);
}

/// 256 MiB of f32 per rank through every collective, in place and out of place.
pub fn large(locals: &[Local<'_>]) {
    let n = locals[0].comm.size();
    let count = (256 << 20) / 4;
    for (i, kind) in [
        Kind::AllReduce(ReduceOp::Sum),
        Kind::Broadcast(0),
        Kind::Reduce(ReduceOp::Sum, n - 1),
        Kind::AllGather,
        Kind::ReduceScatter(ReduceOp::Sum),
    ]
    .into_iter()
    .enumerate()
    {
        // The reduce-scatter input is n blocks: keep it at 256 MiB in all.
        let c = if matches!(kind, Kind::ReduceScatter(_)) {
            count / n
        } else {
            count
        };
        for in_place in [false, true] {
            run_case::<f32>(locals, kind, c, in_place, 100 + i as u64);
        }
    }
    run_case::<f32>(locals, Kind::SendRecv, count, false, 200);
    run_case::<f32>(locals, Kind::AllToAll, count / n, false, 201);
}

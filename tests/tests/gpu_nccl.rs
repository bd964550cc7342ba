//! GPU: cuda-nccl on every GPU of the machine (at least 2; with fewer every test fails).
//!
//! * single process (`init_all`, one thread, groups): every collective in place and out of
//!   place, ten element types, 1 / 7 / 4099 / 2^20+3 elements and 256 MiB, checked against a
//!   CPU computation on random data; `split` into communicators of 2; bad input rejected with
//!   typed errors before anything is issued; a receive nobody sends to times out, aborts, and
//!   the GPU stays usable;
//! * the soundness round 2 holes: a pool block dropped inside a group is not reused before the
//!   group ends; a buffer that cannot be marked on the stream issues nothing; partial overlap
//!   of send and receive ranges is refused while NCCL's in-place forms work; a communicator
//!   moved out of (or dropped inside) an open group is held until the group ends; `wait` on the
//!   per-thread stream of a thread that did not issue the work is refused;
//! * multi process (this test binary re-executed once per GPU by `cudars_nccl::Launcher`, each
//!   copy running the ignored `rank_worker` test): the same suite over NCCL's default
//!   transports, then over sockets only (`NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1`, the path
//!   between machines) with non-blocking communicators; one rank exits in the middle of a
//!   collective and the others get a typed error within the timeout and keep using their GPU.
//!
//! `NCCL_NVLS_ENABLE=0` everywhere. NCCL reads its environment once per process, so variants
//! that change it run as separate processes.
#![cfg(feature = "gpu")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use std::process::ExitStatus;
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use cudars_core::memory::DevicePtr;
use cudars_core::{Device, Stream};
use cudars_nccl::{
    group, CommConfig, Communicator, Error, GroupGuard, Launcher, ReduceOp, UniqueId,
};
use workspace_tests::gpu::serial;
use workspace_tests::nccl_check::{every_type, large, run_case, Kind, Local, WAIT};

/// Every GPU; fails with fewer than two.
fn devices() -> Vec<Device> {
    static ENV: Once = Once::new();
    ENV.call_once(|| std::env::set_var("NCCL_NVLS_ENABLE", "0"));
    let devices = Device::all().expect("CUDA devices");
    assert!(
        devices.len() >= 2,
        "the NCCL tests need at least 2 GPUs, found {}",
        devices.len()
    );
    devices
}

struct World {
    comms: Vec<Communicator>,
    streams: Vec<Stream>,
}

impl World {
    fn new() -> World {
        let devices = devices();
        let comms = Communicator::init_all(&devices).expect("init_all");
        let streams = devices
            .iter()
            .map(|d| Stream::new(d).expect("stream"))
            .collect();
        World { comms, streams }
    }

    fn locals(&self) -> Vec<Local<'_>> {
        self.comms
            .iter()
            .zip(&self.streams)
            .map(|(comm, stream)| Local { comm, stream })
            .collect()
    }
}

#[test]
fn init_all_accessors_and_version() {
    let _s = serial();
    let devices = devices();
    let (major, minor, _) = cudars_nccl::version().expect("NCCL version");
    assert!(
        major >= 2 && (major > 2 || minor >= 10),
        "NCCL {major}.{minor}"
    );
    let world = World::new();
    for (i, c) in world.comms.iter().enumerate() {
        assert_eq!(c.rank(), i);
        assert_eq!(c.size(), devices.len());
        assert_eq!(c.device().ordinal(), devices[i].ordinal());
        assert!(c.async_error().expect("async error").is_none());
    }
    let id = UniqueId::new().expect("unique id");
    assert_eq!(id.to_string().parse::<UniqueId>().unwrap(), id);
}

#[test]
fn single_process_every_collective_every_type() {
    let _s = serial();
    let world = World::new();
    every_type(&world.locals());
}

#[test]
fn single_process_256_mib() {
    let _s = serial();
    let world = World::new();
    large(&world.locals());
}

#[test]
fn bad_input_is_a_typed_error_and_issues_nothing() {
    let _s = serial();
    let world = World::new();
    let (c0, s0, s1) = (&world.comms[0], &world.streams[0], &world.streams[1]);
    let d0 = c0.device();
    let d1 = world.comms[1].device();
    let small = DevicePtr::alloc(&d0, 64).unwrap();
    let other = DevicePtr::alloc(&d1, 1024).unwrap();
    let big = DevicePtr::alloc(&d0, 1024).unwrap();
    // A stream of another device.
    let e = c0
        .all_reduce_in_place::<f32>(&big, 4, ReduceOp::Sum, s1)
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::WrongDevice {
                what: "the stream",
                ..
            }
        ),
        "{e}"
    );
    // A buffer of another device.
    let e = c0
        .all_reduce::<f32>(&big, &other, 4, ReduceOp::Sum, s0)
        .unwrap_err();
    assert!(matches!(e, Error::WrongDevice { .. }), "{e}");
    // Too small for the count.
    let e = c0
        .all_reduce::<f64>(&small, &big, 9, ReduceOp::Sum, s0)
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::BufferTooSmall {
                needed: 72,
                len: 64,
                ..
            }
        ),
        "{e}"
    );
    // all_gather's receive buffer needs size() blocks.
    let n = c0.size();
    let recv = DevicePtr::alloc(&d0, 16 * 4 * n - 4).unwrap();
    let e = c0.all_gather::<f32>(&big, &recv, 16, s0).unwrap_err();
    assert!(matches!(e, Error::BufferTooSmall { .. }), "{e}");
    // Misaligned for the type.
    let odd = big.slice(2..).unwrap();
    let e = c0.broadcast_in_place::<f32>(&odd, 4, 0, s0).unwrap_err();
    assert!(matches!(e, Error::Misaligned { align: 4, .. }), "{e}");
    // Root and peer outside the communicator.
    let e = c0.broadcast_in_place::<f32>(&big, 4, n, s0).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let e = c0.send::<u8>(&big, 4, n + 3, s0).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    // Overflowing counts.
    let e = c0
        .all_gather::<f64>(&big, &recv, usize::MAX / 2, s0)
        .unwrap_err();
    assert!(
        matches!(e, Error::SizeOverflow(_) | Error::BufferTooSmall { .. }),
        "{e}"
    );
    // Nothing was issued: the stream is idle and the communicator healthy.
    assert!(s0.is_done().unwrap());
    assert!(c0.async_error().unwrap().is_none());
    // init_all refuses a device twice; init_rank a rank outside the world.
    let e = Communicator::init_all(&[d0, d0]).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let id = UniqueId::new().unwrap();
    let e = Communicator::init_rank(&d0, 2, 2, &id).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    // Zero elements issue nothing and succeed.
    c0.all_reduce_in_place::<f32>(&big, 0, ReduceOp::Sum, s0)
        .unwrap();
}

/// Splits the world into communicators of 2 (ranks {0,1}, {2,3}, ...; an odd last rank alone),
/// each split running on its own thread as NCCL requires, then all-reduces inside each pair.
#[test]
fn split_into_pairs() {
    let _s = serial();
    let World { comms, streams } = World::new();
    let n = comms.len();
    let handles: Vec<_> = comms
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let color = (c.rank() / 2) as u32;
                let pair = c.split(Some(color), c.rank() as i32).expect("split");
                (c, pair)
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let mut pairs = Vec::new();
    for (c, pair) in &results {
        let pair = pair.as_ref().expect("every rank has a color");
        let first = c.rank() / 2 * 2;
        assert_eq!(pair.size(), (n - first).min(2), "rank {}", c.rank());
        assert_eq!(pair.rank(), c.rank() - first);
        assert_eq!(pair.device().ordinal(), c.device().ordinal());
        pairs.push(pair);
    }
    for first in (0..n).step_by(2) {
        let members: Vec<Local<'_>> = (first..(first + 2).min(n))
            .map(|r| Local {
                comm: pairs[r],
                stream: &streams[r],
            })
            .collect();
        run_case::<f32>(&members, Kind::AllReduce(ReduceOp::Sum), 1000, false, 77);
        run_case::<i32>(&members, Kind::AllGather, 33, true, 78);
    }
    // A rank that passes no color gets no communicator.
    let comms: Vec<Communicator> = results.into_iter().map(|(c, _)| c).collect();
    let handles: Vec<_> = comms
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let color = if c.rank() == 0 { None } else { Some(0) };
                let sub = c.split(color, 0).expect("split");
                (c.rank(), sub.map(|s| s.size()))
            })
        })
        .collect();
    for h in handles {
        let (rank, size) = h.join().unwrap();
        assert_eq!(size, if rank == 0 { None } else { Some(n - 1) });
    }
}

/// A receive that no rank sends to never completes: `wait` returns `Timeout` within its bound,
/// aborts the communicator (later calls say `Aborted`), and the GPU keeps working.
#[test]
fn an_unmatched_receive_times_out_aborts_and_the_gpu_stays_usable() {
    let _s = serial();
    let world = World::new();
    // Connect every pair first: NCCL sets up a peer connection on first use, which would need
    // the peer's participation; afterwards the lone receive below only waits on the GPU.
    run_case::<f32>(&world.locals(), Kind::AllToAll, 16, false, 5);
    let World { mut comms, streams } = world;
    let c0 = comms.remove(0);
    let dev = c0.device();
    let buf = DevicePtr::alloc(&dev, 4096).unwrap();
    c0.recv::<f32>(&buf, 1024, 1, &streams[0]).unwrap();
    let timeout = Duration::from_secs(3);
    let t = Instant::now();
    let e = c0.wait(&streams[0], timeout).unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    assert!(
        t.elapsed() < timeout + Duration::from_secs(10),
        "{:?}",
        t.elapsed()
    );
    assert!(c0.is_aborted());
    let e = c0
        .all_reduce_in_place::<f32>(&buf, 4, ReduceOp::Sum, &streams[0])
        .unwrap_err();
    assert!(matches!(e, Error::Aborted), "{e}");
    // The aborted kernel is gone: the stream drains and the device works.
    streams[0]
        .synchronize()
        .expect("the stream drains after the abort");
    gpu_still_works(&dev);
    for c in comms {
        c.abort().expect("abort the others");
    }
}

// ---- soundness round 2 --------------------------------------------------------------------

/// `count` u32 of `value` in fresh device memory of `dev` (written synchronously).
fn filled(dev: &Device, count: usize, value: u32) -> DevicePtr {
    let buf = DevicePtr::alloc(dev, count * 4).unwrap();
    buf.copy_from_host(&vec![value; count]).unwrap();
    buf
}

fn read(buf: &DevicePtr) -> Vec<u32> {
    let mut host = vec![0u32; buf.len() / 4];
    buf.copy_to_host(&mut host).unwrap();
    host
}

/// Aborts every communicator (their kernels stop, nothing hangs at drop), then panics.
fn abort_and_panic(comms: Vec<Communicator>, why: String) -> ! {
    for c in comms {
        let _ = c.abort();
    }
    panic!("{why}");
}

/// Hole 3: NCCL issues grouped calls at `ncclGroupEnd`. A pool block dropped inside the group
/// must stay held until then: otherwise the pool hands it to the next allocation on the same
/// stream, whose memset runs before the all-reduce that then reads (and writes) it.
#[test]
fn a_pool_block_dropped_inside_a_group_is_not_reused_before_the_group_ends() {
    let _s = serial();
    let world = World::new();
    let n = world.comms.len();
    let count = 1 << 16;
    let s0 = &world.streams[0];
    let block = cudars_mempool::driver::malloc(s0, count * 4).expect("pool block");
    block.memset_u32_async(1, s0).unwrap();
    s0.synchronize().unwrap();
    let dropped_at = block.as_raw();
    let others: Vec<DevicePtr> = world.comms[1..]
        .iter()
        .map(|c| filled(&c.device(), count, 1))
        .collect();
    let next = group::group(|| {
        world.comms[0].all_reduce_in_place::<u32>(&block, count, ReduceOp::Sum, s0)?;
        drop(block);
        for ((c, s), b) in world.comms[1..]
            .iter()
            .zip(&world.streams[1..])
            .zip(&others)
        {
            c.all_reduce_in_place::<u32>(b, count, ReduceOp::Sum, s)?;
        }
        // The same size on the same stream: without the hold, the block just dropped.
        let next = cudars_mempool::driver::malloc(s0, count * 4).expect("next pool block");
        next.memset_u32_async(7, s0)?;
        Ok(next)
    })
    .expect("group");
    for (c, s) in world.comms.iter().zip(&world.streams) {
        c.wait(s, WAIT).expect("wait");
    }
    let got = read(&next);
    assert!(
        got.iter().all(|&x| x == 7),
        "the block allocated inside the group was written by the all-reduce of the block          dropped there (first element {:#x}; same address: {})",
        got[0],
        next.as_raw() == dropped_at
    );
    for b in &others {
        let got = read(b);
        assert!(got.iter().all(|&x| x == n as u32), "first {}", got[0]);
    }
}

/// Hole 4: a buffer that cannot be marked on the stream (a pool block and the per-thread
/// stream, which the pool refuses) is an error with nothing issued: a lone rank-0 all-reduce
/// would otherwise sit on the stream waiting for its peers.
#[test]
fn a_buffer_that_cannot_be_marked_on_the_stream_issues_nothing() {
    let _s = serial();
    let World { comms, streams } = World::new();
    let dev = comms[0].device();
    let block = cudars_mempool::driver::malloc(&streams[0], 4096).expect("pool block");
    let ptds = Stream::per_thread(&dev);
    for in_group in [false, true] {
        let r = if in_group {
            group::group(|| comms[0].all_reduce_in_place::<f32>(&block, 1024, ReduceOp::Sum, &ptds))
        } else {
            comms[0].all_reduce_in_place::<f32>(&block, 1024, ReduceOp::Sum, &ptds)
        };
        std::thread::sleep(Duration::from_millis(200));
        let idle = ptds.is_done().unwrap();
        match r {
            Err(Error::Cuda(_)) if idle => {}
            other => abort_and_panic(
                comms,
                format!("in group: {in_group}: {other:?}, per-thread stream idle: {idle}"),
            ),
        }
        assert!(comms[0].async_error().unwrap().is_none());
    }
}

/// Hole 8: send and receive ranges that partly overlap are refused before anything is issued;
/// the out-of-place calls given NCCL's in-place layout (the same view, this rank's block)
/// still work.
#[test]
fn partial_overlap_is_refused_and_the_in_place_layouts_still_work() {
    let _s = serial();
    let World { comms, streams } = World::new();
    let n = comms.len();
    let (c0, s0) = (&comms[0], &streams[0]);
    let d0 = c0.device();
    let count = 1024;
    let buf = DevicePtr::alloc(&d0, count * 4 * (n + 1)).unwrap();
    let a = buf.slice(0..count * 4).unwrap();
    let b = buf.slice(4..4 + count * 4).unwrap();
    let whole = buf.slice(0..count * 4 * n).unwrap();
    let cases: Vec<(&str, Result<(), Error>)> = vec![
        (
            "all_reduce",
            c0.all_reduce::<u32>(&a, &b, count, ReduceOp::Sum, s0),
        ),
        ("broadcast", c0.broadcast::<u32>(&b, &a, count, 0, s0)),
        (
            "reduce",
            c0.reduce::<u32>(&a, &b, count, ReduceOp::Sum, 0, s0),
        ),
        // Rank 0's in-place send is block 0 of the receive buffer; one element off is not.
        ("all_gather", c0.all_gather::<u32>(&b, &whole, count, s0)),
        (
            "reduce_scatter",
            c0.reduce_scatter::<u32>(&whole, &b, count, ReduceOp::Sum, s0),
        ),
        // all_to_all has no in-place form: even the same view is refused.
        (
            "all_to_all",
            c0.all_to_all::<u32>(&whole, &whole, count, s0),
        ),
    ];
    let wrong: Vec<String> = cases
        .into_iter()
        .filter(|(_, r)| !matches!(r, Err(Error::Overlap { .. })))
        .map(|(what, r)| format!("{what}: {r:?}"))
        .collect();
    if !wrong.is_empty() {
        abort_and_panic(comms, format!("partial overlap not refused: {wrong:?}"));
    }
    assert!(s0.is_done().unwrap(), "nothing was issued");
    assert!(c0.async_error().unwrap().is_none());
    // The in-place layouts through the out-of-place calls, on every rank.
    let bufs: Vec<DevicePtr> = comms
        .iter()
        .map(|c| {
            let b = filled(&c.device(), count * n, 0);
            let own = b
                .slice(c.rank() * count * 4..(c.rank() + 1) * count * 4)
                .unwrap();
            own.copy_from_host(&vec![c.rank() as u32 + 1; count])
                .unwrap();
            b
        })
        .collect();
    group::group(|| {
        for ((c, s), b) in comms.iter().zip(&streams).zip(&bufs) {
            let own = b.slice(c.rank() * count * 4..(c.rank() + 1) * count * 4)?;
            c.all_gather::<u32>(&own, b, count, s)?;
        }
        Ok(())
    })
    .expect("all_gather with send = own block of recv");
    for (c, s) in comms.iter().zip(&streams) {
        c.wait(s, WAIT).unwrap();
    }
    let want: Vec<u32> = (0..n)
        .flat_map(|r| std::iter::repeat_n(r as u32 + 1, count))
        .collect();
    for b in &bufs {
        assert_eq!(read(b), want);
    }
    group::group(|| {
        for ((c, s), b) in comms.iter().zip(&streams).zip(&bufs) {
            c.all_reduce::<u32>(b, b, count * n, ReduceOp::Sum, s)?;
        }
        Ok(())
    })
    .expect("all_reduce with send = recv");
    for (c, s) in comms.iter().zip(&streams) {
        c.wait(s, WAIT).unwrap();
    }
    let want: Vec<u32> = want.iter().map(|x| x * n as u32).collect();
    for b in &bufs {
        assert_eq!(read(b), want);
    }
}

/// Hole 9: a communicator used in an open group and moved to another thread cannot be used
/// there until the group ends, and dropping it there is deferred to the group's end: the
/// group ends `Ok`, with every rank's result right.
#[test]
fn a_communicator_moved_out_of_an_open_group_is_held_until_the_group_ends() {
    let _s = serial();
    let World { mut comms, streams } = World::new();
    let n = comms.len();
    let count = 4096;
    let bufs: Vec<DevicePtr> = comms
        .iter()
        .map(|c| filled(&c.device(), count, c.rank() as u32 + 1))
        .collect();
    let g = GroupGuard::begin().unwrap();
    for ((c, s), b) in comms.iter().zip(&streams).zip(&bufs) {
        c.all_reduce_in_place::<u32>(b, count, ReduceOp::Sum, s)
            .unwrap();
    }
    let last = comms.pop().unwrap();
    let (b, s) = (bufs[n - 1].clone(), streams[n - 1].clone());
    let refused = std::thread::spawn(move || {
        let refused = [
            last.all_reduce_in_place::<u32>(&b, count, ReduceOp::Sum, &s),
            last.async_error().map(|_| ()),
            last.wait(&s, Duration::from_secs(1)),
            last.split(Some(0), 0).map(|_| ()),
        ];
        drop(last); // destroyed when the group ends, on the group's thread
        refused
    })
    .join()
    .unwrap();
    for r in refused {
        if !matches!(r, Err(Error::HeldByGroup { .. })) {
            drop(g);
            abort_and_panic(comms, format!("expected HeldByGroup, got {r:?}"));
        }
    }
    g.end()
        .expect("the group ends with the moved communicator alive");
    for (c, s) in comms.iter().zip(&streams) {
        c.wait(s, WAIT).unwrap();
    }
    streams[n - 1].synchronize().unwrap();
    let sum = (n * (n + 1) / 2) as u32;
    for b in &bufs {
        assert_eq!(read(b), vec![sum; count]);
    }
}

/// Hole 9, on one thread: a communicator dropped inside the group it was used in is destroyed
/// after the group's end, which issues its call.
#[test]
fn a_communicator_dropped_inside_its_group_is_destroyed_after_the_end() {
    let _s = serial();
    let World { mut comms, streams } = World::new();
    let n = comms.len();
    let count = 4096;
    let bufs: Vec<DevicePtr> = comms
        .iter()
        .map(|c| filled(&c.device(), count, c.rank() as u32 + 1))
        .collect();
    group::group(|| {
        for ((c, s), b) in comms.iter().zip(&streams).zip(&bufs) {
            c.all_reduce_in_place::<u32>(b, count, ReduceOp::Sum, s)?;
        }
        drop(comms.pop());
        Ok(())
    })
    .expect("group");
    for (c, s) in comms.iter().zip(&streams) {
        c.wait(s, WAIT).unwrap();
    }
    streams[n - 1].synchronize().unwrap();
    let sum = (n * (n + 1) / 2) as u32;
    for b in &bufs {
        assert_eq!(read(b), vec![sum; count]);
    }
}

/// Hole 10: the per-thread default stream names each thread's own stream. Work issued on it
/// by this thread cannot be waited for on another: that `wait` is refused (before, it watched
/// the other thread's idle stream and said `Ok` at once); on this thread it works.
#[test]
fn wait_refuses_the_per_thread_stream_of_another_thread() {
    let _s = serial();
    let World { mut comms, .. } = World::new();
    let n = comms.len();
    let count = 1 << 20;
    let ptds: Vec<Stream> = comms
        .iter()
        .map(|c| Stream::per_thread(&c.device()))
        .collect();
    let bufs: Vec<DevicePtr> = comms
        .iter()
        .map(|c| filled(&c.device(), count, c.rank() as u32 + 1))
        .collect();
    group::group(|| {
        for ((c, s), b) in comms.iter().zip(&ptds).zip(&bufs) {
            for _ in 0..8 {
                c.all_reduce_in_place::<u32>(b, count, ReduceOp::Max, s)?;
            }
        }
        Ok(())
    })
    .expect("group");
    let c0 = comms.remove(0);
    let dev0 = c0.device();
    let (c0, there) = std::thread::spawn(move || {
        let r = c0.wait(&Stream::per_thread(&dev0), Duration::from_secs(5));
        (c0, r)
    })
    .join()
    .unwrap();
    assert!(
        matches!(there, Err(Error::ForeignPerThreadStream)),
        "{there:?}"
    );
    assert!(!c0.is_aborted());
    comms.insert(0, c0);
    for (c, s) in comms.iter().zip(&ptds) {
        c.wait(s, WAIT).expect("wait on the issuing thread");
    }
    for b in &bufs {
        assert_eq!(read(b), vec![n as u32; count]);
    }
}

fn gpu_still_works(dev: &Device) {
    let data: Vec<u32> = (0..1 << 16).collect();
    let buf = DevicePtr::alloc(dev, data.len() * 4).expect("alloc after the fault");
    buf.copy_from_host(&data).expect("upload after the fault");
    let mut back = vec![0u32; data.len()];
    buf.copy_to_host(&mut back)
        .expect("download after the fault");
    assert_eq!(back, data);
}

// ---- multi-process --------------------------------------------------------------------------

const WORKER_VAR: &str = "CUDARS_NCCL_WORKER";

fn launch(worker: &str, extra: &[(&str, &str)], timeout: Duration) -> Vec<ExitStatus> {
    let n = devices().len();
    let mut l = Launcher::new(n)
        .program(std::env::current_exe().unwrap())
        .args([
            "rank_worker",
            "--exact",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(WORKER_VAR, worker);
    for (k, v) in extra {
        l = l.env(k, v);
    }
    l.spawn()
        .expect("launch")
        .wait(timeout)
        .expect("ranks finish")
}

#[test]
fn multi_process_every_collective() {
    let _s = serial();
    let st = launch("collectives", &[], Duration::from_secs(600));
    assert!(st.iter().all(|s| s.success()), "{st:?}");
}

#[test]
fn multi_process_socket_transport_nonblocking() {
    let _s = serial();
    let st = launch(
        "collectives",
        &[
            ("NCCL_P2P_DISABLE", "1"),
            ("NCCL_SHM_DISABLE", "1"),
            ("CUDARS_NCCL_NONBLOCKING", "1"),
        ],
        Duration::from_secs(600),
    );
    assert!(st.iter().all(|s| s.success()), "{st:?}");
}

/// The last rank exits in the middle of a collective; every other rank must get a typed error
/// within its 20 s timeout and still use its GPU, then exit 0.
#[test]
fn a_rank_that_exits_mid_collective_gives_the_others_a_typed_error() {
    let _s = serial();
    for transports in [
        &[][..],
        &[("NCCL_P2P_DISABLE", "1"), ("NCCL_SHM_DISABLE", "1")][..],
    ] {
        let t = Instant::now();
        let st = launch("fault", transports, Duration::from_secs(180));
        let n = st.len();
        assert_eq!(st[n - 1].code(), Some(FAULT_EXIT), "{transports:?}: {st:?}");
        assert!(
            st[..n - 1].iter().all(|s| s.success()),
            "{transports:?}: {st:?}"
        );
        assert!(t.elapsed() < Duration::from_secs(150), "{:?}", t.elapsed());
    }
}

/// A kernel faults on GPU 0 just before a collective of a communicator that spans GPUs 0
/// and 1 in this process: rank 1's part waits for a peer that never comes. No call hangs:
/// rank 0's wait returns ContextLost, rank 1's an error, dropping both communicators
/// returns (an abort while a device is lost), GPU 1 works or reports ContextLost (the fault
/// can reach it through the peer mapping), and the reset of GPU 0 returns within its bound. In a child process (the fault loses GPU 0 for the process).
#[test]
fn a_fault_on_one_gpu_leaves_no_nccl_call_on_the_other_hanging() {
    let _s = serial();
    let _ = devices();
    let helper = workspace_tests::test_child_path(env!("CARGO_BIN_EXE_test_child"));
    let started = Instant::now();
    let mut child = std::process::Command::new(&helper)
        .arg("nccl-peer-fault")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the test child starts");
    while child.try_wait().expect("the child's status").is_none() {
        if started.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("the child still runs after 120 s: a call hangs");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("the child's output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("child stdout:\n{stdout}");
    println!("child stderr:\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "child failed: {}", out.status);
    assert!(stdout.lines().any(|l| l.starts_with("NCCL_PEER_FAULT ")));
}

const FAULT_EXIT: i32 = 42;

/// Registered memory (`ncclCommRegister`) and symmetric windows give the same results as
/// plain memory for all-reduce, all-gather, reduce-scatter and broadcast; a graph that
/// captured collectives on registered memory keeps the registration alive over 1,000
/// replays; a registration dropped under running collectives is deregistered only after
/// them; windows of different sizes are refused on every rank; an abort with registrations
/// live frees them. One process per GPU.
#[test]
fn multi_process_registered_and_symmetric_memory_match_plain_memory() {
    let _s = serial();
    let st = launch("registered", &[], Duration::from_secs(600));
    assert!(st.iter().all(|s| s.success()), "{st:?}");
}

/// One rank of the multi-process tests; started by them (fails when run by hand).
#[test]
#[ignore = "a rank of the multi-process tests, started by them"]
fn rank_worker() {
    let worker = std::env::var(WORKER_VAR).expect("started by a multi-process test");
    let nonblocking = std::env::var_os("CUDARS_NCCL_NONBLOCKING").is_some();
    let config = CommConfig::default()
        .nonblocking(nonblocking)
        .timeout(Duration::from_secs(120));
    let (comm, job) = Communicator::from_env(&config).expect("join the job");
    assert_eq!(comm.rank(), job.rank);
    assert_eq!(comm.size(), job.world_size);
    let stream = Stream::new(&comm.device()).expect("stream");
    let locals = [Local {
        comm: &comm,
        stream: &stream,
    }];
    match worker.as_str() {
        "collectives" => {
            every_type(&locals);
            large(&locals);
            let pair = comm
                .split(Some((comm.rank() / 2) as u32), 0)
                .expect("split")
                .expect("a pair");
            assert_eq!(pair.size(), (comm.size() - comm.rank() / 2 * 2).min(2));
            let pl = [Local {
                comm: &pair,
                stream: &stream,
            }];
            run_case::<f64>(&pl, Kind::AllReduce(ReduceOp::Max), 5000, true, 9);
            println!(
                "rank {} of {}: every collective checked",
                job.rank, job.world_size
            );
        }
        "fault" => fault_rank(comm, &stream),
        "registered" => registered_rank(comm, &stream),
        other => panic!("unknown worker {other}"),
    }
}

fn fault_rank(comm: Communicator, stream: &Stream) {
    let dev = comm.device();
    let count = (64 << 20) / 4;
    let buf = DevicePtr::alloc(&dev, count * 4).unwrap();
    buf.memset(0).unwrap();
    // One healthy collective first: everybody is connected.
    comm.all_reduce_in_place::<f32>(&buf, count, ReduceOp::Sum, stream)
        .unwrap();
    comm.wait(stream, Duration::from_secs(60)).unwrap();
    if comm.rank() == comm.size() - 1 {
        comm.all_reduce_in_place::<f32>(&buf, count, ReduceOp::Sum, stream)
            .unwrap();
        // Gone in the middle of it, without a goodbye.
        std::process::exit(FAULT_EXIT);
    }
    let timeout = Duration::from_secs(20);
    let t = Instant::now();
    let mut outcome = Ok(());
    // A few only: with the peer gone, NCCL's queue of pending work can fill and block the
    // enqueue itself.
    for _ in 0..3 {
        outcome = comm.all_reduce_in_place::<f32>(&buf, count, ReduceOp::Sum, stream);
        if outcome.is_err() {
            break;
        }
    }
    let outcome = outcome.and_then(|()| comm.wait(stream, timeout));
    let waited = t.elapsed();
    match &outcome {
        Err(Error::Timeout { .. } | Error::AsyncError(_) | Error::Nccl(_)) => {}
        other => panic!(
            "rank {}: expected a typed error, got {other:?}",
            comm.rank()
        ),
    }
    assert!(waited < timeout + Duration::from_secs(15), "{waited:?}");
    let rank = comm.rank();
    let aborted_by_wait = comm.is_aborted();
    // An error at issue time leaves the abort to us.
    comm.abort().expect("abort");
    let old_stream = stream.synchronize();
    gpu_still_works(&dev);
    let fresh = Stream::new(&dev).unwrap();
    let b = DevicePtr::alloc(&dev, 1 << 20).unwrap();
    b.memset_async(7, &fresh).unwrap();
    fresh.synchronize().unwrap();
    println!(
        "rank {rank}: FAULT_OK after {waited:?}: {} (aborted by wait: {aborted_by_wait}; old stream after abort: {old_stream:?})",
        outcome.unwrap_err()
    );
}

// ---- captured collectives (#55) ------------------------------------------------------------

/// All-reduce, all-gather, reduce-scatter and broadcast captured in one graph per rank (one
/// thread per GPU), replayed 1,000 times with new inputs: every replay's results right, the
/// pool flat over the replays. Then each communicator is dropped while its graph exists: the
/// graph still replays right (the graph keeps the communicator), and the communicator goes
/// with the graph.
#[test]
fn captured_collectives_replay_new_inputs_and_keep_their_communicator() {
    let _s = serial();
    let devices = devices();
    let n = devices.len();
    let comms = Communicator::init_all(&devices).expect("init_all");
    let count = 4096usize;
    let replays = 1000u32;
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(n));
    let handles: Vec<_> = comms
        .into_iter()
        .enumerate()
        .map(|(rank, comm)| {
            let dev = devices[rank];
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let stream = Stream::new(&dev).unwrap();
                let alloc = |bytes: usize| cudars_mempool::driver::malloc(&stream, bytes).unwrap();
                let (ar_in, ar_out) = (alloc(count * 4), alloc(count * 4));
                let (ag_in, ag_out) = (alloc(count * 4), alloc(count * 4 * n));
                let (rs_in, rs_out) = (alloc(count * 4 * n), alloc(count * 4));
                let bc = alloc(count * 4);
                // NCCL connects lazily at a communicator's first collectives (allocating):
                // run each once before capturing, as PyTorch does.
                comm.all_reduce::<u32>(&ar_in, &ar_out, count, ReduceOp::Sum, &stream)
                    .unwrap();
                comm.all_gather::<u32>(&ag_in, &ag_out, count, &stream)
                    .unwrap();
                comm.reduce_scatter::<u32>(&rs_in, &rs_out, count, ReduceOp::Sum, &stream)
                    .unwrap();
                comm.broadcast_in_place::<u32>(&bc, count, 0, &stream)
                    .unwrap();
                stream.synchronize().unwrap();
                barrier.wait();
                let graph =
                    cudars_graph::capture(&stream, cudars_graph::CaptureMode::ThreadLocal, |s| {
                        let e = cudars_graph::Error::other;
                        comm.all_reduce::<u32>(&ar_in, &ar_out, count, ReduceOp::Sum, s)
                            .map_err(e)?;
                        comm.all_gather::<u32>(&ag_in, &ag_out, count, s)
                            .map_err(e)?;
                        comm.reduce_scatter::<u32>(&rs_in, &rs_out, count, ReduceOp::Sum, s)
                            .map_err(e)?;
                        comm.broadcast_in_place::<u32>(&bc, count, 0, s).map_err(e)
                    })
                    .expect("capture")
                    .instantiate()
                    .expect("instantiate");
                let pool = cudars_mempool::driver::default_pool().unwrap();
                let id = cudars_mempool::driver::device_id(&dev);
                let reserved = || pool.stats(id).unwrap().reserved.current;
                let before = reserved();
                let r = rank as u32;
                let check = |i: u32| {
                    let sum: u32 = (0..n as u32).map(|q| i + q).sum();
                    assert!(
                        read(&ar_out).iter().all(|&v| v == sum),
                        "all-reduce, replay {i}"
                    );
                    let g = read(&ag_out);
                    for q in 0..n {
                        assert!(
                            g[q * count..(q + 1) * count]
                                .iter()
                                .all(|&v| v == i * 10 + q as u32),
                            "all-gather, replay {i}"
                        );
                    }
                    let want: u32 = (0..n as u32).map(|q| i + q + r).sum();
                    assert!(
                        read(&rs_out).iter().all(|&v| v == want),
                        "reduce-scatter, replay {i}"
                    );
                    assert!(
                        read(&bc).iter().all(|&v| v == i + 7),
                        "broadcast, replay {i}"
                    );
                };
                let fill = |i: u32| {
                    ar_in.copy_from_host(&vec![i + r; count]).unwrap();
                    ag_in.copy_from_host(&vec![i * 10 + r; count]).unwrap();
                    // Block q of rank r's input: i + r + q (reduce-scatter sums block q over ranks).
                    let blocks: Vec<u32> =
                        (0..n as u32).flat_map(|q| vec![i + r + q; count]).collect();
                    rs_in.copy_from_host(&blocks).unwrap();
                    bc.copy_from_host(&vec![if rank == 0 { i + 7 } else { 0 }; count])
                        .unwrap();
                };
                for i in 0..replays {
                    fill(i);
                    graph.launch(&stream).unwrap();
                    stream.synchronize().unwrap();
                    check(i);
                }
                let after = reserved();
                // The communicator goes; the graph keeps it and replays right.
                drop(comm);
                barrier.wait();
                fill(replays);
                graph.launch(&stream).unwrap();
                stream.synchronize().unwrap();
                check(replays);
                drop(graph);
                (rank, before, after)
            })
        })
        .collect();
    for h in handles {
        let (rank, before, after) = h.join().expect("rank thread");
        println!("rank {rank}: {replays} replays of the captured collectives, pool reserved {before} -> {after} bytes; replayed after the communicator was dropped");
        assert!(
            after <= before,
            "rank {rank}: reserved grew from {before} to {after}"
        );
    }
}

// ---- registered memory and symmetric windows (#55) -----------------------------------------

/// The buffers of the four collectives, carved from one view at the same offsets on every
/// rank (so symmetric windows line up).
struct Bufs {
    ar_in: DevicePtr,
    ar_out: DevicePtr,
    ag_in: DevicePtr,
    ag_out: DevicePtr,
    rs_in: DevicePtr,
    rs_out: DevicePtr,
    bc: DevicePtr,
}

impl Bufs {
    fn bytes(count: usize, n: usize) -> usize {
        count * 4 * (5 + 2 * n)
    }

    fn carve(base: &DevicePtr, count: usize, n: usize) -> Bufs {
        let mut at = 0usize;
        let mut next = |elems: usize| {
            let v = base.slice(at..at + elems * 4).unwrap();
            at += elems * 4;
            v
        };
        Bufs {
            ar_in: next(count),
            ar_out: next(count),
            ag_in: next(count),
            ag_out: next(count * n),
            rs_in: next(count * n),
            rs_out: next(count),
            bc: next(count),
        }
    }

    fn fill(&self, count: usize, n: usize, rank: u32, i: u32) {
        self.ar_in.copy_from_host(&vec![i + rank; count]).unwrap();
        self.ag_in
            .copy_from_host(&vec![i * 10 + rank; count])
            .unwrap();
        let blocks: Vec<u32> = (0..n as u32)
            .flat_map(|q| vec![i + rank + q; count])
            .collect();
        self.rs_in.copy_from_host(&blocks).unwrap();
        self.bc
            .copy_from_host(&vec![if rank == 0 { i + 7 } else { 0 }; count])
            .unwrap();
    }

    fn issue(&self, comm: &Communicator, count: usize, s: &Stream) -> cudars_nccl::Result<()> {
        comm.all_reduce::<u32>(&self.ar_in, &self.ar_out, count, ReduceOp::Sum, s)?;
        comm.all_gather::<u32>(&self.ag_in, &self.ag_out, count, s)?;
        comm.reduce_scatter::<u32>(&self.rs_in, &self.rs_out, count, ReduceOp::Sum, s)?;
        comm.broadcast_in_place::<u32>(&self.bc, count, 0, s)
    }

    /// The four outputs.
    fn outputs(&self) -> Vec<Vec<u32>> {
        [&self.ar_out, &self.ag_out, &self.rs_out, &self.bc]
            .iter()
            .map(|b| read(b))
            .collect()
    }

    fn check(&self, count: usize, n: usize, rank: u32, i: u32, what: &str) {
        let out = self.outputs();
        let sum: u32 = (0..n as u32).map(|q| i + q).sum();
        assert!(out[0].iter().all(|&v| v == sum), "{what}: all-reduce, {i}");
        for q in 0..n {
            assert!(
                out[1][q * count..(q + 1) * count]
                    .iter()
                    .all(|&v| v == i * 10 + q as u32),
                "{what}: all-gather, {i}"
            );
        }
        let want: u32 = (0..n as u32).map(|q| i + q + rank).sum();
        assert!(
            out[2].iter().all(|&v| v == want),
            "{what}: reduce-scatter, {i}"
        );
        assert!(out[3].iter().all(|&v| v == i + 7), "{what}: broadcast, {i}");
    }
}

fn registered_rank(comm: Communicator, stream: &Stream) {
    use cudars_nccl::register;
    let dev = comm.device();
    let n = comm.size();
    let rank = comm.rank() as u32;
    let wait = |c: &Communicator| c.wait(stream, Duration::from_secs(60)).unwrap();
    let arena = Bufs::bytes(1 << 18, n);

    // Three kinds of memory, the same collectives, the same inputs.
    let plain = DevicePtr::alloc(&dev, arena).unwrap();
    let reg_mem = register::alloc(&dev, arena).unwrap();
    let reg = comm.register(&reg_mem).expect("ncclCommRegister");
    let win_mem = register::alloc(&dev, arena).unwrap();
    let win = match comm.register_window(&win_mem) {
        Ok(w) => w,
        Err(e) => panic!("rank {rank}: ncclCommWindowRegister: {e}"),
    };
    assert_eq!(comm.registrations().live, 2);
    for (count, i) in [(1usize, 1u32), (256, 2), (4099, 3), (1 << 18, 4)] {
        let mut results = Vec::new();
        for (what, base) in [("plain", &plain), ("registered", &reg), ("window", &win)] {
            let b = Bufs::carve(base, count, n);
            b.fill(count, n, rank, i);
            b.issue(&comm, count, stream).unwrap();
            wait(&comm);
            b.check(count, n, rank, i, what);
            results.push(b.outputs());
        }
        assert!(results[1] == results[0] && results[2] == results[0]);
        println!("rank {rank}: {count} elements: plain, registered and window results equal");
    }

    // A graph of the four collectives on registered memory keeps the registration alive.
    let count = 1024;
    let captured_mem = register::alloc(&dev, Bufs::bytes(count, n)).unwrap();
    let graph = {
        let view = comm.register(&captured_mem).unwrap();
        let b = Bufs::carve(&view, count, n);
        b.fill(count, n, rank, 0);
        // NCCL connects lazily: once before capturing.
        b.issue(&comm, count, stream).unwrap();
        wait(&comm);
        cudars_graph::capture(stream, cudars_graph::CaptureMode::ThreadLocal, |s| {
            b.issue(&comm, count, s).map_err(cudars_graph::Error::other)
        })
        .expect("capture")
        .instantiate()
        .expect("instantiate")
    };
    // Only the graph holds the registered view now; fills go through the plain memory.
    assert_eq!(comm.registrations().live, 3);
    let fills = Bufs::carve(&captured_mem, count, n);
    for i in 0..1000u32 {
        fills.fill(count, n, rank, i);
        graph.launch(stream).unwrap();
        stream.synchronize().unwrap();
        fills.check(count, n, rank, i, "captured, registered");
    }
    drop(graph);
    wait(&comm);
    // The graph's keep-alive may go through cuda-core's release thread.
    let t = Instant::now();
    while comm.registrations().live != 2 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(comm.registrations().live, 2);
    println!("rank {rank}: 1000 replays of captured collectives on registered memory right");

    // Dropped under running collectives: deregistered only after them.
    let big = 16usize << 20;
    let busy_mem = register::alloc(&dev, big * 4).unwrap();
    busy_mem.memset(0).unwrap();
    let busy = comm.register(&busy_mem).unwrap();
    busy.copy_from_host(&vec![1.0f32; big]).unwrap();
    for _ in 0..4 {
        comm.all_reduce_in_place::<f32>(&busy, big, ReduceOp::Sum, stream)
            .unwrap();
    }
    drop(busy);
    let small = DevicePtr::alloc(&dev, 4).unwrap();
    // A call of the communicator: the retired registration waits for the collectives above.
    comm.all_reduce_in_place::<f32>(&small, 1, ReduceOp::Sum, stream)
        .unwrap();
    let while_running = comm.registrations();
    wait(&comm);
    let after = comm.registrations();
    let mut host = vec![0f32; big];
    busy_mem.copy_to_host(&mut host).unwrap();
    let want = (n as f32).powi(4);
    assert!(host.iter().all(|&v| v == want), "{} != {want}", host[0]);
    assert_eq!(while_running.retired, 1, "{while_running:?}");
    assert_eq!(after.retired, 0, "{after:?}");
    println!("rank {rank}: a registration dropped under 4 running all-reduces of 64 MiB was deregistered after them ({while_running:?} -> {after:?})");

    // Windows of different sizes: refused on every rank, the communicator still works.
    let odd = register::alloc(&dev, if rank == 0 { 4 << 20 } else { 6 << 20 }).unwrap();
    match comm.register_window(&odd) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("different sizes"), "{m}"),
        other => panic!("rank {rank}: windows of different sizes: {other:?}"),
    }
    small.copy_from_host(&[1.0f32]).unwrap();
    comm.all_reduce_in_place::<f32>(&small, 1, ReduceOp::Sum, stream)
        .unwrap();
    wait(&comm);
    let mut one = [0f32];
    small.copy_to_host(&mut one).unwrap();
    assert_eq!(one[0], n as f32);

    // A pool whose segments are registered as they are made, deregistered before they are
    // freed: by a trim, by out-of-memory recovery, by the pool's drop.
    let (pool, segs) = comm.registered_pool().expect("registered_pool");
    let id = cudars_mempool::driver::device_id(&dev);
    {
        let count = 4099;
        let block: DevicePtr = pool
            .malloc_shared(stream, Bufs::bytes(count, n))
            .unwrap()
            .into();
        let b = Bufs::carve(&block, count, n);
        b.fill(count, n, rank, 5);
        b.issue(&comm, count, stream).unwrap();
        wait(&comm);
        b.check(count, n, rank, 5, "registered pool");
        let big: DevicePtr = pool.malloc_shared(stream, 64 << 20).unwrap().into();
        big.copy_from_host(&vec![2.0f32; 16 << 20]).unwrap();
        comm.all_reduce_in_place::<f32>(&big, 16 << 20, ReduceOp::Sum, stream)
            .unwrap();
        wait(&comm);
        let mut host = vec![0f32; 16 << 20];
        big.copy_to_host(&mut host).unwrap();
        assert!(host.iter().all(|&v| v == 2.0 * n as f32));
        assert!(segs.segments() >= 2, "{segs:?}");
        assert_eq!(segs.registered(), segs.segments(), "{segs:?}");
    }
    // Another thread makes and frees segments (registering and deregistering them) while
    // this one runs collectives on a block of the same pool: the call lock keeps NCCL's
    // calls apart.
    {
        let block: DevicePtr = pool.malloc_shared(stream, 4 << 20).unwrap().into();
        let churn = {
            let (pool, dev) = (Arc::clone(&pool), dev);
            std::thread::spawn(move || {
                let s = Stream::new(&dev).unwrap();
                for i in 0..100usize {
                    let b = pool.malloc_shared(&s, (8 + i % 5) << 20).unwrap();
                    drop(b);
                    s.synchronize().unwrap();
                    if i % 10 == 9 {
                        pool.free_all_blocks().unwrap();
                    }
                }
            })
        };
        for i in 0..200u32 {
            block.copy_from_host(&vec![i; 1 << 20]).unwrap();
            comm.all_reduce_in_place::<u32>(&block, 1 << 20, ReduceOp::Sum, stream)
                .unwrap();
            wait(&comm);
            let got = read(&block);
            assert!(got.iter().all(|&v| v == i * n as u32), "churn round {i}");
        }
        churn.join().expect("the churning thread");
    }
    stream.synchronize().unwrap();
    pool.free_all_blocks().unwrap();
    assert_eq!(segs.segments(), 0, "a trim frees every cached segment");
    pool.set_limit(id, cudars_mempool::Limit::Bytes(96 << 20))
        .unwrap();
    let a: DevicePtr = pool.malloc_shared(stream, 64 << 20).unwrap().into();
    drop(a);
    stream.synchronize().unwrap();
    assert_eq!(segs.segments(), 1);
    // 64 MiB cached + 80 MiB > the 96 MiB limit: recovery frees the cached segment.
    let b2: DevicePtr = pool.malloc_shared(stream, 80 << 20).unwrap().into();
    assert_eq!((segs.segments(), segs.registered()), (1, 1), "{segs:?}");
    b2.copy_from_host(&vec![1.0f32; 20 << 20]).unwrap();
    comm.all_reduce_in_place::<f32>(&b2, 20 << 20, ReduceOp::Sum, stream)
        .unwrap();
    wait(&comm);
    let mut host = vec![0f32; 20 << 20];
    b2.copy_to_host(&mut host).unwrap();
    assert!(host.iter().all(|&v| v == n as f32));
    drop(b2);
    stream.synchronize().unwrap();
    drop(pool);
    let t = Instant::now();
    while segs.segments() != 0 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(segs.segments(), 0, "the pool's drop frees every segment");
    println!("rank {rank}: registered pool: collectives right; segments deregistered and freed by a trim, by out-of-memory recovery and by the pool's drop");

    // An abort with registrations live: their memory goes with the views, no NCCL call;
    // a registered pool's segments are freed without NCCL afterwards.
    let (pool2, segs2) = comm.registered_pool().unwrap();
    let kept: DevicePtr = pool2.malloc_shared(stream, 1 << 20).unwrap().into();
    assert_eq!(segs2.registered(), 1);
    drop(win);
    assert_eq!(comm.registrations().retired_windows, 1);
    comm.abort().expect("abort");
    drop(reg);
    drop(reg_mem);
    kept.memset(3).unwrap();
    drop(kept);
    stream.synchronize().unwrap();
    pool2.free_all_blocks().unwrap();
    assert_eq!(segs2.segments(), 0);
    drop(pool2);
    gpu_still_works(&dev);
    println!("rank {rank}: REGISTERED_OK");
}

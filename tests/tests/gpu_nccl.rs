//! GPU: cuda-nccl on every GPU of the machine (at least 2; with fewer every test fails).
//!
//! * single process (`init_all`, one thread, groups): every collective in place and out of
//!   place, ten element types, 1 / 7 / 4099 / 2^20+3 elements and 256 MiB, checked against a
//!   CPU computation on random data; `split` into communicators of 2; bad input rejected with
//!   typed errors before anything is issued; a receive nobody sends to times out, aborts, and
//!   the GPU stays usable;
//! * multi process (this test binary re-executed once per GPU by `cuda_nccl::Launcher`, each
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
use std::sync::{Mutex, MutexGuard, Once};
use std::time::{Duration, Instant};

use cuda_core::memory::DevicePtr;
use cuda_core::{Device, Stream};
use cuda_nccl::{CommConfig, Communicator, Error, Launcher, ReduceOp, UniqueId};
use tests::nccl_check::{every_type, large, run_case, Kind, Local};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

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
    let (major, minor, _) = cuda_nccl::version().expect("NCCL version");
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

const FAULT_EXIT: i32 = 42;

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

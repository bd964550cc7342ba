//! GPU: sharing device memory between processes (`cudars_core::ipc`, `cudars_mempool::ipc`).
//!
//! Each two-process test re-executes this test binary on itself (`--exact NAME`) with
//! `CUDA_RS_IPC_ROLE` set: the same test function then plays the other process's part, so no
//! test is ignored and none returns early. The child's stdin is one end of a Unix socket
//! pair (file descriptors and go-ahead bytes travel on it); it reports on stdout with lines
//! starting `IPC_CHILD`.
//!
//! * legacy handles and VMM shareable file descriptors: random data of 1 B, odd sizes and
//!   1 GiB; the producer's copy into the shared buffer is queued behind a kernel that waits
//!   for a host flag, and the flag is set only after the consumer has queued its reads (device
//!   copies out of the mapping, behind a wait on the IPC event) and seen the event pending,
//!   so the consumer reads the right bytes only if its stream really waits on the event. The
//!   buffer never passes through the host on its way (the consumer checks a device copy);
//! * pool IPC: a block exported from an IPC pool is not handed to other allocations while
//!   the importer holds it (and the importer's view of it is untouched by them); after the
//!   importer records an IPC event and the exporter releases the block after it, the block
//!   is reused;
//! * bad input: a corrupted handle, this process's own handle, a handle opened twice, the
//!   exporter exiting first, a VMM pool asked to export, a descriptor that is not CUDA
//!   memory: typed errors, no crash, and the process keeps working.
#![cfg(feature = "gpu")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;

use cudars_core::ipc::{self, IpcError, IpcMapping, IpcMemHandle, IpcRegion, SharedMapping};
use cudars_core::memory::{DeviceMemory, DevicePtr, PinnedFlags, PinnedMemory};
use cudars_core::sys::CUdevice_attribute;
use cudars_core::vmm::{self, PhysicalAllocation};
use cudars_core::{Device, Error, Event, IpcEventHandle, Stream};
use cudars_mempool::ipc::import_block;
use cudars_mempool::{DevicePool, PoolError};
use workspace_tests::gpu::{dev0, serial};
use workspace_tests::kernels::Kernels;

const ROLE: &str = "CUDA_RS_IPC_ROLE";
const ARG: &str = "CUDA_RS_IPC_ARG";

/// The role this process plays in test `name`, if it is the child of that test.
fn role() -> Option<String> {
    std::env::var(ROLE).ok()
}

/// Deterministic random bytes (xorshift64*), so both processes know the data.
fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Spawns this binary as the child of test `test` in role `role`, with `arg` in the
/// environment and a socket as its stdin. Returns the child, our end of the socket, and the
/// child's stdout lines.
fn spawn(
    test: &str,
    role: &str,
    arg: &str,
) -> (Child, UnixStream, std::io::Lines<BufReader<ChildStdout>>) {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(ARG, arg)
        .stdin(Stdio::from(OwnedFd::from(theirs)))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    (child, ours, lines)
}

/// The child's end of the socket (its stdin).
fn child_socket() -> UnixStream {
    UnixStream::from(std::io::stdin().as_fd().try_clone_to_owned().unwrap())
}

/// Reads child lines until one contains `IPC_CHILD <key>`; returns the rest of that line.
fn expect_line(lines: &mut std::io::Lines<BufReader<ChildStdout>>, key: &str) -> String {
    let marker = format!("IPC_CHILD {key}");
    for line in lines.by_ref() {
        let line = line.unwrap();
        println!("child: {line}");
        // libtest may print "test NAME ... " before the test's output on the same line.
        if let Some(at) = line.find(&marker) {
            return line[at + marker.len()..].trim().to_string();
        }
    }
    panic!("the child ended without printing {marker:?}");
}

fn finish(mut child: Child, mut lines: std::io::Lines<BufReader<ChildStdout>>) {
    for line in lines.by_ref() {
        println!("child: {}", line.unwrap());
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "child failed: {status}");
}

fn wait_byte(socket: &mut UnixStream) -> u8 {
    let mut b = [0u8; 1];
    socket.read_exact(&mut b).unwrap();
    b[0]
}

/// A mapped pinned `u32` the host sets to release a `wait_flag` kernel.
struct Flag {
    mem: PinnedMemory,
    dev: Device,
}

impl Flag {
    fn new(dev: &Device) -> Flag {
        let mut mem =
            PinnedMemory::new(dev, 4, PinnedFlags::DEVICE_MAP | PinnedFlags::PORTABLE).unwrap();
        mem.as_mut_slice().fill(0);
        Flag { mem, dev: *dev }
    }
    fn dev_ptr(&self) -> u64 {
        self.mem.device_ptr().unwrap()
    }
    fn set(&mut self) {
        let p = self.mem.as_mut_ptr() as *mut u32;
        // SAFETY: 4 live pinned bytes; volatile so the device's poll sees it.
        unsafe { std::ptr::write_volatile(p, 1) };
    }
}

impl Drop for Flag {
    fn drop(&mut self) {
        self.set();
        let _ = self.dev.synchronize();
    }
}

fn cycles_for_ms(dev: &Device, ms: f64) -> u64 {
    let khz = dev
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)
        .unwrap() as f64;
    (khz * ms) as u64
}

// -----------------------------------------------------------------------------------------
// Producer / consumer, both kinds
// -----------------------------------------------------------------------------------------

const SIZES: [usize; 5] = [1, 3, 4097, 1_000_003, 1 << 30];

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Legacy,
    Shareable,
}

/// The producer: buffers of SIZES filled with random data by device copies queued behind a
/// flag-waiting kernel, an IPC event after them; the consumer checks every byte.
fn producer(test: &str, kind: Kind) {
    let _g = serial();
    let dev = dev0();
    let k = Kernels::load(&dev).unwrap();
    let stream = Stream::builder(&dev).non_blocking(true).build().unwrap();
    let mut flag = Flag::new(&dev);
    let event = Event::builder(&dev)
        .disable_timing(true)
        .interprocess(true)
        .build()
        .unwrap();
    // Staging buffers hold the data on the device; the shared buffers start zeroed.
    let mut staging = Vec::new();
    let mut targets = Vec::new();
    let mut fds = Vec::new();
    let mut arg = event.ipc_handle().unwrap().to_hex();
    for (i, &size) in SIZES.iter().enumerate() {
        let data = random_bytes(i as u64 + 1, size);
        let s = DevicePtr::alloc(&dev, size).unwrap();
        s.copy_from_host(&data).unwrap();
        staging.push(s);
        let target = match kind {
            Kind::Legacy => {
                let mem = DeviceMemory::new(&dev, size).unwrap();
                arg.push_str(&format!(",{}:{}", size, mem.ipc_handle().unwrap().to_hex()));
                mem.into_ptr()
            }
            Kind::Shareable => {
                let mapping = SharedMapping::new(&dev, size).unwrap();
                assert!(mapping.size() >= size);
                arg.push_str(&format!(",{}:{}", size, mapping.size()));
                fds.push((mapping.physical().export_fd().unwrap(), mapping.size()));
                mapping.into_ptr().slice(..size).unwrap()
            }
        };
        target.memset(0).unwrap();
        targets.push(target);
    }
    dev.synchronize().unwrap();
    // Queue: wait for the flag, then the copies into the shared buffers, then the event.
    // SAFETY: the flag is mapped pinned memory that outlives the kernel (Flag's Drop sets it
    // and synchronises).
    unsafe { k.wait_flag_raw(&stream, flag.dev_ptr(), cycles_for_ms(&dev, 60_000.0)) }.unwrap();
    for (target, s) in targets.iter().zip(&staging) {
        target.copy_from_device_async(s, &stream).unwrap();
    }
    event.record(&stream).unwrap();
    assert!(!event.query().unwrap(), "the copies ran before the flag");

    let (child, socket, mut lines) = spawn(test, "consumer", &arg);
    for (fd, full) in &fds {
        ipc::send_fd(&socket, fd.as_fd(), *full as u64).unwrap();
    }
    let pending = expect_line(&mut lines, "opened pending=");
    assert_eq!(
        pending, "true",
        "the consumer saw the event complete before the flag"
    );
    assert!(!event.query().unwrap());
    flag.set();
    expect_line(&mut lines, "verified");
    drop(socket);
    finish(child, lines);
    stream.synchronize().unwrap();
}

/// The consumer: opens every buffer and the event, reports the event pending, waits for the
/// go-ahead, makes its stream wait on the event and checks every byte.
fn consumer(kind: Kind) {
    let dev = dev0();
    let arg = std::env::var(ARG).unwrap();
    let mut parts = arg.split(',');
    let event = Event::open_ipc(
        &dev,
        &IpcEventHandle::from_hex(parts.next().unwrap()).unwrap(),
    )
    .unwrap();
    let socket = child_socket();
    let mut views = Vec::new();
    for part in parts {
        let (size, rest) = part.split_once(':').unwrap();
        let size: usize = size.parse().unwrap();
        let view = match kind {
            Kind::Legacy => {
                let handle = IpcMemHandle::from_hex(rest).unwrap();
                let mapping = IpcMapping::open(&dev, &handle).unwrap();
                assert!(mapping.size() >= size);
                DevicePtr::from_arc(mapping).slice(..size).unwrap()
            }
            Kind::Shareable => {
                let (fd, full) = ipc::recv_fd(&socket).unwrap();
                assert_eq!(full, rest.parse::<u64>().unwrap());
                let physical =
                    PhysicalAllocation::import_fd(&dev, fd.as_fd(), full as usize).unwrap();
                SharedMapping::map(&dev, physical)
                    .unwrap()
                    .into_ptr()
                    .slice(..size)
                    .unwrap()
            }
        };
        views.push(view);
    }
    // Queue the reads now, behind the event, while the producer's copies are still held
    // back by its kernel: a stream that did not really wait would copy the zeros.
    let stream = Stream::builder(&dev).non_blocking(true).build().unwrap();
    stream.wait_event(&event).unwrap();
    let mut local = Vec::new();
    for view in &views {
        let copy = DevicePtr::alloc(&dev, view.len()).unwrap();
        copy.copy_from_device_async(view, &stream).unwrap();
        local.push(copy);
    }
    let pending = !event.query().unwrap();
    println!("IPC_CHILD opened pending={pending}");
    stream.synchronize().unwrap(); // returns once the producer has released its copies
    for (i, copy) in local.iter().enumerate() {
        let mut host = vec![0u8; copy.len()];
        copy.copy_to_host(&mut host).unwrap();
        let expected = random_bytes(i as u64 + 1, copy.len());
        let first_bad = host.iter().zip(&expected).position(|(a, b)| a != b);
        assert_eq!(first_bad, None, "buffer {i} ({} bytes) differs", copy.len());
    }
    println!("IPC_CHILD verified");
}

#[test]
fn legacy_handles_share_exact_bytes_ordered_by_an_ipc_event() {
    match role().as_deref() {
        Some("consumer") => consumer(Kind::Legacy),
        _ => producer(
            "legacy_handles_share_exact_bytes_ordered_by_an_ipc_event",
            Kind::Legacy,
        ),
    }
}

#[test]
fn shareable_fds_share_exact_bytes_ordered_by_an_ipc_event() {
    match role().as_deref() {
        Some("consumer") => consumer(Kind::Shareable),
        _ => {
            assert!(
                vmm::is_supported(&dev0()).unwrap(),
                "the device must support virtual memory management"
            );
            producer(
                "shareable_fds_share_exact_bytes_ordered_by_an_ipc_event",
                Kind::Shareable,
            )
        }
    }
}

// -----------------------------------------------------------------------------------------
// Pool IPC
// -----------------------------------------------------------------------------------------

const BLOCK: usize = 1 << 20;
const PATTERN: u32 = 0x5EED_1234;
const IMPORTER_PATTERN: u32 = 0x00DD_BA11;

fn overlaps(a: &DevicePtr, base: u64, len: usize) -> bool {
    a.as_raw() < base + len as u64 && base < a.as_raw() + a.len() as u64
}

fn read_u32s(view: &DevicePtr) -> Vec<u32> {
    let mut host = vec![0u32; view.len() / 4];
    view.copy_to_host(&mut host).unwrap();
    host
}

#[test]
fn pool_block_stays_out_of_reuse_while_imported_and_is_reused_after() {
    pool_block_test(
        "pool_block_stays_out_of_reuse_while_imported_and_is_reused_after",
        Kind::Legacy,
    );
}

/// The same with a pool of shareable virtual-memory segments: the block travels as its
/// segment's file descriptor.
#[test]
fn a_shareable_pool_block_travels_as_a_file_descriptor_with_the_same_rules() {
    pool_block_test(
        "a_shareable_pool_block_travels_as_a_file_descriptor_with_the_same_rules",
        Kind::Shareable,
    );
}

/// What the exporter of `pool_block_test` hands over, and how it releases.
enum Exported {
    Legacy(cudars_mempool::ipc::ExportedBlock),
    Fd(cudars_mempool::ipc::ExportedFdBlock),
}

impl Exported {
    fn view(&self) -> &DevicePtr {
        match self {
            Exported::Legacy(b) => b.view(),
            Exported::Fd(b) => b.view(),
        }
    }
    fn release_after(self, stream: &Stream, done: &Event) {
        match self {
            Exported::Legacy(b) => b.release_after(stream, done).unwrap(),
            Exported::Fd(b) => b.release_after(stream, done).unwrap(),
        }
    }
}

fn pool_block_test(test: &'static str, kind: Kind) {
    if role().as_deref() == Some("importer") {
        let dev = dev0();
        let mut socket = child_socket();
        let view = match kind {
            Kind::Legacy => {
                let region = IpcRegion::from_hex(&std::env::var(ARG).unwrap()).unwrap();
                import_block(&dev, &region).unwrap()
            }
            Kind::Shareable => {
                let region =
                    cudars_mempool::ipc::FdRegion::from_hex(&std::env::var(ARG).unwrap()).unwrap();
                let (fd, _) = ipc::recv_fd(&socket).unwrap();
                cudars_mempool::ipc::import_block_fd(&dev, fd.as_fd(), &region).unwrap()
            }
        };
        assert_eq!(view.len(), BLOCK);
        assert!(read_u32s(&view).iter().all(|&x| x == PATTERN));
        println!("IPC_CHILD imported");
        wait_byte(&mut socket); // the exporter has allocated and written other blocks
        assert!(
            read_u32s(&view).iter().all(|&x| x == PATTERN),
            "another allocation wrote into the imported block"
        );
        // Last use: write our own pattern, then record an IPC event after it.
        let stream = Stream::builder(&dev).non_blocking(true).build().unwrap();
        view.memset_u32_async(IMPORTER_PATTERN, &stream).unwrap();
        let done = Event::builder(&dev)
            .disable_timing(true)
            .interprocess(true)
            .build()
            .unwrap();
        done.record(&stream).unwrap();
        println!("IPC_CHILD done {}", done.ipc_handle().unwrap().to_hex());
        wait_byte(&mut socket); // the exporter opened the event
        drop(view); // closes the mapping (after synchronising)
        println!("IPC_CHILD closed");
        return;
    }
    let _g = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let (pool, block, arg) = match kind {
        Kind::Legacy => {
            let pool = Arc::new(DevicePool::new_ipc().unwrap());
            assert!(pool.can_export(&dev).unwrap());
            let block = pool.malloc_ipc(&stream, BLOCK).unwrap();
            let region = block.region();
            assert_eq!(region.len, BLOCK as u64);
            (pool, Exported::Legacy(block), region.to_hex())
        }
        Kind::Shareable => {
            let pool = Arc::new(DevicePool::new_shareable().unwrap());
            let block = pool.malloc_fd(&stream, BLOCK).unwrap();
            let region = block.region();
            assert_eq!(region.len, BLOCK as u64);
            assert!(region.offset + region.len <= region.segment_size);
            (pool, Exported::Fd(block), region.to_hex())
        }
    };
    let (base, len) = (block.view().as_raw(), block.view().len());
    block.view().memset_u32_async(PATTERN, &stream).unwrap();
    stream.synchronize().unwrap();

    let (child, mut socket, mut lines) = spawn(test, "importer", &arg);
    if let Exported::Fd(b) = &block {
        ipc::send_fd(&socket, b.fd(), 0).unwrap();
    }
    expect_line(&mut lines, "imported");
    // While the importer holds it, no allocation gets the block's memory.
    let mut others = Vec::new();
    for _ in 0..64 {
        let other: DevicePtr = pool.malloc_shared(&stream, BLOCK).unwrap().into();
        assert!(
            !overlaps(&other, base, len),
            "an allocation got the exported block"
        );
        other.memset_async(0xFF, &stream).unwrap();
        others.push(other);
    }
    stream.synchronize().unwrap();
    drop(others);
    socket.write_all(&[1]).unwrap();
    let hex = expect_line(&mut lines, "done");
    let done = Event::open_ipc(&dev, &IpcEventHandle::from_hex(&hex).unwrap()).unwrap();
    socket.write_all(&[1]).unwrap();
    let view = block.view().clone();
    block.release_after(&stream, &done);
    stream.synchronize().unwrap();
    assert!(
        read_u32s(&view).iter().all(|&x| x == IMPORTER_PATTERN),
        "the importer's write is not visible to the exporter"
    );
    drop(view);
    expect_line(&mut lines, "closed");
    finish(child, lines);
    // Released: the block's memory goes to new allocations again.
    let mut again = Vec::new();
    let mut reused = false;
    for _ in 0..80 {
        let a: DevicePtr = pool.malloc_shared(&stream, BLOCK).unwrap().into();
        reused |= overlaps(&a, base, len);
        again.push(a);
        if reused {
            break;
        }
    }
    assert!(reused, "the released block was never reused");
}

#[test]
fn a_vmm_pool_cannot_export_and_says_so() {
    let _g = serial();
    let dev = dev0();
    assert!(
        vmm::is_supported(&dev).unwrap(),
        "the device must support VMM"
    );
    let stream = Stream::new(&dev).unwrap();
    let pool = Arc::new(DevicePool::new_driver().unwrap());
    assert!(!pool.can_export(&dev).unwrap());
    let err = pool.malloc_ipc(&stream, 4096).unwrap_err();
    println!("{err}");
    assert!(matches!(err, PoolError::NotExportable { .. }), "{err}");
    // The same through a block of it: the driver refuses a legacy handle for VMM memory.
    let view: DevicePtr = pool.malloc_shared(&stream, 4096).unwrap().into();
    let err = ipc::export_view(&view).unwrap_err();
    println!("{err}");
    assert!(
        matches!(err, Error::Ipc(IpcError::NotExportable(_))),
        "{err}"
    );
    // An IPC pool refuses empty blocks.
    let ipc_pool = Arc::new(DevicePool::new_ipc().unwrap());
    assert!(matches!(
        ipc_pool.malloc_ipc(&stream, 0),
        Err(PoolError::NotExportable { .. })
    ));
    still_works(&dev);
}

// -----------------------------------------------------------------------------------------
// Bad input
// -----------------------------------------------------------------------------------------

/// Allocates, writes and reads back: the process's CUDA state is fine.
fn still_works(dev: &Device) {
    let buf = DevicePtr::alloc(dev, 4096).unwrap();
    buf.memset(0x3C).unwrap();
    let mut host = vec![0u8; 4096];
    buf.copy_to_host(&mut host).unwrap();
    assert!(host.iter().all(|&b| b == 0x3C));
}

#[test]
fn corrupted_handles_are_typed_errors() {
    let _g = serial();
    let dev = dev0();
    for bytes in [[0u8; 64], [0xAB; 64]] {
        let err = IpcMapping::open(&dev, &IpcMemHandle(bytes)).unwrap_err();
        println!("{err}");
        assert!(
            matches!(err, Error::Ipc(IpcError::InvalidHandle { .. })),
            "{err}"
        );
    }
    let mut random = [0u8; 64];
    random.copy_from_slice(&random_bytes(99, 64));
    let err = IpcRegion {
        handle: IpcMemHandle(random),
        offset: 0,
        len: 16,
    }
    .open(&dev)
    .unwrap_err();
    assert!(
        matches!(err, Error::Ipc(IpcError::InvalidHandle { .. })),
        "{err}"
    );
    still_works(&dev);
}

#[test]
fn a_handle_of_this_process_is_refused_with_a_clear_error() {
    let _g = serial();
    let dev = dev0();
    let mem = DeviceMemory::new(&dev, 4096).unwrap();
    let handle = mem.ipc_handle().unwrap();
    let err = IpcMapping::open(&dev, &handle).unwrap_err();
    println!("{err}");
    assert!(
        matches!(err, Error::Ipc(IpcError::SameProcess { .. })),
        "{err}"
    );
    assert!(err.to_string().contains("this process"));
    // Empty memory has nothing to export.
    let empty = DeviceMemory::new(&dev, 0).unwrap();
    assert!(matches!(
        empty.ipc_handle(),
        Err(Error::Ipc(IpcError::NotExportable(_)))
    ));
    still_works(&dev);
}

#[test]
fn a_handle_opened_twice_and_an_exporter_that_exits_first() {
    const TEST: &str = "a_handle_opened_twice_and_an_exporter_that_exits_first";
    if role().as_deref() == Some("exporter") {
        let dev = dev0();
        let kept = DeviceMemory::new(&dev, 1 << 20).unwrap();
        let handle = kept.ipc_handle().unwrap();
        let kept = kept.into_ptr();
        kept.memset(0x42).unwrap();
        dev.synchronize().unwrap();
        println!("IPC_CHILD handle {}", handle.to_hex());
        let mut socket = child_socket();
        wait_byte(&mut socket); // then exit, freeing everything
        println!("IPC_CHILD exiting");
        return;
    }
    let _g = serial();
    let dev = dev0();
    let (child, mut socket, mut lines) = spawn(TEST, "exporter", "");
    let handle = IpcMemHandle::from_hex(&expect_line(&mut lines, "handle")).unwrap();
    let first = IpcMapping::open(&dev, &handle).unwrap();
    let err = IpcMapping::open(&dev, &handle).unwrap_err();
    println!("{err}");
    assert!(matches!(err, Error::Ipc(IpcError::AlreadyOpen)), "{err}");
    let shared = IpcMapping::open_shared(&dev, &handle).unwrap();
    assert_eq!(shared.as_raw(), first.as_raw());
    let view = DevicePtr::from_arc(shared);
    let mut host = vec![0u8; view.len()];
    view.copy_to_host(&mut host).unwrap();
    assert!(host.iter().all(|&b| b == 0x42));
    drop((view, first));
    // Closed: it opens again.
    let again = IpcMapping::open(&dev, &handle).unwrap();
    drop(again);
    // The exporter exits; its handle is stale.
    socket.write_all(&[1]).unwrap();
    expect_line(&mut lines, "exiting");
    finish(child, lines);
    let err = IpcMapping::open(&dev, &handle).unwrap_err();
    println!("stale handle: {err}");
    assert!(
        matches!(err, Error::Ipc(IpcError::InvalidHandle { .. })),
        "{err}"
    );
    still_works(&dev);
}

#[test]
fn shareable_handles_refuse_bad_input() {
    let _g = serial();
    let dev = dev0();
    assert!(
        vmm::is_supported(&dev).unwrap(),
        "the device must support VMM"
    );
    let page = vmm::granularity(&dev, vmm::Granularity::Minimum).unwrap();
    // Made without the POSIX handle type: nothing to export.
    let plain = PhysicalAllocation::new(&dev, page).unwrap();
    let err = plain.export_fd().unwrap_err();
    println!("{err}");
    assert!(
        matches!(err, Error::Ipc(IpcError::NotExportable(_))),
        "{err}"
    );
    // A descriptor that is not CUDA memory.
    let null = std::fs::File::open("/dev/null").unwrap();
    let err = PhysicalAllocation::import_fd(&dev, null.as_fd(), page).unwrap_err();
    println!("{err}");
    assert!(
        matches!(err, Error::Ipc(IpcError::InvalidHandle { .. })),
        "{err}"
    );
    // In one process, an exported descriptor imports and maps (the same memory twice).
    let mapping = SharedMapping::new(&dev, 3).unwrap();
    let fd = mapping.physical().export_fd().unwrap();
    let twin = SharedMapping::map(
        &dev,
        PhysicalAllocation::import_fd(&dev, fd.as_fd(), mapping.size()).unwrap(),
    )
    .unwrap()
    .into_ptr();
    let view = mapping.into_ptr();
    view.memset(0x77).unwrap();
    dev.synchronize().unwrap();
    let mut host = vec![0u8; twin.len()];
    twin.copy_to_host(&mut host).unwrap();
    assert!(host.iter().all(|&b| b == 0x77));
    still_works(&dev);
}

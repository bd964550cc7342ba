//! The seed's graph usage in Rust: capture a sequence of operations on a stream
//! (`capture_begin` … `capture_end`), then launch (replay) it.
//!
//! CuPy:
//!
//! ```python
//! graph = cupy.cuda.Graph()
//! graph.capture_begin(stream)
//! ... operations on stream ...
//! graph.capture_end(stream)
//! graph.launch(stream)
//! ```
//!
//! Here the guard returned by `capture_begin` is the open capture; `end()` gives the graph,
//! which is instantiated once and launched as often as wanted. The closure form does the same
//! and cannot forget the end. Run with `cargo run --example graph_basics`.

mod common;
use common::println;

use cudars_core::{memory::DevicePtr, Device, Stream};
use cudars_graph::{CaptureMode, CaptureStatus};

const N: usize = 1 << 20;

fn main() {
    if let Err(e) = run() {
        eprintln!("graph_basics: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), cudars_graph::Error> {
    let dev = Device::new(0)?;
    let stream = Stream::new(&dev)?;
    let a = DevicePtr::alloc(&dev, N * 4)?;
    let b = DevicePtr::alloc(&dev, N * 4)?;
    println!("device 0: {}", dev.name()?);

    // capture_begin ... capture_end
    let capture = cudars_graph::capture_begin(&stream, CaptureMode::Global)?;
    println!(
        "capturing: {} ({})",
        capture.id(),
        cudars_graph::capture_status(&stream)?.status
    );
    a.memset_u32_async(0x1234_5678, &capture)?;
    b.copy_from_device_async(&a, &capture)?;
    let graph = capture.end()?;
    println!(
        "captured {} nodes; the stream is {} again",
        graph.node_count()?,
        cudars_graph::capture_status(&stream)?.status
    );

    // Nothing ran during the capture: b is still whatever it was. Launch, then look.
    let exec = graph.instantiate()?;
    exec.upload(&stream)?;
    exec.launch(&stream)?;
    stream.synchronize()?;
    let mut host = vec![0u32; N];
    b.copy_to_host(&mut host)?;
    assert!(host.iter().all(|&x| x == 0x1234_5678));
    println!("after launch: b[0] = {:#x}, all {N} words match", host[0]);

    // The same with the closure form, which always ends the capture.
    let graph2 = cudars_graph::capture(&stream, CaptureMode::ThreadLocal, |s| {
        b.memset_u32_async(7, s)?;
        Ok(())
    })?;
    graph2.instantiate()?.launch(&stream)?;
    stream.synchronize()?;
    b.copy_to_host(&mut host)?;
    assert!(host.iter().all(|&x| x == 7));
    println!("closure form: b[0] = {}", host[0]);

    // A DOT file of the first graph, for `dot -Tsvg`.
    let dot = std::env::temp_dir().join("graph_basics.dot");
    graph.write_dot(&dot, true)?;
    println!("graph written to {}", dot.display());

    // An illegal call inside a capture: the error names the capture, and the stream is usable.
    #[allow(
        clippy::expect_used,
        reason = "the example shows a refusal; a success would be a bug to report loudly"
    )]
    let err = cudars_graph::capture(&stream, CaptureMode::ThreadLocal, |s| {
        a.memset_u32_async(1, s)?;
        s.synchronize()?; // not allowed while capturing
        Ok(())
    })
    .expect_err("synchronize inside a capture is refused");
    println!("as expected: {err}");
    assert_eq!(
        cudars_graph::capture_status(&stream)?.status,
        CaptureStatus::None
    );
    a.memset_u32_async(3, &stream)?;
    stream.synchronize()?;
    println!("the stream works normally after the failed capture");
    Ok(())
}

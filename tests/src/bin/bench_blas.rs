//! `bench_blas`: `cuda-blas` on the GPU, beside PyTorch and CuPy from the same run.
//!
//! - GEMM TFLOP/s at 4096^3 and 8192^3 for bf16, f16, tf32 and f32, and a batch of
//!   64 x 512^3 (bf16 and f32): the median of 15 timed runs (CUDA events) after 3 warm-ups;
//! - small-GEMM issue cost (64^3 f32, batches of 200 back to back, the stream synchronised
//!   between batches), host ns per call: ours
//!   (`Gemm::run`, the cached handle) against a bare `cublasGemmEx` on one handle with the same
//!   stream and workspace; 41 rounds in alternating order, median ratio of the rounds;
//! - a captured graph of 100 GEMMs (512^3 bf16), replay time.
//!
//! `blas_peers.py` writes the peers' figures for the same rows as `name value` lines to a
//! file: the one named by the first argument, else this binary runs the bundle's script first
//! (`$CUDA_RS_BUNDLE_DIR/blas_peers.py`). Each row prints ours, each peer's, and the ratio.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "benchmark code: a failed check panics with its message"
)]

use std::collections::HashMap;
use std::ffi::c_void;
use std::time::Instant;

use cudars_blas::{bf16, f16, Element, Gemm, Mat, MathMode, StridedBatch};
use cudars_blas_sys::{cublas, cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t};
use cudars_core::{DevicePtr, Event, Stream};
use cudars_graph::CaptureMode;

fn peers(path: Option<String>) -> HashMap<String, f64> {
    let Some(path) = path else {
        return HashMap::new();
    };
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.trim().to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

fn row(peers: &HashMap<String, f64>, name: &str, ours: f64, unit: &str, higher_is_better: bool) {
    let keys = [format!("torch {name}"), format!("cupy {name}")];
    let mut line = format!("{name}: ours {ours:.3} {unit}");
    for k in &keys {
        if let Some(p) = peers.get(k) {
            let ratio = if higher_is_better { ours / p } else { p / ours };
            line.push_str(&format!(
                " | {} {p:.3} {unit} (ours/peer {ratio:.3}{})",
                k.split(' ').next().unwrap_or(""),
                if higher_is_better {
                    ""
                } else {
                    ", inverted: peer/ours"
                }
            ));
        }
    }
    println!("{line}");
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn alloc<T: Element>(stream: &Stream, n: usize) -> DevicePtr {
    let p = cudars_mempool::driver::malloc(stream, n * std::mem::size_of::<T>()).unwrap();
    p.memset_async(0, stream).unwrap();
    p
}

/// Median seconds of `f` over 15 runs timed by events, after 3 warm-ups.
fn timed(stream: &Stream, mut f: impl FnMut()) -> f64 {
    let dev = stream.device();
    for _ in 0..3 {
        f();
    }
    let mut t = Vec::new();
    for _ in 0..15 {
        let (a, b) = (Event::timed(&dev).unwrap(), Event::timed(&dev).unwrap());
        a.record(stream).unwrap();
        f();
        b.record(stream).unwrap();
        b.synchronize().unwrap();
        t.push(Event::elapsed_ms(&a, &b).unwrap() as f64 / 1e3);
    }
    median(&mut t)
}

fn gemm_tflops<T: Element>(
    stream: &Stream,
    n: usize,
    math: MathMode,
    alpha: T::Scalar,
    beta: T::Scalar,
) -> f64 {
    let (a, b, c) = (
        alloc::<T>(stream, n * n),
        alloc::<T>(stream, n * n),
        alloc::<T>(stream, n * n),
    );
    let g = Gemm::new(
        Mat::<T>::col_major(&a, n, n),
        Mat::col_major(&b, n, n),
        Mat::col_major(&c, n, n),
    )
    .math(math)
    .alpha(alpha)
    .beta(beta);
    let s = timed(stream, || g.run(stream).unwrap());
    2.0 * (n as f64).powi(3) / s / 1e12
}

fn batched_tflops<T: Element>(stream: &Stream, math: MathMode) -> f64 {
    let (n, batch) = (512, 64);
    let (a, b, c) = (
        alloc::<T>(stream, n * n * batch),
        alloc::<T>(stream, n * n * batch),
        alloc::<T>(stream, n * n * batch),
    );
    let g = Gemm::new(
        Mat::<T>::col_major(&a, n, n),
        Mat::col_major(&b, n, n),
        Mat::col_major(&c, n, n),
    )
    .math(math);
    let st = StridedBatch {
        a: n * n,
        b: n * n,
        c: n * n,
    };
    let s = timed(stream, || g.run_strided_batched(stream, batch, st).unwrap());
    2.0 * (n as f64).powi(3) * batch as f64 / s / 1e12
}

/// The peers' file: the first argument, else `blas_peers.py` of the bundle run now into a
/// temporary file (when `$CUDA_RS_BUNDLE_DIR` has it and `python3` runs).
fn peers_file() -> Option<String> {
    if let Some(p) = std::env::args().nth(1) {
        return Some(p);
    }
    let dir = std::env::var("CUDA_RS_BUNDLE_DIR").ok()?;
    let script = std::path::Path::new(&dir).join("blas_peers.py");
    if !script.is_file() {
        return None;
    }
    let out = std::env::temp_dir().join(format!("blas_peers_{}.txt", std::process::id()));
    let status = std::process::Command::new("python3")
        .arg(&script)
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .status()
        .ok()?;
    status.success().then(|| out.to_string_lossy().into_owned())
}

fn batched_lt_tflops<T: Element>(stream: &Stream) -> f64 {
    let (n, batch) = (512, 64);
    let (a, b, c) = (
        alloc::<T>(stream, n * n * batch),
        alloc::<T>(stream, n * n * batch),
        alloc::<T>(stream, n * n * batch),
    );
    let g = cudars_blas::LtMatmul::new(
        Mat::<T>::col_major(&a, n, n),
        Mat::col_major(&b, n, n),
        Mat::col_major(&c, n, n),
    );
    let st = StridedBatch {
        a: n * n,
        b: n * n,
        c: n * n,
    };
    let s = timed(stream, || g.run_strided_batched(stream, batch, st).unwrap());
    2.0 * (n as f64).powi(3) * batch as f64 / s / 1e12
}

fn main() {
    let peers = peers(peers_file());
    let dev = cudars_core::Device::new(0).unwrap();
    let stream = Stream::new(&dev).unwrap();
    println!(
        "bench_blas on {} (cuBLAS {})",
        dev.name().unwrap_or_default(),
        cudars_blas_sys::cublas()
            .map(|l| l.path().to_string())
            .unwrap_or_default()
    );
    for n in [4096usize, 8192] {
        row(
            &peers,
            &format!("gemm {n}^3 bf16 TFLOP/s"),
            gemm_tflops::<bf16>(&stream, n, MathMode::Default, 1.0, 0.0),
            "TFLOP/s",
            true,
        );
        row(
            &peers,
            &format!("gemm {n}^3 f16 TFLOP/s"),
            gemm_tflops::<f16>(&stream, n, MathMode::Default, 1.0, 0.0),
            "TFLOP/s",
            true,
        );
        row(
            &peers,
            &format!("gemm {n}^3 tf32 TFLOP/s"),
            gemm_tflops::<f32>(&stream, n, MathMode::Tf32, 1.0, 0.0),
            "TFLOP/s",
            true,
        );
        row(
            &peers,
            &format!("gemm {n}^3 f32 TFLOP/s"),
            gemm_tflops::<f32>(&stream, n, MathMode::Default, 1.0, 0.0),
            "TFLOP/s",
            true,
        );
    }
    row(
        &peers,
        "batched 64x512^3 bf16 TFLOP/s",
        batched_tflops::<bf16>(&stream, MathMode::Default),
        "TFLOP/s",
        true,
    );
    row(
        &peers,
        "batched 64x512^3 f32 TFLOP/s",
        batched_tflops::<f32>(&stream, MathMode::Default),
        "TFLOP/s",
        true,
    );
    println!(
        "batched 64x512^3 bf16 through cuBLASLt: {:.3} TFLOP/s",
        batched_lt_tflops::<bf16>(&stream)
    );
    println!(
        "batched 64x512^3 f32 through cuBLASLt: {:.3} TFLOP/s",
        batched_lt_tflops::<f32>(&stream)
    );

    // Small GEMM issue cost: ours against bare cublasGemmEx calls on the same handle (the
    // stream's cached one, through with_raw_handle: locked once for the whole batch).
    let n = 64;
    let (a, b, c) = (
        alloc::<f32>(&stream, n * n),
        alloc::<f32>(&stream, n * n),
        alloc::<f32>(&stream, n * n),
    );
    let g = Gemm::new(
        Mat::<f32>::col_major(&a, n, n),
        Mat::col_major(&b, n, n),
        Mat::col_major(&c, n, n),
    );
    g.run(&stream).unwrap();
    let lib = cublas().unwrap();
    let (alpha, beta) = (1f32, 0f32);
    // 200 calls a batch: under the driver's launch queue, so the host times only the issue.
    let batch = 200;
    let ours = || {
        stream.synchronize().unwrap();
        let t = Instant::now();
        for _ in 0..batch {
            g.run(&stream).unwrap();
        }
        let e = t.elapsed().as_nanos() as f64 / batch as f64;
        stream.synchronize().unwrap();
        e
    };
    let bare = || {
        stream.synchronize().unwrap();
        let e = cudars_blas::handle::with_raw_handle(&stream, |h, _issue| {
            let t = Instant::now();
            for _ in 0..batch {
                // SAFETY: valid 64x64 f32 matrices of the handle's device (marked by the runs
                // of `g` above on this stream), host scalars, the handle's own stream.
                let s = unsafe {
                    lib.cublasGemmEx(
                        h,
                        cublasOperation_t::CUBLAS_OP_N,
                        cublasOperation_t::CUBLAS_OP_N,
                        n as i32,
                        n as i32,
                        n as i32,
                        (&alpha as *const f32).cast(),
                        a.as_raw() as *const c_void,
                        f32::DATA_TYPE,
                        n as i32,
                        b.as_raw() as *const c_void,
                        f32::DATA_TYPE,
                        n as i32,
                        (&beta as *const f32).cast(),
                        c.as_raw() as *mut c_void,
                        f32::DATA_TYPE,
                        n as i32,
                        cublasComputeType_t::CUBLAS_COMPUTE_32F,
                        cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                    )
                };
                assert!(s.unwrap().is_success());
            }
            t.elapsed().as_nanos() as f64 / batch as f64
        })
        .unwrap();
        stream.synchronize().unwrap();
        e
    };
    for _ in 0..3 {
        ours();
        bare();
    }
    let (mut o, mut r, mut q) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..41 {
        let (x, y) = if i % 2 == 0 {
            let x = ours();
            (x, bare())
        } else {
            let y = bare();
            (ours(), y)
        };
        o.push(x);
        r.push(y);
        q.push(x / y);
    }
    let (om, rm, qm) = (median(&mut o), median(&mut r), median(&mut q));
    row(&peers, "small gemm 64^3 f32 issue ns/call", om, "ns", false);
    println!("small gemm 64^3 f32 issue: ours {om:.0} ns, bare cublasGemmEx on the same handle {rm:.0} ns, ours/bare {qm:.3} (median of 41 rounds' ratios; q1 {:.3} q3 {:.3})", q[q.len() / 4], q[3 * q.len() / 4]);

    // 100 GEMMs captured into one graph, replayed.
    let n = 512;
    let (a, b) = (alloc::<bf16>(&stream, n * n), alloc::<bf16>(&stream, n * n));
    let cs: Vec<DevicePtr> = (0..100).map(|_| alloc::<bf16>(&stream, n * n)).collect();
    stream.synchronize().unwrap();
    let graph = cudars_graph::capture(&stream, CaptureMode::ThreadLocal, |s| {
        for c in &cs {
            Gemm::new(
                Mat::<bf16>::col_major(&a, n, n),
                Mat::col_major(&b, n, n),
                Mat::col_major(c, n, n),
            )
            .run(s)
            .map_err(cudars_graph::Error::other)?;
        }
        Ok(())
    })
    .unwrap();
    let exec = graph.instantiate().unwrap();
    let s = timed(&stream, || exec.launch(&stream).unwrap());
    row(
        &peers,
        "graph of 100 gemm 512^3 bf16 replay us",
        s * 1e6,
        "us",
        false,
    );
}

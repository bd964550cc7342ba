//! `bench_sparse`: `cuda-sparse`'s SpMV beside (through `sparse_peers.py`) PyTorch and CuPy.
//!
//! Row: `spmv csr 1e8 nnz f32`: `y = A x` with `A` a 10^6 x 10^6 CSR matrix of 100 nonzeros
//! per row (10^8 nonzeros, i32 indices, f32 values), one column drawn at random in each of
//! the 100 equal bands of columns (so each row's columns are sorted and distinct); ms per
//! product, the median of 50 (CUDA events around each call on the stream) after 5 warm-up
//! calls. About 0.8 GB of device memory.
//!
//! A second line gives what building the matrix cost on the host side: the structure check
//! of `CsrMatrix::from_host` over the 10^8 indices and their upload.
//!
//! `sparse_peers.py` prints `torch` (`torch.mv` on a `torch.sparse_csr_tensor`) and `cupy`
//! (`cupyx.scipy.sparse.csr_matrix @ x`) for the same row, on a matrix of the same shape.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "benchmark code: a failed check panics with its message"
)]

use std::time::Instant;

use cudars_core::{Device, DevicePtr, Event, Stream};
use cudars_sparse::{CsrMatrix, DnVec, Op, Sparse};
use workspace_tests::bench::median;
use workspace_tests::rtc::Rng;

const ROWS: usize = 1_000_000;
const PER_ROW: usize = 100;
const BAND: usize = ROWS / PER_ROW;

fn ones(stream: &Stream, n: usize) -> DevicePtr {
    let p = cudars_mempool::driver::malloc(stream, n * 4).unwrap();
    p.memset_u32_async(1f32.to_bits(), stream).unwrap();
    p
}

fn main() {
    let dev = Device::new(0).unwrap();
    let stream = Stream::new(&dev).unwrap();
    let nnz = ROWS * PER_ROW;
    // The structure on the host: row i holds columns b * BAND + r_b, b = 0..100.
    let t0 = Instant::now();
    let offsets: Vec<i32> = (0..=ROWS).map(|i| (i * PER_ROW) as i32).collect();
    let mut rng = Rng::new(1);
    let mut cols = Vec::with_capacity(nnz);
    for _ in 0..ROWS {
        for b in 0..PER_ROW {
            cols.push((b * BAND) as i32 + (rng.next_u64() % BAND as u64) as i32);
        }
    }
    let generated = t0.elapsed().as_secs_f64() * 1e3;
    let values = ones(&stream, nnz);
    stream.synchronize().unwrap();
    let t0 = Instant::now();
    let a = CsrMatrix::<f32>::from_host(ROWS, ROWS, &offsets, &cols, &values).unwrap();
    let built = t0.elapsed().as_secs_f64() * 1e3;
    drop((offsets, cols));
    let x = ones(&stream, ROWS);
    let y = ones(&stream, ROWS);
    let mut sparse = Sparse::new(&stream).unwrap();
    let mut spmv = || {
        sparse
            .spmv(
                Op::N,
                1.0,
                &a,
                DnVec::new(&x, ROWS),
                0.0,
                DnVec::new(&y, ROWS),
            )
            .unwrap();
    };
    for _ in 0..5 {
        spmv();
    }
    stream.synchronize().unwrap();
    let mut t = Vec::new();
    for _ in 0..50 {
        let s = stream.record_timed().unwrap();
        spmv();
        let e = stream.record_timed().unwrap();
        e.synchronize().unwrap();
        t.push(f64::from(Event::elapsed_ms(&s, &e).unwrap()));
    }
    // Every row sums 100 ones.
    let mut head = [0f32; 4];
    y.slice(..16).unwrap().copy_to_host(&mut head).unwrap();
    assert_eq!(head, [100.0; 4]);
    println!("spmv csr 1e8 nnz f32: ours {:.4} ms", median(&mut t));
    println!(
        "spmv csr 1e8 nnz f32 setup: host structure {generated:.0} ms, CsrMatrix::from_host (check + upload) {built:.0} ms"
    );
}

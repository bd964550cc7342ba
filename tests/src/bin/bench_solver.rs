//! bench_solver: cuSOLVER's dense routines through `cuda-solver` on the rows; the
//! peers (`torch.linalg`, `cupy.linalg`) print theirs from `solver_peers.py` in the same run
//! (`run.sh solver-bench`).
//!
//! Rows (f32, 4096 x 4096, ms of host wall time per call, the median of 5 after a warm-up;
//! each call waits for its result, as the peers' do: ours read `info`, theirs check it):
//! * `cholesky 4096`: the factor of a symmetric positive definite matrix, out of place (a
//!   device copy of the input, then `potrf`; torch's `linalg.cholesky` and cupy's
//!   `linalg.cholesky` copy too);
//! * `svd 4096`: singular values and both singular-vector matrices; ours by `gesvd` (QR
//!   iteration, CuPy's choice) and by `gesvdj` (Jacobi), each on a fresh copy of the input.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "benchmark code: a failed check panics with its message"
)]

use std::time::Instant;

use cudars_core::{DevicePtr, Stream};
use cudars_solver::{Jacobi, Matrix, Solver, Uplo};
use workspace_tests::bench::median;
use workspace_tests::rtc::Rng;

fn upload(stream: &Stream, host: &[f32]) -> DevicePtr {
    let p = cudars_mempool::driver::malloc(stream, std::mem::size_of_val(host)).unwrap();
    p.copy_from_host(host).unwrap();
    p
}

fn ms(stream: &Stream, reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    stream.synchronize().unwrap();
    let mut t = Vec::new();
    for _ in 0..reps {
        let t0 = Instant::now();
        f();
        stream.synchronize().unwrap();
        t.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    median(&mut t)
}

fn main() {
    let dev = cudars_core::Device::new(0).unwrap();
    let stream = Stream::new(&dev).unwrap();
    let mut solver = Solver::new(&stream).unwrap();
    let n = 4096;
    let mut rng = Rng::new(5);
    // Symmetric, diagonally dominant with a positive diagonal: positive definite.
    let mut spd = vec![0f32; n * n];
    for j in 0..n {
        for i in 0..j {
            let v = rng.f32() - 0.5;
            spd[i + j * n] = v;
            spd[j + i * n] = v;
        }
        spd[j + j * n] = n as f32;
    }
    let a = upload(&stream, &spd);
    let work = cudars_mempool::driver::malloc(&stream, n * n * 4).unwrap();
    let chol = ms(&stream, 5, || {
        work.copy_from_device_async(&a, &stream).unwrap();
        solver
            .potrf::<f32>(Matrix::new(&work, n, n), Uplo::Lower)
            .unwrap();
    });
    println!("cholesky {n} f32: ours {chol:.3} ms (potrf)");
    let g: Vec<f32> = (0..n * n).map(|_| rng.f32() - 0.5).collect();
    let a = upload(&stream, &g);
    let s = cudars_mempool::driver::malloc(&stream, n * 4).unwrap();
    let u = cudars_mempool::driver::malloc(&stream, n * n * 4).unwrap();
    let v = cudars_mempool::driver::malloc(&stream, n * n * 4).unwrap();
    let gesvd = ms(&stream, 3, || {
        work.copy_from_device_async(&a, &stream).unwrap();
        solver
            .gesvd::<f32>(
                Matrix::new(&work, n, n),
                &s,
                Some(Matrix::new(&u, n, n)),
                Some(Matrix::new(&v, n, n)),
            )
            .unwrap();
    });
    println!("svd {n} f32: ours {gesvd:.3} ms (gesvd)");
    let gesvdj = ms(&stream, 3, || {
        work.copy_from_device_async(&a, &stream).unwrap();
        solver
            .gesvdj::<f32>(
                Matrix::new(&work, n, n),
                &s,
                Some((Matrix::new(&u, n, n), Matrix::new(&v, n, n))),
                true,
                Jacobi::default(),
            )
            .unwrap();
    });
    println!("svd {n} f32: ours {gesvdj:.3} ms (gesvdj)");
}

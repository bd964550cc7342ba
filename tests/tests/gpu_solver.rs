//! GPU: cuSOLVER's dense routines through `cuda-solver`: Cholesky (potrf/potrs) and LU
//! (getrf/getrs) in f32 and f64 reconstruct their input and solve systems; QR, symmetric
//! eigen-decomposition and SVD reconstruct theirs; a matrix that is
//! not positive definite and a singular one give the typed error naming the index; refusals
//! (shapes, views, a capturing stream) issue nothing.
#![cfg(feature = "gpu")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use cudars_core::{DevicePtr, Stream};
use cudars_solver::{Error, Matrix, Solver, Uplo};
use workspace_tests::gpu::{dev0, serial};
use workspace_tests::rtc::Rng;

fn upload<T: bytemuck::Pod>(stream: &Stream, host: &[T]) -> DevicePtr {
    let p = cudars_mempool::driver::malloc(stream, std::mem::size_of_val(host).max(1)).unwrap();
    p.copy_from_host(host).unwrap();
    p
}

fn download<T: bytemuck::Pod>(stream: &Stream, p: &DevicePtr, n: usize) -> Vec<T> {
    stream.synchronize().unwrap();
    let mut v = vec![T::zeroed(); n];
    p.slice(..n * std::mem::size_of::<T>())
        .unwrap()
        .copy_to_host(&mut v)
        .unwrap();
    v
}

/// A column-major symmetric positive definite matrix: M M^T + n I.
fn spd(rng: &mut Rng, n: usize) -> Vec<f64> {
    let m: Vec<f64> = (0..n * n).map(|_| rng.f32() as f64 - 0.5).collect();
    let mut a = vec![0.0; n * n];
    for j in 0..n {
        for i in 0..n {
            let s: f64 = (0..n).map(|k| m[i + k * n] * m[j + k * n]).sum();
            a[i + j * n] = s + if i == j { n as f64 } else { 0.0 };
        }
    }
    a
}

fn matvec(a: &[f64], n: usize, x: &[f64]) -> Vec<f64> {
    (0..n)
        .map(|i| (0..n).map(|j| a[i + j * n] * x[j]).sum())
        .collect()
}

#[test]
fn cholesky_reconstructs_and_solves_in_both_precisions() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let mut solver = Solver::new(&stream).unwrap();
    let mut rng = Rng::new(4);
    let n = 64;
    let a = spd(&mut rng, n);
    let x: Vec<f64> = (0..n).map(|i| (i as f64 * 0.37).sin()).collect();
    let b = matvec(&a, n, &x);
    // f64
    let da = upload(&stream, &a);
    solver
        .potrf::<f64>(Matrix::new(&da, n, n), Uplo::Lower)
        .unwrap();
    let l = download::<f64>(&stream, &da, n * n);
    let mut worst = 0f64;
    for j in 0..n {
        for i in j..n {
            let s: f64 = (0..=j).map(|k| l[i + k * n] * l[j + k * n]).sum();
            worst = worst.max((s - a[i + j * n]).abs());
        }
    }
    let db = upload(&stream, &b);
    solver
        .potrs::<f64>(Matrix::new(&da, n, n), Uplo::Lower, Matrix::new(&db, n, 1))
        .unwrap();
    let got = download::<f64>(&stream, &db, n);
    let err = got
        .iter()
        .zip(&x)
        .fold(0f64, |m, (g, w)| m.max((g - w).abs()));
    println!("potrf f64 {n}x{n}: |L L^T - A| {worst:.1e}; potrs |x - x*| {err:.1e}");
    assert!(worst < 1e-10 && err < 1e-10);
    // f32
    let a32: Vec<f32> = a.iter().map(|&v| v as f32).collect();
    let b32: Vec<f32> = b.iter().map(|&v| v as f32).collect();
    let (da, db) = (upload(&stream, &a32), upload(&stream, &b32));
    solver
        .potrf::<f32>(Matrix::new(&da, n, n), Uplo::Upper)
        .unwrap();
    solver
        .potrs::<f32>(Matrix::new(&da, n, n), Uplo::Upper, Matrix::new(&db, n, 1))
        .unwrap();
    let got = download::<f32>(&stream, &db, n);
    let err = got
        .iter()
        .zip(&x)
        .fold(0f64, |m, (g, w)| m.max((*g as f64 - w).abs()));
    println!("potrf/potrs f32 (upper): |x - x*| {err:.1e}");
    assert!(err < 1e-4);
}

#[test]
fn an_indefinite_matrix_is_an_error_naming_the_minor() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let mut solver = Solver::new(&stream).unwrap();
    let n = 8;
    let mut a = vec![0f64; n * n];
    for i in 0..n {
        a[i + i * n] = if i == 2 { -1.0 } else { 2.0 };
    }
    let da = upload(&stream, &a);
    let e = solver
        .potrf::<f64>(Matrix::new(&da, n, n), Uplo::Lower)
        .unwrap_err();
    assert_eq!(
        e,
        Error::NotPositiveDefinite {
            routine: "potrf",
            index: 3
        }
    );
    println!("{e}");
}

#[test]
fn lu_solves_and_a_singular_matrix_names_its_zero_pivot() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let mut solver = Solver::new(&stream).unwrap();
    let mut rng = Rng::new(8);
    let n = 50;
    let a: Vec<f64> = (0..n * n).map(|_| rng.f32() as f64 - 0.5).collect();
    let x: Vec<f64> = (0..n).map(|i| 1.0 + i as f64 / n as f64).collect();
    let b = matvec(&a, n, &x);
    let da = upload(&stream, &a);
    let piv = upload(&stream, &vec![0i32; n]);
    solver.getrf::<f64>(Matrix::new(&da, n, n), &piv).unwrap();
    let p = download::<i32>(&stream, &piv, n);
    assert!(p.iter().all(|&v| v >= 1 && v as usize <= n), "{p:?}");
    let db = upload(&stream, &b);
    solver
        .getrs::<f64>(Matrix::new(&da, n, n), &piv, Matrix::new(&db, n, 1))
        .unwrap();
    let got = download::<f64>(&stream, &db, n);
    let err = got
        .iter()
        .zip(&x)
        .fold(0f64, |m, (g, w)| m.max((g - w).abs()));
    println!("getrf/getrs f64 {n}x{n}: |x - x*| {err:.1e}");
    assert!(err < 1e-9);
    // Column 6 (0-based 5) all zeros: U(6, 6) = 0.
    let mut s = a.clone();
    for i in 0..n {
        s[i + 5 * n] = 0.0;
    }
    let ds = upload(&stream, &s.iter().map(|&v| v as f32).collect::<Vec<f32>>());
    let e = solver
        .getrf::<f32>(Matrix::new(&ds, n, n), &piv)
        .unwrap_err();
    assert_eq!(
        e,
        Error::Singular {
            routine: "getrf",
            index: 6
        }
    );
    println!("{e}");
}

#[test]
fn refusals_issue_nothing() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let mut solver = Solver::new(&stream).unwrap();
    let a = upload(&stream, &[1f64; 16]);
    let b = upload(&stream, &[5f64; 4]);
    assert!(matches!(
        solver.potrf::<f64>(Matrix::new(&a, 4, 3), Uplo::Lower),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        solver.potrf::<f64>(Matrix::new(&a, 5, 5), Uplo::Lower),
        Err(Error::BufferTooSmall { .. })
    ));
    assert!(matches!(
        solver.potrf::<f64>(Matrix::new(&a, 4, 4).with_ld(3), Uplo::Lower),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        solver.potrs::<f64>(Matrix::new(&a, 4, 4), Uplo::Lower, Matrix::new(&a, 4, 1)),
        Err(Error::Overlap { .. })
    ));
    assert!(matches!(
        solver.potrs::<f64>(Matrix::new(&a, 4, 4), Uplo::Lower, Matrix::new(&b, 3, 1)),
        Err(Error::Shape { .. })
    ));
    let short = upload(&stream, &[0i32; 3]);
    assert!(matches!(
        solver.getrf::<f64>(Matrix::new(&a, 4, 4), &short),
        Err(Error::BufferTooSmall { arg: "pivots", .. })
    ));
    assert!(matches!(
        Solver::new(&Stream::per_thread(&dev)),
        Err(Error::Shape { arg: "stream", .. })
    ));
    assert_eq!(download::<f64>(&stream, &a, 16), vec![1f64; 16]);
    assert_eq!(download::<f64>(&stream, &b, 4), vec![5f64; 4]);
    // A capturing stream is refused and the capture survives.
    let g = cudars_graph::capture(&stream, cudars_graph::CaptureMode::ThreadLocal, |_| {
        let e = solver
            .potrf::<f64>(Matrix::new(&a, 4, 4), Uplo::Lower)
            .unwrap_err();
        assert!(matches!(e, Error::Capturing { .. }), "{e}");
        Ok(())
    });
    assert!(g.is_ok(), "{g:?}");
}

#[test]
fn qr_eigen_and_svd_reconstruct_their_input() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let mut solver = Solver::new(&stream).unwrap();
    let mut rng = Rng::new(12);
    let (m, n) = (40, 24);
    let a: Vec<f64> = (0..m * n).map(|_| rng.f32() as f64 - 0.5).collect();
    // QR: Q (m x n) with orthonormal columns, R upper; Q R = A.
    let da = upload(&stream, &a);
    let tau = upload(&stream, &vec![0f64; n]);
    solver.geqrf::<f64>(Matrix::new(&da, m, n), &tau).unwrap();
    let qr = download::<f64>(&stream, &da, m * n);
    solver
        .orgqr::<f64>(Matrix::new(&da, m, n), n, &tau)
        .unwrap();
    let q = download::<f64>(&stream, &da, m * n);
    let mut worst = 0f64;
    for j in 0..n {
        for i in 0..m {
            let s: f64 = (0..=j).map(|k| q[i + k * m] * qr[k + j * m]).sum();
            worst = worst.max((s - a[i + j * m]).abs());
        }
    }
    println!("geqrf/orgqr f64 {m}x{n}: |Q R - A| {worst:.1e}");
    assert!(worst < 1e-12);
    // Symmetric eigen-decomposition: A V = V diag(w).
    let k = 32;
    let sym = spd(&mut rng, k);
    let ds = upload(&stream, &sym);
    let w = upload(&stream, &vec![0f64; k]);
    solver
        .syevd::<f64>(Matrix::new(&ds, k, k), Uplo::Lower, &w, true)
        .unwrap();
    let (v, wv) = (
        download::<f64>(&stream, &ds, k * k),
        download::<f64>(&stream, &w, k),
    );
    assert!(wv.windows(2).all(|p| p[0] <= p[1]), "ascending");
    let mut worst = 0f64;
    for c in 0..k {
        let col: Vec<f64> = (0..k).map(|i| v[i + c * k]).collect();
        let av = matvec(&sym, k, &col);
        for i in 0..k {
            worst = worst.max((av[i] - wv[c] * col[i]).abs());
        }
    }
    println!("syevd f64 {k}x{k}: |A v - w v| {worst:.1e}");
    assert!(worst < 1e-9);
    // SVD: U diag(s) V^T = A.
    let da = upload(&stream, &a);
    let (ds, du, dvt) = (
        upload(&stream, &vec![0f64; n]),
        upload(&stream, &vec![0f64; m * m]),
        upload(&stream, &vec![0f64; n * n]),
    );
    solver
        .gesvd::<f64>(
            Matrix::new(&da, m, n),
            &ds,
            Some(Matrix::new(&du, m, m)),
            Some(Matrix::new(&dvt, n, n)),
        )
        .unwrap();
    let (sv, u, vt) = (
        download::<f64>(&stream, &ds, n),
        download::<f64>(&stream, &du, m * m),
        download::<f64>(&stream, &dvt, n * n),
    );
    assert!(sv.windows(2).all(|p| p[0] >= p[1]), "descending");
    let mut worst = 0f64;
    for j in 0..n {
        for i in 0..m {
            let s: f64 = (0..n).map(|p| u[i + p * m] * sv[p] * vt[p + j * n]).sum();
            worst = worst.max((s - a[i + j * m]).abs());
        }
    }
    println!("gesvd f64 {m}x{n}: |U S V^T - A| {worst:.1e}");
    assert!(worst < 1e-12);
    // m < n is refused before anything runs.
    let wide = upload(&stream, &vec![0f64; n * m]);
    assert!(matches!(
        solver.gesvd::<f64>(Matrix::new(&wide, n - 4, m), &ds, None, None),
        Err(Error::Shape { .. })
    ));
}

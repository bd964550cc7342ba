//! GPU: cuSOLVER's dense routines through `cuda-solver`: Cholesky (potrf/potrs) and LU
//! (getrf/getrs) in f32 and f64 reconstruct their input and solve systems; QR, symmetric
//! eigen-decomposition and SVD reconstruct theirs; a matrix that is
//! not positive definite and a singular one give the typed error naming the index; refusals
//! (shapes, views, a capturing stream) issue nothing. potri inverts, ormqr applies Q, the
//! Jacobi routines (and their batched forms) reconstruct their input. A captured Cholesky
//! solve and LU solve replay with new inputs, hold no memory node, report a replayed
//! failure typed through `check_replay`, and keep the pool flat over 1,000 captures.
#![cfg(feature = "gpu")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use cudars_core::{DevicePtr, Stream};
use cudars_graph::CaptureMode;
use cudars_solver::{Error, Jacobi, Matrix, Pivots, Side, Solver, Uplo};
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
    let mut piv = Pivots::new(&stream, n, n).unwrap();
    solver
        .getrf::<f64>(Matrix::new(&da, n, n), &mut piv)
        .unwrap();
    stream.synchronize().unwrap();
    let p = piv.to_host().unwrap();
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
        .getrf::<f32>(Matrix::new(&ds, n, n), &mut piv)
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
    // Pivots of too few entries, or made for another number of rows, are refused: getrs
    // would use them as row indices of `b`.
    let mut short = Pivots::new(&stream, 4, 3).unwrap();
    assert!(matches!(
        solver.getrf::<f64>(Matrix::new(&a, 4, 4), &mut short),
        Err(Error::Shape { arg: "pivots", .. })
    ));
    let mut tall = Pivots::new(&stream, 10, 4).unwrap();
    let a10 = upload(&stream, &[1f64; 40]);
    solver
        .getrf::<f64>(Matrix::new(&a10, 10, 4), &mut tall)
        .unwrap_err(); // rank 1: singular, the pivots are written
    assert!(matches!(
        solver.getrs::<f64>(Matrix::new(&a, 4, 4), &tall, Matrix::new(&b, 4, 1)),
        Err(Error::Shape { arg: "pivots", .. })
    ));
    assert!(matches!(
        Solver::new(&Stream::per_thread(&dev)),
        Err(Error::PerThreadStream { .. })
    ));
    assert_eq!(download::<f64>(&stream, &a, 16), vec![1f64; 16]);
    assert_eq!(download::<f64>(&stream, &b, 4), vec![5f64; 4]);
    // The eigen routines refuse a capture, and the capture survives.
    let w = upload(&stream, &[0f64; 4]);
    let g = cudars_graph::capture(&stream, cudars_graph::CaptureMode::ThreadLocal, |_| {
        let e = solver
            .syevd::<f64>(Matrix::new(&a, 4, 4), Uplo::Lower, &w, true)
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::Capturing {
                    routine: "syevd",
                    ..
                }
            ),
            "{e}"
        );
        Ok(())
    });
    assert!(g.is_ok(), "{g:?}");
    assert_eq!(download::<f64>(&stream, &a, 16), vec![1f64; 16]);
    // Batched Jacobi past 32 x 32, and ormqr's mismatched shapes, are refused.
    let big = upload(&stream, &vec![0f64; 33 * 33]);
    let w33 = upload(&stream, &[0f64; 33]);
    assert!(matches!(
        solver.syevj_batched::<f64>(
            Matrix::new(&big, 33, 33),
            Uplo::Lower,
            &w33,
            false,
            Jacobi::default(),
            1
        ),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        solver.ormqr::<f64>(
            Side::Left,
            true,
            Matrix::new(&a, 3, 2),
            &b,
            Matrix::new(&big, 4, 4)
        ),
        Err(Error::Shape { arg: "a", .. })
    ));
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

/// Max |x - y|.
fn dist(x: &[f64], y: &[f64]) -> f64 {
    x.iter()
        .zip(y)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max)
}

#[test]
fn potri_ormqr_and_the_jacobi_routines() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let mut solver = Solver::new(&stream).unwrap();
    let mut rng = Rng::new(21);
    // potri: the inverse of an SPD matrix from its factor; A * inv(A) = I.
    let n = 48;
    let a = spd(&mut rng, n);
    let da = upload(&stream, &a);
    solver
        .potrf::<f64>(Matrix::new(&da, n, n), Uplo::Lower)
        .unwrap();
    solver
        .potri::<f64>(Matrix::new(&da, n, n), Uplo::Lower)
        .unwrap();
    let inv = download::<f64>(&stream, &da, n * n);
    let full = |i: usize, j: usize| {
        if i >= j {
            inv[i + j * n]
        } else {
            inv[j + i * n]
        }
    };
    let mut worst = 0f64;
    for j in 0..n {
        for i in 0..n {
            let s: f64 = (0..n).map(|k| a[i + k * n] * full(k, j)).sum();
            worst = worst.max((s - if i == j { 1.0 } else { 0.0 }).abs());
        }
    }
    println!("potri f64 {n}x{n}: |A inv(A) - I| {worst:.1e}");
    assert!(worst < 1e-12);
    // ormqr: Q^T A = R (the upper triangle geqrf left), zero below.
    let (m, k) = (36, 20);
    let x: Vec<f64> = (0..m * k).map(|_| rng.f32() as f64 - 0.5).collect();
    let (dq, dc) = (upload(&stream, &x), upload(&stream, &x));
    let tau = upload(&stream, &vec![0f64; k]);
    solver.geqrf::<f64>(Matrix::new(&dq, m, k), &tau).unwrap();
    solver
        .ormqr::<f64>(
            Side::Left,
            true,
            Matrix::new(&dq, m, k),
            &tau,
            Matrix::new(&dc, m, k),
        )
        .unwrap();
    let (qr, c) = (
        download::<f64>(&stream, &dq, m * k),
        download::<f64>(&stream, &dc, m * k),
    );
    let mut worst = 0f64;
    for j in 0..k {
        for i in 0..m {
            let want = if i <= j { qr[i + j * m] } else { 0.0 };
            worst = worst.max((c[i + j * m] - want).abs());
        }
    }
    println!("ormqr f64 {m}x{k}: |Q^T A - R| {worst:.1e}");
    assert!(worst < 1e-12);
    // syevj: A v = w v.
    let e = 40;
    let sym = spd(&mut rng, e);
    let ds = upload(&stream, &sym);
    let w = upload(&stream, &vec![0f64; e]);
    solver
        .syevj::<f64>(
            Matrix::new(&ds, e, e),
            Uplo::Upper,
            &w,
            true,
            Jacobi::default(),
        )
        .unwrap();
    let (v, wv) = (
        download::<f64>(&stream, &ds, e * e),
        download::<f64>(&stream, &w, e),
    );
    let mut worst = 0f64;
    for col in 0..e {
        let vc: Vec<f64> = (0..e).map(|i| v[i + col * e]).collect();
        let av = matvec(&sym, e, &vc);
        worst = worst.max(dist(
            &av,
            &vc.iter().map(|t| t * wv[col]).collect::<Vec<_>>(),
        ));
    }
    println!("syevj f64 {e}x{e}: |A v - w v| {worst:.1e}");
    assert!(worst < 1e-8);
    // gesvdj, economy, of a wide matrix (gesvd cannot): U S V^T = A.
    let (m, n) = (18, 30);
    let g: Vec<f64> = (0..m * n).map(|_| rng.f32() as f64 - 0.5).collect();
    let dg = upload(&stream, &g);
    let (dsv, du, dv) = (
        upload(&stream, &vec![0f64; m]),
        upload(&stream, &vec![0f64; m * m]),
        upload(&stream, &vec![0f64; n * m]),
    );
    solver
        .gesvdj::<f64>(
            Matrix::new(&dg, m, n),
            &dsv,
            Some((Matrix::new(&du, m, m), Matrix::new(&dv, n, m))),
            true,
            Jacobi::default(),
        )
        .unwrap();
    let (sv, u, vv) = (
        download::<f64>(&stream, &dsv, m),
        download::<f64>(&stream, &du, m * m),
        download::<f64>(&stream, &dv, n * m),
    );
    let mut worst = 0f64;
    for j in 0..n {
        for i in 0..m {
            let s: f64 = (0..m).map(|p| u[i + p * m] * sv[p] * vv[j + p * n]).sum();
            worst = worst.max((s - g[i + j * m]).abs());
        }
    }
    println!("gesvdj f64 {m}x{n} (economy): |U S V^T - A| {worst:.1e}");
    assert!(worst < 1e-10);
    // The batched Jacobi forms: 8 symmetric 16 x 16 (f32), 8 of 12 x 10 (f64).
    let (bn, batch) = (16, 8);
    let mats: Vec<Vec<f64>> = (0..batch).map(|_| spd(&mut rng, bn)).collect();
    let flat: Vec<f32> = mats.iter().flatten().map(|&t| t as f32).collect();
    let db = upload(&stream, &flat);
    let dw = upload(&stream, &vec![0f32; bn * batch]);
    solver
        .syevj_batched::<f32>(
            Matrix::new(&db, bn, bn),
            Uplo::Lower,
            &dw,
            true,
            Jacobi::default(),
            batch,
        )
        .unwrap();
    let (vb, wb) = (
        download::<f32>(&stream, &db, bn * bn * batch),
        download::<f32>(&stream, &dw, bn * batch),
    );
    let mut worst = 0f64;
    for (q, mat) in mats.iter().enumerate() {
        for col in 0..bn {
            let vc: Vec<f64> = (0..bn)
                .map(|i| f64::from(vb[q * bn * bn + i + col * bn]))
                .collect();
            let av = matvec(mat, bn, &vc);
            let wv = f64::from(wb[q * bn + col]);
            worst =
                worst.max(dist(&av, &vc.iter().map(|t| t * wv).collect::<Vec<_>>()) / bn as f64);
        }
    }
    println!("syevj_batched f32 {batch} x {bn}x{bn}: |A v - w v| / n {worst:.1e}");
    assert!(worst < 1e-4);
    let (m, n) = (12, 10);
    let mats: Vec<f64> = (0..m * n * batch).map(|_| rng.f32() as f64 - 0.5).collect();
    let dm = upload(&stream, &mats);
    let (dsv, du, dv) = (
        upload(&stream, &vec![0f64; n * batch]),
        upload(&stream, &vec![0f64; m * m * batch]),
        upload(&stream, &vec![0f64; n * n * batch]),
    );
    solver
        .gesvdj_batched::<f64>(
            Matrix::new(&dm, m, n),
            &dsv,
            Some((Matrix::new(&du, m, m), Matrix::new(&dv, n, n))),
            Jacobi::default(),
            batch,
        )
        .unwrap();
    let (sv, u, vv) = (
        download::<f64>(&stream, &dsv, n * batch),
        download::<f64>(&stream, &du, m * m * batch),
        download::<f64>(&stream, &dv, n * n * batch),
    );
    let mut worst = 0f64;
    for q in 0..batch {
        for j in 0..n {
            for i in 0..m {
                let s: f64 = (0..n)
                    .map(|p| u[q * m * m + i + p * m] * sv[q * n + p] * vv[q * n * n + j + p * n])
                    .sum();
                worst = worst.max((s - mats[q * m * n + i + j * m]).abs());
            }
        }
    }
    println!("gesvdj_batched f64 {batch} x {m}x{n}: |U S V^T - A| {worst:.1e}");
    assert!(worst < 1e-10);
}

#[test]
fn a_captured_solve_replays_new_inputs_with_no_memory_node() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let mut solver = Solver::new(&stream).unwrap();
    let mut rng = Rng::new(77);
    let n = 96;
    let da = upload(&stream, &vec![0f64; n * n]);
    let db = upload(&stream, &vec![0f64; n]);
    let mut piv = Pivots::new(&stream, n, n).unwrap();
    let dl = upload(&stream, &vec![0f64; n * n]);
    let dc = upload(&stream, &vec![0f64; n]);
    stream.synchronize().unwrap();
    // Cholesky solve of (da, db) and LU solve of (dl, dc), in one graph.
    let mut capture = |solver: &mut Solver| {
        cudars_graph::capture(&stream, CaptureMode::ThreadLocal, |_| {
            let e = cudars_graph::Error::other;
            solver
                .potrf::<f64>(Matrix::new(&da, n, n), Uplo::Lower)
                .map_err(e)?;
            solver
                .potrs::<f64>(Matrix::new(&da, n, n), Uplo::Lower, Matrix::new(&db, n, 1))
                .map_err(e)?;
            solver
                .getrf::<f64>(Matrix::new(&dl, n, n), &mut piv)
                .map_err(e)?;
            solver
                .getrs::<f64>(Matrix::new(&dl, n, n), &piv, Matrix::new(&dc, n, 1))
                .map_err(e)
        })
        .unwrap()
    };
    let graph = capture(&mut solver);
    let dot = std::env::temp_dir().join(format!("cudars-solver-{}.dot", std::process::id()));
    graph.write_dot(&dot, true).unwrap();
    let text = std::fs::read_to_string(&dot).unwrap().to_lowercase();
    let _ = std::fs::remove_file(&dot);
    assert!(
        !text.contains("mem_alloc") && !text.contains("memalloc"),
        "a memory node:\n{text}"
    );
    let exec = graph.instantiate().unwrap();
    for round in 0..3 {
        let a = spd(&mut rng, n);
        let g: Vec<f64> = (0..n * n)
            .map(|k| rng.f32() as f64 - 0.5 + if k % (n + 1) == 0 { 4.0 } else { 0.0 })
            .collect();
        let x: Vec<f64> = (0..n).map(|_| rng.f32() as f64).collect();
        da.copy_from_host(&a).unwrap();
        db.copy_from_host(&matvec(&a, n, &x)).unwrap();
        dl.copy_from_host(&g).unwrap();
        dc.copy_from_host(&matvec(&g, n, &x)).unwrap();
        exec.launch(&stream).unwrap();
        solver.check_replay().unwrap();
        let (xc, xl) = (
            download::<f64>(&stream, &db, n),
            download::<f64>(&stream, &dc, n),
        );
        println!(
            "replay {round}: captured potrf/potrs |x - x*| {:.1e}, getrf/getrs {:.1e}",
            dist(&xc, &x),
            dist(&xl, &x)
        );
        assert!(dist(&xc, &x) < 1e-10 && dist(&xl, &x) < 1e-10);
    }
    // A replay of an indefinite matrix: the typed error comes from check_replay.
    let mut bad = spd(&mut rng, n);
    bad[5 + 5 * n] = -1e6;
    da.copy_from_host(&bad).unwrap();
    exec.launch(&stream).unwrap();
    let e = solver.check_replay().unwrap_err();
    println!("replay of an indefinite matrix: {e}");
    assert!(
        matches!(
            e,
            Error::NotPositiveDefinite {
                routine: "potrf",
                index: 6
            }
        ),
        "{e}"
    );
    drop(exec);
    drop(graph);
    // 1,000 captures: the pool's reserved bytes stay flat.
    let pool = cudars_mempool::driver::default_pool().unwrap();
    let id = cudars_mempool::driver::device_id(&dev);
    for _ in 0..10 {
        capture(&mut solver)
            .instantiate()
            .unwrap()
            .launch(&stream)
            .unwrap();
    }
    stream.synchronize().unwrap();
    let before = pool.stats(id).unwrap().reserved.current;
    for _ in 0..1000 {
        capture(&mut solver)
            .instantiate()
            .unwrap()
            .launch(&stream)
            .unwrap();
    }
    stream.synchronize().unwrap();
    let after = pool.stats(id).unwrap().reserved.current;
    println!("1,000 captured solves: pool reserved {before} -> {after} bytes");
    assert!(after <= before, "reserved grew from {before} to {after}");
    // An eager call between captures still reads its own info.
    da.copy_from_host(&bad).unwrap();
    assert!(matches!(
        solver.potrf::<f64>(Matrix::new(&da, n, n), Uplo::Lower),
        Err(Error::NotPositiveDefinite { index: 6, .. })
    ));
}

#[test]
fn a_large_captured_solve_outlives_its_solver_and_each_capture_keeps_its_info() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let mut solver = Solver::new(&stream).unwrap();
    let mut rng = Rng::new(90);
    // Large enough for cuSOLVER's blocked paths (cuBLAS GEMM, TRSM, SYRK inside).
    let n = 2048;
    let da = upload(&stream, &vec![0f32; n * n]);
    let db = upload(&stream, &vec![0f32; n]);
    stream.synchronize().unwrap();
    let (free_before, _) = dev.memory_info().unwrap();
    let graph = cudars_graph::capture(&stream, CaptureMode::ThreadLocal, |_| {
        let e = cudars_graph::Error::other;
        solver
            .potrf::<f32>(Matrix::new(&da, n, n), Uplo::Lower)
            .map_err(e)?;
        solver
            .potrs::<f32>(Matrix::new(&da, n, n), Uplo::Lower, Matrix::new(&db, n, 1))
            .map_err(e)
    })
    .unwrap();
    let dot = std::env::temp_dir().join(format!("cudars-solver-big-{}.dot", std::process::id()));
    graph.write_dot(&dot, true).unwrap();
    let text = std::fs::read_to_string(&dot).unwrap().to_lowercase();
    let _ = std::fs::remove_file(&dot);
    assert!(
        !text.contains("mem_alloc") && !text.contains("memalloc"),
        "a memory node in the {n} x {n} solve"
    );
    let exec = graph.instantiate().unwrap();
    let info = solver.take_capture_info();
    assert_eq!(info.routines(), vec!["potrf", "potrs"]);
    // A second capture (LU) of the same solver: its info is its own.
    let dl = upload(&stream, &vec![0f32; 64 * 64]);
    let dc = upload(&stream, &vec![0f32; 64]);
    let mut piv = Pivots::new(&stream, 64, 64).unwrap();
    let lu = cudars_graph::capture(&stream, CaptureMode::ThreadLocal, |_| {
        let e = cudars_graph::Error::other;
        solver
            .getrf::<f32>(Matrix::new(&dl, 64, 64), &mut piv)
            .map_err(e)?;
        solver
            .getrs::<f32>(Matrix::new(&dl, 64, 64), &piv, Matrix::new(&dc, 64, 1))
            .map_err(e)
    })
    .unwrap()
    .instantiate()
    .unwrap();
    let lu_info = solver.take_capture_info();
    // The solver goes; its handle lives on with the graphs.
    drop(solver);
    // An SPD matrix (diagonally dominant) and a right-hand side of a known solution.
    let mut a = vec![0f32; n * n];
    for j in 0..n {
        for i in 0..j {
            let v = rng.f32() - 0.5;
            a[i + j * n] = v;
            a[j + i * n] = v;
        }
        a[j + j * n] = n as f32;
    }
    let x: Vec<f32> = (0..n).map(|_| rng.f32()).collect();
    let b: Vec<f32> = (0..n)
        .map(|i| {
            (0..n)
                .map(|j| a[i + j * n] as f64 * x[j] as f64)
                .sum::<f64>() as f32
        })
        .collect();
    for round in 0..2 {
        da.copy_from_host(&a).unwrap();
        db.copy_from_host(&b).unwrap();
        exec.launch(&stream).unwrap();
        info.check(&stream).unwrap();
        let got = download::<f32>(&stream, &db, n);
        let e = got
            .iter()
            .zip(&x)
            .fold(0f32, |m, (g, w)| m.max((g - w).abs()));
        println!("replay {round} of the {n} x {n} captured Cholesky solve, its solver dropped: |x - x*| {e:.1e}");
        assert!(e < 1e-4, "{e}");
    }
    // The LU graph of a singular matrix: its own info says so; the Cholesky graph's is clean.
    dl.copy_from_host(&vec![1f32; 64 * 64]).unwrap();
    lu.launch(&stream).unwrap();
    let e = lu_info.check(&stream).unwrap_err();
    println!("the LU graph's own info after a singular replay: {e}");
    assert!(
        matches!(
            e,
            Error::Singular {
                routine: "getrf",
                ..
            }
        ),
        "{e}"
    );
    info.check(&stream).unwrap();
    drop(exec);
    drop(lu);
    stream.synchronize().unwrap();
    let (free_after, _) = dev.memory_info().unwrap();
    println!(
        "device free memory around the captures: {} -> {} MiB",
        free_before >> 20,
        free_after >> 20
    );
}

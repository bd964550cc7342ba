//! GPU: `cuda-blas`: every routine on random data against a CPU reference, for every element
//! type and both transposes; cuBLASLt epilogues and FP8; a captured GEMM without memory nodes,
//! and 1,000 captures leaving the pool's reserved bytes flat; handles from 8 threads on their
//! own streams; out of memory while taking a workspace; refusals that leave memory untouched.
//!
//! Tolerances (|got - want| <= tol * sum_k |a_ik b_kj|, the products' magnitude): f64 1e-12,
//! f32 1e-5, TF32 2e-3, f16 2e-3 (f32 accumulation, f16 output rounding: 2^-11 relative),
//! bf16 1e-2 (2^-8 relative output rounding), complex as their parts.
//!
//! cuBLAS is opened from `$CUDA_CUBLAS_LIBRARY` (`run.sh` points it at pip's wheel).
#![cfg(feature = "gpu")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use cudars_blas::{
    axpy, dot, dot_into, geam, gemm_batched, gemv, nrm2, scal, Complex32, Complex64, Element,
    Epilogue, Error, Fp8, Fp8Matmul, Gemm, LtMatmul, Mat, MathMode, Op, StridedBatch, Vector,
};
use cudars_core::{DevicePtr, Stream};
use cudars_graph::CaptureMode;
use half::{bf16, f16};
use workspace_tests::gpu::{dev0, serial};
use workspace_tests::rtc::Rng;

/// Test-side conversions of the element types, through (re, im) in f64.
trait El: Element + Copy {
    fn from_parts(re: f64, im: f64) -> Self;
    fn parts(self) -> (f64, f64);
    fn scalar(re: f64) -> Self::Scalar;
    const TOL: f64;
}

macro_rules! real {
    ($t:ty, $tol:expr, $from:expr, $to:expr, $sc:expr) => {
        impl El for $t {
            fn from_parts(re: f64, _im: f64) -> Self {
                $from(re)
            }
            fn parts(self) -> (f64, f64) {
                ($to(self), 0.0)
            }
            fn scalar(re: f64) -> Self::Scalar {
                $sc(re)
            }
            const TOL: f64 = $tol;
        }
    };
}

real!(f32, 1e-5, |v: f64| v as f32, |v: f32| v as f64, |v: f64| v
    as f32);
real!(f64, 1e-12, |v: f64| v, |v: f64| v, |v: f64| v);
real!(f16, 2e-3, f16::from_f64, |v: f16| v.to_f64(), |v: f64| v
    as f32);
real!(
    bf16,
    1e-2,
    bf16::from_f64,
    |v: bf16| v.to_f64(),
    |v: f64| v as f32
);

impl El for Complex32 {
    fn from_parts(re: f64, im: f64) -> Self {
        Complex32::new(re as f32, im as f32)
    }
    fn parts(self) -> (f64, f64) {
        (self.re as f64, self.im as f64)
    }
    fn scalar(re: f64) -> Self::Scalar {
        Complex32::new(re as f32, 0.0)
    }
    const TOL: f64 = 1e-5;
}

impl El for Complex64 {
    fn from_parts(re: f64, im: f64) -> Self {
        Complex64::new(re, im)
    }
    fn parts(self) -> (f64, f64) {
        (self.re, self.im)
    }
    fn scalar(re: f64) -> Self::Scalar {
        Complex64::new(re, 0.0)
    }
    const TOL: f64 = 1e-12;
}

fn random<T: El>(rng: &mut Rng, n: usize) -> Vec<T> {
    (0..n)
        .map(|_| {
            let im = if T::COMPLEX { rng.f32() as f64 } else { 0.0 };
            T::from_parts(rng.f32() as f64, im)
        })
        .collect()
}

fn upload<T: El>(stream: &Stream, host: &[T]) -> DevicePtr {
    let p = cudars_mempool::driver::malloc(stream, std::mem::size_of_val(host).max(1)).unwrap();
    p.copy_from_host(host).unwrap();
    p
}

fn download<T: El>(p: &DevicePtr, n: usize) -> Vec<T> {
    let mut v = vec![T::zeroed(); n];
    p.slice(..n * std::mem::size_of::<T>())
        .unwrap()
        .copy_to_host(&mut v)
        .unwrap();
    v
}

type C64 = (f64, f64);

fn mul(a: C64, b: C64) -> C64 {
    (a.0 * b.0 - a.1 * b.1, a.0 * b.1 + a.1 * b.0)
}

/// Element (i, j) of op(X) for a column-major X (rows x cols, ld).
fn at<T: El>(x: &[T], ld: usize, op: Op, i: usize, j: usize) -> C64 {
    let (r, c) = if op == Op::N { (i, j) } else { (j, i) };
    let v = x[c * ld + r].parts();
    if op == Op::C {
        (v.0, -v.1)
    } else {
        v
    }
}

/// Reference C = alpha op(A) op(B) + beta C (column-major) and the products' magnitudes.
#[allow(clippy::too_many_arguments, reason = "a BLAS reference")]
fn gemm_ref<T: El>(
    (m, n, k): (usize, usize, usize),
    a: &[T],
    lda: usize,
    op_a: Op,
    b: &[T],
    ldb: usize,
    op_b: Op,
    c: &[T],
    alpha: f64,
    beta: f64,
) -> (Vec<C64>, Vec<f64>) {
    let mut out = vec![(0.0, 0.0); m * n];
    let mut mag = vec![0.0; m * n];
    for j in 0..n {
        for i in 0..m {
            let mut s = (0.0, 0.0);
            let mut g = 0.0;
            for p in 0..k {
                let x = mul(at(a, lda, op_a, i, p), at(b, ldb, op_b, p, j));
                s = (s.0 + x.0, s.1 + x.1);
                g += (x.0 * x.0 + x.1 * x.1).sqrt();
            }
            let cv = c[j * m + i].parts();
            out[j * m + i] = (alpha * s.0 + beta * cv.0, alpha * s.1 + beta * cv.1);
            mag[j * m + i] = alpha.abs() * g + beta.abs() * (cv.0.abs() + cv.1.abs()) + 1e-30;
        }
    }
    (out, mag)
}

fn assert_close<T: El>(what: &str, got: &[T], want: &[C64], mag: &[f64], tol: f64) {
    for (i, (g, (w, m))) in got.iter().zip(want.iter().zip(mag)).enumerate() {
        let g = g.parts();
        let err = (g.0 - w.0).abs().max((g.1 - w.1).abs());
        assert!(
            err <= tol * m.max(1e-3),
            "{what} [{}]: element {i}: got {g:?}, want {w:?} (err {err:e}, bound {:e})",
            T::NAME,
            tol * m
        );
    }
}

fn gemm_case<T: El>(stream: &Stream, rng: &mut Rng, op_a: Op, op_b: Op, math: MathMode, tol: f64) {
    let (m, n, k) = (37, 29, 45);
    let (ar, ac) = if op_a == Op::N { (m, k) } else { (k, m) };
    let (br, bc) = if op_b == Op::N { (k, n) } else { (n, k) };
    let (lda, ldb) = (ar + 3, br + 1);
    let a: Vec<T> = random(rng, lda * ac);
    let b: Vec<T> = random(rng, ldb * bc);
    let c: Vec<T> = random(rng, m * n);
    let (da, db, dc) = (upload(stream, &a), upload(stream, &b), upload(stream, &c));
    let (alpha, beta) = (0.75, -0.5);
    Gemm::new(
        Mat::<T>::col_major(&da, ar, ac).with_ld(lda),
        Mat::col_major(&db, br, bc).with_ld(ldb),
        Mat::col_major(&dc, m, n),
    )
    .op_a(op_a)
    .op_b(op_b)
    .alpha(T::scalar(alpha))
    .beta(T::scalar(beta))
    .math(math)
    .run(stream)
    .unwrap();
    stream.synchronize().unwrap();
    let (want, mag) = gemm_ref((m, n, k), &a, lda, op_a, &b, ldb, op_b, &c, alpha, beta);
    assert_close(
        &format!("gemm {op_a:?}{op_b:?} {math:?}"),
        &download::<T>(&dc, m * n),
        &want,
        &mag,
        tol,
    );
}

fn gemm_all_ops<T: El>(stream: &Stream, rng: &mut Rng) {
    let mut ops = vec![Op::N, Op::T];
    if T::COMPLEX {
        ops.push(Op::C);
    }
    for &a in &ops {
        for &b in &ops {
            gemm_case::<T>(stream, rng, a, b, MathMode::Default, T::TOL);
        }
    }
}

#[test]
fn gemm_matches_the_cpu_for_every_type_and_transpose() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let mut rng = Rng::new(50);
    gemm_all_ops::<f32>(&stream, &mut rng);
    gemm_all_ops::<f64>(&stream, &mut rng);
    gemm_all_ops::<f16>(&stream, &mut rng);
    gemm_all_ops::<bf16>(&stream, &mut rng);
    gemm_all_ops::<Complex32>(&stream, &mut rng);
    gemm_all_ops::<Complex64>(&stream, &mut rng);
    gemm_case::<f32>(&stream, &mut rng, Op::T, Op::N, MathMode::Tf32, 2e-3);
    gemm_case::<f32>(&stream, &mut rng, Op::N, Op::T, MathMode::Pedantic, 1e-5);
}

#[test]
fn scalars_read_from_device_memory_when_the_gemm_runs() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let n = 16;
    let da = upload(&stream, &vec![1f32; n * n]);
    let dc = upload(&stream, &vec![1f32; n * n]);
    let alpha = upload(&stream, &[2f32]);
    let beta = upload(&stream, &[3f32]);
    // C = 2 * (A A) + 3 * C = 2 * n + 3.
    Gemm::new(
        Mat::<f32>::col_major(&da, n, n),
        Mat::col_major(&da, n, n),
        Mat::col_major(&dc, n, n),
    )
    .scalars_on_device(&alpha, &beta)
    .run(&stream)
    .unwrap();
    assert!(download::<f32>(&dc, n * n)
        .iter()
        .all(|&v| v == 2.0 * n as f32 + 3.0));
    // Host scalars again on the same handle (the pointer mode switches back).
    Gemm::new(
        Mat::<f32>::col_major(&da, n, n),
        Mat::col_major(&da, n, n),
        Mat::col_major(&dc, n, n),
    )
    .run(&stream)
    .unwrap();
    assert!(download::<f32>(&dc, n * n).iter().all(|&v| v == n as f32));
}

#[test]
fn row_major_gemm_equals_the_column_major_reference() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let mut rng = Rng::new(51);
    let (m, n, k) = (13, 21, 17);
    // Row-major A (m x k), B stored n x k (used transposed), C (m x n).
    let a: Vec<f32> = random(&mut rng, m * k);
    let b: Vec<f32> = random(&mut rng, n * k);
    let (da, db) = (upload(&stream, &a), upload(&stream, &b));
    let dc = upload(&stream, &vec![0f32; m * n]);
    Gemm::new(
        Mat::<f32>::row_major(&da, m, k),
        Mat::row_major(&db, n, k),
        Mat::row_major(&dc, m, n),
    )
    .op_b(Op::T)
    .run(&stream)
    .unwrap();
    let got: Vec<f32> = download(&dc, m * n);
    for i in 0..m {
        for j in 0..n {
            let want: f64 = (0..k)
                .map(|p| a[i * k + p] as f64 * b[j * k + p] as f64)
                .sum();
            let g = got[i * n + j] as f64;
            assert!((g - want).abs() < 1e-4, "({i},{j}): {g} vs {want}");
        }
    }
}

#[test]
fn batched_gemms_strided_and_by_pointer_arrays() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let mut rng = Rng::new(52);
    let (m, n, k, batch) = (16, 12, 8, 5);
    let a: Vec<f32> = random(&mut rng, m * k * batch);
    let b: Vec<f32> = random(&mut rng, k * n * batch);
    let (da, db) = (upload(&stream, &a), upload(&stream, &b));
    let dc = upload(&stream, &vec![0f32; m * n * batch]);
    Gemm::new(
        Mat::<f32>::col_major(&da, m, k),
        Mat::col_major(&db, k, n),
        Mat::col_major(&dc, m, n),
    )
    .run_strided_batched(
        &stream,
        batch,
        StridedBatch {
            a: m * k,
            b: k * n,
            c: m * n,
        },
    )
    .unwrap();
    let got: Vec<f32> = download(&dc, m * n * batch);
    for i in 0..batch {
        let (want, mag) = gemm_ref(
            (m, n, k),
            &a[i * m * k..],
            m,
            Op::N,
            &b[i * k * n..],
            k,
            Op::N,
            &vec![0f32; m * n],
            1.0,
            0.0,
        );
        assert_close(
            "strided batch",
            &got[i * m * n..(i + 1) * m * n],
            &want,
            &mag,
            1e-5,
        );
    }
    // The same batch through cuBLASLt: the same numbers.
    let dc2 = upload(&stream, &vec![0f32; m * n * batch]);
    LtMatmul::new(
        Mat::<f32>::col_major(&da, m, k),
        Mat::col_major(&db, k, n),
        Mat::col_major(&dc2, m, n),
    )
    .run_strided_batched(
        &stream,
        batch,
        StridedBatch {
            a: m * k,
            b: k * n,
            c: m * n,
        },
    )
    .unwrap();
    let got2: Vec<f32> = download(&dc2, m * n * batch);
    for (i, (x, y)) in got.iter().zip(&got2).enumerate() {
        assert!(
            (x - y).abs() <= 1e-5 * (k as f32),
            "lt batch element {i}: {x} vs {y}"
        );
    }
    // The same products by pointer arrays, on separate views.
    let views: Vec<(DevicePtr, DevicePtr, DevicePtr)> = (0..batch)
        .map(|i| {
            (
                upload(&stream, &a[i * m * k..(i + 1) * m * k]),
                upload(&stream, &b[i * k * n..(i + 1) * k * n]),
                upload(&stream, &vec![0f32; m * n]),
            )
        })
        .collect();
    let gemms: Vec<Gemm<'_, f32>> = views
        .iter()
        .map(|(a, b, c)| {
            Gemm::new(
                Mat::col_major(a, m, k),
                Mat::col_major(b, k, n),
                Mat::col_major(c, m, n),
            )
        })
        .collect();
    gemm_batched(&stream, &gemms).unwrap();
    for (i, (_, _, c)) in views.iter().enumerate() {
        let g: Vec<f32> = download(c, m * n);
        assert_eq!(g, got[i * m * n..(i + 1) * m * n].to_vec(), "batch {i}");
    }
    // Two outputs that are one view: refused before anything runs.
    let mut bad = gemms.clone();
    bad[1].c = bad[0].c;
    assert!(matches!(
        gemm_batched(&stream, &bad),
        Err(Error::Overlap { .. })
    ));
}

fn level12<T: El>(stream: &Stream, rng: &mut Rng, tol: f64) {
    let (m, n) = (33, 19);
    let a: Vec<T> = random(rng, m * n);
    let x: Vec<T> = random(rng, n);
    let y: Vec<T> = random(rng, m);
    let (da, dx, dy) = (upload(stream, &a), upload(stream, &x), upload(stream, &y));
    // gemv: y = 1.5 A x - 0.5 y
    gemv(
        stream,
        Mat::<T>::col_major(&da, m, n),
        Op::N,
        Vector::new(&dx, n),
        Vector::new(&dy, m),
        (T::scalar(1.5), T::scalar(-0.5)),
    )
    .unwrap();
    let (want, mag) = gemm_ref((m, 1, n), &a, m, Op::N, &x, n, Op::N, &y, 1.5, -0.5);
    assert_close("gemv", &download::<T>(&dy, m), &want, &mag, tol);
    // axpy: y2 = 2 x + y2
    let y2: Vec<T> = random(rng, n);
    let dy2 = upload(stream, &y2);
    axpy(
        stream,
        T::scalar(2.0),
        Vector::<T>::new(&dx, n),
        Vector::new(&dy2, n),
    )
    .unwrap();
    let want: Vec<C64> = x
        .iter()
        .zip(&y2)
        .map(|(x, y)| {
            (
                2.0 * x.parts().0 + y.parts().0,
                2.0 * x.parts().1 + y.parts().1,
            )
        })
        .collect();
    let mag = vec![3.0; n];
    assert_close("axpy", &download::<T>(&dy2, n), &want, &mag, tol);
    // scal: every other element of x times -3 (inc 2)
    let dxs = upload(stream, &x);
    scal(
        stream,
        T::scalar(-3.0),
        Vector::<T>::new(&dxs, n.div_ceil(2)).with_inc(2),
    )
    .unwrap();
    let want: Vec<C64> = x
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let p = v.parts();
            if i % 2 == 0 {
                (-3.0 * p.0, -3.0 * p.1)
            } else {
                p
            }
        })
        .collect();
    assert_close("scal", &download::<T>(&dxs, n), &want, &vec![3.0; n], tol);
    // dot (conjugating x for complex types), to the host and to the device, with y2 as axpy
    // left it.
    let y2: Vec<T> = download(&dy2, n);
    let want = x.iter().zip(&y2).fold((0.0, 0.0), |s, (a, b)| {
        let a = a.parts();
        let p = mul((a.0, -a.1), b.parts());
        (s.0 + p.0, s.1 + p.1)
    });
    let got = dot(stream, Vector::<T>::new(&dx, n), Vector::new(&dy2, n))
        .unwrap()
        .parts();
    let dmag = n as f64 * 4.0;
    assert!(
        (got.0 - want.0).abs() <= tol * dmag && (got.1 - want.1).abs() <= tol * dmag,
        "dot {}: {got:?} vs {want:?}",
        T::NAME
    );
    let dres = cudars_mempool::driver::malloc(stream, 16).unwrap();
    dot_into(
        stream,
        Vector::<T>::new(&dx, n),
        Vector::new(&dy2, n),
        &dres,
    )
    .unwrap();
    let dgot = download::<T>(&dres, 1)[0].parts();
    assert!(
        (dgot.0 - got.0).abs() <= tol * dmag,
        "dot_into {}: {dgot:?} vs {got:?}",
        T::NAME
    );
    // nrm2
    let want = x
        .iter()
        .map(|v| v.parts().0.powi(2) + v.parts().1.powi(2))
        .sum::<f64>()
        .sqrt();
    let got = nrm2(stream, Vector::<T>::new(&dx, n)).unwrap();
    let got: f64 = {
        let bytes = bytemuck::bytes_of(&got);
        match bytes.len() {
            2 if T::DATA_TYPE == bf16::DATA_TYPE => {
                bf16::from_le_bytes([bytes[0], bytes[1]]).to_f64()
            }
            2 => f16::from_le_bytes([bytes[0], bytes[1]]).to_f64(),
            4 => f32::from_le_bytes(bytes.try_into().unwrap()) as f64,
            _ => f64::from_le_bytes(bytes.try_into().unwrap()),
        }
    };
    assert!(
        (got - want).abs() <= tol * want * 4.0,
        "nrm2 {}: {got} vs {want}",
        T::NAME
    );
    // geam: C = 2 A^T - B (A: n x m stored, so A^T is m x n)
    let at_: Vec<T> = random(rng, n * m);
    let bm: Vec<T> = random(rng, m * n);
    let (dat, dbm) = (upload(stream, &at_), upload(stream, &bm));
    let dcm = upload(stream, &vec![T::zeroed(); m * n]);
    geam(
        stream,
        (T::scalar(2.0), Mat::<T>::col_major(&dat, n, m), Op::T),
        (T::scalar(-1.0), Mat::col_major(&dbm, m, n), Op::N),
        Mat::col_major(&dcm, m, n),
    )
    .unwrap();
    let mut want = vec![(0.0, 0.0); m * n];
    for j in 0..n {
        for i in 0..m {
            let a = at_[i * n + j].parts();
            let b = bm[j * m + i].parts();
            want[j * m + i] = (2.0 * a.0 - b.0, 2.0 * a.1 - b.1);
        }
    }
    assert_close(
        "geam",
        &download::<T>(&dcm, m * n),
        &want,
        &vec![3.0; m * n],
        tol,
    );
}

#[test]
fn level_1_and_2_routines_and_geam_match_the_cpu_for_every_type() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let mut rng = Rng::new(53);
    level12::<f32>(&stream, &mut rng, 1e-5);
    level12::<f64>(&stream, &mut rng, 1e-12);
    level12::<f16>(&stream, &mut rng, 4e-3);
    level12::<bf16>(&stream, &mut rng, 2e-2);
    level12::<Complex32>(&stream, &mut rng, 1e-5);
    level12::<Complex64>(&stream, &mut rng, 1e-12);
}

fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + (0.797_884_560_802_865_4 * (x + 0.044715 * x * x * x)).tanh())
}

fn lt_epilogues<T: El>(stream: &Stream, rng: &mut Rng, tol: f64) {
    // A linear layer, row-major: y (batch x out) = x (batch x inp) w^T + bias.
    let (batch, inp, out) = (24, 40, 16);
    let x: Vec<T> = random(rng, batch * inp);
    let w: Vec<T> = random(rng, out * inp);
    let bias: Vec<T> = random(rng, out);
    let (dx, dw, db) = (
        upload(stream, &x),
        upload(stream, &w),
        upload(stream, &bias),
    );
    let pre = |i: usize, j: usize| -> f64 {
        (0..inp)
            .map(|p| x[i * inp + p].parts().0 * w[j * inp + p].parts().0)
            .sum::<f64>()
            + bias[j].parts().0
    };
    for e in [
        Epilogue::Bias,
        Epilogue::ReluBias,
        Epilogue::GeluBias,
        Epilogue::GeluAuxBias,
    ] {
        let dy = upload(stream, &vec![T::zeroed(); batch * out]);
        // aux: C's stored shape (out x batch column-major), ld a multiple of 8.
        let aux_ld = out.next_multiple_of(8);
        let daux = upload(stream, &vec![T::zeroed(); aux_ld * batch]);
        let mut mm = LtMatmul::new(
            Mat::<T>::row_major(&dx, batch, inp),
            Mat::row_major(&dw, out, inp),
            Mat::row_major(&dy, batch, out),
        )
        .op_b(Op::T)
        .epilogue(e)
        .bias(&db);
        if e.uses_aux() {
            mm = mm.aux(&daux, aux_ld);
        }
        mm.run(stream).unwrap();
        let got: Vec<T> = download(&dy, batch * out);
        let aux: Vec<T> = download(&daux, aux_ld * batch);
        for i in 0..batch {
            for j in 0..out {
                let p = pre(i, j);
                let want = match e {
                    Epilogue::Bias => p,
                    Epilogue::ReluBias => p.max(0.0),
                    _ => gelu(p),
                };
                let g = got[i * out + j].parts().0;
                assert!(
                    (g - want).abs() <= tol * (inp as f64 + 1.0),
                    "{e:?} {} ({i},{j}): {g} vs {want}",
                    T::NAME
                );
                if e.uses_aux() {
                    let a = aux[i * aux_ld + j].parts().0;
                    assert!(
                        (a - p).abs() <= tol * (inp as f64 + 1.0),
                        "aux {} ({i},{j}): {a} vs {p}",
                        T::NAME
                    );
                }
            }
        }
    }
    // The bias gradient with dW: dW = dy^T x, and db = the sums of dy over the batch, which are
    // op(A)'s (dy^T's) sums over k: BgradA in the caller's terms, whatever the layouts.
    let dbg = upload(stream, &vec![T::zeroed(); out]);
    let dg = upload(stream, &vec![T::zeroed(); out * inp]);
    // dW (out x inp) = dy^T (out x batch) x (batch x inp), bias grad = sum over batch of dy.
    let dyv: Vec<T> = random(rng, batch * out);
    let ddy = upload(stream, &dyv);
    LtMatmul::new(
        Mat::<T>::row_major(&ddy, batch, out),
        Mat::row_major(&dx, batch, inp),
        Mat::row_major(&dg, out, inp),
    )
    .op_a(Op::T)
    .epilogue(Epilogue::BgradA)
    .bias(&dbg)
    .run(stream)
    .unwrap();
    let got: Vec<T> = download(&dbg, out);
    for j in 0..out {
        let want: f64 = (0..batch).map(|i| dyv[i * out + j].parts().0).sum();
        let g = got[j].parts().0;
        assert!(
            (g - want).abs() <= tol * batch as f64 * 2.0,
            "bgrad {} [{j}]: {g} vs {want}",
            T::NAME
        );
    }
}

#[test]
fn cublaslt_epilogues_match_the_cpu() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let mut rng = Rng::new(54);
    lt_epilogues::<f32>(&stream, &mut rng, 1e-5);
    lt_epilogues::<bf16>(&stream, &mut rng, 1e-2);
    lt_epilogues::<f16>(&stream, &mut rng, 2e-3);
}

#[test]
fn fp8_matmul_matches_the_cpu_or_is_refused_by_type() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let mut rng = Rng::new(55);
    let (m, n, k) = (32, 48, 64);
    // E4M3 codes of exact values: 0, +-0.5, +-1, +-2.
    let codes: [(u8, f64); 7] = [
        (0x00, 0.0),
        (0x30, 0.5),
        (0xB0, -0.5),
        (0x38, 1.0),
        (0xB8, -1.0),
        (0x40, 2.0),
        (0xC0, -2.0),
    ];
    let pick = |rng: &mut Rng| codes[(rng.next_u64() % 7) as usize];
    let a: Vec<(u8, f64)> = (0..k * m).map(|_| pick(&mut rng)).collect();
    let b: Vec<(u8, f64)> = (0..k * n).map(|_| pick(&mut rng)).collect();
    let pa = cudars_mempool::driver::malloc(&stream, k * m).unwrap();
    pa.copy_from_host(&a.iter().map(|v| v.0).collect::<Vec<u8>>())
        .unwrap();
    let pb = cudars_mempool::driver::malloc(&stream, k * n).unwrap();
    pb.copy_from_host(&b.iter().map(|v| v.0).collect::<Vec<u8>>())
        .unwrap();
    let sa = upload(&stream, &[2.0f32]);
    let sb = upload(&stream, &[0.5f32]);
    let dd = upload(&stream, &vec![0f32; m * n]);
    let r = Fp8Matmul {
        a: (&pa, Fp8::E4M3, k),
        b: (&pb, Fp8::E4M3, k),
        d: Mat::<f32>::col_major(&dd, m, n),
        scales: (&sa, &sb),
        k,
    }
    .run(&stream);
    let (major, minor) = dev.compute_capability().unwrap();
    if (major, minor) < (8, 9) {
        assert!(matches!(r, Err(Error::Unsupported { .. })), "{r:?}");
        return;
    }
    r.unwrap();
    let got: Vec<f32> = download(&dd, m * n);
    for j in 0..n {
        for i in 0..m {
            let want: f64 = (0..k).map(|p| a[i * k + p].1 * b[j * k + p].1).sum();
            assert_eq!(got[j * m + i] as f64, want, "({i},{j})");
        }
    }
}

#[test]
fn a_captured_gemm_has_no_memory_node_and_replays_right() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let mut rng = Rng::new(56);
    let n = 128;
    let a: Vec<f32> = random(&mut rng, n * n);
    let b: Vec<f32> = random(&mut rng, n * n);
    let (da, db) = (upload(&stream, &a), upload(&stream, &b));
    let dc = upload(&stream, &vec![0f32; n * n]);
    stream.synchronize().unwrap();
    let graph = cudars_graph::capture(&stream, CaptureMode::ThreadLocal, |s| {
        Gemm::new(
            Mat::<f32>::col_major(&da, n, n),
            Mat::col_major(&db, n, n),
            Mat::col_major(&dc, n, n),
        )
        .run(s)
        .map_err(cudars_graph::Error::other)
    })
    .unwrap();
    let dot_path = std::env::temp_dir().join(format!("cudars-blas-{}.dot", std::process::id()));
    graph.write_dot(&dot_path, true).unwrap();
    let text = std::fs::read_to_string(&dot_path).unwrap().to_lowercase();
    let _ = std::fs::remove_file(&dot_path);
    assert!(
        !text.contains("mem_alloc") && !text.contains("memalloc"),
        "a memory node:\n{text}"
    );
    assert!(graph.node_count().unwrap() >= 1);
    let exec = graph.instantiate().unwrap();
    exec.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    let (want, mag) = gemm_ref(
        (n, n, n),
        &a,
        n,
        Op::N,
        &b,
        n,
        Op::N,
        &vec![0f32; n * n],
        1.0,
        0.0,
    );
    assert_close(
        "captured gemm",
        &download::<f32>(&dc, n * n),
        &want,
        &mag,
        1e-5,
    );
    // A host-result routine inside a capture is refused, and the capture survives.
    let r = cudars_graph::capture(&stream, CaptureMode::ThreadLocal, |s| {
        let e = dot(s, Vector::<f32>::new(&da, 16), Vector::new(&db, 16)).unwrap_err();
        assert!(matches!(e, Error::Unsupported { .. }), "{e}");
        Ok(())
    });
    assert!(r.is_ok(), "{r:?}");
}

#[test]
fn a_thousand_captures_of_a_gemm_leave_the_pools_reserved_bytes_flat() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let n = 256;
    let da = upload(&stream, &vec![1f32; n * n]);
    let db = upload(&stream, &vec![1f32; n * n]);
    let dc = upload(&stream, &vec![0f32; n * n]);
    let pool = cudars_mempool::driver::default_pool().unwrap();
    let id = cudars_mempool::driver::device_id(&dev);
    let capture_once = || {
        let g = cudars_graph::capture(&stream, CaptureMode::ThreadLocal, |s| {
            Gemm::new(
                Mat::<f32>::col_major(&da, n, n),
                Mat::col_major(&db, n, n),
                Mat::col_major(&dc, n, n),
            )
            .run(s)
            .map_err(cudars_graph::Error::other)
        })
        .unwrap();
        let exec = g.instantiate().unwrap();
        exec.launch(&stream).unwrap();
    };
    for _ in 0..10 {
        capture_once();
    }
    stream.synchronize().unwrap();
    let before = pool.stats(id).unwrap().reserved.current;
    for _ in 0..1000 {
        capture_once();
    }
    stream.synchronize().unwrap();
    let after = pool.stats(id).unwrap().reserved.current;
    println!("reserved before {before} after {after}");
    assert!(
        after <= before,
        "reserved grew from {before} to {after} over 1,000 captures"
    );
    assert_eq!(download::<f32>(&dc, 1)[0], n as f32);
}

#[test]
fn handles_from_eight_threads_on_their_own_streams_give_right_results() {
    let _s = serial();
    let dev = dev0();
    let created = cudars_blas::handle::handles_created();
    std::thread::scope(|scope| {
        for t in 0..8u64 {
            scope.spawn(move || {
                let stream = Stream::new(&dev).unwrap();
                let mut rng = Rng::new(100 + t);
                for _ in 0..20 {
                    gemm_case::<f32>(&stream, &mut rng, Op::N, Op::T, MathMode::Default, 1e-5);
                }
            });
        }
    });
    // One handle per stream, not per call.
    let made = cudars_blas::handle::handles_created() - created;
    assert!(made <= 8, "{made} handles for 8 streams");
    assert_eq!(cudars_blas::handle::destroy_failures(), 0);
}

#[test]
fn out_of_memory_while_taking_a_workspace_is_typed_and_leaks_nothing() {
    let _s = serial();
    let dev = dev0();
    let pool = cudars_mempool::driver::default_pool().unwrap();
    let id = cudars_mempool::driver::device_id(&dev);
    let stream = Stream::new(&dev).unwrap();
    let n = 64;
    let da = upload(&stream, &vec![1f32; n * n]);
    let dc = upload(&stream, &vec![0f32; n * n]);
    stream.synchronize().unwrap();
    let used = pool.stats(id).unwrap().used.current;
    // The limit just above what the live blocks occupy (whole pages): asking for less says how
    // much that is.
    let in_use = match pool.set_limit(id, cudars_mempool::Limit::Bytes(0)) {
        Err(cudars_mempool::PoolError::LimitBelowUsage { in_use, .. }) => in_use,
        other => panic!("a limit of 0 must be refused: {other:?}"),
    };
    pool.set_limit(
        id,
        cudars_mempool::Limit::Bytes(in_use as usize + (1 << 20)),
    )
    .unwrap();
    // A new stream: its handle needs a workspace (32 MiB on Hopper, 4 MiB before) > 1 MiB.
    let fresh = Stream::new(&dev).unwrap();
    let r = Gemm::new(
        Mat::<f32>::col_major(&da, n, n),
        Mat::col_major(&da, n, n),
        Mat::col_major(&dc, n, n),
    )
    .run(&fresh);
    pool.set_limit(id, cudars_mempool::Limit::Unlimited)
        .unwrap();
    match r {
        Err(Error::Pool {
            source: cudars_mempool::PoolError::OutOfMemory { .. },
            ..
        }) => {}
        other => panic!("expected a pool out-of-memory error, got {other:?}"),
    }
    assert_eq!(
        pool.stats(id).unwrap().used.current,
        used,
        "the failed call kept memory"
    );
    // The next call, with memory again, works.
    Gemm::new(
        Mat::<f32>::col_major(&da, n, n),
        Mat::col_major(&da, n, n),
        Mat::col_major(&dc, n, n),
    )
    .run(&fresh)
    .unwrap();
    fresh.synchronize().unwrap();
    assert_eq!(download::<f32>(&dc, 1)[0], n as f32);
}

#[test]
fn a_refused_call_leaves_the_output_untouched() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let n = 32;
    let da = upload(&stream, &vec![1f32; n * n]);
    let dc = upload(&stream, &vec![7f32; n * n]);
    // B's view holds one column too few.
    let short = da.slice(..(n * n - n) * 4).unwrap();
    let e = Gemm::new(
        Mat::<f32>::col_major(&da, n, n),
        Mat::col_major(&short, n, n),
        Mat::col_major(&dc, n, n),
    )
    .run(&stream)
    .unwrap_err();
    assert!(
        matches!(e, Error::BufferTooSmall { argument: "b", .. }),
        "{e}"
    );
    stream.synchronize().unwrap();
    assert!(download::<f32>(&dc, n * n).iter().all(|&v| v == 7.0));
    // A misaligned f64 view.
    let odd = dc.slice(4..).unwrap();
    let e = Gemm::new(
        Mat::<f64>::col_major(&odd, 2, 2),
        Mat::col_major(&odd, 2, 2),
        Mat::col_major(&da, 2, 2),
    )
    .run(&stream)
    .unwrap_err();
    assert!(matches!(e, Error::Misaligned { .. }), "{e}");
}

#[test]
#[ignore = "needs two GPUs"]
fn an_operand_on_another_device_is_refused_before_anything_runs() {
    let _s = serial();
    let devices = cudars_core::Device::all().unwrap();
    assert!(
        devices.len() >= 2,
        "this test needs two GPUs, found {}",
        devices.len()
    );
    let (d0, d1) = (devices[0], devices[1]);
    let s0 = Stream::new(&d0).unwrap();
    let s1 = Stream::new(&d1).unwrap();
    let n = 16;
    let a0 = upload(&s0, &vec![1f32; n * n]);
    let c0 = upload(&s0, &vec![5f32; n * n]);
    let b1 = upload(&s1, &vec![1f32; n * n]);
    let e = Gemm::new(
        Mat::<f32>::col_major(&a0, n, n),
        Mat::col_major(&b1, n, n),
        Mat::col_major(&c0, n, n),
    )
    .run(&s0)
    .unwrap_err();
    assert!(
        matches!(
            e,
            Error::WrongDevice {
                argument: "b",
                expected: 0,
                actual: 1,
                ..
            }
        ),
        "{e}"
    );
    // The stream of device 1 with device 0's matrices: refused too.
    let e = Gemm::new(
        Mat::<f32>::col_major(&a0, n, n),
        Mat::col_major(&a0, n, n),
        Mat::col_major(&c0, n, n),
    )
    .run(&s1)
    .unwrap_err();
    assert!(
        matches!(
            e,
            Error::WrongDevice {
                expected: 1,
                actual: 0,
                ..
            }
        ),
        "{e}"
    );
    assert!(download::<f32>(&c0, n * n).iter().all(|&v| v == 5.0));
    // Each device's own GEMM works, with a handle of its own.
    Gemm::new(
        Mat::<f32>::col_major(&b1, n, n),
        Mat::col_major(&b1, n, n),
        Mat::col_major(&upload(&s1, &vec![0f32; n * n]), n, n),
    )
    .run(&s1)
    .unwrap();
    s1.synchronize().unwrap();
}

#[test]
fn the_raw_handle_escape_hatch_restores_what_it_changes() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let n = 8;
    let da = upload(&stream, &vec![1f32; n * n]);
    let dc = upload(&stream, &vec![0f32; n * n]);
    let other = Stream::new(&dev).unwrap();
    cudars_blas::handle::with_raw_handle(&stream, |h, _issue| {
        let lib = cudars_blas_sys::cublas().unwrap();
        // SAFETY: a live handle; a live stream of its device.
        unsafe {
            assert!(lib
                .cublasSetPointerMode_v2(
                    h,
                    cudars_blas_sys::cublasPointerMode_t::CUBLAS_POINTER_MODE_DEVICE
                )
                .unwrap()
                .is_success());
            assert!(lib
                .cublasSetStream_v2(h, other.raw() as cudars_blas_sys::cudaStream_t)
                .unwrap()
                .is_success());
        }
    })
    .unwrap();
    // Host scalars on this stream again: right results, on the right stream.
    Gemm::new(
        Mat::<f32>::col_major(&da, n, n),
        Mat::col_major(&da, n, n),
        Mat::col_major(&dc, n, n),
    )
    .alpha(2.0)
    .run(&stream)
    .unwrap();
    stream.synchronize().unwrap();
    assert!(download::<f32>(&dc, n * n)
        .iter()
        .all(|&v| v == 2.0 * n as f32));
}

#[test]
fn a_panic_in_the_raw_handle_closure_leaves_the_handle_usable_and_reentry_is_refused() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let n = 8;
    let da = upload(&stream, &vec![1f32; n * n]);
    let dc = upload(&stream, &vec![0f32; n * n]);
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = cudars_blas::handle::with_raw_handle(&stream, |h, _issue| {
            let lib = cudars_blas_sys::cublas().unwrap();
            // SAFETY: a live handle.
            let _ = unsafe {
                lib.cublasSetPointerMode_v2(
                    h,
                    cudars_blas_sys::cublasPointerMode_t::CUBLAS_POINTER_MODE_DEVICE,
                )
            };
            panic!("the closure fails");
        });
    }));
    assert!(caught.is_err());
    Gemm::new(
        Mat::<f32>::col_major(&da, n, n),
        Mat::col_major(&da, n, n),
        Mat::col_major(&dc, n, n),
    )
    .alpha(3.0)
    .run(&stream)
    .unwrap();
    assert!(download::<f32>(&dc, n * n)
        .iter()
        .all(|&v| v == 3.0 * n as f32));
    // A call back into the crate on the same stream from inside: refused, not a deadlock.
    let inner = cudars_blas::handle::with_raw_handle(&stream, |_h, _issue| {
        Gemm::new(
            Mat::<f32>::col_major(&da, n, n),
            Mat::col_major(&da, n, n),
            Mat::col_major(&dc, n, n),
        )
        .run(&stream)
    })
    .unwrap();
    assert!(matches!(inner, Err(Error::Unsupported { .. })), "{inner:?}");
    // Released, the stream gets a new handle at its next call.
    let made = cudars_blas::handle::handles_created();
    assert!(cudars_blas::handle::release(&stream));
    Gemm::new(
        Mat::<f32>::col_major(&da, n, n),
        Mat::col_major(&da, n, n),
        Mat::col_major(&dc, n, n),
    )
    .run(&stream)
    .unwrap();
    assert_eq!(cudars_blas::handle::handles_created(), made + 1);
    assert!(download::<f32>(&dc, n * n).iter().all(|&v| v == n as f32));
}

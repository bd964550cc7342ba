//! GPU: cuSPARSE's SpMV and SpMM through `cuda-sparse`: CSR and COO, f32 and f64, i32 and
//! i64 indices, column- and row-major dense operands, both operations on `A`, each against
//! the dense product computed on the host (the max errors printed); index arrays built on the
//! host and on the device, checked either way; a bad index refused (on the host and read back
//! from the device); refusals (shapes, overlaps, devices, the per-thread stream, a capturing
//! stream) issue nothing.
#![cfg(feature = "gpu")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use cudars_core::{DevicePtr, Stream};
use cudars_sparse::{
    CooMatrix, CsrMatrix, DnMat, DnVec, Error, Op, Order, Sparse, SparseMatrix, Value,
};
use workspace_tests::gpu::{dev0, serial};
use workspace_tests::rtc::Rng;

fn upload<T: bytemuck::Pod>(stream: &Stream, host: &[T]) -> DevicePtr {
    let p = cudars_mempool::driver::malloc(stream, std::mem::size_of_val(host).max(1)).unwrap();
    p.slice(..std::mem::size_of_val(host))
        .unwrap()
        .copy_from_host(host)
        .unwrap();
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

/// The value types, with their conversions from and to the f64 the host reference uses.
trait Real: Value + Copy {
    const TOL: f64;
    fn of(v: f64) -> Self;
    fn f(self) -> f64;
}

impl Real for f32 {
    const TOL: f64 = 1e-4;
    fn of(v: f64) -> Self {
        v as f32
    }
    fn f(self) -> f64 {
        f64::from(self)
    }
}

impl Real for f64 {
    const TOL: f64 = 1e-12;
    fn of(v: f64) -> Self {
        v
    }
    fn f(self) -> f64 {
        self
    }
}

/// A random CSR matrix: up to `per_row` nonzeros per row, columns sorted and distinct, some
/// rows empty. Values are exact in f32.
struct Host {
    rows: usize,
    cols: usize,
    offsets: Vec<i32>,
    col_idx: Vec<i32>,
    vals: Vec<f64>,
}

impl Host {
    fn random(rng: &mut Rng, rows: usize, cols: usize, per_row: usize) -> Host {
        let mut offsets = vec![0i32];
        let mut col_idx = Vec::new();
        let mut vals = Vec::new();
        for _ in 0..rows {
            let k = (rng.next_u64() % (per_row as u64 + 1)) as usize;
            let mut cs: Vec<i32> = (0..k)
                .map(|_| (rng.next_u64() % cols as u64) as i32)
                .collect();
            cs.sort_unstable();
            cs.dedup();
            for c in cs {
                col_idx.push(c);
                vals.push(f64::from(rng.f32()));
            }
            offsets.push(col_idx.len() as i32);
        }
        Host {
            rows,
            cols,
            offsets,
            col_idx,
            vals,
        }
    }

    fn nnz(&self) -> usize {
        self.col_idx.len()
    }

    /// The COO row indices.
    fn row_idx(&self) -> Vec<i32> {
        (0..self.rows)
            .flat_map(|r| {
                std::iter::repeat_n(r as i32, (self.offsets[r + 1] - self.offsets[r]) as usize)
            })
            .collect()
    }

    /// The dense matrix, row-major.
    fn dense(&self) -> Vec<f64> {
        let mut d = vec![0.0; self.rows * self.cols];
        for r in 0..self.rows {
            for k in self.offsets[r] as usize..self.offsets[r + 1] as usize {
                d[r * self.cols + self.col_idx[k] as usize] += self.vals[k];
            }
        }
        d
    }

    /// `op(A)[i][j]`.
    fn at(&self, dense: &[f64], op: Op, i: usize, j: usize) -> f64 {
        match op {
            Op::N => dense[i * self.cols + j],
            Op::T => dense[j * self.cols + i],
        }
    }
}

fn max_err(got: &[f64], want: &[f64]) -> f64 {
    got.iter()
        .zip(want)
        .fold(0f64, |m, (g, w)| m.max((g - w).abs()))
}

/// SpMV with `a` (`host`'s matrix) against the host product, for both operations.
fn check_spmv<T: Real, A: SparseMatrix<Value = T>>(
    sparse: &mut Sparse,
    stream: &Stream,
    rng: &mut Rng,
    host: &Host,
    a: &A,
    what: &str,
) {
    let dense = host.dense();
    for op in [Op::N, Op::T] {
        let (m, k) = op.apply((host.rows, host.cols));
        let x: Vec<f64> = (0..k).map(|_| f64::from(rng.f32())).collect();
        let y0: Vec<f64> = (0..m).map(|_| f64::from(rng.f32())).collect();
        let (alpha, beta) = (1.5, -0.5);
        let want: Vec<f64> = (0..m)
            .map(|i| {
                let s: f64 = (0..k).map(|j| host.at(&dense, op, i, j) * x[j]).sum();
                alpha * s + beta * y0[i]
            })
            .collect();
        let dx = upload(stream, &x.iter().map(|&v| T::of(v)).collect::<Vec<T>>());
        let dy = upload(stream, &y0.iter().map(|&v| T::of(v)).collect::<Vec<T>>());
        sparse
            .spmv(
                op,
                T::of(alpha),
                a,
                DnVec::new(&dx, k),
                T::of(beta),
                DnVec::new(&dy, m),
            )
            .unwrap();
        let got: Vec<f64> = download::<T>(stream, &dy, m)
            .into_iter()
            .map(T::f)
            .collect();
        let err = max_err(&got, &want);
        println!(
            "spmv {what} {} op {op:?} {}x{} nnz {}: max |y - y*| {err:.1e}",
            T::NAME,
            host.rows,
            host.cols,
            host.nnz()
        );
        assert!(err < T::TOL, "{what} {op:?}: {err}");
    }
}

/// SpMM with `a` against the host product: `op_b` and `order` of B, C in `order` too.
fn check_spmm<T: Real, A: SparseMatrix<Value = T>>(
    sparse: &mut Sparse,
    stream: &Stream,
    rng: &mut Rng,
    host: &Host,
    a: &A,
    (op_a, op_b, order): (Op, Op, Order),
    what: &str,
) {
    let dense = host.dense();
    let (m, k) = op_a.apply((host.rows, host.cols));
    let n = 7;
    // op(B) is k x n: B stored k x n (N) or n x k (T).
    let (br, bc) = op_b.apply((k, n));
    let b: Vec<f64> = (0..br * bc).map(|_| f64::from(rng.f32())).collect();
    let c0: Vec<f64> = (0..m * n).map(|_| f64::from(rng.f32())).collect();
    let at = |v: &[f64], rows: usize, cols: usize, i: usize, j: usize| match order {
        Order::ColMajor => v[i + j * rows],
        Order::RowMajor => v[i * cols + j],
    };
    let opb = |p: usize, j: usize| match op_b {
        Op::N => at(&b, br, bc, p, j),
        Op::T => at(&b, br, bc, j, p),
    };
    let (alpha, beta) = (0.75, 2.0);
    let mut want = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let s: f64 = (0..k)
                .map(|p| host.at(&dense, op_a, i, p) * opb(p, j))
                .sum();
            let idx = match order {
                Order::ColMajor => i + j * m,
                Order::RowMajor => i * n + j,
            };
            want[idx] = alpha * s + beta * at(&c0, m, n, i, j);
        }
    }
    let db = upload(stream, &b.iter().map(|&v| T::of(v)).collect::<Vec<T>>());
    let dc = upload(stream, &c0.iter().map(|&v| T::of(v)).collect::<Vec<T>>());
    let mat = |p, r, c| match order {
        Order::ColMajor => DnMat::col_major(p, r, c),
        Order::RowMajor => DnMat::row_major(p, r, c),
    };
    sparse
        .spmm(
            op_a,
            op_b,
            T::of(alpha),
            a,
            mat(&db, br, bc),
            T::of(beta),
            mat(&dc, m, n),
        )
        .unwrap();
    let got: Vec<f64> = download::<T>(stream, &dc, m * n)
        .into_iter()
        .map(T::f)
        .collect();
    let err = max_err(&got, &want);
    println!(
        "spmm {what} {} op(A) {op_a:?} op(B) {op_b:?} {order:?} {}x{} nnz {} x {n} columns: max |C - C*| {err:.1e}",
        T::NAME,
        host.rows,
        host.cols,
        host.nnz()
    );
    assert!(err < T::TOL, "{what}: {err}");
}

fn values<T: Real>(stream: &Stream, host: &Host) -> DevicePtr {
    upload(
        stream,
        &host.vals.iter().map(|&v| T::of(v)).collect::<Vec<T>>(),
    )
}

fn spmv_both_formats<T: Real>(sparse: &mut Sparse, stream: &Stream, rng: &mut Rng) {
    let host = Host::random(rng, 300, 200, 12);
    let v = values::<T>(stream, &host);
    let csr = CsrMatrix::<T>::from_host(300, 200, &host.offsets, &host.col_idx, &v).unwrap();
    assert!(csr.is_checked());
    check_spmv(sparse, stream, rng, &host, &csr, "csr");
    let coo = CooMatrix::<T>::from_host(300, 200, &host.row_idx(), &host.col_idx, &v).unwrap();
    check_spmv(sparse, stream, rng, &host, &coo, "coo");
}

#[test]
fn spmv_csr_and_coo_match_the_host_product_in_both_precisions() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let mut sparse = Sparse::new(&stream).unwrap();
    let mut rng = Rng::new(21);
    spmv_both_formats::<f32>(&mut sparse, &stream, &mut rng);
    spmv_both_formats::<f64>(&mut sparse, &stream, &mut rng);
}

fn spmm_both_formats<T: Real>(sparse: &mut Sparse, stream: &Stream, rng: &mut Rng) {
    let host = Host::random(rng, 120, 90, 9);
    let v = values::<T>(stream, &host);
    let csr = CsrMatrix::<T>::from_host(120, 90, &host.offsets, &host.col_idx, &v).unwrap();
    let coo = CooMatrix::<T>::from_host(120, 90, &host.row_idx(), &host.col_idx, &v).unwrap();
    for order in [Order::ColMajor, Order::RowMajor] {
        for op_b in [Op::N, Op::T] {
            check_spmm(
                sparse,
                stream,
                rng,
                &host,
                &csr,
                (Op::N, op_b, order),
                "csr",
            );
        }
        check_spmm(
            sparse,
            stream,
            rng,
            &host,
            &coo,
            (Op::N, Op::N, order),
            "coo",
        );
    }
    check_spmm(
        sparse,
        stream,
        rng,
        &host,
        &csr,
        (Op::T, Op::N, Order::ColMajor),
        "csr",
    );
}

#[test]
fn spmm_csr_and_coo_match_the_host_product_in_both_orders_and_precisions() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let mut sparse = Sparse::new(&stream).unwrap();
    let mut rng = Rng::new(22);
    spmm_both_formats::<f32>(&mut sparse, &stream, &mut rng);
    spmm_both_formats::<f64>(&mut sparse, &stream, &mut rng);
}

#[test]
fn device_index_arrays_are_checked_and_i64_indices_work() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let mut sparse = Sparse::new(&stream).unwrap();
    let mut rng = Rng::new(23);
    let host = Host::random(&mut rng, 250, 180, 10);
    let nnz = host.nnz();
    let v = values::<f64>(&stream, &host);
    // i32 index arrays on the device: copied, read back and checked.
    let (dro, dci, dri) = (
        upload(&stream, &host.offsets),
        upload(&stream, &host.col_idx),
        upload(&stream, &host.row_idx()),
    );
    let csr = CsrMatrix::<f64>::from_device(&stream, 250, 180, nnz, &dro, &dci, &v).unwrap();
    assert!(csr.is_checked());
    check_spmv(
        &mut sparse,
        &stream,
        &mut rng,
        &host,
        &csr,
        "csr from device",
    );
    let coo = CooMatrix::<f64>::from_device(&stream, 250, 180, nnz, &dri, &dci, &v).unwrap();
    check_spmv(
        &mut sparse,
        &stream,
        &mut rng,
        &host,
        &coo,
        "coo from device",
    );
    // The checked matrix holds its own copy: rewriting the caller's array afterwards
    // changes nothing it reads.
    dci.memset_u32(0xffff_ffff).unwrap();
    check_spmv(
        &mut sparse,
        &stream,
        &mut rng,
        &host,
        &csr,
        "csr after the caller's write",
    );
    // ... and a bad index on the device is refused when read back.
    let mut bad = host.col_idx.clone();
    bad[nnz / 2] = 180;
    let dbad = upload(&stream, &bad);
    let e = CsrMatrix::<f64>::from_device(&stream, 250, 180, nnz, &dro, &dbad, &v).unwrap_err();
    assert_eq!(
        e,
        Error::IndexOutOfRange {
            routine: "CsrMatrix::from_device",
            arg: "col_indices",
            position: nnz / 2,
            value: 180,
            bound: 180
        }
    );
    println!("{e}");
    // i64 indices, host and device.
    let o64: Vec<i64> = host.offsets.iter().map(|&o| i64::from(o)).collect();
    let c64: Vec<i64> = host.col_idx.iter().map(|&c| i64::from(c)).collect();
    let r64: Vec<i64> = host.row_idx().iter().map(|&r| i64::from(r)).collect();
    let csr64 = CsrMatrix::<f64, i64>::from_host(250, 180, &o64, &c64, &v).unwrap();
    check_spmv(&mut sparse, &stream, &mut rng, &host, &csr64, "csr i64");
    let (d64r, d64c) = (upload(&stream, &r64), upload(&stream, &c64));
    let coo64 =
        CooMatrix::<f64, i64>::from_device(&stream, 250, 180, nnz, &d64r, &d64c, &v).unwrap();
    check_spmv(
        &mut sparse,
        &stream,
        &mut rng,
        &host,
        &coo64,
        "coo i64 from device",
    );
    check_spmm(
        &mut sparse,
        &stream,
        &mut rng,
        &host,
        &csr64,
        (Op::N, Op::N, Order::RowMajor),
        "csr i64",
    );
    // The unchecked constructor over valid arrays.
    let (dro2, dci2) = (
        upload(&stream, &host.offsets),
        upload(&stream, &host.col_idx),
    );
    // SAFETY: `host`'s offsets and column indices, valid for a 250 x 180 matrix, and nothing
    // writes them while the matrix lives.
    let raw = unsafe { CsrMatrix::<f64>::from_device_unchecked(250, 180, nnz, &dro2, &dci2, &v) }
        .unwrap();
    assert!(!raw.is_checked());
    check_spmv(&mut sparse, &stream, &mut rng, &host, &raw, "csr unchecked");
}

#[test]
fn refusals_issue_nothing() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let mut sparse = Sparse::new(&stream).unwrap();
    // [[1, 0, 2], [0, 3, 0]]
    let v = upload(&stream, &[1f32, 2.0, 3.0]);
    let a = CsrMatrix::<f32>::from_host(2, 3, &[0, 2, 3], &[0, 2, 1], &v).unwrap();
    // A bad index, a bad offset, unsorted COO rows, a short values view.
    assert!(matches!(
        CsrMatrix::<f32>::from_host(2, 3, &[0, 2, 3], &[0, 3, 1], &v),
        Err(Error::IndexOutOfRange {
            arg: "col_indices",
            position: 1,
            ..
        })
    ));
    assert!(matches!(
        CsrMatrix::<f32>::from_host(2, 3, &[0, 4, 3], &[0, 2, 1], &v),
        Err(Error::RowOffsets { .. })
    ));
    assert!(matches!(
        CooMatrix::<f32>::from_host(2, 3, &[1, 0, 1], &[0, 2, 1], &v),
        Err(Error::Unsorted { .. })
    ));
    assert!(matches!(
        CsrMatrix::<f32>::from_host(2, 3, &[0, 2, 4], &[0, 2, 1, 0], &v),
        Err(Error::BufferTooSmall { arg: "values", .. })
    ));
    let x = upload(&stream, &[1f32, 1.0, 1.0]);
    let y = upload(&stream, &[7f32, 7.0]);
    // Wrong lengths, a short view, overlaps.
    assert!(matches!(
        sparse.spmv(Op::N, 1.0, &a, DnVec::new(&x, 2), 0.0, DnVec::new(&y, 2)),
        Err(Error::Shape { arg: "x", .. })
    ));
    assert!(matches!(
        sparse.spmv(Op::T, 1.0, &a, DnVec::new(&x, 3), 0.0, DnVec::new(&y, 2)),
        Err(Error::Shape { arg: "x", .. })
    ));
    assert!(matches!(
        sparse.spmv(Op::N, 1.0, &a, DnVec::new(&x, 3), 0.0, DnVec::new(&v, 2)),
        Err(Error::Overlap {
            a: "values",
            b: "y",
            ..
        })
    ));
    assert!(matches!(
        sparse.spmv(Op::T, 1.0, &a, DnVec::new(&y, 2), 0.0, DnVec::new(&y, 3)),
        Err(Error::BufferTooSmall { arg: "y", .. })
    ));
    let b = upload(&stream, &[0f32; 6]);
    assert!(matches!(
        sparse.spmm(
            Op::N,
            Op::N,
            1.0,
            &a,
            DnMat::col_major(&b, 3, 2),
            0.0,
            DnMat::col_major(&b, 2, 2)
        ),
        Err(Error::Overlap { a: "b", b: "c", .. })
    ));
    assert!(matches!(
        sparse.spmm(
            Op::N,
            Op::N,
            1.0,
            &a,
            DnMat::col_major(&b, 3, 2).with_ld(2),
            0.0,
            DnMat::col_major(&y, 2, 2)
        ),
        Err(Error::Shape { arg: "b", .. })
    ));
    assert!(matches!(
        sparse.spmm(
            Op::N,
            Op::N,
            1.0,
            &a,
            DnMat::row_major(&b, 3, 2).with_ld(3),
            0.0,
            DnMat::col_major(&y, 2, 1)
        ),
        Err(Error::Shape { arg: "c", .. })
    ));
    assert!(matches!(
        Sparse::new(&Stream::per_thread(&dev)),
        Err(Error::PerThreadStream { .. })
    ));
    assert!(matches!(
        sparse.set_stream(&Stream::per_thread(&dev)),
        Err(Error::PerThreadStream { .. })
    ));
    assert_eq!(download::<f32>(&stream, &y, 2), vec![7f32; 2]);
    assert_eq!(download::<f32>(&stream, &v, 3), vec![1f32, 2.0, 3.0]);
    // A capturing stream is refused and the capture survives.
    let g = cudars_graph::capture(&stream, cudars_graph::CaptureMode::ThreadLocal, |_| {
        let e = sparse
            .spmv(Op::N, 1.0, &a, DnVec::new(&x, 3), 0.0, DnVec::new(&y, 2))
            .unwrap_err();
        assert!(matches!(e, Error::Capturing { .. }), "{e}");
        Ok(())
    });
    assert!(g.is_ok(), "{g:?}");
    // The product itself, on another stream after set_stream.
    let other = Stream::new(&dev).unwrap();
    sparse.set_stream(&other).unwrap();
    sparse
        .spmv(Op::N, 1.0, &a, DnVec::new(&x, 3), 0.0, DnVec::new(&y, 2))
        .unwrap();
    assert_eq!(download::<f32>(&other, &y, 2), vec![3f32, 3.0]);
}

//! CPU tests of every refusal: the checks are pure functions over [`View`]s, so they run
//! without a GPU or the library (CI), and a refusal here is one the routine makes before it
//! issues anything.

use crate::blas::{check_gemm, check_vector};
use crate::lt::check_lt;
use crate::shape::{Mat, Op, Vector, View};
use crate::{Complex64, Epilogue, Error};

/// A view that is only numbers.
#[derive(Debug)]
struct Fake {
    addr: u64,
    bytes: usize,
    device: usize,
}

impl View for Fake {
    fn addr(&self) -> u64 {
        self.addr
    }
    fn bytes(&self) -> usize {
        self.bytes
    }
    fn device_ordinal(&self) -> usize {
        self.device
    }
}

fn fake(addr: u64, bytes: usize) -> Fake {
    Fake {
        addr,
        bytes,
        device: 0,
    }
}

const GB: u64 = 1 << 30;

fn refused<T: std::fmt::Debug>(r: crate::Result<T>) -> Error {
    match r {
        Err(e) => e,
        Ok(v) => panic!("expected a refusal, got {v:?}"),
    }
}

#[test]
fn a_valid_gemm_maps_to_the_column_major_call() {
    let (a, b, c) = (
        fake(GB, 64 * 32 * 4),
        fake(2 * GB, 32 * 16 * 4),
        fake(3 * GB, 64 * 16 * 4),
    );
    let plan = check_gemm::<f32, Fake>(
        "gemm",
        (&Mat::col_major(&a, 64, 32), Op::N),
        (&Mat::col_major(&b, 32, 16), Op::N),
        &Mat::col_major(&c, 64, 16),
        0,
        None,
    )
    .unwrap();
    assert_eq!((plan.m, plan.n, plan.k, plan.swapped), (64, 16, 32, false));
    assert_eq!((plan.transa, plan.transb), (Op::N, Op::N));
}

#[test]
fn a_row_major_output_swaps_the_operands_and_transposes_the_problem() {
    // C (m x n, row-major) = A (m x k, row-major) B^T (B: n x k, row-major).
    let (m, n, k) = (8, 4, 16);
    let (a, b, c) = (
        fake(GB, m * k * 4),
        fake(2 * GB, n * k * 4),
        fake(3 * GB, m * n * 4),
    );
    let plan = check_gemm::<f32, Fake>(
        "gemm",
        (&Mat::row_major(&a, m, k), Op::N),
        (&Mat::row_major(&b, n, k), Op::T),
        &Mat::row_major(&c, m, n),
        0,
        None,
    )
    .unwrap();
    // C^T (n x m) = B (n x k as stored k x n, read T) A^T (stored k x m, read N).
    assert!(plan.swapped);
    assert_eq!((plan.m, plan.n, plan.k), (n, m, k));
    assert_eq!((plan.transa, plan.transb), (Op::T, Op::N));
}

#[test]
fn gemm_refuses_mismatched_inner_dimensions_and_output_shapes() {
    let (a, b, c) = (fake(GB, 4096), fake(2 * GB, 4096), fake(3 * GB, 4096));
    let e = refused(check_gemm::<f32, Fake>(
        "gemm",
        (&Mat::col_major(&a, 4, 5), Op::N),
        (&Mat::col_major(&b, 4, 4), Op::N),
        &Mat::col_major(&c, 4, 4),
        0,
        None,
    ));
    assert!(matches!(e, Error::Shape { argument: "b", .. }), "{e}");
    assert!(e.to_string().contains("inner dimensions differ"), "{e}");
    let e = refused(check_gemm::<f32, Fake>(
        "gemm",
        (&Mat::col_major(&a, 4, 4), Op::N),
        (&Mat::col_major(&b, 4, 4), Op::N),
        &Mat::col_major(&c, 4, 3),
        0,
        None,
    ));
    assert!(matches!(e, Error::Shape { argument: "c", .. }), "{e}");
}

#[test]
fn gemm_refuses_a_leading_dimension_below_the_rows() {
    let (a, b, c) = (fake(GB, 4096), fake(2 * GB, 4096), fake(3 * GB, 4096));
    let e = refused(check_gemm::<f32, Fake>(
        "gemm",
        (&Mat::col_major(&a, 8, 4).with_ld(7), Op::N),
        (&Mat::col_major(&b, 4, 4), Op::N),
        &Mat::col_major(&c, 8, 4),
        0,
        None,
    ));
    assert!(matches!(e, Error::Shape { argument: "a", .. }), "{e}");
}

#[test]
fn gemm_refuses_each_view_that_is_too_short() {
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        let mut sizes = [16 * 16 * 8; 3];
        sizes[i] -= 8; // one f64 short
        let (a, b, c) = (
            fake(GB, sizes[0]),
            fake(2 * GB, sizes[1]),
            fake(3 * GB, sizes[2]),
        );
        let e = refused(check_gemm::<f64, Fake>(
            "gemm",
            (&Mat::col_major(&a, 16, 16), Op::N),
            (&Mat::col_major(&b, 16, 16), Op::T),
            &Mat::col_major(&c, 16, 16),
            0,
            None,
        ));
        match e {
            Error::BufferTooSmall {
                argument,
                needed,
                len,
                ..
            } => {
                assert_eq!(argument, *name);
                assert_eq!(needed, 16 * 16 * 8);
                assert_eq!(len, 16 * 16 * 8 - 8);
            }
            other => panic!("{name}: {other}"),
        }
    }
}

#[test]
fn a_leading_dimension_counts_in_the_length_needed() {
    // 4 x 3 with ld 10: 10 * 2 + 4 = 24 elements, not 12.
    let (a, b, c) = (fake(GB, 23 * 4), fake(2 * GB, 4096), fake(3 * GB, 4096));
    let e = refused(check_gemm::<f32, Fake>(
        "gemm",
        (&Mat::col_major(&a, 4, 3).with_ld(10), Op::N),
        (&Mat::col_major(&b, 3, 2), Op::N),
        &Mat::col_major(&c, 4, 2),
        0,
        None,
    ));
    assert!(
        matches!(
            e,
            Error::BufferTooSmall {
                argument: "a",
                needed: 96,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn gemm_refuses_misaligned_views_and_other_devices() {
    let (a, b, c) = (fake(GB + 2, 4096), fake(2 * GB, 4096), fake(3 * GB, 4096));
    let e = refused(check_gemm::<f32, Fake>(
        "gemm",
        (&Mat::col_major(&a, 4, 4), Op::N),
        (&Mat::col_major(&b, 4, 4), Op::N),
        &Mat::col_major(&c, 4, 4),
        0,
        None,
    ));
    assert!(
        matches!(
            e,
            Error::Misaligned {
                argument: "a",
                align: 4,
                ..
            }
        ),
        "{e}"
    );
    let b1 = Fake {
        addr: 2 * GB,
        bytes: 4096,
        device: 1,
    };
    let a = fake(GB, 4096);
    let e = refused(check_gemm::<f32, Fake>(
        "gemm",
        (&Mat::col_major(&a, 4, 4), Op::N),
        (&Mat::col_major(&b1, 4, 4), Op::N),
        &Mat::col_major(&c, 4, 4),
        0,
        None,
    ));
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
}

#[test]
fn gemm_refuses_an_output_that_overlaps_an_input() {
    let a = fake(GB, 4096);
    let c = fake(GB + 32, 4096);
    let b = fake(2 * GB, 4096);
    let e = refused(check_gemm::<f32, Fake>(
        "gemm",
        (&Mat::col_major(&a, 4, 4), Op::N),
        (&Mat::col_major(&b, 4, 4), Op::N),
        &Mat::col_major(&c, 4, 4),
        0,
        None,
    ));
    assert!(
        matches!(
            e,
            Error::Overlap {
                output: "c",
                input: "a",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn strided_batches_need_every_matrix_and_outputs_that_do_not_overlap() {
    let (a, b) = (fake(GB, 4 * 16 * 4), fake(2 * GB, 4 * 16 * 4));
    let c_short = fake(3 * GB, 3 * 16 * 4);
    let e = refused(check_gemm::<f32, Fake>(
        "gemm_strided_batched",
        (&Mat::col_major(&a, 4, 4), Op::N),
        (&Mat::col_major(&b, 4, 4), Op::N),
        &Mat::col_major(&c_short, 4, 4),
        0,
        Some((4, [16, 16, 16])),
    ));
    assert!(
        matches!(e, Error::BufferTooSmall { argument: "c", .. }),
        "{e}"
    );
    let c = fake(3 * GB, 4 * 16 * 4);
    let e = refused(check_gemm::<f32, Fake>(
        "gemm_strided_batched",
        (&Mat::col_major(&a, 4, 4), Op::N),
        (&Mat::col_major(&b, 4, 4), Op::N),
        &Mat::col_major(&c, 4, 4),
        0,
        Some((4, [16, 16, 8])),
    ));
    assert!(matches!(e, Error::Overlap { output: "c", .. }), "{e}");
    // Side by side in one leading dimension (row-major 8 x 4 heads of a 8 x 16 row stride,
    // 4 apart): disjoint, allowed; 3 apart they share elements, refused; a fifth head would
    // run past the row, refused.
    let wide = fake(4 * GB, 2 * 8 * 16 * 4);
    let side = |count: usize, stride: usize| {
        check_gemm::<f32, Fake>(
            "gemm_strided_batched",
            (&Mat::row_major(&a, 8, 2), Op::N),
            (&Mat::row_major(&b, 2, 4), Op::N),
            &Mat::row_major(&wide, 8, 4).with_ld(16),
            0,
            Some((count, [0, 0, stride])),
        )
    };
    side(4, 4).unwrap();
    side(0, 4).unwrap(); // an empty batch: nothing is written
    side(1, 0).unwrap();
    assert!(matches!(
        refused(side(4, 3)),
        Error::Overlap { output: "c", .. }
    ));
    assert!(matches!(
        refused(side(5, 4)),
        Error::Overlap { output: "c", .. }
    ));
    // A shared A (stride 0) is allowed.
    check_gemm::<f32, Fake>(
        "gemm_strided_batched",
        (&Mat::col_major(&a, 4, 4), Op::N),
        (&Mat::col_major(&b, 4, 4), Op::N),
        &Mat::col_major(&c, 4, 4),
        0,
        Some((4, [0, 16, 16])),
    )
    .unwrap();
}

#[test]
fn a_conjugate_transpose_of_a_row_major_complex_matrix_is_refused() {
    let (a, b, c) = (fake(GB, 4096), fake(2 * GB, 4096), fake(3 * GB, 4096));
    let e = refused(check_gemm::<Complex64, Fake>(
        "gemm",
        (&Mat::row_major(&a, 4, 4), Op::C),
        (&Mat::col_major(&b, 4, 4), Op::N),
        &Mat::col_major(&c, 4, 4),
        0,
        None,
    ));
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
    // For real types a conjugate transpose is a transpose: allowed.
    check_gemm::<f32, Fake>(
        "gemm",
        (&Mat::row_major(&a, 4, 4), Op::C),
        (&Mat::col_major(&b, 4, 4), Op::N),
        &Mat::col_major(&c, 4, 4),
        0,
        None,
    )
    .unwrap();
}

#[test]
fn dimensions_beyond_32_bits_are_refused_before_any_length_check() {
    let (a, b, c) = (fake(GB, 16), fake(2 * GB, 16), fake(3 * GB, 16));
    let big = 1usize << 31;
    let e = refused(check_gemm::<f32, Fake>(
        "gemm",
        (&Mat::col_major(&a, 1, big), Op::N),
        (&Mat::col_major(&b, big, 1), Op::N),
        &Mat::col_major(&c, 1, 1),
        0,
        None,
    ));
    assert!(e.to_string().contains("exceeds"), "{e}");
}

#[test]
fn vectors_refuse_a_zero_increment_and_count_their_stride() {
    let x = fake(GB, 10 * 4);
    let e = refused(check_vector::<f32, Fake>(
        "axpy",
        "x",
        &Vector::new(&x, 4).with_inc(0),
        0,
    ));
    assert!(matches!(e, Error::Shape { argument: "x", .. }), "{e}");
    // 4 elements 3 apart: 3 * 3 + 1 = 10 elements.
    check_vector::<f32, Fake>("axpy", "x", &Vector::new(&x, 4).with_inc(3), 0).unwrap();
    let e = refused(check_vector::<f32, Fake>(
        "axpy",
        "x",
        &Vector::new(&x, 4).with_inc(4),
        0,
    ));
    assert!(
        matches!(
            e,
            Error::BufferTooSmall {
                needed: 52,
                len: 40,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(Vector::<f32, Fake>::whole(&x).len(), 10);
}

#[test]
fn epilogues_need_exactly_the_buffers_they_use() {
    let (a, b, c) = (fake(GB, 4096), fake(2 * GB, 4096), fake(3 * GB, 4096));
    let bias = fake(4 * GB, 4 * 4);
    let aux = fake(5 * GB, 8 * 4 * 4);
    let ma = Mat::<f32, Fake>::col_major(&a, 4, 4);
    let mb = Mat::col_major(&b, 4, 4);
    let mc = Mat::col_major(&c, 4, 4);
    let run = |e: Epilogue, bias: Option<&Fake>, aux: Option<(&Fake, usize)>| {
        check_lt((&ma, Op::N), (&mb, Op::N), &mc, e, (bias, aux), 0)
    };
    assert!(run(Epilogue::None, None, None).is_ok());
    let e = refused(run(Epilogue::ReluBias, None, None));
    assert!(
        matches!(
            e,
            Error::Shape {
                argument: "bias",
                ..
            }
        ),
        "{e}"
    );
    let e = refused(run(Epilogue::Relu, Some(&bias), None));
    assert!(
        matches!(
            e,
            Error::Shape {
                argument: "bias",
                ..
            }
        ),
        "{e}"
    );
    let short = fake(4 * GB, 3 * 4);
    let e = refused(run(Epilogue::Bias, Some(&short), None));
    assert!(
        matches!(
            e,
            Error::BufferTooSmall {
                argument: "bias",
                ..
            }
        ),
        "{e}"
    );
    let e = refused(run(Epilogue::GeluAux, None, None));
    assert!(
        matches!(
            e,
            Error::Shape {
                argument: "aux",
                ..
            }
        ),
        "{e}"
    );
    let e = refused(run(Epilogue::GeluAux, None, Some((&aux, 6))));
    assert!(e.to_string().contains("multiple of 8"), "{e}");
    assert!(run(Epilogue::GeluAux, None, Some((&aux, 8))).is_ok());
    // A gradient written into an input is refused.
    let into_a = fake(GB, 16);
    let e = refused(run(Epilogue::BgradA, Some(&into_a), None));
    assert!(
        matches!(
            e,
            Error::Overlap {
                output: "bias",
                input: "a",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn device_scalars_must_hold_one_scalar_and_stay_out_of_the_output() {
    use crate::blas::check_scalars;
    let c = fake(3 * GB, 16 * 4);
    let mc = Mat::<f32, Fake>::col_major(&c, 4, 4);
    let (alpha, beta) = (fake(GB, 4), fake(2 * GB, 4));
    check_scalars::<f32, Fake>("gemm", (&alpha, &beta), &mc, 0).unwrap();
    let short = fake(GB, 2);
    let e = refused(check_scalars::<f32, Fake>("gemm", (&short, &beta), &mc, 0));
    assert!(
        matches!(
            e,
            Error::BufferTooSmall {
                argument: "alpha",
                ..
            }
        ),
        "{e}"
    );
    let inside = fake(3 * GB + 8, 4);
    let e = refused(check_scalars::<f32, Fake>(
        "gemm",
        (&alpha, &inside),
        &mc,
        0,
    ));
    assert!(matches!(e, Error::Overlap { input: "beta", .. }), "{e}");
    // f16 GEMMs take f32 scalars: two bytes are too few.
    let c16 = fake(3 * GB, 16 * 2);
    let m16 = Mat::<crate::f16, Fake>::col_major(&c16, 4, 4);
    let two = fake(GB, 2);
    let e = refused(check_scalars::<crate::f16, Fake>(
        "gemm",
        (&two, &beta),
        &m16,
        0,
    ));
    assert!(
        matches!(
            e,
            Error::BufferTooSmall {
                argument: "alpha",
                needed: 4,
                ..
            }
        ),
        "{e}"
    );
}

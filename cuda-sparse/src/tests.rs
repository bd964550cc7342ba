//! CPU tests of every refusal: the checks are pure functions of lengths, addresses and host
//! index arrays; no library or driver call.

use crate::check::{
    bytes, coo_structure, csr_structure, disjoint, fits, length, matrix_bytes, spmm_shapes,
    spmv_lengths, vector_bytes, view,
};
use crate::{CooMatrix, CsrMatrix, Error, Op, Order, Sparse};

const R: &str = "r";

#[test]
fn a_good_csr_structure_passes_in_both_index_types() {
    // [[1, 0, 2], [0, 0, 0], [0, 3, 0]]
    csr_structure::<i32>(R, (3, 3), &[0, 2, 2, 3], &[0, 2, 1]).unwrap();
    csr_structure::<i64>(R, (3, 3), &[0, 2, 2, 3], &[0, 2, 1]).unwrap();
    // No nonzeros, no rows.
    csr_structure::<i32>(R, (2, 5), &[0, 0, 0], &[]).unwrap();
    csr_structure::<i32>(R, (0, 0), &[0], &[]).unwrap();
}

#[test]
fn bad_csr_row_offsets_are_refused_naming_the_position() {
    assert_eq!(
        csr_structure::<i32>(R, (3, 3), &[0, 2, 3], &[0, 2, 1]),
        Err(Error::Length {
            routine: R,
            arg: "row_offsets",
            expected: 4,
            actual: 3
        })
    );
    assert!(matches!(
        csr_structure::<i32>(R, (3, 3), &[1, 2, 2, 3], &[0, 2, 1]),
        Err(Error::RowOffsets { position: 0, .. })
    ));
    assert!(matches!(
        csr_structure::<i32>(R, (3, 3), &[0, 2, 1, 3], &[0, 2, 1]),
        Err(Error::RowOffsets { position: 2, .. })
    ));
    assert!(matches!(
        csr_structure::<i32>(R, (3, 3), &[0, 2, 2, 2], &[0, 2, 1]),
        Err(Error::RowOffsets { position: 3, .. })
    ));
    // An offset past nnz is caught by the last one (monotone up to it).
    assert!(matches!(
        csr_structure::<i64>(R, (3, 3), &[0, 2, 9, 3], &[0, 2, 1]),
        Err(Error::RowOffsets { position: 3, .. })
    ));
    // A negative first offset.
    assert!(matches!(
        csr_structure::<i32>(R, (1, 3), &[-1, 0], &[]),
        Err(Error::RowOffsets { position: 0, .. })
    ));
}

#[test]
fn column_indices_outside_the_matrix_are_refused() {
    assert_eq!(
        csr_structure::<i32>(R, (3, 3), &[0, 2, 2, 3], &[0, 3, 1]),
        Err(Error::IndexOutOfRange {
            routine: R,
            arg: "col_indices",
            position: 1,
            value: 3,
            bound: 3
        })
    );
    assert_eq!(
        csr_structure::<i64>(R, (3, 3), &[0, 2, 2, 3], &[0, 1, -1]),
        Err(Error::IndexOutOfRange {
            routine: R,
            arg: "col_indices",
            position: 2,
            value: -1,
            bound: 3
        })
    );
    // No columns: every index is out of range.
    assert!(matches!(
        csr_structure::<i32>(R, (1, 0), &[0, 1], &[0]),
        Err(Error::IndexOutOfRange { bound: 0, .. })
    ));
}

#[test]
fn counts_must_fit_the_index_type() {
    fits::<i32>(R, "rows", i32::MAX as usize).unwrap();
    assert!(matches!(
        fits::<i32>(R, "rows", i32::MAX as usize + 1),
        Err(Error::Shape { arg: "rows", .. })
    ));
    fits::<i64>(R, "rows", i32::MAX as usize + 1).unwrap();
    assert!(matches!(
        csr_structure::<i32>(R, (1usize << 31, 1), &[0], &[]),
        Err(Error::Shape { arg: "rows", .. })
    ));
    assert!(matches!(
        coo_structure::<i32>(R, (1, 1usize << 32), &[], &[]),
        Err(Error::Shape { arg: "cols", .. })
    ));
}

#[test]
fn coo_structure_is_checked() {
    coo_structure::<i32>(R, (3, 3), &[0, 0, 2], &[0, 2, 1]).unwrap();
    coo_structure::<i64>(R, (3, 3), &[], &[]).unwrap();
    assert_eq!(
        coo_structure::<i32>(R, (3, 3), &[0, 0, 2], &[0, 2]),
        Err(Error::Length {
            routine: R,
            arg: "col_indices",
            expected: 3,
            actual: 2
        })
    );
    assert_eq!(
        coo_structure::<i32>(R, (3, 3), &[0, 2, 1], &[0, 2, 1]),
        Err(Error::Unsorted {
            routine: R,
            arg: "row_indices",
            position: 2
        })
    );
    assert!(matches!(
        coo_structure::<i32>(R, (3, 3), &[0, 0, 3], &[0, 2, 1]),
        Err(Error::IndexOutOfRange {
            arg: "row_indices",
            position: 2,
            value: 3,
            ..
        })
    ));
    assert!(matches!(
        coo_structure::<i64>(R, (3, 3), &[-1, 0, 1], &[0, 2, 1]),
        Err(Error::IndexOutOfRange {
            arg: "row_indices",
            position: 0,
            value: -1,
            ..
        })
    ));
    assert!(matches!(
        coo_structure::<i32>(R, (3, 3), &[0, 0, 1], &[0, 7, 1]),
        Err(Error::IndexOutOfRange {
            arg: "col_indices",
            position: 1,
            value: 7,
            ..
        })
    ));
}

#[test]
fn views_are_checked_for_device_alignment_and_length() {
    assert_eq!(
        view(R, "x", (4096, 64, 0), 64, (8, 0)).unwrap(),
        (4096, 4160)
    );
    assert_eq!(
        view(R, "x", (4096, 64, 1), 64, (8, 0)),
        Err(Error::WrongDevice {
            routine: R,
            arg: "x",
            expected: 0,
            actual: 1
        })
    );
    assert!(matches!(
        view(R, "x", (4100, 64, 0), 64, (8, 0)),
        Err(Error::Misaligned { align: 8, .. })
    ));
    assert_eq!(
        view(R, "y", (4096, 60, 0), 64, (4, 0)),
        Err(Error::BufferTooSmall {
            routine: R,
            arg: "y",
            need: 64,
            have: 60
        })
    );
    length(R, "a", 3, 3).unwrap();
    assert!(matches!(length(R, "a", 2, 3), Err(Error::Length { .. })));
    assert!(matches!(
        bytes(R, "a", usize::MAX, 8),
        Err(Error::Shape { .. })
    ));
}

#[test]
fn outputs_overlapping_inputs_are_refused() {
    disjoint(R, ("x", (0, 64)), ("y", (64, 128))).unwrap();
    disjoint(R, ("x", (0, 0)), ("y", (0, 128))).unwrap();
    assert_eq!(
        disjoint(R, ("values", (0, 65)), ("y", (64, 128))),
        Err(Error::Overlap {
            routine: R,
            a: "values",
            b: "y"
        })
    );
    assert!(matches!(
        disjoint(R, ("b", (100, 200)), ("c", (0, 101))),
        Err(Error::Overlap { .. })
    ));
}

#[test]
fn vectors_have_the_lengths_of_the_product() {
    assert_eq!(spmv_lengths(Op::N, 5, 3), (3, 5));
    assert_eq!(spmv_lengths(Op::T, 5, 3), (5, 3));
    assert_eq!(vector_bytes(R, "x", 3, 3, 8).unwrap(), 24);
    assert!(matches!(
        vector_bytes(R, "x", 4, 3, 8),
        Err(Error::Shape { arg: "x", .. })
    ));
}

#[test]
fn dense_matrices_reach_ld_times_their_outer_dimension() {
    // Column-major 4 x 3, ld 4: 12 elements; ld 10: 30 (the padding of the last column
    // included, as cuSPARSE documents the values' length).
    assert_eq!(
        matrix_bytes(R, "b", (4, 3, 4), Order::ColMajor, 8).unwrap(),
        96
    );
    assert_eq!(
        matrix_bytes(R, "b", (4, 3, 10), Order::ColMajor, 4).unwrap(),
        120
    );
    // Row-major 4 x 3: ld >= 3, ld * rows elements.
    assert_eq!(
        matrix_bytes(R, "b", (4, 3, 3), Order::RowMajor, 4).unwrap(),
        48
    );
    assert!(matches!(
        matrix_bytes(R, "b", (4, 3, 3), Order::ColMajor, 4),
        Err(Error::Shape { arg: "b", .. })
    ));
    assert!(matches!(
        matrix_bytes(R, "c", (4, 3, 2), Order::RowMajor, 4),
        Err(Error::Shape { arg: "c", .. })
    ));
    assert_eq!(
        matrix_bytes(R, "b", (0, 3, 1), Order::ColMajor, 4).unwrap(),
        0
    );
    assert!(matches!(
        matrix_bytes(R, "b", (2, usize::MAX, 2), Order::ColMajor, 4),
        Err(Error::Shape { .. })
    ));
}

#[test]
fn spmm_shapes_follow_the_operations() {
    // A 5 x 3, B 3 x 4, C 5 x 4.
    spmm_shapes(R, Op::N.apply((5, 3)), Op::N.apply((3, 4)), (5, 4)).unwrap();
    // A^T (3 x 5) B^T (stored 4 x 5) = C (3 x 4).
    spmm_shapes(R, Op::T.apply((5, 3)), Op::T.apply((4, 5)), (3, 4)).unwrap();
    assert!(matches!(
        spmm_shapes(R, Op::N.apply((5, 3)), Op::N.apply((4, 4)), (5, 4)),
        Err(Error::Shape { arg: "b", .. })
    ));
    assert!(matches!(
        spmm_shapes(R, Op::N.apply((5, 3)), Op::N.apply((3, 4)), (4, 5)),
        Err(Error::Shape { arg: "c", .. })
    ));
}

#[test]
fn errors_say_what_is_wrong() {
    let e = csr_structure::<i32>("CsrMatrix::from_host", (3, 3), &[0, 2, 2, 3], &[0, 3, 1])
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "CsrMatrix::from_host: col_indices[1] = 3 is outside [0, 3)"
    );
    let e = coo_structure::<i32>("CooMatrix::from_host", (3, 3), &[1, 0], &[0, 0]).unwrap_err();
    assert!(e.to_string().contains("row_indices[1]"), "{e}");
    assert!(Error::Capturing { routine: "spmv" }
        .to_string()
        .contains("captured"));
    assert!(Error::PerThreadStream {
        routine: "Sparse::new"
    }
    .to_string()
    .contains("per-thread"));
}

#[test]
fn the_types_cross_threads_as_documented() {
    fn send<T: Send>() {}
    fn sync<T: Sync>() {}
    send::<Sparse>();
    send::<CsrMatrix<f32>>();
    sync::<CsrMatrix<f64, i64>>();
    send::<CooMatrix<f64>>();
    sync::<CooMatrix<f32, i64>>();
}

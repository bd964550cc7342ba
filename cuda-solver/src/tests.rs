//! CPU tests of every refusal: the checks are pure functions, no library call.

use crate::check::{disjoint, info, matrices_bytes, matrix_bytes, square, view};
use crate::Error;

#[test]
fn matrices_reach_their_last_element() {
    assert_eq!(matrix_bytes("r", "a", (4, 3, 4), 8).unwrap(), 12 * 8);
    assert_eq!(matrix_bytes("r", "a", (4, 3, 10), 4).unwrap(), (20 + 4) * 4);
    assert_eq!(matrix_bytes("r", "a", (0, 3, 1), 4).unwrap(), 0);
    assert!(matches!(
        matrix_bytes("r", "a", (4, 3, 3), 4),
        Err(Error::Shape { arg: "a", .. })
    ));
    assert!(matches!(
        matrix_bytes("r", "a", (1 << 31, 1, 1 << 31), 4),
        Err(Error::Shape { .. })
    ));
}

#[test]
fn views_are_checked_for_device_alignment_and_length() {
    let ok = view("r", "a", (4096, 64, 0), 64, (8, 0)).unwrap();
    assert_eq!(ok, (4096, 4160));
    assert!(matches!(
        view("r", "a", (4096, 64, 1), 64, (8, 0)),
        Err(Error::WrongDevice {
            expected: 0,
            actual: 1,
            ..
        })
    ));
    assert!(matches!(
        view("r", "a", (4100, 64, 0), 64, (8, 0)),
        Err(Error::Misaligned { align: 8, .. })
    ));
    assert!(matches!(
        view("r", "b", (4096, 60, 0), 64, (8, 0)),
        Err(Error::BufferTooSmall {
            arg: "b",
            need: 64,
            have: 60,
            ..
        })
    ));
}

#[test]
fn overlaps_and_shapes_are_refused() {
    disjoint("r", ("a", (0, 64)), ("b", (64, 128))).unwrap();
    disjoint("r", ("a", (0, 0)), ("b", (0, 128))).unwrap();
    assert!(matches!(
        disjoint("r", ("a", (0, 65)), ("b", (64, 128))),
        Err(Error::Overlap { a: "a", b: "b", .. })
    ));
    assert_eq!(square("r", "a", 5, 5).unwrap(), 5);
    assert!(matches!(square("r", "a", 5, 4), Err(Error::Shape { .. })));
}

#[test]
fn info_becomes_a_typed_result() {
    info("potrf", 0, |_| unreachable!()).unwrap();
    assert_eq!(
        info("potrf", 7, |index| Error::NotPositiveDefinite {
            routine: "potrf",
            index
        }),
        Err(Error::NotPositiveDefinite {
            routine: "potrf",
            index: 7
        })
    );
    assert_eq!(
        info("getrf", -4, |_| unreachable!()),
        Err(Error::InvalidParameter {
            routine: "getrf",
            index: 4
        })
    );
}

#[test]
fn batched_matrices_reach_the_last_ones_last_element() {
    // 3 matrices of 4 x 3 with ld 5: two strides of 15 elements, then the last one's 14.
    assert_eq!(
        matrices_bytes("r", "a", (4, 3, 5), 8, 3).unwrap(),
        (2 * 15 + 14) * 8
    );
    assert_eq!(matrices_bytes("r", "a", (4, 3, 5), 8, 1).unwrap(), 14 * 8);
    assert_eq!(matrices_bytes("r", "a", (4, 0, 5), 8, 9).unwrap(), 0);
    assert!(matches!(
        matrices_bytes("r", "a", (32, 32, 32), 8, usize::MAX),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        matrices_bytes("r", "a", (4, 3, 2), 8, 3),
        Err(Error::Shape { arg: "a", .. })
    ));
}

#[test]
fn info_words_become_typed_errors_naming_the_matrix_of_a_batch() {
    use crate::dense::infos;
    let nc = |routine, index| Error::NoConvergence { routine, index };
    infos("syevj_batched", &[0, 0, 0], nc, true).unwrap();
    assert_eq!(
        infos("syevj_batched", &[0, 0, 33, 1], nc, true),
        Err(Error::InBatch {
            batch: 2,
            error: Box::new(Error::NoConvergence {
                routine: "syevj_batched",
                index: 33
            })
        })
    );
    // A batch of one still names its matrix; a refused parameter is not a matrix's failure.
    assert!(matches!(
        infos("gesvdj_batched", &[7], nc, true),
        Err(Error::InBatch { batch: 0, .. })
    ));
    assert_eq!(
        infos("gesvdj_batched", &[-4, 0], nc, true),
        Err(Error::InvalidParameter {
            routine: "gesvdj_batched",
            index: 4
        })
    );
    // Not batched: the error as it is.
    assert_eq!(
        infos("syevd", &[3], nc, false),
        Err(Error::NoConvergence {
            routine: "syevd",
            index: 3
        })
    );
}

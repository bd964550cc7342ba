//! CPU tests of the geometry and every refusal: pure functions, no library call.

use crate::layout::{Direction, Geometry, Layout, Precision, Transform};
use crate::Error;

const S: Precision = Precision::Single;
const D: Precision = Precision::Double;

#[test]
fn packed_transforms_reach_their_elements() {
    let g = Geometry::packed(Transform::C2C, S, &[1024], 64).unwrap();
    assert_eq!(g.input_bytes().unwrap(), 64 * 1024 * 8);
    assert_eq!(g.output_bytes().unwrap(), 64 * 1024 * 8);
    let g = Geometry::packed(Transform::R2C, D, &[4, 6], 3).unwrap();
    assert_eq!(g.input_bytes().unwrap(), 3 * 24 * 8);
    assert_eq!(g.output_bytes().unwrap(), 3 * 4 * 4 * 16);
    let g = Geometry::packed(Transform::C2R, S, &[2, 3, 5], 1).unwrap();
    assert_eq!(g.input_bytes().unwrap(), 2 * 3 * 3 * 8);
    assert_eq!(g.output_bytes().unwrap(), 30 * 4);
}

#[test]
fn bad_shapes_are_refused() {
    for (shape, batch, arg) in [
        (&[][..], 1, "shape"),
        (&[2, 2, 2, 2][..], 1, "shape"),
        (&[8, 0][..], 1, "shape"),
        (&[8][..], 0, "batch"),
    ] {
        match Geometry::packed(Transform::C2C, S, shape, batch) {
            Err(Error::Shape { arg: a, .. }) => assert_eq!(a, arg),
            other => panic!("{shape:?} x {batch}: {other:?}"),
        }
    }
}

#[test]
fn half_precision_takes_powers_of_two_and_two_byte_reals() {
    let h = Precision::Half;
    let g = Geometry::packed(Transform::C2C, h, &[16, 32], 3).unwrap();
    assert_eq!(g.input_bytes().unwrap(), 3 * 512 * 4);
    let g = Geometry::packed(Transform::R2C, h, &[64], 1).unwrap();
    assert_eq!(g.input_bytes().unwrap(), 64 * 2);
    assert_eq!(g.output_bytes().unwrap(), 33 * 4);
    for shape in [&[1000][..], &[16, 24][..], &[3][..]] {
        assert!(
            matches!(
                Geometry::packed(Transform::C2C, h, shape, 1),
                Err(Error::Shape { arg: "shape", .. })
            ),
            "{shape:?}"
        );
    }
    // The same sizes are fine in single precision.
    Geometry::packed(Transform::C2C, S, &[1000], 1).unwrap();
    // Strided half-precision layouts are refused; a shape whose product overflows is
    // refused, not a panic.
    let l = Layout::packed(&[64]);
    assert!(matches!(
        Geometry::with_layouts(Transform::C2C, h, &[64], 1, l.clone(), l),
        Err(Error::Shape { arg: "layout", .. })
    ));
    assert!(Geometry::packed(Transform::C2C, S, &[1 << 32, 1 << 32, 1 << 32], 1).is_err());
}

#[test]
fn layouts_are_checked_and_must_write_each_output_once() {
    // Column-wise transforms of a 16 x 8 row-major matrix: stride 8, dist 1 (interleaved).
    let col = Layout {
        embed: vec![16],
        stride: 8,
        dist: 1,
    };
    let g = Geometry::with_layouts(Transform::C2C, S, &[16], 8, col.clone(), col.clone()).unwrap();
    assert_eq!(g.output_bytes().unwrap(), 16 * 8 * 8);
    // dist 0: every transform writes the same elements.
    let same = Layout {
        dist: 0,
        ..col.clone()
    };
    assert!(matches!(
        Geometry::with_layouts(Transform::C2C, S, &[16], 8, col.clone(), same),
        Err(Error::Overlap { .. })
    ));
    // A stride that lands inside the batch's interleaving: 4 transforms, dist 1, stride 2.
    let clash = Layout {
        embed: vec![16],
        stride: 2,
        dist: 1,
    };
    assert!(matches!(
        Geometry::with_layouts(Transform::C2C, S, &[16], 4, col.clone(), clash.clone()),
        Err(Error::Overlap { .. })
    ));
    // ... which is fine as a C2C input (read only), but not as a C2R input (overwritten).
    Geometry::with_layouts(Transform::C2C, S, &[16], 4, clash.clone(), col.clone()).unwrap();
    let real_out = Layout {
        embed: vec![16],
        stride: 1,
        dist: 16,
    };
    let half_clash = Layout {
        embed: vec![9],
        stride: 2,
        dist: 1,
    };
    assert!(matches!(
        Geometry::with_layouts(Transform::C2R, S, &[16], 4, half_clash, real_out),
        Err(Error::Overlap { .. })
    ));
    // Embeddings: one per dimension, and at least the dimension (past the first).
    let short = Layout {
        embed: vec![4, 3],
        stride: 1,
        dist: 12,
    };
    assert!(matches!(
        Geometry::with_layouts(Transform::C2C, S, &[4, 4], 1, short.clone(), short),
        Err(Error::Shape { arg: "input", .. })
    ));
    let rank = Layout {
        embed: vec![4],
        stride: 1,
        dist: 4,
    };
    assert!(matches!(
        Geometry::with_layouts(Transform::C2C, S, &[4, 4], 1, rank.clone(), rank),
        Err(Error::Shape { .. })
    ));
    let zero = Layout {
        embed: vec![4],
        stride: 0,
        dist: 4,
    };
    assert!(matches!(
        Geometry::with_layouts(Transform::C2C, S, &[4], 1, zero.clone(), zero),
        Err(Error::Shape { .. })
    ));
    let huge = Layout {
        embed: vec![4],
        stride: 1 << 62,
        dist: 1 << 62,
    };
    assert!(matches!(
        Geometry::with_layouts(Transform::C2C, S, &[4], 4, huge.clone(), huge),
        Err(Error::Shape { .. } | Error::Overlap { .. })
    ));
}

#[test]
fn views_are_checked_for_length_alignment_and_overlap() {
    let g = Geometry::packed(Transform::C2C, S, &[256], 2).unwrap();
    let bytes = 2 * 256 * 8;
    g.check_views((1 << 20, bytes), (2 << 20, bytes)).unwrap();
    // In place: same address, same layout.
    g.check_views((1 << 20, bytes), (1 << 20, bytes)).unwrap();
    assert!(matches!(
        g.check_views((1 << 20, bytes - 1), (2 << 20, bytes)),
        Err(Error::BufferTooSmall { arg: "input", .. })
    ));
    assert!(matches!(
        g.check_views((1 << 20, bytes), (2 << 20, 8)),
        Err(Error::BufferTooSmall { arg: "output", .. })
    ));
    assert!(matches!(
        g.check_views((1 << 20, bytes), ((2 << 20) + 4, bytes)),
        Err(Error::Misaligned {
            arg: "output",
            align: 8,
            ..
        })
    ));
    // Partial overlap.
    assert!(matches!(
        g.check_views((1 << 20, bytes), ((1 << 20) + 8, bytes)),
        Err(Error::Overlap { .. })
    ));
    // R2C never in place here.
    let r = Geometry::packed(Transform::R2C, S, &[256], 1).unwrap();
    assert!(matches!(
        r.check_views((1 << 20, 4096), (1 << 20, 4096)),
        Err(Error::Overlap { .. })
    ));
}

#[test]
fn directions_follow_the_transform() {
    let c = Geometry::packed(Transform::C2C, D, &[8], 1).unwrap();
    assert_eq!(c.direction(Direction::Inverse).unwrap(), Direction::Inverse);
    let r = Geometry::packed(Transform::R2C, D, &[8], 1).unwrap();
    assert!(matches!(
        r.direction(Direction::Inverse),
        Err(Error::Direction { .. })
    ));
    let i = Geometry::packed(Transform::C2R, D, &[8], 1).unwrap();
    assert!(matches!(
        i.direction(Direction::Forward),
        Err(Error::Direction { .. })
    ));
    i.direction(Direction::Inverse).unwrap();
}

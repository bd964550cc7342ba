// A plan trusts its geometry for the bytes a transform reads and writes: a Geometry cannot be
// built from its fields, which would skip the checks.
use cudars_fft::{Geometry, Layout, Precision, Transform};

fn main() {
    let _forged = Geometry {
        transform: Transform::C2C,
        precision: Precision::Single,
        shape: vec![1 << 20],
        batch: 1,
        input: Layout::packed(&[1]),
        output: Layout::packed(&[1]),
        advanced: false,
    };
}

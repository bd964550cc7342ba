// A checked Geometry cannot have a field changed after its checks.
use cudars_fft::{Geometry, Precision, Transform};

fn main() {
    let mut g = Geometry::packed(Transform::C2C, Precision::Single, &[8], 1).unwrap();
    g.batch = 1 << 20;
}

//! [`RandFloat`]: the float types cuRAND's host API fills (`f32`, `f64`).

mod sealed {
    /// What the generator needs of a float type; not implementable outside this crate.
    pub trait Sealed: Copy + Send + Sync + 'static {
        /// The value as `f64` (exact for both types).
        fn to_f64(self) -> f64;
    }

    impl Sealed for f32 {
        fn to_f64(self) -> f64 {
            f64::from(self)
        }
    }

    impl Sealed for f64 {
        fn to_f64(self) -> f64 {
            self
        }
    }
}

/// A float type cuRAND fills: `f32` (`curandGenerateUniform`, `...Normal`, `...LogNormal`)
/// and `f64` (their `*Double` forms). cuRAND's host API has no half-precision fills. Sealed:
/// the generator's methods rely on the element size of exactly these two types.
///
/// ```compile_fail
/// // Not for other types:
/// struct Half(u16);
/// impl cudars_rand::RandFloat for Half {}
/// ```
pub trait RandFloat: sealed::Sealed {}

impl RandFloat for f32 {}
impl RandFloat for f64 {}

/// The element size of `T`, in bytes.
pub(crate) fn width<T: RandFloat>() -> usize {
    std::mem::size_of::<T>()
}

/// `value` as `f64`.
pub(crate) fn to_f64<T: RandFloat>(value: T) -> f64 {
    sealed::Sealed::to_f64(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_two_float_types_have_their_widths_and_exact_f64_values() {
        // The fills pick the single- or double-precision entry point by this width.
        assert_eq!(width::<f32>(), 4);
        assert_eq!(width::<f64>(), 8);
        assert_eq!(to_f64(0.1f32), f64::from(0.1f32));
        assert!(to_f64(f32::NAN).is_nan());
        assert_eq!(to_f64(-2.5f64), -2.5);
    }
}

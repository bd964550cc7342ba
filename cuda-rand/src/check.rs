//! The checks every call makes before anything is issued: pure functions of plain values (the
//! view's address, length and device; the generator's kind, dimensions and device; the
//! arguments), so that the unit tests cover every refusal without a GPU or cuRAND, and so
//! that no refusal can depend on a library call.

use cudars_core::DevicePtr;

use crate::error::{Error, Result};
use crate::kind::{RngKind, RngOrdering};

/// cuRAND's largest Poisson mean (`CURAND_STATUS_OUT_OF_RANGE` above it).
pub const MAX_POISSON_LAMBDA: f64 = 400_000.0;

/// cuRAND's largest number of Sobol dimensions (`curandSetQuasiRandomGeneratorDimensions`).
pub const MAX_DIMENSIONS: u32 = 20_000;

/// The view a fill writes, as plain values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Target {
    /// The device address of its first byte.
    pub addr: u64,
    /// Its length in bytes.
    pub len: usize,
    /// Its device's ordinal.
    pub device: usize,
}

impl Target {
    /// The plain values of `view`.
    pub(crate) fn of(view: &DevicePtr) -> Target {
        Target {
            addr: view.as_raw(),
            len: view.len(),
            device: view.device().ordinal(),
        }
    }
}

/// The generator, as plain values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    /// Its kind.
    pub kind: RngKind,
    /// Its Sobol dimensions (1 for pseudo-random generators).
    pub dimensions: u32,
    /// Its device's ordinal.
    pub device: usize,
}

/// What a fill makes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Fill {
    /// Uniform floats of `element` bytes.
    Uniform {
        /// 4 or 8.
        element: usize,
    },
    /// Normal floats.
    Normal {
        /// 4 or 8.
        element: usize,
        /// Mean.
        mean: f64,
        /// Standard deviation.
        std: f64,
    },
    /// Log-normal floats (of a normal with `mean`, `std`).
    LogNormal {
        /// 4 or 8.
        element: usize,
        /// Mean of the underlying normal.
        mean: f64,
        /// Standard deviation of the underlying normal.
        std: f64,
    },
    /// Poisson `u32`s.
    Poisson {
        /// The mean.
        lambda: f64,
    },
    /// Raw `u32`s.
    Bits32,
    /// Raw `u64`s.
    Bits64,
}

impl Fill {
    /// The element size in bytes.
    pub(crate) fn element(&self) -> usize {
        match *self {
            Fill::Uniform { element }
            | Fill::Normal { element, .. }
            | Fill::LogNormal { element, .. } => element,
            Fill::Poisson { .. } | Fill::Bits32 => 4,
            Fill::Bits64 => 8,
        }
    }

    /// The method's name, for messages.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Fill::Uniform { .. } => "uniform",
            Fill::Normal { .. } => "normal",
            Fill::LogNormal { .. } => "log_normal",
            Fill::Poisson { .. } => "poisson",
            Fill::Bits32 => "bits_u32",
            Fill::Bits64 => "bits_u64",
        }
    }
}

/// [`Error::WrongDevice`] naming `arg` unless `actual` is `expected`.
pub(crate) fn same_device(arg: &'static str, expected: usize, actual: usize) -> Result<()> {
    if expected == actual {
        Ok(())
    } else {
        Err(Error::WrongDevice {
            arg,
            expected,
            actual,
        })
    }
}

/// `Ok` when a seed applies to `kind` (pseudo-random generators).
pub(crate) fn seedable(kind: RngKind) -> Result<()> {
    if kind.is_pseudo() {
        Ok(())
    } else {
        Err(Error::Unsupported {
            what: "a seed",
            kind,
            why: "quasi-random generators have no seed; set their offset or dimensions",
        })
    }
}

/// `Ok` when `dimensions` may be set on `kind`: a quasi-random generator and 1 to
/// [`MAX_DIMENSIONS`].
pub(crate) fn dimensions(kind: RngKind, dimensions: u32) -> Result<()> {
    if kind.is_pseudo() {
        return Err(Error::Unsupported {
            what: "dimensions",
            kind,
            why: "only quasi-random (Sobol) generators have dimensions",
        });
    }
    if dimensions == 0 || dimensions > MAX_DIMENSIONS {
        return Err(Error::BadValue {
            arg: "dimensions",
            value: f64::from(dimensions),
            expected: "1 to 20000",
        });
    }
    Ok(())
}

/// `Ok` when `ordering` is of `kind`'s class (pseudo- or quasi-random).
pub(crate) fn ordering(kind: RngKind, ordering: RngOrdering) -> Result<()> {
    if ordering.is_pseudo() == kind.is_pseudo() {
        Ok(())
    } else if kind.is_pseudo() {
        Err(Error::Unsupported {
            what: "RngOrdering::QuasiDefault",
            kind,
            why: "pseudo-random generators take the Pseudo* orderings",
        })
    } else {
        Err(Error::Unsupported {
            what: "a pseudo-random ordering",
            kind,
            why: "quasi-random generators take RngOrdering::QuasiDefault",
        })
    }
}

/// [`Error::BadValue`] unless `value` is finite.
fn finite(arg: &'static str, value: f64) -> Result<()> {
    if value.is_finite() {
        Ok(())
    } else {
        Err(Error::BadValue {
            arg,
            value,
            expected: "a finite number",
        })
    }
}

/// [`Error::BadValue`] unless `value` is finite and above 0.
fn positive(arg: &'static str, value: f64) -> Result<()> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(Error::BadValue {
            arg,
            value,
            expected: "a finite number above 0",
        })
    }
}

/// Every check of a fill of `out` (the argument `"out"`) by a generator of `shape`: the
/// number of elements cuRAND will write, exactly the view's, or the refusal. In order:
///
/// 1. the kind makes this fill (`u64`s only from 64-bit Sobol, `u32`s not from them);
/// 2. the numeric arguments (`mean` finite, `std` finite and above 0, `lambda` in
///    (0, 400000]);
/// 3. the view is on the generator's device;
/// 4. its length is a whole number of elements, and (when not empty) its address is
///    aligned to them;
/// 5. the count suits the generator: even for normal and log-normal numbers of a
///    pseudo-random generator, a multiple of the dimensions for a quasi-random one.
pub(crate) fn plan(shape: Shape, fill: Fill, out: Target) -> Result<usize> {
    const OUT: &str = "out";
    match fill {
        Fill::Bits32 if shape.kind.is_64_bit() => {
            return Err(Error::Unsupported {
                what: "bits_u32",
                kind: shape.kind,
                why: "a 64-bit Sobol generator makes u64s: use bits_u64",
            })
        }
        Fill::Bits64 if !shape.kind.is_64_bit() => {
            return Err(Error::Unsupported {
                what: "bits_u64",
                kind: shape.kind,
                why: "only Sobol64 and ScrambledSobol64 make u64s: use bits_u32",
            })
        }
        Fill::Normal { mean, std, .. } | Fill::LogNormal { mean, std, .. } => {
            finite("mean", mean)?;
            positive("std", std)?;
        }
        Fill::Poisson { lambda } => {
            positive("lambda", lambda)?;
            if lambda > MAX_POISSON_LAMBDA {
                return Err(Error::BadValue {
                    arg: "lambda",
                    value: lambda,
                    expected: "at most 400000 (cuRAND's largest Poisson mean)",
                });
            }
        }
        _ => {}
    }
    same_device(OUT, shape.device, out.device)?;
    let element = fill.element();
    if !out.len.is_multiple_of(element) {
        return Err(Error::Length {
            arg: OUT,
            len: out.len,
            element,
        });
    }
    let count = out.len / element;
    if count == 0 {
        return Ok(0);
    }
    if !out.addr.is_multiple_of(element as u64) {
        return Err(Error::Misaligned {
            arg: OUT,
            addr: out.addr,
            align: element,
        });
    }
    let pairs = matches!(fill, Fill::Normal { .. } | Fill::LogNormal { .. });
    if shape.kind.is_pseudo() && pairs && !count.is_multiple_of(2) {
        return Err(Error::OddCount {
            arg: OUT,
            count,
            call: fill.name(),
        });
    }
    if shape.kind.is_quasi() && !count.is_multiple_of(shape.dimensions.max(1) as usize) {
        return Err(Error::NotMultipleOfDimensions {
            arg: OUT,
            count,
            dimensions: shape.dimensions,
        });
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PHILOX: Shape = Shape {
        kind: RngKind::Philox,
        dimensions: 1,
        device: 0,
    };

    fn sobol(kind: RngKind, dimensions: u32) -> Shape {
        Shape {
            kind,
            dimensions,
            device: 0,
        }
    }

    fn view(addr: u64, len: usize) -> Target {
        Target {
            addr,
            len,
            device: 0,
        }
    }

    const F32_NORMAL: Fill = Fill::Normal {
        element: 4,
        mean: 0.0,
        std: 1.0,
    };

    #[test]
    fn whole_aligned_views_give_their_element_count() {
        let base = 0x7f00_0000_0000;
        assert_eq!(
            plan(PHILOX, Fill::Uniform { element: 4 }, view(base, 4096)),
            Ok(1024)
        );
        assert_eq!(
            plan(PHILOX, Fill::Uniform { element: 8 }, view(base + 8, 24)),
            Ok(3)
        );
        assert_eq!(plan(PHILOX, F32_NORMAL, view(base, 8)), Ok(2));
        assert_eq!(
            plan(PHILOX, Fill::Poisson { lambda: 3.5 }, view(base + 4, 12)),
            Ok(3)
        );
        assert_eq!(plan(PHILOX, Fill::Bits32, view(base, 4)), Ok(1));
        let wide = sobol(RngKind::Sobol64, 3);
        assert_eq!(plan(wide, Fill::Bits64, view(base, 48)), Ok(6));
        // Quasi-random normals need no pairs, only whole points.
        let s = sobol(RngKind::Sobol32, 3);
        assert_eq!(plan(s, F32_NORMAL, view(base, 12)), Ok(3));
    }

    #[test]
    fn a_length_that_is_not_whole_elements_is_refused_naming_out() {
        for (fill, len, element) in [
            (Fill::Uniform { element: 4 }, 4098, 4),
            (Fill::Uniform { element: 8 }, 20, 8),
            (Fill::Poisson { lambda: 1.0 }, 6, 4),
            (Fill::Bits32, 3, 4),
        ] {
            assert_eq!(
                plan(PHILOX, fill, view(0x1000, len)),
                Err(Error::Length {
                    arg: "out",
                    len,
                    element
                }),
                "{fill:?}"
            );
        }
        assert_eq!(
            plan(sobol(RngKind::Sobol64, 1), Fill::Bits64, view(0x1000, 12)),
            Err(Error::Length {
                arg: "out",
                len: 12,
                element: 8
            })
        );
    }

    #[test]
    fn a_misaligned_view_is_refused_unless_it_is_empty() {
        assert_eq!(
            plan(PHILOX, Fill::Uniform { element: 4 }, view(0x1002, 8)),
            Err(Error::Misaligned {
                arg: "out",
                addr: 0x1002,
                align: 4
            })
        );
        assert_eq!(
            plan(PHILOX, Fill::Uniform { element: 8 }, view(0x1004, 16)),
            Err(Error::Misaligned {
                arg: "out",
                addr: 0x1004,
                align: 8
            })
        );
        // An empty view writes nothing: its address does not matter.
        assert_eq!(
            plan(PHILOX, Fill::Uniform { element: 8 }, view(0x1003, 0)),
            Ok(0)
        );
    }

    #[test]
    fn a_view_of_another_device_is_refused_even_when_empty() {
        let other = Target {
            addr: 0x1000,
            len: 0,
            device: 1,
        };
        assert_eq!(
            plan(PHILOX, Fill::Bits32, other),
            Err(Error::WrongDevice {
                arg: "out",
                expected: 0,
                actual: 1
            })
        );
        assert_eq!(
            same_device("stream", 2, 0),
            Err(Error::WrongDevice {
                arg: "stream",
                expected: 2,
                actual: 0
            })
        );
        assert_eq!(same_device("stream", 1, 1), Ok(()));
    }

    #[test]
    fn odd_normal_counts_are_refused_for_pseudo_generators_only() {
        for kind in [RngKind::Xorwow, RngKind::Philox, RngKind::Mrg32k3a] {
            let shape = Shape {
                kind,
                dimensions: 1,
                device: 0,
            };
            for (fill, call) in [
                (F32_NORMAL, "normal"),
                (
                    Fill::LogNormal {
                        element: 8,
                        mean: 0.0,
                        std: 0.5,
                    },
                    "log_normal",
                ),
            ] {
                let len = 3 * fill.element();
                assert_eq!(
                    plan(shape, fill, view(0x1000, len)),
                    Err(Error::OddCount {
                        arg: "out",
                        count: 3,
                        call
                    }),
                    "{kind:?} {fill:?}"
                );
            }
            // Uniform and Poisson numbers come one by one.
            assert_eq!(
                plan(shape, Fill::Uniform { element: 4 }, view(0x1000, 12)),
                Ok(3)
            );
            assert_eq!(
                plan(shape, Fill::Poisson { lambda: 2.0 }, view(0x1000, 12)),
                Ok(3)
            );
        }
        assert_eq!(
            plan(sobol(RngKind::Sobol32, 1), F32_NORMAL, view(0x1000, 12)),
            Ok(3)
        );
    }

    #[test]
    fn quasi_counts_must_be_whole_points() {
        for kind in [
            RngKind::Sobol32,
            RngKind::ScrambledSobol32,
            RngKind::Sobol64,
            RngKind::ScrambledSobol64,
        ] {
            let shape = sobol(kind, 4);
            for fill in [
                Fill::Uniform { element: 4 },
                Fill::Uniform { element: 8 },
                F32_NORMAL,
                Fill::Poisson { lambda: 1.0 },
            ] {
                let len = 6 * fill.element();
                assert_eq!(
                    plan(shape, fill, view(0x1000, len)),
                    Err(Error::NotMultipleOfDimensions {
                        arg: "out",
                        count: 6,
                        dimensions: 4
                    }),
                    "{kind:?} {fill:?}"
                );
                assert_eq!(plan(shape, fill, view(0x1000, 8 * fill.element())), Ok(8));
            }
        }
    }

    #[test]
    fn bad_means_deviations_and_lambdas_are_refused_naming_them() {
        let normal = |mean, std| Fill::Normal {
            element: 4,
            mean,
            std,
        };
        let log_normal = |mean, std| Fill::LogNormal {
            element: 8,
            mean,
            std,
        };
        for fill in [normal(0.0, 0.0), log_normal(0.0, 0.0)] {
            assert!(matches!(
                plan(PHILOX, fill, view(0x1000, 16)),
                Err(Error::BadValue { arg: "std", value, .. }) if value == 0.0
            ));
        }
        for std in [-1.0, f64::NAN, f64::INFINITY] {
            assert!(matches!(
                plan(PHILOX, normal(0.0, std), view(0x1000, 16)),
                Err(Error::BadValue { arg: "std", .. })
            ));
        }
        for mean in [f64::NAN, f64::NEG_INFINITY] {
            assert!(matches!(
                plan(PHILOX, log_normal(mean, 1.0), view(0x1000, 16)),
                Err(Error::BadValue { arg: "mean", .. })
            ));
        }
        for lambda in [0.0, -2.0, f64::NAN, f64::INFINITY, 400_000.5] {
            assert!(
                matches!(
                    plan(PHILOX, Fill::Poisson { lambda }, view(0x1000, 16)),
                    Err(Error::BadValue { arg: "lambda", .. })
                ),
                "{lambda}"
            );
        }
        assert_eq!(
            plan(
                PHILOX,
                Fill::Poisson {
                    lambda: MAX_POISSON_LAMBDA
                },
                view(0x1000, 16)
            ),
            Ok(4)
        );
        // The values are checked before the view: a bad value on an empty view is refused.
        assert!(matches!(
            plan(PHILOX, normal(0.0, -1.0), view(0x1000, 0)),
            Err(Error::BadValue { arg: "std", .. })
        ));
    }

    #[test]
    fn raw_bits_of_the_wrong_width_are_refused() {
        for kind in RngKind::ALL {
            let shape = sobol(kind, 1);
            let narrow = plan(shape, Fill::Bits32, view(0x1000, 8));
            let wide = plan(shape, Fill::Bits64, view(0x1000, 8));
            if kind.is_64_bit() {
                assert!(
                    matches!(narrow, Err(Error::Unsupported { what: "bits_u32", kind: k, .. }) if k == kind)
                );
                assert_eq!(wide, Ok(1));
            } else {
                assert_eq!(narrow, Ok(2));
                assert!(
                    matches!(wide, Err(Error::Unsupported { what: "bits_u64", kind: k, .. }) if k == kind)
                );
            }
        }
    }

    #[test]
    fn seeds_dimensions_and_orderings_follow_the_kind() {
        for kind in RngKind::ALL {
            assert_eq!(seedable(kind).is_ok(), kind.is_pseudo(), "{kind:?}");
            assert_eq!(dimensions(kind, 3).is_ok(), kind.is_quasi(), "{kind:?}");
            assert!(ordering(kind, RngOrdering::default_for(kind)).is_ok());
            let other = if kind.is_pseudo() {
                RngOrdering::QuasiDefault
            } else {
                RngOrdering::PseudoLegacy
            };
            assert!(matches!(
                ordering(kind, other),
                Err(Error::Unsupported { kind: k, .. }) if k == kind
            ));
        }
        assert!(matches!(
            seedable(RngKind::Sobol32),
            Err(Error::Unsupported {
                what: "a seed",
                kind: RngKind::Sobol32,
                ..
            })
        ));
        for bad in [0, MAX_DIMENSIONS + 1] {
            assert!(matches!(
                dimensions(RngKind::Sobol32, bad),
                Err(Error::BadValue { arg: "dimensions", value, .. }) if value == f64::from(bad)
            ));
        }
        assert_eq!(
            dimensions(RngKind::ScrambledSobol64, MAX_DIMENSIONS),
            Ok(())
        );
        assert!(matches!(
            dimensions(RngKind::Philox, 2),
            Err(Error::Unsupported {
                what: "dimensions",
                ..
            })
        ));
    }
}

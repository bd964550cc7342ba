//! [`RngKind`]: the generators; [`RngOrdering`]: how their results are laid out.

use std::fmt;

use cudars_rand_sys::{curandOrdering_t, curandRngType_t};

/// A cuRAND generator algorithm.
///
/// The default is [`RngKind::Xorwow`]: what CuPy's `cupy.random.RandomState()` (and so every
/// `cupy.random.*` function) uses, `CURAND_RNG_PSEUDO_DEFAULT`, which cuRAND defines as
/// XORWOW. [`RngKind::Philox`] is PyTorch's choice (its CUDA generator is Philox-4x32-10) and
/// the fastest cuRAND generator for large fills on current GPUs.
///
/// ```
/// use cudars_rand::RngKind;
/// assert_eq!(RngKind::default(), RngKind::Xorwow);
/// assert!(RngKind::Philox.is_pseudo());
/// assert!(RngKind::Sobol64.is_quasi() && RngKind::Sobol64.is_64_bit());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum RngKind {
    /// XORWOW (`CURAND_RNG_PSEUDO_XORWOW`): cuRAND's and CuPy's default.
    #[default]
    Xorwow,
    /// Philox-4x32-10 (`CURAND_RNG_PSEUDO_PHILOX4_32_10`): counter-based, PyTorch's choice.
    Philox,
    /// MRG32k3a (`CURAND_RNG_PSEUDO_MRG32K3A`): combined multiple recursive generator.
    Mrg32k3a,
    /// Sobol, 32-bit (`CURAND_RNG_QUASI_SOBOL32`): quasi-random, `QUASI_DEFAULT`.
    Sobol32,
    /// Scrambled Sobol, 32-bit (`CURAND_RNG_QUASI_SCRAMBLED_SOBOL32`).
    ScrambledSobol32,
    /// Sobol, 64-bit (`CURAND_RNG_QUASI_SOBOL64`): the only kinds that fill `u64`s.
    Sobol64,
    /// Scrambled Sobol, 64-bit (`CURAND_RNG_QUASI_SCRAMBLED_SOBOL64`).
    ScrambledSobol64,
}

impl RngKind {
    /// Every kind, pseudo-random first.
    pub const ALL: [RngKind; 7] = [
        RngKind::Xorwow,
        RngKind::Philox,
        RngKind::Mrg32k3a,
        RngKind::Sobol32,
        RngKind::ScrambledSobol32,
        RngKind::Sobol64,
        RngKind::ScrambledSobol64,
    ];

    /// cuRAND's value for the kind.
    pub fn to_raw(self) -> curandRngType_t {
        match self {
            RngKind::Xorwow => curandRngType_t::CURAND_RNG_PSEUDO_XORWOW,
            RngKind::Philox => curandRngType_t::CURAND_RNG_PSEUDO_PHILOX4_32_10,
            RngKind::Mrg32k3a => curandRngType_t::CURAND_RNG_PSEUDO_MRG32K3A,
            RngKind::Sobol32 => curandRngType_t::CURAND_RNG_QUASI_SOBOL32,
            RngKind::ScrambledSobol32 => curandRngType_t::CURAND_RNG_QUASI_SCRAMBLED_SOBOL32,
            RngKind::Sobol64 => curandRngType_t::CURAND_RNG_QUASI_SOBOL64,
            RngKind::ScrambledSobol64 => curandRngType_t::CURAND_RNG_QUASI_SCRAMBLED_SOBOL64,
        }
    }

    /// A pseudo-random generator (seeded; normal numbers in pairs).
    pub fn is_pseudo(self) -> bool {
        matches!(self, RngKind::Xorwow | RngKind::Philox | RngKind::Mrg32k3a)
    }

    /// A quasi-random generator (Sobol: dimensions, no seed).
    pub fn is_quasi(self) -> bool {
        !self.is_pseudo()
    }

    /// A 64-bit quasi-random generator: its raw numbers are `u64`
    /// ([`Generator::bits_u64`](crate::Generator::bits_u64)), not `u32`.
    pub fn is_64_bit(self) -> bool {
        matches!(self, RngKind::Sobol64 | RngKind::ScrambledSobol64)
    }

    /// cuRAND's name for the kind (`CURAND_RNG_PSEUDO_XORWOW`, ...).
    pub fn name(self) -> &'static str {
        match self {
            RngKind::Xorwow => "CURAND_RNG_PSEUDO_XORWOW",
            RngKind::Philox => "CURAND_RNG_PSEUDO_PHILOX4_32_10",
            RngKind::Mrg32k3a => "CURAND_RNG_PSEUDO_MRG32K3A",
            RngKind::Sobol32 => "CURAND_RNG_QUASI_SOBOL32",
            RngKind::ScrambledSobol32 => "CURAND_RNG_QUASI_SCRAMBLED_SOBOL32",
            RngKind::Sobol64 => "CURAND_RNG_QUASI_SOBOL64",
            RngKind::ScrambledSobol64 => "CURAND_RNG_QUASI_SCRAMBLED_SOBOL64",
        }
    }
}

impl fmt::Display for RngKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a generator lays its results out in memory (`curandOrdering_t`). Pseudo-random
/// orderings apply to pseudo-random generators and [`RngOrdering::QuasiDefault`] to
/// quasi-random ones ([`Error::Unsupported`](crate::Error::Unsupported) otherwise, before any
/// call). Which pseudo-random orderings a kind supports is cuRAND's to say: one it does not
/// support is its `CURAND_STATUS_OUT_OF_RANGE` or `CURAND_STATUS_TYPE_ERROR`
/// ([`Error::Curand`](crate::Error::Curand)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RngOrdering {
    /// `CURAND_ORDERING_PSEUDO_BEST`: the fastest layout.
    PseudoBest,
    /// `CURAND_ORDERING_PSEUDO_DEFAULT`: the default of pseudo-random generators.
    PseudoDefault,
    /// `CURAND_ORDERING_PSEUDO_SEEDED`: fast, lower-quality seeding (XORWOW).
    PseudoSeeded,
    /// `CURAND_ORDERING_PSEUDO_LEGACY`: the layout every cuRAND release keeps.
    PseudoLegacy,
    /// `CURAND_ORDERING_PSEUDO_DYNAMIC`: adjusted to the device (results differ by GPU).
    PseudoDynamic,
    /// `CURAND_ORDERING_QUASI_DEFAULT`: the one quasi-random layout.
    QuasiDefault,
}

impl RngOrdering {
    /// cuRAND's value.
    pub fn to_raw(self) -> curandOrdering_t {
        match self {
            RngOrdering::PseudoBest => curandOrdering_t::CURAND_ORDERING_PSEUDO_BEST,
            RngOrdering::PseudoDefault => curandOrdering_t::CURAND_ORDERING_PSEUDO_DEFAULT,
            RngOrdering::PseudoSeeded => curandOrdering_t::CURAND_ORDERING_PSEUDO_SEEDED,
            RngOrdering::PseudoLegacy => curandOrdering_t::CURAND_ORDERING_PSEUDO_LEGACY,
            RngOrdering::PseudoDynamic => curandOrdering_t::CURAND_ORDERING_PSEUDO_DYNAMIC,
            RngOrdering::QuasiDefault => curandOrdering_t::CURAND_ORDERING_QUASI_DEFAULT,
        }
    }

    /// An ordering of pseudo-random generators.
    pub fn is_pseudo(self) -> bool {
        self != RngOrdering::QuasiDefault
    }

    /// The ordering a new generator of `kind` has.
    pub fn default_for(kind: RngKind) -> RngOrdering {
        if kind.is_pseudo() {
            RngOrdering::PseudoDefault
        } else {
            RngOrdering::QuasiDefault
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_map_to_the_header_values() {
        let raw: Vec<u32> = RngKind::ALL.iter().map(|k| k.to_raw().0).collect();
        assert_eq!(raw, vec![101, 161, 121, 201, 202, 203, 204]);
        // CuPy's default is CURAND_RNG_PSEUDO_DEFAULT, which cuRAND resolves to XORWOW.
        assert_eq!(RngKind::default(), RngKind::Xorwow);
        let pseudo: Vec<RngKind> = RngKind::ALL.into_iter().filter(|k| k.is_pseudo()).collect();
        assert_eq!(
            pseudo,
            vec![RngKind::Xorwow, RngKind::Philox, RngKind::Mrg32k3a]
        );
        let wide: Vec<RngKind> = RngKind::ALL.into_iter().filter(|k| k.is_64_bit()).collect();
        assert_eq!(wide, vec![RngKind::Sobol64, RngKind::ScrambledSobol64]);
        assert!(RngKind::ALL.iter().all(|k| k.is_pseudo() != k.is_quasi()));
        assert_eq!(
            RngKind::Philox.to_string(),
            "CURAND_RNG_PSEUDO_PHILOX4_32_10"
        );
    }

    #[test]
    fn orderings_map_to_the_header_values_and_defaults_follow_the_kind() {
        let all = [
            RngOrdering::PseudoBest,
            RngOrdering::PseudoDefault,
            RngOrdering::PseudoSeeded,
            RngOrdering::PseudoLegacy,
            RngOrdering::PseudoDynamic,
            RngOrdering::QuasiDefault,
        ];
        let raw: Vec<u32> = all.iter().map(|o| o.to_raw().0).collect();
        assert_eq!(raw, vec![100, 101, 102, 103, 104, 201]);
        assert_eq!(
            RngOrdering::default_for(RngKind::Mrg32k3a),
            RngOrdering::PseudoDefault
        );
        assert_eq!(
            RngOrdering::default_for(RngKind::ScrambledSobol32),
            RngOrdering::QuasiDefault
        );
    }
}

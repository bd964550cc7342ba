//! [`Arch`]: the GPU architecture a program is compiled for.

use std::fmt;

use cudars_core::Device;

use crate::error::{Error, Result};

/// A GPU architecture: compute capability `major.minor`, with NVIDIA's optional suffix (`a`
/// for architecture-specific features such as `sm_90a`, `f` for family-specific ones such as
/// `sm_100f`).
///
/// ```
/// use cudars_rtc::Arch;
/// let hopper = Arch::new(9, 0);
/// assert_eq!(hopper.sm(), "sm_90");
/// assert_eq!(hopper.compute(), "compute_90");
/// assert_eq!(Arch::parse("sm_90a").unwrap(), Arch::new(9, 0).with_suffix('a'));
/// assert_eq!(Arch::parse("compute_120").unwrap(), Arch::new(12, 0));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Arch {
    /// Compute capability major (9 on Hopper).
    pub major: u32,
    /// Compute capability minor.
    pub minor: u32,
    /// `Some('a')` or `Some('f')`, or `None`.
    pub suffix: Option<char>,
}

impl Arch {
    /// `major.minor`, no suffix.
    pub const fn new(major: u32, minor: u32) -> Arch {
        Arch {
            major,
            minor,
            suffix: None,
        }
    }

    /// The same architecture with `suffix` (`'a'` or `'f'`).
    pub const fn with_suffix(mut self, suffix: char) -> Arch {
        self.suffix = Some(suffix);
        self
    }

    /// The architecture of `device` (its compute capability).
    pub fn of(device: &Device) -> Result<Arch> {
        let (major, minor) = device.compute_capability()?;
        Ok(Arch::new(major, minor))
    }

    /// Parses `sm_90`, `sm_90a`, `compute_100f`, `90` or `9.0`.
    pub fn parse(text: &str) -> Result<Arch> {
        let bad = || Error::InvalidArgument(format!("`{text}` is not an architecture (sm_90)"));
        let t = text.trim();
        if let Some((major, minor)) = t.split_once('.') {
            let major = major.parse().map_err(|_| bad())?;
            let minor = minor.parse().map_err(|_| bad())?;
            return Ok(Arch::new(major, minor));
        }
        let t = t
            .strip_prefix("sm_")
            .or_else(|| t.strip_prefix("compute_"))
            .unwrap_or(t);
        let (digits, suffix) = match t.chars().last() {
            Some(c @ ('a' | 'f')) => (&t[..t.len() - 1], Some(c)),
            _ => (t, None),
        };
        if digits.len() < 2 || !digits.chars().all(|c| c.is_ascii_digit()) {
            return Err(bad());
        }
        let (major, minor) = digits.split_at(digits.len() - 1);
        Ok(Arch {
            major: major.parse().map_err(|_| bad())?,
            minor: minor.parse().map_err(|_| bad())?,
            suffix,
        })
    }

    /// The number NVRTC lists it by (`90` for 9.0).
    pub fn number(self) -> u32 {
        self.major * 10 + self.minor
    }

    fn suffix_str(self) -> String {
        self.suffix.map(String::from).unwrap_or_default()
    }

    /// `sm_90`: the real architecture (a cubin).
    pub fn sm(self) -> String {
        format!("sm_{}{}", self.number(), self.suffix_str())
    }

    /// `compute_90`: the virtual architecture (PTX, LTO-IR).
    pub fn compute(self) -> String {
        format!("compute_{}{}", self.number(), self.suffix_str())
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.sm())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn architectures_parse_and_print() {
        for (text, arch) in [
            ("sm_90", Arch::new(9, 0)),
            ("90", Arch::new(9, 0)),
            ("9.0", Arch::new(9, 0)),
            ("sm_80", Arch::new(8, 0)),
            ("sm_86", Arch::new(8, 6)),
            ("sm_100f", Arch::new(10, 0).with_suffix('f')),
            ("compute_120a", Arch::new(12, 0).with_suffix('a')),
        ] {
            assert_eq!(Arch::parse(text).unwrap(), arch, "{text}");
        }
        assert_eq!(Arch::new(10, 0).with_suffix('a').sm(), "sm_100a");
        assert_eq!(Arch::new(8, 9).compute(), "compute_89");
        for bad in ["", "sm_", "sm_9", "sm_x0", "9.x", "sm_90b"] {
            assert!(Arch::parse(bad).is_err(), "{bad}");
        }
    }
}

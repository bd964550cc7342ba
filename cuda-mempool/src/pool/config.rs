//! How a pool is built: [`Limit`] and [`PoolConfig`].

use crate::error::PoolError;
use crate::policy;

/// Environment variable read by [`PoolConfig::from_env`]: a limit applied to every
/// device, in the syntax of [`Limit::parse`] (for example `8589934592` or `50%`).
pub const LIMIT_ENV_VAR: &str = "CUDA_MEMPOOL_LIMIT";

/// A hard cap on the physical memory the pool may hold on one device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Limit {
    /// No cap.
    Unlimited,
    /// At most this many bytes.
    Bytes(usize),
    /// At most this fraction (in `[0, 1]`) of the device's total memory.
    Fraction(f64),
}

impl Limit {
    /// Parses a limit: `none` (or an empty string) for no cap, a byte count
    /// (`1073741824`), or a percentage of device memory (`50%`).
    pub fn parse(text: &str) -> Result<Limit, PoolError> {
        let t = text.trim();
        if t.is_empty() || t.eq_ignore_ascii_case("none") {
            return Ok(Limit::Unlimited);
        }
        if let Some(pct) = t.strip_suffix('%') {
            let p: f64 = pct
                .trim()
                .parse()
                .map_err(|_| PoolError::InvalidLimit(format!("not a percentage: {text:?}")))?;
            return Ok(Limit::Fraction(p / 100.0));
        }
        t.parse::<usize>().map(Limit::Bytes).map_err(|_| {
            PoolError::InvalidLimit(format!("not a byte count or percentage: {text:?}"))
        })
    }

    /// The cap in bytes on a device of `total_memory` bytes (`None`: no cap).
    pub fn resolve(self, total_memory: usize) -> Result<Option<usize>, PoolError> {
        match self {
            Limit::Unlimited => Ok(None),
            Limit::Bytes(b) => Ok(Some(b)),
            Limit::Fraction(f) if (0.0..=1.0).contains(&f) => {
                Ok(Some((total_memory as f64 * f).floor() as usize))
            }
            Limit::Fraction(f) => Err(PoolError::InvalidLimit(format!(
                "fraction {f} is not in [0, 1]"
            ))),
        }
    }
}

/// How a pool is built.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PoolConfig {
    /// Use virtual-memory segments on devices that support them (the default). When
    /// `false`, or on devices without support, plain segments are used.
    pub virtual_memory: bool,
    /// A limit applied to every device when the pool is built.
    pub limit: Limit,
    /// Before growing, serve a request with free memory other streams' work may still be
    /// using, by making the requesting stream wait for that work on the device (default
    /// [`policy::STEAL_BEFORE_GROWING`], which explains the trade).
    pub steal_before_growing: bool,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            virtual_memory: true,
            limit: Limit::Unlimited,
            steal_before_growing: policy::STEAL_BEFORE_GROWING,
        }
    }
}

impl PoolConfig {
    /// The default configuration, with the limit taken from [`LIMIT_ENV_VAR`] when it
    /// is set.
    pub fn from_env() -> Result<PoolConfig, PoolError> {
        let limit = match std::env::var(LIMIT_ENV_VAR) {
            Ok(v) => Limit::parse(&v)?,
            Err(_) => Limit::Unlimited,
        };
        Ok(PoolConfig {
            limit,
            ..PoolConfig::default()
        })
    }
}

//! [`UniqueId`]: the token that names one communicator across processes.

use std::fmt;
use std::str::FromStr;

use cudars_nccl_sys::ncclUniqueId;

use crate::error::{check, library, Error, Result};

/// Bytes in a [`UniqueId`] (`NCCL_UNIQUE_ID_BYTES`).
pub const UNIQUE_ID_BYTES: usize = 128;

/// The id every rank of a communicator passes to [`Communicator::init_rank`]: rank 0 creates it
/// ([`UniqueId::new`]) and sends it to the others by any channel, as bytes
/// ([`as_bytes`](UniqueId::as_bytes) / [`from_bytes`](UniqueId::from_bytes)) or as text (256 hex
/// digits: [`Display`](fmt::Display) / [`FromStr`]). [`crate::rendezvous`] does it over TCP.
///
/// ```
/// use cudars_nccl::UniqueId;
/// let id = UniqueId::from_bytes([7; 128]);
/// let text = id.to_string();
/// assert_eq!(text.len(), 256);
/// assert_eq!(text.parse::<UniqueId>().unwrap(), id);
/// ```
///
/// [`Communicator::init_rank`]: crate::Communicator::init_rank
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct UniqueId([u8; UNIQUE_ID_BYTES]);

impl UniqueId {
    /// A fresh id from NCCL (`ncclGetUniqueId`). Call it on one rank only.
    ///
    /// ```no_run
    /// let id = cudars_nccl::UniqueId::new()?;
    /// println!("{id}");
    /// # Ok::<(), cudars_nccl::Error>(())
    /// ```
    pub fn new() -> Result<UniqueId> {
        let nccl = library()?;
        let mut raw = ncclUniqueId::default();
        check(
            // SAFETY: `raw` is a valid out-pointer to an ncclUniqueId.
            unsafe { nccl.ncclGetUniqueId(&mut raw) }?,
            "ncclGetUniqueId",
        )?;
        Ok(UniqueId::from_raw(raw))
    }

    /// The id with these bytes (as another rank's [`as_bytes`](Self::as_bytes) gave them).
    pub fn from_bytes(bytes: [u8; UNIQUE_ID_BYTES]) -> UniqueId {
        UniqueId(bytes)
    }

    /// The id as bytes.
    pub fn as_bytes(&self) -> &[u8; UNIQUE_ID_BYTES] {
        &self.0
    }

    /// From the raw NCCL struct.
    pub fn from_raw(raw: ncclUniqueId) -> UniqueId {
        UniqueId(raw.internal.map(|c| c as u8))
    }

    /// As the raw NCCL struct.
    pub fn to_raw(&self) -> ncclUniqueId {
        ncclUniqueId {
            internal: self.0.map(|b| b as std::os::raw::c_char),
        }
    }
}

impl fmt::Display for UniqueId {
    /// 256 lower-case hex digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.to_string();
        write!(f, "UniqueId({}...)", &text[..16])
    }
}

impl FromStr for UniqueId {
    type Err = Error;

    /// Parses the 256 hex digits [`Display`](fmt::Display) writes (surrounding whitespace is
    /// ignored).
    fn from_str(s: &str) -> Result<UniqueId> {
        let s = s.trim();
        if s.len() != 2 * UNIQUE_ID_BYTES || !s.is_ascii() {
            return Err(Error::InvalidArgument(format!(
                "a UniqueId is {} hex digits, got {} characters",
                2 * UNIQUE_ID_BYTES,
                s.len()
            )));
        }
        let mut bytes = [0u8; UNIQUE_ID_BYTES];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| {
                Error::InvalidArgument(format!(
                    "UniqueId text has a non-hex digit near position {}",
                    2 * i
                ))
            })?;
        }
        Ok(UniqueId(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_raw_round_trip() {
        let mut bytes = [0u8; UNIQUE_ID_BYTES];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i * 37 % 256) as u8;
        }
        let id = UniqueId::from_bytes(bytes);
        assert_eq!(id.to_string().parse::<UniqueId>().unwrap(), id);
        assert_eq!(UniqueId::from_raw(id.to_raw()), id);
        assert_eq!(id.as_bytes(), &bytes);
    }

    #[test]
    fn bad_text_is_a_typed_error() {
        assert!(matches!(
            "abc".parse::<UniqueId>(),
            Err(Error::InvalidArgument(_))
        ));
        let bad = "zz".repeat(UNIQUE_ID_BYTES);
        assert!(matches!(
            bad.parse::<UniqueId>(),
            Err(Error::InvalidArgument(_))
        ));
    }
}

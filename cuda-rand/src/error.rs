//! [`Error`]: every failure of `cuda-rand`, and the typed refusals of bad arguments.

use cudars_rand_sys::{curandStatus_t, Curand, LoadError, MissingSymbol};

use crate::kind::RngKind;

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every failure of `cuda-rand`.
///
/// The variants from [`Error::Length`] on are refusals: an argument that would make cuRAND
/// fail, or read or write outside the views passed, caught before anything is issued. Each
/// names the argument (`"out"`, `"std"`, `"lambda"`, `"stream"`, ...).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// cuRAND could not be opened (lists every path tried).
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The loaded cuRAND lacks an entry point these bindings know.
    #[error(transparent)]
    MissingSymbol(#[from] MissingSymbol),
    /// A cuRAND call returned something other than `CURAND_STATUS_SUCCESS`.
    #[error("{call} failed: {name} ({code})")]
    Curand {
        /// The entry point.
        call: &'static str,
        /// The `curandStatus_t` value.
        code: u32,
        /// Its name in `curand.h` (`CURAND_STATUS_LAUNCH_FAILURE`, ...).
        name: &'static str,
    },
    /// A `cuda-core` call failed (binding the context, the stream's device, marking memory on
    /// the stream, an event).
    #[error(transparent)]
    Cuda(#[from] cudars_core::Error),
    /// The view is not a whole number of elements.
    #[error("{arg}: {len} bytes is not a whole number of {element}-byte elements")]
    Length {
        /// The argument.
        arg: &'static str,
        /// The view's length in bytes.
        len: usize,
        /// The element size in bytes.
        element: usize,
    },
    /// The view's address is not aligned to its elements.
    #[error("{arg}: address {addr:#x} is not aligned to its {align}-byte elements")]
    Misaligned {
        /// The argument.
        arg: &'static str,
        /// The view's device address.
        addr: u64,
        /// The alignment the elements need.
        align: usize,
    },
    /// An object of another device than the generator's.
    #[error("{arg} belongs to device {actual}; the generator belongs to device {expected}")]
    WrongDevice {
        /// The argument.
        arg: &'static str,
        /// The generator's device.
        expected: usize,
        /// The argument's device.
        actual: usize,
    },
    /// Normal and log-normal numbers from a pseudo-random generator come in pairs (cuRAND's
    /// Box-Muller transform): an odd count would be `CURAND_STATUS_LENGTH_NOT_MULTIPLE`.
    #[error("{arg}: {count} elements; {call} with a pseudo-random generator needs an even count")]
    OddCount {
        /// The argument.
        arg: &'static str,
        /// The number of elements of the view.
        count: usize,
        /// The fill asked for (`normal`, `log_normal`).
        call: &'static str,
    },
    /// A quasi-random generator fills whole points: the count must be a multiple of its
    /// dimensions (`CURAND_STATUS_LENGTH_NOT_MULTIPLE` otherwise).
    #[error(
        "{arg}: {count} elements is not a multiple of the generator's {dimensions} dimensions"
    )]
    NotMultipleOfDimensions {
        /// The argument.
        arg: &'static str,
        /// The number of elements of the view.
        count: usize,
        /// The generator's dimensions.
        dimensions: u32,
    },
    /// A numeric argument outside what cuRAND takes.
    #[error("{arg} = {value}: {expected}")]
    BadValue {
        /// The argument.
        arg: &'static str,
        /// The value given (as `f64`).
        value: f64,
        /// What it must be.
        expected: &'static str,
    },
    /// The operation does not apply to this kind of generator (a seed for Sobol, 64-bit
    /// numbers from a 32-bit generator, dimensions for a pseudo-random generator).
    #[error("{what} does not apply to {kind} generators: {why}")]
    Unsupported {
        /// The operation.
        what: &'static str,
        /// The generator's kind.
        kind: RngKind,
        /// Why, or what to use instead.
        why: &'static str,
    },
    /// The stream is being captured into a graph: refused, because the graph would keep
    /// writing the generator's state (and the view) at every replay, after the generator is
    /// gone, and would repeat the same numbers at each replay.
    #[error("{arg} is being captured into a graph; cuRAND's host API is not issued into captures")]
    Capturing {
        /// The argument (`"stream"`, or `"the generator's stream"`).
        arg: &'static str,
    },
}

impl From<&'static LoadError> for Error {
    fn from(e: &'static LoadError) -> Self {
        Error::Load(e.clone())
    }
}

impl From<Error> for cudars_core::Error {
    /// A wrapped `cuda-core` error ([`Error::Cuda`]) comes back as itself; any other failure
    /// is carried as `cudars_core::Error::Crate`, as every crate of the workspace does.
    fn from(error: Error) -> Self {
        match error {
            Error::Cuda(core) => core,
            other => {
                cudars_core::Error::Crate(cudars_core::CrateError::new("cuda-rand", other, None))
            }
        }
    }
}

/// The process-wide cuRAND ([`cudars_rand_sys::curand`]), or [`Error::Load`].
pub(crate) fn library() -> Result<&'static Curand> {
    Ok(cudars_rand_sys::curand()?)
}

/// `Ok` for `CURAND_STATUS_SUCCESS`; the call's [`Error::Curand`] or [`Error::MissingSymbol`]
/// otherwise.
pub(crate) fn check(
    status: std::result::Result<curandStatus_t, MissingSymbol>,
    call: &'static str,
) -> Result<()> {
    let status = status?;
    if status.is_success() {
        Ok(())
    } else {
        Err(Error::Curand {
            call,
            code: status.0,
            name: status.name(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_status_names_the_call_and_the_code() {
        let e = check(
            Ok(curandStatus_t::CURAND_STATUS_LENGTH_NOT_MULTIPLE),
            "curandGenerateNormal",
        )
        .unwrap_err();
        match &e {
            Error::Curand { call, code, name } => {
                assert_eq!(*call, "curandGenerateNormal");
                assert_eq!(*code, 105);
                assert_eq!(*name, "CURAND_STATUS_LENGTH_NOT_MULTIPLE");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            e.to_string(),
            "curandGenerateNormal failed: CURAND_STATUS_LENGTH_NOT_MULTIPLE (105)"
        );
        assert!(check(Ok(curandStatus_t::CURAND_STATUS_SUCCESS), "x").is_ok());
        let missing = check(
            Err(MissingSymbol {
                name: "curandGeneratePoisson",
            }),
            "curandGeneratePoisson",
        )
        .unwrap_err();
        assert!(matches!(missing, Error::MissingSymbol(m) if m.name == "curandGeneratePoisson"));
    }

    #[test]
    fn converts_into_the_workspace_error_keeping_core_errors_as_themselves() {
        let core = cudars_core::Error::Unsupported("x");
        let back: cudars_core::Error = Error::Cuda(core.clone()).into();
        assert_eq!(back, core);
        let refusal = Error::OddCount {
            arg: "out",
            count: 3,
            call: "normal",
        };
        let text = refusal.to_string();
        let wrapped: cudars_core::Error = refusal.into();
        assert_eq!(wrapped.to_string(), text);
        assert!(matches!(
            wrapped.downcast_ref::<Error>(),
            Some(Error::OddCount { count: 3, .. })
        ));
    }
}

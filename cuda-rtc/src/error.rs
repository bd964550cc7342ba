//! [`Error`]: every failure of `cuda-rtc`.

use cudars_rtc_sys::{nvJitLinkResult, nvrtcResult, LoadError, MissingSymbol};

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every failure of `cuda-rtc`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// NVRTC or nvJitLink could not be opened (lists every path tried).
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The loaded library lacks an entry point these bindings know.
    #[error(transparent)]
    MissingSymbol(#[from] MissingSymbol),
    /// An NVRTC call failed (other than the compilation itself: see [`Error::Compile`]).
    #[error("{call} failed: {name} ({message})")]
    Nvrtc {
        /// The call.
        call: &'static str,
        /// The `nvrtcResult` code.
        code: u32,
        /// Its name (`NVRTC_ERROR_...`).
        name: String,
        /// NVRTC's message (`nvrtcGetErrorString`).
        message: String,
    },
    /// The source did not compile; `log` is NVRTC's log.
    #[error("{program} did not compile ({options}):\n{log}")]
    Compile {
        /// The program's name.
        program: String,
        /// The options it was compiled with, as one line.
        options: String,
        /// NVRTC's compile log.
        log: String,
    },
    /// nvJitLink failed; `log` is its error log.
    #[error("nvJitLink {call} failed: {name}:\n{log}")]
    Link {
        /// The call.
        call: &'static str,
        /// The `nvJitLinkResult` name.
        name: &'static str,
        /// nvJitLink's error log.
        log: String,
    },
    /// A name expression is not valid C++ or names nothing the program instantiates.
    #[error("name expression `{expression}`: {message}")]
    NameExpression {
        /// The expression as given.
        expression: String,
        /// What NVRTC said.
        message: String,
    },
    /// The compiler does not know the architecture asked for.
    #[error("{arch} is not supported by NVRTC {version}; it knows {supported}")]
    ArchUnsupported {
        /// The architecture asked for.
        arch: String,
        /// The compiler's version.
        version: String,
        /// The architectures it supports, as one line.
        supported: String,
    },
    /// The kernel takes a different number of parameters: nothing was launched.
    #[error("{kernel} takes {expected} parameter(s); {given} argument(s) given")]
    ArgCount {
        /// The kernel.
        kernel: String,
        /// What it takes.
        expected: usize,
        /// What was given.
        given: usize,
    },
    /// An argument's size differs from its parameter's: nothing was launched.
    #[error("{kernel}: parameter {index} is {expected} byte(s); the argument is {given}")]
    ArgSize {
        /// The kernel.
        kernel: String,
        /// The parameter's index (from 0).
        index: usize,
        /// The parameter's size.
        expected: usize,
        /// The argument's size.
        given: usize,
    },
    /// The kernel's parameters are unknown (a driver before CUDA 12.4 and no PTX to read
    /// them from), so a checked launch cannot check: use `launch_unchecked`.
    #[error("the parameters of {kernel} are unknown (driver older than CUDA 12.4 and no PTX); a checked launch is impossible")]
    SignatureUnknown {
        /// The kernel.
        kernel: String,
    },
    /// Bad input, refused before any library call.
    #[error("{0}")]
    InvalidArgument(String),
    /// The disk cache could not be read or written (a write failure never fails a compile:
    /// it is counted in [`CacheStats`](crate::CacheStats)).
    #[error("cache {path}: {source}")]
    Cache {
        /// The file or directory.
        path: std::path::PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A `cuda-core` call failed (module load, function lookup, launch).
    #[error(transparent)]
    Cuda(#[from] cudars_core::Error),
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
                cudars_core::Error::Crate(cudars_core::CrateError::new("cuda-rtc", other, None))
            }
        }
    }
}

/// NVRTC's name for a result code.
pub(crate) fn nvrtc_name(r: nvrtcResult) -> String {
    let names = [
        "NVRTC_SUCCESS",
        "NVRTC_ERROR_OUT_OF_MEMORY",
        "NVRTC_ERROR_PROGRAM_CREATION_FAILURE",
        "NVRTC_ERROR_INVALID_INPUT",
        "NVRTC_ERROR_INVALID_PROGRAM",
        "NVRTC_ERROR_INVALID_OPTION",
        "NVRTC_ERROR_COMPILATION",
        "NVRTC_ERROR_BUILTIN_OPERATION_FAILURE",
        "NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION",
        "NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION",
        "NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID",
        "NVRTC_ERROR_INTERNAL_ERROR",
        "NVRTC_ERROR_TIME_FILE_WRITE_FAILED",
        "NVRTC_ERROR_NO_PCH_CREATE_ATTEMPTED",
        "NVRTC_ERROR_PCH_CREATE_HEAP_EXHAUSTED",
        "NVRTC_ERROR_PCH_CREATE",
        "NVRTC_ERROR_CANCELLED",
        "NVRTC_ERROR_TIME_TRACE_FILE_WRITE_FAILED",
    ];
    names
        .get(r.0 as usize)
        .map(|s| s.to_string())
        .unwrap_or_else(|| format!("nvrtcResult({})", r.0))
}

/// The error for a failed NVRTC call.
pub(crate) fn nvrtc_error(
    nvrtc: &cudars_rtc_sys::Nvrtc,
    r: nvrtcResult,
    call: &'static str,
) -> Error {
    // SAFETY: nvrtcGetErrorString takes any value and returns a static C string or null.
    let message = match unsafe { nvrtc.nvrtcGetErrorString(r) } {
        Ok(p) if !p.is_null() => {
            // SAFETY: a NUL-terminated static string of NVRTC's.
            unsafe { std::ffi::CStr::from_ptr(p) }
                .to_string_lossy()
                .into_owned()
        }
        _ => "no message".into(),
    };
    Error::Nvrtc {
        call,
        code: r.0,
        name: nvrtc_name(r),
        message,
    }
}

/// `Ok` for `NVRTC_SUCCESS`, else the call's error.
pub(crate) fn check(
    nvrtc: &cudars_rtc_sys::Nvrtc,
    r: nvrtcResult,
    call: &'static str,
) -> Result<()> {
    if r.is_success() {
        Ok(())
    } else {
        Err(nvrtc_error(nvrtc, r, call))
    }
}

/// The error of a failed nvJitLink call, with its log.
pub(crate) fn link_error(r: nvJitLinkResult, call: &'static str, log: String) -> Error {
    Error::Link {
        call,
        name: r.name(),
        log,
    }
}

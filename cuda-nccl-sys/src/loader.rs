//! Opening `libnccl` and filling the function table.

use std::ffi::{c_void, CStr, OsString};
use std::fmt;
use std::sync::OnceLock;

use crate::NcclTable;

/// Environment variable naming the NCCL library to open instead of the default names.
pub const NCCL_PATH_ENV: &str = "CUDA_NCCL_LIBRARY";

/// Names tried, in order, after [`NCCL_PATH_ENV`].
pub const DEFAULT_NAMES: &[&str] = &["libnccl.so.2", "libnccl.so"];

/// The NCCL library could not be opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// No candidate could be opened; each attempt with the loader's message.
    NcclNotFound {
        /// `(path, why)` for each library that was tried, in order.
        tried: Vec<(String, String)>,
    },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::NcclNotFound { tried } => {
                write!(f, "NCCL library not found; tried")?;
                for (i, (path, why)) in tried.iter().enumerate() {
                    let sep = if i == 0 { " " } else { "; " };
                    write!(f, "{sep}{path} ({why})")?;
                }
                if tried.is_empty() {
                    write!(f, " nothing")?;
                }
                write!(
                    f,
                    ". Set {NCCL_PATH_ENV} to the path of libnccl.so.2 (pip's nvidia-nccl-cu13 \
                     wheel has it in site-packages/nvidia/nccl/lib/)"
                )
            }
        }
    }
}

impl std::error::Error for LoadError {}

/// The loaded library has no entry point of this name (NCCL older than the bindings' header, or
/// the library is not NCCL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MissingSymbol {
    /// The missing symbol.
    pub name: &'static str,
}

impl fmt::Display for MissingSymbol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the loaded NCCL library has no entry point `{}` (older than the bindings' header?)",
            self.name
        )
    }
}

impl std::error::Error for MissingSymbol {}

/// An opened NCCL library and its function table.
///
/// Every entry point of `nccl.h` is a method of the same name returning
/// `Err(MissingSymbol)` when the library lacks it, and `Ok(ncclResult_t)` otherwise.
///
/// `Nccl` is `Send + Sync`: the table is immutable after loading; which NCCL calls may run
/// concurrently on one communicator is the safe layer's business.
pub struct Nccl {
    pub(crate) table: NcclTable,
    path: String,
    resolved: usize,
    // Dropped last: the table points into it.
    _library: libloading::Library,
}

impl fmt::Debug for Nccl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nccl")
            .field("path", &self.path)
            .field("resolved", &self.resolved)
            .finish_non_exhaustive()
    }
}

impl Nccl {
    /// Opens NCCL: the library named by [`NCCL_PATH_ENV`] when set, else `libnccl.so.2`, else
    /// `libnccl.so`, and resolves every entry point with `dlsym`.
    pub fn load() -> Result<Nccl, LoadError> {
        let mut candidates: Vec<OsString> = Vec::new();
        if let Some(path) = std::env::var_os(NCCL_PATH_ENV).filter(|p| !p.is_empty()) {
            candidates.push(path);
        }
        candidates.extend(DEFAULT_NAMES.iter().map(OsString::from));
        Self::load_from(&candidates)
    }

    /// Opens the first of `candidates` that loads (names or paths, as `dlopen` takes them).
    pub fn load_from(candidates: &[OsString]) -> Result<Nccl, LoadError> {
        let mut tried = Vec::new();
        for candidate in candidates {
            // SAFETY: opening a shared library runs its initialisers; NCCL's have no
            // preconditions on the caller.
            match unsafe { libloading::Library::new(candidate) } {
                Ok(library) => {
                    let mut resolved = 0;
                    // SAFETY: `lookup` returns null or the address of the exported symbol of
                    // that name, which the header declares with the signature the table uses.
                    let table = unsafe {
                        NcclTable::resolve(|name| {
                            let p = lookup(&library, name);
                            if !p.is_null() {
                                resolved += 1;
                            }
                            p
                        })
                    };
                    return Ok(Nccl {
                        table,
                        path: candidate.to_string_lossy().into_owned(),
                        resolved,
                        _library: library,
                    });
                }
                Err(e) => tried.push((candidate.to_string_lossy().into_owned(), e.to_string())),
            }
        }
        Err(LoadError::NcclNotFound { tried })
    }

    /// The path or name the library was opened from.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// How many entry points of the header the library has.
    pub fn resolved_count(&self) -> usize {
        self.resolved
    }
}

fn lookup(library: &libloading::Library, name: &CStr) -> *mut c_void {
    // SAFETY: the symbol is only read as an address here; its type is fixed by the caller.
    match unsafe { library.get::<*mut c_void>(name.to_bytes_with_nul()) } {
        Ok(sym) => *sym,
        Err(_) => std::ptr::null_mut(),
    }
}

static NCCL: OnceLock<Result<Nccl, LoadError>> = OnceLock::new();

/// The process-wide NCCL library, opened on first use (see [`Nccl::load`]). A failure is
/// remembered: later calls return the same error.
pub fn nccl() -> Result<&'static Nccl, &'static LoadError> {
    NCCL.get_or_init(Nccl::load).as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_names_what_was_tried_and_the_variable() {
        let err = Nccl::load_from(&["/nonexistent/libnccl.so.2".into()]).unwrap_err();
        let LoadError::NcclNotFound { tried } = &err;
        assert_eq!(tried.len(), 1);
        assert_eq!(tried[0].0, "/nonexistent/libnccl.so.2");
        let text = err.to_string();
        assert!(text.contains("/nonexistent/libnccl.so.2"), "{text}");
        assert!(text.contains(NCCL_PATH_ENV), "{text}");
    }

    #[test]
    fn a_library_without_nccl_loads_with_every_symbol_missing() {
        // libc is always there and has no NCCL symbol: every method must report the missing
        // symbol instead of crashing.
        let nccl = Nccl::load_from(&["libc.so.6".into()]).expect("libc opens");
        assert_eq!(nccl.resolved_count(), 0);
        let mut v = 0;
        // SAFETY: the entry point is absent, so nothing is called.
        let err = unsafe { nccl.ncclGetVersion(&mut v) }.unwrap_err();
        assert_eq!(err.name, "ncclGetVersion");
    }
}

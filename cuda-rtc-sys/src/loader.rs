//! Opening `libnvrtc` and `libnvJitLink` and filling their function tables.

use std::ffi::{c_void, CStr, CString, OsString};
use std::fmt;
use std::sync::OnceLock;

use crate::{EntryPoint, NvJitLinkTable, NvrtcTable};

/// Environment variable naming the NVRTC library to open instead of the default names.
pub const NVRTC_PATH_ENV: &str = "CUDA_NVRTC_LIBRARY";

/// NVRTC names tried, in order, after [`NVRTC_PATH_ENV`]: CUDA 13, then CUDA 12.
pub const NVRTC_DEFAULT_NAMES: &[&str] = &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];

/// Environment variable naming the nvJitLink library to open instead of the default names.
pub const NVJITLINK_PATH_ENV: &str = "CUDA_NVJITLINK_LIBRARY";

/// nvJitLink names tried, in order, after [`NVJITLINK_PATH_ENV`].
pub const NVJITLINK_DEFAULT_NAMES: &[&str] = &[
    "libnvJitLink.so.13",
    "libnvJitLink.so.12",
    "libnvJitLink.so",
];

/// A library could not be opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// No candidate could be opened; each attempt with the loader's message.
    NotFound {
        /// `"NVRTC"` or `"nvJitLink"`.
        library: &'static str,
        /// The variable that names the library's path.
        variable: &'static str,
        /// `(path, why)` for each library that was tried, in order.
        tried: Vec<(String, String)>,
    },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::NotFound {
                library,
                variable,
                tried,
            } => {
                write!(f, "{library} library not found; tried")?;
                for (i, (path, why)) in tried.iter().enumerate() {
                    let sep = if i == 0 { " " } else { "; " };
                    write!(f, "{sep}{path} ({why})")?;
                }
                if tried.is_empty() {
                    write!(f, " nothing")?;
                }
                let wheel = if *library == "NVRTC" {
                    "nvidia-cuda-nvrtc"
                } else {
                    "nvidia-nvjitlink"
                };
                write!(
                    f,
                    ". Set {variable} to its path (pip's {wheel} wheel has it in \
                     site-packages/nvidia/cu13/lib/)"
                )
            }
        }
    }
}

impl std::error::Error for LoadError {}

/// The loaded library has no entry point of this name (older than the bindings' header, or
/// not the library it was taken for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MissingSymbol {
    /// The missing entry point's API name.
    pub name: &'static str,
}

impl fmt::Display for MissingSymbol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the loaded library has no entry point `{}` (older than the bindings' header?)",
            self.name
        )
    }
}

impl std::error::Error for MissingSymbol {}

/// Opens the first of `candidates` that loads.
fn open(
    candidates: &[OsString],
    library: &'static str,
    variable: &'static str,
) -> Result<(libloading::Library, String), LoadError> {
    let mut tried = Vec::new();
    for candidate in candidates {
        // SAFETY: opening a shared library runs its initialisers; NVRTC's and nvJitLink's have
        // no preconditions on the caller.
        match unsafe { libloading::Library::new(candidate) } {
            Ok(lib) => return Ok((lib, candidate.to_string_lossy().into_owned())),
            Err(e) => tried.push((candidate.to_string_lossy().into_owned(), e.to_string())),
        }
    }
    Err(LoadError::NotFound {
        library,
        variable,
        tried,
    })
}

/// `$variable` when set and not empty, then `defaults`.
fn candidates(variable: &str, defaults: &[&str]) -> Vec<OsString> {
    let mut c: Vec<OsString> = Vec::new();
    if let Some(path) = std::env::var_os(variable).filter(|p| !p.is_empty()) {
        c.push(path);
    }
    c.extend(defaults.iter().map(OsString::from));
    c
}

fn lookup(library: &libloading::Library, name: &CStr) -> *mut c_void {
    // SAFETY: the symbol is only read as an address here; its type is fixed by the caller.
    match unsafe { library.get::<*mut c_void>(name.to_bytes_with_nul()) } {
        Ok(sym) => *sym,
        Err(_) => std::ptr::null_mut(),
    }
}

/// An opened NVRTC library and its function table.
///
/// Every entry point of `nvrtc.h` is a method of the same name returning
/// `Err(MissingSymbol)` when the library lacks it, and `Ok(nvrtcResult)` otherwise.
/// `Send + Sync`: the table is immutable after loading, and NVRTC's calls are thread-safe
/// (each program is used by one thread at a time: the safe layer's business).
pub struct Nvrtc {
    pub(crate) table: NvrtcTable,
    path: String,
    resolved: usize,
    // Dropped last: the table points into it.
    _library: libloading::Library,
    // NVRTC's builtins, opened from beside the library (see `Nvrtc::load_from`).
    _builtins: Vec<libloading::Library>,
}

impl fmt::Debug for Nvrtc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nvrtc")
            .field("path", &self.path)
            .field("resolved", &self.resolved)
            .finish_non_exhaustive()
    }
}

impl Nvrtc {
    /// Opens NVRTC: the library named by [`NVRTC_PATH_ENV`] when set, else
    /// [`NVRTC_DEFAULT_NAMES`] in order, and resolves every entry point with `dlsym`.
    pub fn load() -> Result<Nvrtc, LoadError> {
        Self::load_from(&candidates(NVRTC_PATH_ENV, NVRTC_DEFAULT_NAMES))
    }

    /// Opens the first of `candidates` that loads (names or paths, as `dlopen` takes them).
    ///
    /// NVRTC opens its builtins library (`libnvrtc-builtins.so.13.0`) by name when it
    /// compiles; a library opened by path (pip's wheels, `$CUDA_NVRTC_LIBRARY`) has no search
    /// path that finds it. So the builtins beside the library are opened first, and NVRTC's
    /// own `dlopen` by name then finds them already loaded.
    pub fn load_from(candidates: &[OsString]) -> Result<Nvrtc, LoadError> {
        let builtins: Vec<libloading::Library> =
            candidates.iter().flat_map(builtins_beside).collect();
        let (library, path) = open(candidates, "NVRTC", NVRTC_PATH_ENV)?;
        let mut resolved = 0;
        // SAFETY: `lookup` returns null or the address of the exported symbol of that name,
        // which the header declares with the signature the table uses.
        let table = unsafe {
            NvrtcTable::resolve(|e: &EntryPoint| {
                let p = lookup(&library, e.symbol);
                resolved += usize::from(!p.is_null());
                p
            })
        };
        Ok(Nvrtc {
            table,
            path,
            resolved,
            _library: library,
            _builtins: builtins,
        })
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

/// Opens `libnvrtc-builtins.so*` (not the `.alt` variant) in the directory of `candidate`, when
/// `candidate` is a path to an existing file; nothing otherwise.
fn builtins_beside(candidate: &OsString) -> Vec<libloading::Library> {
    let path = std::path::Path::new(candidate);
    let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) else {
        return Vec::new();
    };
    if !path.is_file() {
        return Vec::new();
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<std::path::PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libnvrtc-builtins.so") && !n.contains(".alt"))
        })
        .collect();
    found.sort();
    found
        .into_iter()
        // SAFETY: NVRTC's builtins library has no initialiser with preconditions; it is the
        // one NVRTC would open itself.
        .filter_map(|p| unsafe { libloading::Library::new(&p) }.ok())
        .collect()
}

/// An opened nvJitLink library and its function table.
///
/// Each entry point is a method named by its API name (`nvJitLinkCreate`). The loader asks
/// for the symbol of the header's library version first (`__nvJitLinkCreate_13_0`), then the
/// plain name, then the versioned symbols of CUDA 13.x and 12.x libraries (the signatures have
/// not changed across them), so a CUDA 12 `libnvJitLink.so.12` serves bindings made from CUDA 13
/// headers. `Send + Sync` as [`Nvrtc`].
pub struct NvJitLink {
    pub(crate) table: NvJitLinkTable,
    path: String,
    resolved: usize,
    // Dropped last: the table points into it.
    _library: libloading::Library,
}

impl fmt::Debug for NvJitLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NvJitLink")
            .field("path", &self.path)
            .field("resolved", &self.resolved)
            .finish_non_exhaustive()
    }
}

/// The symbols asked for an nvJitLink entry point, in order (see [`NvJitLink`]).
pub fn nvjitlink_symbols(entry: &EntryPoint) -> Vec<CString> {
    let api = entry.api.to_string_lossy();
    let mut names = vec![entry.symbol.to_owned()];
    if entry.symbol != entry.api {
        names.push(entry.api.to_owned());
        for major in [13u32, 12] {
            for minor in (0u32..=9).rev() {
                if let Ok(c) = CString::new(format!("__{api}_{major}_{minor}")) {
                    if !names.contains(&c) {
                        names.push(c);
                    }
                }
            }
        }
    }
    names
}

impl NvJitLink {
    /// Opens nvJitLink: the library named by [`NVJITLINK_PATH_ENV`] when set, else
    /// [`NVJITLINK_DEFAULT_NAMES`] in order, and resolves every entry point.
    pub fn load() -> Result<NvJitLink, LoadError> {
        Self::load_from(&candidates(NVJITLINK_PATH_ENV, NVJITLINK_DEFAULT_NAMES))
    }

    /// Opens the first of `candidates` that loads (names or paths, as `dlopen` takes them).
    pub fn load_from(candidates: &[OsString]) -> Result<NvJitLink, LoadError> {
        let (library, path) = open(candidates, "nvJitLink", NVJITLINK_PATH_ENV)?;
        let mut resolved = 0;
        // SAFETY: `lookup` returns null or the address of an exported symbol of the entry
        // point, whose signature is the one the header declares (see `nvjitlink_symbols`).
        let table = unsafe {
            NvJitLinkTable::resolve(|e: &EntryPoint| {
                let p = nvjitlink_symbols(e)
                    .iter()
                    .map(|s| lookup(&library, s))
                    .find(|p| !p.is_null())
                    .unwrap_or(std::ptr::null_mut());
                resolved += usize::from(!p.is_null());
                p
            })
        };
        Ok(NvJitLink {
            table,
            path,
            resolved,
            _library: library,
        })
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

static NVRTC: OnceLock<Result<Nvrtc, LoadError>> = OnceLock::new();
static NVJITLINK: OnceLock<Result<NvJitLink, LoadError>> = OnceLock::new();

/// The process-wide NVRTC library, opened on first use (see [`Nvrtc::load`]). A failure is
/// remembered: later calls return the same error.
pub fn nvrtc() -> Result<&'static Nvrtc, &'static LoadError> {
    NVRTC.get_or_init(Nvrtc::load).as_ref()
}

/// The process-wide nvJitLink library, opened on first use (see [`NvJitLink::load`]). A
/// failure is remembered: later calls return the same error.
pub fn nvjitlink() -> Result<&'static NvJitLink, &'static LoadError> {
    NVJITLINK.get_or_init(NvJitLink::load).as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_names_what_was_tried_and_the_variable() {
        let err = Nvrtc::load_from(&["/nonexistent/libnvrtc.so.13".into()]).unwrap_err();
        let LoadError::NotFound { tried, .. } = &err;
        assert_eq!(tried.len(), 1);
        assert_eq!(tried[0].0, "/nonexistent/libnvrtc.so.13");
        let text = err.to_string();
        assert!(text.contains("NVRTC library not found"), "{text}");
        assert!(text.contains("/nonexistent/libnvrtc.so.13"), "{text}");
        assert!(text.contains(NVRTC_PATH_ENV), "{text}");

        let err = NvJitLink::load_from(&["/nonexistent/libnvJitLink.so.13".into()]).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("nvJitLink library not found"), "{text}");
        assert!(text.contains(NVJITLINK_PATH_ENV), "{text}");
    }

    #[test]
    fn a_library_without_the_entry_points_loads_with_every_symbol_missing() {
        // libc is always there and has none of these symbols: every method must report the
        // missing entry point instead of crashing.
        let nvrtc = Nvrtc::load_from(&["libc.so.6".into()]).expect("libc opens");
        assert_eq!(nvrtc.resolved_count(), 0);
        let (mut major, mut minor) = (0, 0);
        // SAFETY: the entry point is absent, so nothing is called.
        let err = unsafe { nvrtc.nvrtcVersion(&mut major, &mut minor) }.unwrap_err();
        assert_eq!(err.name, "nvrtcVersion");

        let jit = NvJitLink::load_from(&["libc.so.6".into()]).expect("libc opens");
        assert_eq!(jit.resolved_count(), 0);
        let mut handle = std::ptr::null_mut();
        // SAFETY: the entry point is absent, so nothing is called.
        let err = unsafe { jit.nvJitLinkCreate(&mut handle, 0, std::ptr::null_mut()) }.unwrap_err();
        assert_eq!(err.name, "nvJitLinkCreate");
    }

    #[test]
    fn nvjitlink_symbols_try_the_header_version_first() {
        let e = EntryPoint {
            api: c"nvJitLinkCreate",
            symbol: c"__nvJitLinkCreate_13_0",
        };
        let names = nvjitlink_symbols(&e);
        assert_eq!(names[0].as_c_str(), c"__nvJitLinkCreate_13_0");
        assert_eq!(names[1].as_c_str(), c"nvJitLinkCreate");
        assert!(names
            .iter()
            .any(|n| n.as_c_str() == c"__nvJitLinkCreate_12_4"));
        // No duplicate of the header's own symbol.
        assert_eq!(
            names
                .iter()
                .filter(|n| n.as_c_str() == c"__nvJitLinkCreate_13_0")
                .count(),
            1
        );
        // An unversioned entry point is asked for by its name alone.
        let v = EntryPoint {
            api: c"nvJitLinkVersion",
            symbol: c"nvJitLinkVersion",
        };
        assert_eq!(nvjitlink_symbols(&v).len(), 1);
    }
}

//! Opening a CUDA library at run time, for the math `-sys` crates (`cudars-blas-sys`,
//! `cudars-rand-sys`, ...): nothing links against CUDA, and a program that never calls a
//! library never needs it installed.
//!
//! * [`LibrarySpec`]: what a library is called and where to look for it.
//! * [`Loaded::open`]: opens the first candidate that loads, after opening the libraries it
//!   depends on from the same place ([`Dependency`]), and resolves entry points by name
//!   ([`Loaded::lookup`]).
//! * [`LoadError`] lists every candidate tried and why each failed, and names the variable
//!   that points at the library; [`MissingSymbol`] is what a `-sys` crate's method returns
//!   when the loaded library lacks an entry point (one older than the header): nothing panics.
//! * With the `build` feature, `build` is the build-script side: bindgen over the headers,
//!   turned into function tables and a loader per library, with a checked-in snapshot when no
//!   headers are found.
//!
//! # Where a library is looked for
//!
//! When the library's variable ([`LibrarySpec::env`], e.g. `CUDA_CUBLAS_LIBRARY`) is set and
//! not empty, it is the only candidate. Otherwise the names ([`LibrarySpec::names`], newest
//! CUDA first) are tried as the dynamic linker resolves them (`LD_LIBRARY_PATH`, the `ldconfig`
//! cache), then in `$CUDA_HOME/lib64`, `$CUDA_PATH/lib64` and `/usr/local/cuda/lib64`. The
//! libraries pip's wheels install (PyTorch's, CuPy's: `site-packages/nvidia/cu13/lib/` for
//! CUDA 13, `site-packages/nvidia/<name>/lib/` for CUDA 12) are not on the linker's path:
//! point the variable at them. A library opened from a path first gets its dependencies
//! opened from the same directory, or from the CUDA 12 wheels' sibling directories.
//!
//! ```
//! use cudars_loader::{LibrarySpec, Loaded};
//! const NOT_THERE: LibrarySpec = LibrarySpec {
//!     name: "libnothing",
//!     env: "CUDARS_LOADER_DOCTEST_NOTHING",
//!     names: &["libnothing-at-all.so.1"],
//!     dependencies: &[],
//!     wheel: "nvidia-nothing",
//! };
//! let err = Loaded::open(&NOT_THERE).unwrap_err();
//! assert!(err.to_string().contains("libnothing-at-all.so.1"));
//! assert!(err.to_string().contains("CUDARS_LOADER_DOCTEST_NOTHING"));
//! ```

use std::ffi::{c_void, CStr, OsString};
use std::fmt;
use std::path::{Path, PathBuf};

#[cfg(feature = "build")]
pub mod build;

/// A library the loader can open.
#[derive(Debug, Clone, Copy)]
pub struct LibrarySpec {
    /// Its name in messages (`cuBLAS`).
    pub name: &'static str,
    /// The variable naming the file to open; when set, the only candidate.
    pub env: &'static str,
    /// Names tried in order (`libcublas.so.13`, `libcublas.so.12`, ...).
    pub names: &'static [&'static str],
    /// Libraries opened first when the library is opened from a path, in order.
    pub dependencies: &'static [Dependency],
    /// The pip package that ships it (`nvidia-cublas`), for the error message.
    pub wheel: &'static str,
}

/// A library another one needs, opened ahead of it from the same directory (or the CUDA 12
/// wheels' `nvidia/<wheel_dir>/lib`), so the dynamic linker finds it already loaded.
#[derive(Debug, Clone, Copy)]
pub struct Dependency {
    /// File-name prefix before the major version (`libcublasLt.so.`).
    pub prefix: &'static str,
    /// Its directory under `site-packages/nvidia/` in the CUDA 12 wheels (`cublas`).
    pub wheel_dir: &'static str,
}

/// One entry point of a header: the API name and the symbol the header declares for it.
#[derive(Debug, Clone, Copy)]
pub struct EntryPoint {
    /// The API name (`cublasGemmEx`).
    pub api: &'static CStr,
    /// The exported symbol (the same, except for versioned entry points).
    pub symbol: &'static CStr,
}

/// A library could not be opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// No candidate could be opened; each attempt with the loader's message.
    NotFound {
        /// The library (`cuBLAS`).
        library: &'static str,
        /// The variable that names the library's path.
        variable: &'static str,
        /// The pip package that ships it.
        wheel: &'static str,
        /// `(candidate, why)` for each candidate, in order.
        tried: Vec<(String, String)>,
    },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::NotFound {
                library,
                variable,
                wheel,
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

/// The loaded library has no entry point of this name (older than the bindings' header).
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

/// Toolkit roots whose `lib64` is searched after the bare names.
const TOOLKIT_ROOT_ENVS: &[&str] = &["CUDA_HOME", "CUDA_PATH"];
/// The usual toolkit library directory.
const TOOLKIT_LIB_DIR: &str = "/usr/local/cuda/lib64";

/// The candidates for `spec`, in order (see the [crate documentation](crate)).
pub fn candidates(spec: &LibrarySpec) -> Vec<OsString> {
    if let Some(path) = std::env::var_os(spec.env).filter(|p| !p.is_empty()) {
        return vec![path];
    }
    let mut dirs: Vec<PathBuf> = TOOLKIT_ROOT_ENVS
        .iter()
        .filter_map(|v| std::env::var_os(v).filter(|p| !p.is_empty()))
        .map(|root| PathBuf::from(root).join("lib64"))
        .collect();
    dirs.push(PathBuf::from(TOOLKIT_LIB_DIR));
    dirs.dedup();
    let mut all: Vec<OsString> = spec.names.iter().map(OsString::from).collect();
    for dir in &dirs {
        all.extend(spec.names.iter().map(|n| dir.join(n).into_os_string()));
    }
    all
}

/// An opened library (and the dependencies opened ahead of it), kept open while this value
/// lives. `Send + Sync`: it only holds the handles.
pub struct Loaded {
    // Dropped first: nothing points into it after the owner's tables are gone.
    library: libloading::Library,
    path: String,
    _dependencies: Vec<libloading::Library>,
}

impl fmt::Debug for Loaded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Loaded")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Loaded {
    /// Opens `spec`'s library from its [`candidates`].
    pub fn open(spec: &LibrarySpec) -> Result<Loaded, LoadError> {
        Loaded::open_from(spec, &candidates(spec))
    }

    /// Opens the first of `candidates` that loads (names or paths, as `dlopen` takes them).
    pub fn open_from(spec: &LibrarySpec, candidates: &[OsString]) -> Result<Loaded, LoadError> {
        let mut tried = Vec::new();
        for candidate in candidates {
            let shown = candidate.to_string_lossy().into_owned();
            let path = Path::new(candidate);
            let mut dependencies = Vec::new();
            if path.components().count() > 1 {
                if !path.is_file() {
                    tried.push((shown, "no such file".to_string()));
                    continue;
                }
                dependencies = open_dependencies(path, spec);
            }
            // SAFETY: opening a CUDA library runs its initialisers, which only set up the
            // library's own state and have no preconditions on the caller.
            match unsafe { libloading::Library::new(candidate) } {
                Ok(library) => {
                    return Ok(Loaded {
                        library,
                        path: shown,
                        _dependencies: dependencies,
                    })
                }
                Err(e) => tried.push((shown, e.to_string())),
            }
        }
        Err(LoadError::NotFound {
            library: spec.name,
            variable: spec.env,
            wheel: spec.wheel,
            tried,
        })
    }

    /// The address of the exported symbol `name`, or null when the library has none.
    pub fn lookup(&self, name: &CStr) -> *mut c_void {
        // SAFETY: the symbol is only read as an address here; its type is the caller's to
        // fix (a `-sys` crate's table, from the header's declaration).
        match unsafe { self.library.get::<*mut c_void>(name.to_bytes_with_nul()) } {
            Ok(sym) => *sym,
            Err(_) => std::ptr::null_mut(),
        }
    }

    /// The path or name the library was opened from.
    pub fn path(&self) -> &str {
        &self.path
    }
}

/// Opens, from `path`'s directory or the CUDA 12 wheels' sibling directories, the libraries
/// `path` may depend on. Best effort: one that cannot be opened is skipped (the open of `path`
/// then reports what is missing).
fn open_dependencies(path: &Path, spec: &LibrarySpec) -> Vec<libloading::Library> {
    let Some(dir) = path.parent() else {
        return Vec::new();
    };
    let wheel_root = dir.parent().and_then(Path::parent);
    let mut opened = Vec::new();
    for dep in spec.dependencies {
        let mut dirs = vec![dir.to_path_buf()];
        if let Some(root) = wheel_root {
            dirs.push(root.join(dep.wheel_dir).join("lib"));
        }
        if let Some(found) = dirs.iter().find_map(|d| newest_with_prefix(d, dep.prefix)) {
            // SAFETY: as for the library itself: its initialisers only set up its own state.
            if let Ok(l) = unsafe { libloading::Library::new(&found) } {
                opened.push(l);
            }
        }
    }
    opened
}

/// The file in `dir` named `<prefix><major>` with the largest major version.
fn newest_with_prefix(dir: &Path, prefix: &str) -> Option<PathBuf> {
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let major: u32 = name.strip_prefix(prefix)?.parse().ok()?;
            Some((major, e.path()))
        })
        .max_by_key(|(major, _)| *major)
        .map(|(_, p)| p)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: LibrarySpec = LibrarySpec {
        name: "libtest",
        env: "CUDARS_LOADER_TEST_LIBRARY_UNSET",
        names: &["libcudars-loader-test-none.so.9"],
        dependencies: &[],
        wheel: "nvidia-test",
    };

    #[test]
    fn a_missing_library_names_every_candidate_and_the_variable() {
        let err = Loaded::open_from(
            &SPEC,
            &["/nonexistent/libx.so.1".into(), "libcudars-none.so".into()],
        )
        .unwrap_err();
        let LoadError::NotFound { tried, .. } = &err;
        assert_eq!(tried.len(), 2);
        assert_eq!(
            tried[0],
            ("/nonexistent/libx.so.1".into(), "no such file".into())
        );
        let text = err.to_string();
        assert!(text.contains("libtest library not found"), "{text}");
        assert!(text.contains("CUDARS_LOADER_TEST_LIBRARY_UNSET"), "{text}");
        assert!(text.contains("nvidia-test"), "{text}");
    }

    #[test]
    fn candidates_are_names_then_toolkit_directories() {
        let c = candidates(&SPEC);
        assert_eq!(c[0], OsString::from("libcudars-loader-test-none.so.9"));
        assert!(c
            .iter()
            .any(|p| Path::new(p)
                == Path::new("/usr/local/cuda/lib64/libcudars-loader-test-none.so.9")));
    }

    #[test]
    fn lookup_of_an_absent_symbol_is_null_and_of_a_present_one_is_not() {
        let libc = Loaded::open_from(&SPEC, &["libc.so.6".into()]).expect("libc opens");
        assert!(libc.lookup(c"cublasCreate_v2").is_null());
        assert!(!libc.lookup(c"malloc").is_null());
        assert_eq!(libc.path(), "libc.so.6");
    }

    #[test]
    fn newest_with_prefix_takes_the_largest_major() {
        let dir = std::env::temp_dir().join(format!("cudars-loader-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for n in [
            "libfoo.so.11",
            "libfoo.so.13",
            "libfoo.so.12",
            "libfoo.so.x",
        ] {
            std::fs::write(dir.join(n), b"").unwrap();
        }
        assert_eq!(
            newest_with_prefix(&dir, "libfoo.so."),
            Some(dir.join("libfoo.so.13"))
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

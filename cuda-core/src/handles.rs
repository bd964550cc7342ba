//! cuBLAS and cuSOLVER handles of a device (CuPy's `Device.cublas_handle`,
//! `Device.cusolver_handle`, `get_cublas_handle()`); behind the `library-handles` feature.
//!
//! Nothing links against these libraries: they are opened at run time, on first use, with
//! `libloading`, and only the few entry points needed to create and destroy handles are
//! resolved (declared here by hand; no headers are needed).
//!
//! * [`cublas_handle`] / [`cusolver_handle`]: the device's shared handle, created on first use
//!   and the same handle on every later call for that device, for the life of the process.
//! * [`CublasHandle::new`] / [`CusolverHandle::new`]: a handle of your own, destroyed on drop.
//! * [`cublas_library_path`] / [`cusolver_library_path`]: open the library (if not yet) and say
//!   where it came from.
//!
//! # Where the libraries are looked for
//!
//! | library | override | tried otherwise, in order |
//! | --- | --- | --- |
//! | cuBLAS | `$CUDA_CUBLAS_LIBRARY` | [`CUBLAS_NAMES`], then each in `$CUDA_HOME/lib64`, `$CUDA_PATH/lib64`, `/usr/local/cuda/lib64` |
//! | cuSOLVER | `$CUDA_CUSOLVER_LIBRARY` | [`CUSOLVER_NAMES`], then the same directories |
//!
//! CUDA 13 ships `libcublas.so.13` and `libcusolver.so.12`; CUDA 12 `libcublas.so.12` and
//! `libcusolver.so.11`. When the override variable is set (and not empty), that path is the
//! only one tried. Bare names are resolved by the system's dynamic linker (`LD_LIBRARY_PATH`,
//! the `ldconfig` cache). The libraries that PyTorch's and CuPy's pip wheels install
//! (`site-packages/nvidia/cu13/lib/`, or `nvidia/cublas/lib/` for CUDA 12 wheels) are not on
//! the linker's path: point the variables at them, e.g.
//! `CUDA_CUBLAS_LIBRARY=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))')/nvidia/cu13/lib/libcublas.so.13`.
//! When a library is opened from a path, the libraries it needs (`libcublasLt`, `libcusparse`,
//! `libnvJitLink`, `libcublas`) are first opened from the same directory, or from the sibling
//! `nvidia/<name>/lib` directories of the CUDA 12 wheel layout, when they are there.
//!
//! A library that cannot be opened (or lacks an entry point) gives
//! [`Error::LibraryNotFound`] listing every path tried and why each failed. Failures are not
//! remembered: a later call tries again (after the variable was set, say). A library, once
//! opened, stays open for the life of the process.
//!
//! Errors returned by the libraries themselves (`cublasCreate_v2` returning
//! `CUBLAS_STATUS_NOT_INITIALIZED`, ...) come back as [`Error::Driver`] whose
//! [`DriverError`] carries the library's status code, its name (`CUBLAS_STATUS_...`), a
//! description and the call: the code is the library's, not a `CUresult`.
//!
//! ```no_run
//! # #[cfg(feature = "library-handles")] {
//! use cudars_core::{handles, Device};
//!
//! let dev = Device::new(0)?;
//! let blas = handles::cublas_handle(&dev)?;
//! assert_eq!(blas.raw(), handles::cublas_handle(&dev)?.raw()); // the same handle
//! // pass `blas.raw()` as the `cublasHandle_t` to cuBLAS functions.
//! # }
//! # Ok::<(), cudars_core::Error>(())
//! ```

use std::ffi::{c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use libloading::Library;

use crate::device::MAX_DEVICES;
use crate::error::{DriverError, Error, Result};
use crate::Device;

/// Environment variable naming the cuBLAS library to open (a path or a name); when set, the
/// only candidate tried.
pub const CUBLAS_LIBRARY_ENV: &str = "CUDA_CUBLAS_LIBRARY";
/// Environment variable naming the cuSOLVER library to open; when set, the only candidate.
pub const CUSOLVER_LIBRARY_ENV: &str = "CUDA_CUSOLVER_LIBRARY";

/// cuBLAS library names tried in order (CUDA 13, 12, 11, then the unversioned development
/// link).
pub const CUBLAS_NAMES: &[&str] = &[
    "libcublas.so.13",
    "libcublas.so.12",
    "libcublas.so.11",
    "libcublas.so",
];
/// cuSOLVER library names tried in order (CUDA 13 ships `.so.12`, CUDA 12 and 11 `.so.11`).
pub const CUSOLVER_NAMES: &[&str] = &["libcusolver.so.12", "libcusolver.so.11", "libcusolver.so"];

/// Toolkit directories tried after the bare names.
const TOOLKIT_ROOT_ENVS: &[&str] = &["CUDA_HOME", "CUDA_PATH"];
const TOOLKIT_LIB_DIR: &str = "/usr/local/cuda/lib64";

/// Libraries cuBLAS and cuSOLVER depend on, in the order they must be opened (each needs only
/// the ones before it), and the pip-wheel directory (`nvidia/<dir>/lib`) each lives in.
const DEPENDENCIES: &[(&str, &str)] = &[
    ("libnvJitLink.so.", "nvjitlink"),
    ("libcublasLt.so.", "cublas"),
    ("libcublas.so.", "cublas"),
    ("libcusparse.so.", "cusparse"),
];

/// `cublasCreate_v2` / `cusolverDnCreate`: `status f(handle_t *out)`.
type CreateFn = unsafe extern "C" fn(*mut *mut c_void) -> c_int;
/// `cublasDestroy_v2` / `cusolverDnDestroy`: `status f(handle_t)`.
type DestroyFn = unsafe extern "C" fn(*mut c_void) -> c_int;

/// What differs between cuBLAS and cuSOLVER.
struct Spec {
    library: &'static str,
    env: &'static str,
    names: &'static [&'static str],
    create: &'static str,
    destroy: &'static str,
    status_name: fn(c_int) -> (&'static str, &'static str),
}

const CUBLAS: Spec = Spec {
    library: "cuBLAS",
    env: CUBLAS_LIBRARY_ENV,
    names: CUBLAS_NAMES,
    create: "cublasCreate_v2",
    destroy: "cublasDestroy_v2",
    status_name: cublas_status,
};

const CUSOLVER: Spec = Spec {
    library: "cuSOLVER",
    env: CUSOLVER_LIBRARY_ENV,
    names: CUSOLVER_NAMES,
    create: "cusolverDnCreate",
    destroy: "cusolverDnDestroy",
    status_name: cusolver_status,
};

/// An opened library and its two entry points.
struct Opened {
    path: String,
    create: CreateFn,
    destroy: DestroyFn,
    _library: Library,
}

static CUBLAS_LIB: OnceLock<Opened> = OnceLock::new();
static CUSOLVER_LIB: OnceLock<Opened> = OnceLock::new();
/// Serialises opening, so a library is opened once; never held on the fast path.
static OPENING: Mutex<()> = Mutex::new(());
/// Serialises the creation of the shared handles.
static CREATING: Mutex<()> = Mutex::new(());
/// Dependencies opened ahead of a library given by path; kept open for the process's life.
static DEPENDENCY_LIBS: Mutex<Vec<Library>> = Mutex::new(Vec::new());

fn opened(spec: &Spec, cell: &'static OnceLock<Opened>) -> Result<&'static Opened> {
    if let Some(o) = cell.get() {
        return Ok(o);
    }
    let _lock = OPENING.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(o) = cell.get() {
        return Ok(o);
    }
    let o = open(spec)?;
    Ok(cell.get_or_init(|| o))
}

fn candidates(spec: &Spec) -> Vec<PathBuf> {
    if let Some(path) = std::env::var_os(spec.env).filter(|p| !p.is_empty()) {
        return vec![PathBuf::from(path)];
    }
    let mut dirs: Vec<PathBuf> = TOOLKIT_ROOT_ENVS
        .iter()
        .filter_map(|v| std::env::var_os(v).filter(|p| !p.is_empty()))
        .map(|root| PathBuf::from(root).join("lib64"))
        .collect();
    dirs.push(PathBuf::from(TOOLKIT_LIB_DIR));
    dirs.dedup();
    let mut all: Vec<PathBuf> = spec.names.iter().map(PathBuf::from).collect();
    for dir in &dirs {
        all.extend(spec.names.iter().map(|n| dir.join(n)));
    }
    all
}

fn open(spec: &Spec) -> Result<Opened> {
    let mut tried = Vec::new();
    for candidate in candidates(spec) {
        let shown = candidate.display().to_string();
        if candidate.components().count() > 1 {
            if !candidate.exists() {
                tried.push(format!("{shown} (no such file)"));
                continue;
            }
            open_dependencies(&candidate, spec.library);
        }
        // SAFETY: opening cuBLAS/cuSOLVER runs their initialisers, which only set up the
        // libraries' own state.
        let library = match unsafe { Library::new(&candidate) } {
            Ok(l) => l,
            Err(e) => {
                tried.push(format!("{shown} ({e})"));
                continue;
            }
        };
        // SAFETY: the declared types match the C prototypes
        // `cublasStatus_t cublasCreate_v2(cublasHandle_t *)`,
        // `cublasStatus_t cublasDestroy_v2(cublasHandle_t)` and cuSOLVER's
        // `cusolverDnCreate(cusolverDnHandle_t *)` / `cusolverDnDestroy(cusolverDnHandle_t)`
        // (statuses are C enums: `int`; handles are pointers).
        let symbols = unsafe {
            library
                .get::<CreateFn>(spec.create.as_bytes())
                .map(|s| *s)
                .and_then(|c| {
                    library
                        .get::<DestroyFn>(spec.destroy.as_bytes())
                        .map(|d| (c, *d))
                })
        };
        match symbols {
            Ok((create, destroy)) => {
                return Ok(Opened {
                    path: shown,
                    create,
                    destroy,
                    _library: library,
                })
            }
            Err(e) => tried.push(format!(
                "{shown} (opened, but lacks {} or {}: {e})",
                spec.create, spec.destroy
            )),
        }
    }
    Err(Error::LibraryNotFound {
        library: spec.library,
        tried: if tried.is_empty() {
            "nothing".to_string()
        } else {
            tried.join("; ")
        },
    })
}

/// Opens, from `path`'s directory or the CUDA 12 wheel's sibling `nvidia/<name>/lib`
/// directories, the libraries `path` may depend on, so the dynamic linker finds them already
/// loaded (it matches dependencies against loaded libraries by soname). Best effort: a
/// dependency that cannot be opened is skipped, and the open of `path` then reports what is
/// missing.
fn open_dependencies(path: &Path, library: &str) {
    let Some(dir) = path.parent() else { return };
    let wheel_root = dir.parent().and_then(Path::parent);
    let mut libs = DEPENDENCY_LIBS.lock().unwrap_or_else(|p| p.into_inner());
    for (prefix, wheel_dir) in DEPENDENCIES {
        // cuBLAS does not need itself.
        if library == "cuBLAS" && *prefix == "libcublas.so." {
            continue;
        }
        let mut dirs = vec![dir.to_path_buf()];
        if let Some(root) = wheel_root {
            dirs.push(root.join(wheel_dir).join("lib"));
        }
        let found = dirs.iter().find_map(|d| newest_with_prefix(d, prefix));
        if let Some(dep) = found {
            // SAFETY: as for the library itself: its initialisers only set up its own state.
            if let Ok(l) = unsafe { Library::new(&dep) } {
                libs.push(l);
            }
        }
    }
}

/// The file in `dir` named `<prefix><major>` with the largest major version.
fn newest_with_prefix(dir: &Path, prefix: &str) -> Option<PathBuf> {
    let entries = std::fs::read_dir(dir).ok()?;
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let major: u32 = name.strip_prefix(prefix)?.parse().ok()?;
            Some((major, e.path()))
        })
        .max_by_key(|(major, _)| *major)
        .map(|(_, p)| p)
}

/// Opens cuBLAS (if not yet open) and returns the path or name it was opened from.
///
/// [`Error::LibraryNotFound`] lists every candidate and why it failed; see the
/// [module documentation](self) for the search order and [`CUBLAS_LIBRARY_ENV`].
///
/// ```
/// match cudars_core::handles::cublas_library_path() {
///     Ok(path) => println!("cuBLAS from {path}"),
///     Err(e) => println!("no cuBLAS: {e}"),
/// }
/// ```
pub fn cublas_library_path() -> Result<&'static str> {
    opened(&CUBLAS, &CUBLAS_LIB).map(|o| o.path.as_str())
}

/// Opens cuSOLVER (if not yet open) and returns the path or name it was opened from; see
/// [`cublas_library_path`] and [`CUSOLVER_LIBRARY_ENV`].
pub fn cusolver_library_path() -> Result<&'static str> {
    opened(&CUSOLVER, &CUSOLVER_LIB).map(|o| o.path.as_str())
}

fn create(spec: &Spec, lib: &Opened, device: &Device) -> Result<*mut c_void> {
    let _ctx = device.bind()?;
    let mut raw: *mut c_void = std::ptr::null_mut();
    // SAFETY: `create` is the library's handle constructor (prototype checked at open); the
    // out-pointer is valid; the device's primary context is current, which is the context the
    // library's runtime uses for the handle.
    let status = unsafe { (lib.create)(&mut raw) };
    if status != 0 {
        return Err(status_error(spec, spec.create, status));
    }
    Ok(raw)
}

fn status_error(spec: &Spec, call: &'static str, status: c_int) -> Error {
    let (name, message) = (spec.status_name)(status);
    Error::Driver(DriverError {
        code: status as u32,
        name,
        message,
        call,
    })
}

macro_rules! handle_type {
    ($(#[$doc:meta])* $name:ident, $spec:ident, $cell:ident, $c_type:literal) => {
        $(#[$doc])*
        ///
        /// A handle made by `new` is destroyed when dropped; the shared handle of a device
        /// lives as long as the process.
        ///
        /// `Send` and `Sync`: the wrapper only carries the handle value. The library's own
        /// rule applies to using it: one handle must not be used by several host threads at
        /// the same time (its stream and workspace settings are shared state). Threads that
        /// call the library concurrently should each make their own handle with `new`, or
        /// serialise their use of the shared one.
        #[derive(Debug)]
        pub struct $name {
            raw: *mut c_void,
            device: Device,
            owned: bool,
        }

        // SAFETY: the struct holds a handle value and a device id; no method touches the
        // handle except Drop, which runs once, on whichever thread owns the value.
        unsafe impl Send for $name {}
        // SAFETY: `&self` methods only read the two fields; using the handle concurrently is
        // governed by the library's rule (above), which the caller's FFI calls must follow.
        unsafe impl Sync for $name {}

        impl $name {
            #[doc = concat!("A new handle for `device`, owned by the caller and destroyed on drop (`", stringify!($c_type), "`).")]
            pub fn new(device: &Device) -> Result<$name> {
                // Stamped before binding: a reset in between is refused (see `health`).
                let device = &device.stamped();
                let lib = opened(&$spec, &$cell)?;
                let raw = create(&$spec, lib, device)?;
                Ok($name { raw, device: *device, owned: true })
            }

            #[doc = concat!("The `", $c_type, "` value, to pass to the library's functions.")]
            pub fn raw(&self) -> *mut c_void {
                self.raw
            }

            /// The device the handle was created for.
            pub fn device(&self) -> Device {
                self.device
            }
        }

        impl Drop for $name {
            fn drop(&mut self) {
                if !self.owned {
                    return;
                }
                let Some(lib) = $cell.get() else { return };
                if let Ok(_ctx) = self.device.bind() {
                    // SAFETY: a handle this process created with the same library and never
                    // destroyed; its device's context is current.
                    let _ = unsafe { (lib.destroy)(self.raw) };
                }
            }
        }
    };
}

handle_type!(
    /// A cuBLAS handle (`cublasHandle_t`) of one device.
    CublasHandle, CUBLAS, CUBLAS_LIB, "cublasHandle_t"
);
handle_type!(
    /// A cuSOLVER dense handle (`cusolverDnHandle_t`) of one device.
    CusolverHandle, CUSOLVER, CUSOLVER_LIB, "cusolverDnHandle_t"
);

static SHARED_CUBLAS: [OnceLock<CublasHandle>; MAX_DEVICES] =
    [const { OnceLock::new() }; MAX_DEVICES];
static SHARED_CUSOLVER: [OnceLock<CusolverHandle>; MAX_DEVICES] =
    [const { OnceLock::new() }; MAX_DEVICES];

/// The shared cuBLAS handle of `device` (CuPy's `Device.cublas_handle`): created on the first
/// call (opening cuBLAS if needed), then the same handle for every later call with this device,
/// from any thread. Never destroyed. See [`CublasHandle`] for the threading rule.
pub fn cublas_handle(device: &Device) -> Result<&'static CublasHandle> {
    shared(&SHARED_CUBLAS, device, CublasHandle::device, || {
        CublasHandle::new(device).map(|mut h| {
            h.owned = false;
            h
        })
    })
}

/// The cuBLAS handle of the calling thread's current device (CuPy's `get_cublas_handle()`).
pub fn current_cublas_handle() -> Result<&'static CublasHandle> {
    cublas_handle(&Device::current()?)
}

/// The shared cuSOLVER dense handle of `device` (CuPy's `Device.cusolver_handle`); see
/// [`cublas_handle`].
pub fn cusolver_handle(device: &Device) -> Result<&'static CusolverHandle> {
    shared(&SHARED_CUSOLVER, device, CusolverHandle::device, || {
        CusolverHandle::new(device).map(|mut h| {
            h.owned = false;
            h
        })
    })
}

/// The shared handle of `device`, made on first use. A handle made before a
/// [`Device::reset_after_fault`] belongs to the destroyed context: it is refused with
/// [`Error::ContextLost`] (make a handle of your own with `new` after a reset).
fn shared<H>(
    cells: &'static [OnceLock<H>; MAX_DEVICES],
    device: &Device,
    device_of: fn(&H) -> Device,
    make: impl FnOnce() -> Result<H>,
) -> Result<&'static H> {
    let cell = cells.get(device.ordinal()).ok_or(Error::InvalidDevice {
        ordinal: device.ordinal(),
        count: MAX_DEVICES,
    })?;
    if let Some(h) = cell.get() {
        crate::health::usable(&device_of(h))?;
        return Ok(h);
    }
    // One creator at a time, so a device never gets two shared handles. `make` opens the
    // library under the other lock, OPENING.
    let _lock = CREATING.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(h) = cell.get() {
        crate::health::usable(&device_of(h))?;
        return Ok(h);
    }
    let made = make()?;
    Ok(cell.get_or_init(|| made))
}

fn cublas_status(status: c_int) -> (&'static str, &'static str) {
    match status {
        1 => (
            "CUBLAS_STATUS_NOT_INITIALIZED",
            "the cuBLAS library was not initialized (often: no usable device or driver)",
        ),
        3 => (
            "CUBLAS_STATUS_ALLOC_FAILED",
            "resource allocation failed inside cuBLAS",
        ),
        7 => (
            "CUBLAS_STATUS_INVALID_VALUE",
            "an invalid value was passed to cuBLAS",
        ),
        8 => (
            "CUBLAS_STATUS_ARCH_MISMATCH",
            "the device does not support a feature cuBLAS needs",
        ),
        11 => (
            "CUBLAS_STATUS_MAPPING_ERROR",
            "access to GPU memory space failed",
        ),
        13 => (
            "CUBLAS_STATUS_EXECUTION_FAILED",
            "the GPU program failed to execute",
        ),
        14 => (
            "CUBLAS_STATUS_INTERNAL_ERROR",
            "an internal cuBLAS operation failed",
        ),
        15 => (
            "CUBLAS_STATUS_NOT_SUPPORTED",
            "the functionality requested is not supported",
        ),
        16 => (
            "CUBLAS_STATUS_LICENSE_ERROR",
            "the functionality requested requires a license",
        ),
        _ => ("CUBLAS_STATUS_UNKNOWN", "unrecognised cuBLAS status"),
    }
}

fn cusolver_status(status: c_int) -> (&'static str, &'static str) {
    match status {
        1 => (
            "CUSOLVER_STATUS_NOT_INITIALIZED",
            "the cuSOLVER library was not initialized (often: no usable device or driver)",
        ),
        2 => (
            "CUSOLVER_STATUS_ALLOC_FAILED",
            "resource allocation failed inside cuSOLVER",
        ),
        3 => (
            "CUSOLVER_STATUS_INVALID_VALUE",
            "an invalid value was passed to cuSOLVER",
        ),
        4 => (
            "CUSOLVER_STATUS_ARCH_MISMATCH",
            "the device does not support a feature cuSOLVER needs",
        ),
        6 => (
            "CUSOLVER_STATUS_EXECUTION_FAILED",
            "the GPU program failed to execute",
        ),
        7 => (
            "CUSOLVER_STATUS_INTERNAL_ERROR",
            "an internal cuSOLVER operation failed",
        ),
        _ => ("CUSOLVER_STATUS_UNKNOWN", "unrecognised cuSOLVER status"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both override variables are set by one test only, so tests do not race on them.
    #[test]
    fn a_missing_library_is_a_clear_error_listing_what_was_tried() {
        let missing = "/nonexistent/cuda-core-test/libcublas.so.13";
        let missing_solver = "/nonexistent/cuda-core-test/libcusolver.so.12";
        std::env::set_var(CUBLAS_LIBRARY_ENV, missing);
        std::env::set_var(CUSOLVER_LIBRARY_ENV, missing_solver);
        let blas = cublas_library_path();
        let solver = cusolver_library_path();
        std::env::remove_var(CUBLAS_LIBRARY_ENV);
        std::env::remove_var(CUSOLVER_LIBRARY_ENV);
        match blas {
            Err(Error::LibraryNotFound { library, tried }) => {
                assert_eq!(library, "cuBLAS");
                assert_eq!(tried, format!("{missing} (no such file)"));
            }
            other => panic!("expected LibraryNotFound, got {other:?}"),
        }
        match solver {
            Err(e @ Error::LibraryNotFound { .. }) => {
                let text = e.to_string();
                assert!(text.starts_with("cuSOLVER could not be opened"), "{text}");
                assert!(text.contains(missing_solver), "{text}");
            }
            other => panic!("expected LibraryNotFound, got {other:?}"),
        }
    }

    #[test]
    fn the_default_search_tries_every_name_newest_first() {
        // Without the override the list starts with the bare names, newest first.
        let spec = Spec {
            env: "CUDA_CORE_TEST_UNSET_VARIABLE",
            ..CUBLAS
        };
        let list = candidates(&spec);
        let first: Vec<_> = list
            .iter()
            .take(4)
            .map(|p| p.display().to_string())
            .collect();
        assert_eq!(first, CUBLAS_NAMES);
        assert!(list.contains(&Path::new(TOOLKIT_LIB_DIR).join("libcublas.so.13")));
        let spec = Spec {
            env: "CUDA_CORE_TEST_UNSET_VARIABLE",
            ..CUSOLVER
        };
        assert_eq!(candidates(&spec)[0], Path::new("libcusolver.so.12"));
    }

    #[test]
    fn a_library_without_the_entry_points_is_reported() {
        // libc opens but has no cublasCreate_v2.
        let spec = Spec {
            env: "CUDA_CORE_TEST_LIBC_AS_CUBLAS",
            ..CUBLAS
        };
        std::env::set_var(spec.env, "libc.so.6");
        let result = open(&spec);
        std::env::remove_var(spec.env);
        match result {
            Err(Error::LibraryNotFound { tried, .. }) => {
                assert!(tried.contains("lacks cublasCreate_v2"), "{tried}");
            }
            other => panic!("expected LibraryNotFound, got {:?}", other.map(|o| o.path)),
        }
    }

    #[test]
    fn dependencies_are_found_by_newest_major_version() {
        let dir = std::env::temp_dir().join(format!("cuda-core-handles-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for name in [
            "libcublasLt.so.12",
            "libcublasLt.so.13",
            "libcublasLt.so",
            "libcublasLt.so.x",
        ] {
            std::fs::write(dir.join(name), b"").unwrap();
        }
        let found = newest_with_prefix(&dir, "libcublasLt.so.");
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(found, Some(dir.join("libcublasLt.so.13")));
    }
}

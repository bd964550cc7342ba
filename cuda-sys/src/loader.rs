//! Opening the driver library and filling the function table.

use std::ffi::{c_void, CStr, OsStr};
use std::fmt;
use std::sync::OnceLock;

use crate::{
    CUdriverProcAddressQueryResult, CUdriverProcAddress_flags, CUresult, DriverTable, CUDA_VERSION,
};

/// Environment variable naming the driver library to open instead of the default names.
pub const DRIVER_PATH_ENV: &str = "CUDA_DRIVER_LIBRARY";

/// Names tried, in order, when [`DRIVER_PATH_ENV`] is not set.
const DEFAULT_NAMES: &[&str] = &["libcuda.so.1", "libcuda.so"];

/// One entry point of the driver: the API name `cuGetProcAddress` takes (`cuMemAlloc`) and
/// the exported symbol of the ABI version these bindings were generated for (`cuMemAlloc_v2`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryPoint {
    /// API name, as `cuGetProcAddress` expects it.
    pub api: &'static CStr,
    /// Versioned symbol name, as `dlsym` finds it.
    pub symbol: &'static CStr,
    /// `false` where `cuGetProcAddress` would answer with another ABI than the declaration's
    /// (the header declares both `cuX` and a distinct `cuX_vN`): resolved with `dlsym` only.
    pub by_proc_address: bool,
    /// The CUDA version whose ABI of `api` this binding declares (from `cudaTypedefs.h`); 0
    /// where unknown. `cuGetProcAddress` is asked for exactly this version. A driver older
    /// than it would answer with an older ABI, so the loader leaves the entry point out there
    /// and calls through it return [`MissingSymbol`] with [`MissingSymbol::is_driver_too_old`].
    pub since: u32,
}

/// The driver library could not be opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// No candidate could be opened; each attempt with the loader's message.
    DriverNotFound {
        /// `(path, why)` for each library that was tried, in order.
        tried: Vec<(String, String)>,
    },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::DriverNotFound { tried } => {
                write!(f, "CUDA driver library not found; tried")?;
                for (i, (path, why)) in tried.iter().enumerate() {
                    let sep = if i == 0 { " " } else { "; " };
                    write!(f, "{sep}{path} ({why})")?;
                }
                if tried.is_empty() {
                    write!(f, " nothing")?;
                }
                write!(f, ". Set {DRIVER_PATH_ENV} to the path of libcuda.so.1 if it is installed elsewhere")
            }
        }
    }
}

impl std::error::Error for LoadError {}

/// The loaded library has no entry point of this name, or only one with an older ABI than the
/// binding's (the driver is older than the bindings), or the library is not the CUDA driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MissingSymbol {
    /// API name of the missing entry point.
    pub name: &'static str,
    /// The CUDA version that introduced the ABI this binding needs; 0 where unknown.
    pub needed: u32,
    /// The loaded driver's version (`cuDriverGetVersion`); 0 where unknown.
    pub driver: u32,
}

impl MissingSymbol {
    /// A missing entry point with no version information.
    pub const fn new(name: &'static str) -> Self {
        MissingSymbol {
            name,
            needed: 0,
            driver: 0,
        }
    }

    /// `true` when the entry point is missing because the driver is older than the CUDA
    /// version whose ABI the binding needs.
    pub fn is_driver_too_old(&self) -> bool {
        self.driver != 0 && self.needed > self.driver
    }
}

/// `12040 -> "12.4"`.
pub(crate) struct VersionText(pub(crate) u32);

impl fmt::Display for VersionText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.0 / 1000, self.0 % 1000 / 10)
    }
}

impl fmt::Display for MissingSymbol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_driver_too_old() {
            write!(
                f,
                "`{}` needs a CUDA {} driver; the loaded driver supports CUDA {}",
                self.name,
                VersionText(self.needed),
                VersionText(self.driver)
            )
        } else {
            write!(
                f,
                "the loaded CUDA driver has no entry point `{}`",
                self.name
            )
        }
    }
}

impl std::error::Error for MissingSymbol {}

/// How the function table was filled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// Through `cuGetProcAddress` for the bindings' CUDA version, `dlsym` for what it lacked.
    ProcAddress,
    /// Through `dlsym` alone (the library has no `cuGetProcAddress_v2`).
    Dlsym,
}

/// An opened driver library and its function table.
///
/// Every entry point of `cuda.h` is a method of the same (unversioned) name: `cuMemAlloc`
/// calls `cuMemAlloc_v2`. A method returns `Err(MissingSymbol)` when the library lacks that
/// entry point, and `Ok(CUresult)` otherwise.
///
/// `Driver` is `Send + Sync`: the table is immutable after loading and the driver API is
/// thread-safe.
pub struct Driver {
    pub(crate) table: DriverTable,
    pub(crate) compat: crate::compat::CompatTable,
    path: String,
    resolution: Resolution,
    resolved: usize,
    /// Per entry of `DRIVER_ENTRY_POINTS`: found in the library.
    present: Vec<bool>,
    init_status: Option<CUresult>,
    /// `cuDriverGetVersion`; 0 where unknown.
    driver_version: u32,
    // Dropped last: the table points into it. `None` for a driver built from a resolver.
    _library: Option<libloading::Library>,
}

impl fmt::Debug for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Driver")
            .field("path", &self.path)
            .field("resolution", &self.resolution)
            .field("resolved", &self.resolved)
            .field("init_status", &self.init_status)
            .field("driver_version", &self.driver_version)
            .finish_non_exhaustive()
    }
}

impl Driver {
    /// Opens the driver: the library named by [`DRIVER_PATH_ENV`] when set, else
    /// `libcuda.so.1`, else `libcuda.so`. Calls `cuInit(0)` (its status is [`init_status`])
    /// and resolves every entry point.
    ///
    /// [`init_status`]: Driver::init_status
    pub fn load() -> Result<Self, LoadError> {
        let candidates: Vec<String> = match std::env::var(DRIVER_PATH_ENV) {
            Ok(path) if !path.is_empty() => vec![path],
            _ => DEFAULT_NAMES.iter().map(|s| s.to_string()).collect(),
        };
        let mut tried = Vec::new();
        for candidate in candidates {
            // SAFETY: the candidates are the CUDA driver's own names (or the path the user
            // named as the driver), whose initialisers are safe to run and whose cu* symbols
            // have the signatures of cuda.h.
            match unsafe { Self::load_from(&candidate) } {
                Ok(driver) => return Ok(driver),
                Err(LoadError::DriverNotFound { tried: t }) => tried.extend(t),
            }
        }
        Err(LoadError::DriverNotFound { tried })
    }

    /// Opens the library at `path` as the driver.
    ///
    /// A library that opens but lacks the driver's symbols loads fine: each missing entry point
    /// is an `Err(MissingSymbol)` at the call that needs it.
    ///
    /// # Safety
    ///
    /// Opening a library runs its initialisers, and any `cu*` symbol it exports is called with
    /// the signature `cuda.h` gives that name: `path` must be the CUDA driver or a library that
    /// exports no `cu*` symbol of another signature.
    pub unsafe fn load_from(path: impl AsRef<OsStr>) -> Result<Self, LoadError> {
        let path = path.as_ref();
        // SAFETY: the caller vouches for the library (see above).
        let library = match unsafe { libloading::Library::new(path) } {
            Ok(lib) => lib,
            Err(e) => {
                return Err(LoadError::DriverNotFound {
                    tried: vec![(path.to_string_lossy().into_owned(), e.to_string())],
                })
            }
        };
        // SAFETY: as above; the symbols are looked up with the signatures of cuda.h.
        Ok(unsafe { Self::from_library(library, path.to_string_lossy().into_owned()) })
    }

    unsafe fn from_library(library: libloading::Library, path: String) -> Self {
        // SAFETY: `cuInit`, `cuDriverGetVersion` and `cuGetProcAddress_v2` have these
        // signatures in every driver that exports them; the pointers live as long as `library`,
        // which the Driver owns.
        let init = unsafe { library.get::<crate::pfn::cuInit>(b"cuInit\0") }
            .ok()
            .map(|s| *s);
        // SAFETY: as above.
        let get_version =
            unsafe { library.get::<crate::pfn::cuDriverGetVersion>(b"cuDriverGetVersion\0") }
                .ok()
                .map(|s| *s);
        // SAFETY: as above.
        let get_proc =
            unsafe { library.get::<crate::pfn::cuGetProcAddress>(b"cuGetProcAddress_v2\0") }
                .ok()
                .map(|s| *s);
        // cuGetProcAddress answers only on an initialised driver.
        // SAFETY: cuInit(0) is valid at any time.
        let init_status = init.map(|f| unsafe { f(0) });
        let mut version: i32 = 0;
        if let Some(f) = get_version {
            // SAFETY: valid out-pointer; callable before and after cuInit.
            if unsafe { f(&mut version) } != CUresult::CUDA_SUCCESS {
                version = 0;
            }
        }
        let flags = CUdriverProcAddress_flags::CU_GET_PROC_ADDRESS_LEGACY_STREAM.0 as u64;
        let lookup = |api: &CStr, symbol: &CStr, at: i32| -> *mut c_void {
            let mut ptr: *mut c_void = std::ptr::null_mut();
            if let Some(get_proc) = get_proc.filter(|_| at > 0) {
                let mut status = CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS;
                // SAFETY: valid C string, valid out-pointers.
                let r = unsafe { get_proc(api.as_ptr(), &mut ptr, at, flags, &mut status) };
                if r != CUresult::CUDA_SUCCESS {
                    ptr = std::ptr::null_mut();
                }
            }
            if ptr.is_null() {
                // SAFETY: looking a symbol up has no side effect.
                if let Ok(sym) = unsafe { library.get::<*mut c_void>(symbol.to_bytes_with_nul()) } {
                    ptr = *sym;
                }
            }
            ptr
        };
        let resolution = if get_proc.is_some() {
            Resolution::ProcAddress
        } else {
            Resolution::Dlsym
        };
        // SAFETY: `lookup` asks cuGetProcAddress at the version it is given (the ABI bindgen
        // read, or the compat entry's own version) or dlsym for the exact versioned symbol.
        let mut driver =
            unsafe { Self::with_resolver(path, resolution, version as u32, init_status, lookup) };
        driver._library = Some(library);
        driver
    }

    /// Builds a driver whose entry points come from `lookup(api, symbol, version)`, which
    /// returns null or the entry point `api` at ABI `version` (as `cuGetProcAddress` does; 0
    /// asks for the exact exported `symbol` instead). Entry points whose ABI is newer than
    /// `driver_version` are not asked for (see [`EntryPoint::since`]). For tests with a fake
    /// driver, and for embedders that resolve symbols themselves.
    ///
    /// # Safety
    ///
    /// Every non-null pointer `lookup` returns must be a function with the signature of that
    /// entry point at that version, valid for as long as the `Driver` is used.
    pub unsafe fn with_resolver(
        path: String,
        resolution: Resolution,
        driver_version: u32,
        init_status: Option<CUresult>,
        mut lookup: impl FnMut(&CStr, &CStr, i32) -> *mut c_void,
    ) -> Self {
        let too_old = |since: u32| driver_version != 0 && since > driver_version;
        let mut present = Vec::with_capacity(crate::DRIVER_ENTRY_POINT_COUNT);
        // SAFETY: each pointer comes from `lookup` for the bindings' CUDA version (the ABI
        // bindgen read) or for the exact versioned symbol, or is null; the caller vouches for
        // `lookup`.
        let table = unsafe {
            DriverTable::resolve(|entry| {
                let ptr = if too_old(entry.since) {
                    std::ptr::null_mut()
                } else if entry.by_proc_address {
                    // The version of the declared ABI where known, else the bindings'.
                    let at = if entry.since > 0 {
                        entry.since
                    } else {
                        CUDA_VERSION
                    };
                    lookup(entry.api, entry.symbol, at as i32)
                } else {
                    lookup(entry.api, entry.symbol, 0)
                };
                present.push(!ptr.is_null());
                ptr
            })
        };
        // SAFETY: as above; compat entries are asked for at their own versions.
        let compat = unsafe {
            crate::compat::CompatTable::resolve(|api, symbol, since| {
                if too_old(since) {
                    std::ptr::null_mut()
                } else {
                    lookup(api, symbol, since as i32)
                }
            })
        };
        let resolved = present.iter().filter(|p| **p).count();
        Driver {
            table,
            compat,
            path,
            resolution,
            resolved,
            present,
            init_status,
            driver_version,
            _library: None,
        }
    }

    /// The error for a call through the entry point `name`, whose binding needs the ABI of
    /// CUDA `needed`.
    pub(crate) fn missing(&self, name: &'static str, needed: u32) -> MissingSymbol {
        MissingSymbol {
            name,
            needed,
            driver: self.driver_version,
        }
    }

    /// The version the loaded driver reports (`cuDriverGetVersion`, `1000 * major + 10 *
    /// minor`); 0 where it could not be asked.
    pub fn driver_version(&self) -> u32 {
        self.driver_version
    }

    /// `Ok(())` when the entry point with API name `api` was resolved; otherwise the error a
    /// call through it returns (also for a name the bindings do not know).
    pub fn entry_status(&self, api: &str) -> Result<(), MissingSymbol> {
        let found = crate::DRIVER_ENTRY_POINTS
            .iter()
            .enumerate()
            .find(|(_, e)| e.api.to_bytes() == api.as_bytes());
        match found {
            Some((i, _)) if self.present.get(i).copied().unwrap_or(false) => Ok(()),
            // The entry's API name is 'static; `api` may not be.
            Some((_, e)) => Err(self.missing(e.api.to_str().unwrap_or("?"), e.since)),
            None => Err(self.missing("unknown entry point", 0)),
        }
    }

    /// The path or name the library was opened under.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// How the function table was filled.
    pub fn resolution(&self) -> Resolution {
        self.resolution
    }

    /// How many of the [`DRIVER_ENTRY_POINT_COUNT`](crate::DRIVER_ENTRY_POINT_COUNT) entry
    /// points the library provides.
    pub fn resolved_count(&self) -> usize {
        self.resolved
    }

    /// What `cuInit(0)` returned when the library was loaded; `None` if it has no `cuInit`.
    pub fn init_status(&self) -> Option<CUresult> {
        self.init_status
    }

    /// The function table.
    pub fn table(&self) -> &DriverTable {
        &self.table
    }
}

static GLOBAL: OnceLock<Result<Driver, LoadError>> = OnceLock::new();

/// The process-wide driver, loaded with [`Driver::load`] on first use and kept for the life of
/// the process. A failed load is remembered too: every call returns the same error.
pub fn driver() -> Result<&'static Driver, LoadError> {
    GLOBAL
        .get_or_init(Driver::load)
        .as_ref()
        .map_err(Clone::clone)
}

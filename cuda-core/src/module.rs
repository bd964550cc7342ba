//! Modules and kernels: PTX text JIT-compiled by the driver (`cuModuleLoadDataEx`) and its
//! functions launched on a [`Stream`] (`cuLaunchKernel`).
//!
//! CuPy reaches kernels through `RawModule`/`RawKernel`; here the thin driver-level pair is
//! [`Module`] and [`Function`].
//!
//! ```no_run
//! use std::ffi::c_void;
//! use cudars_core::{module::Module, Device, Stream};
//!
//! const PTX: &str = r#"
//! .version 7.0
//! .target sm_70
//! .address_size 64
//! .visible .entry nothing(.param .u64 unused) { ret; }
//! "#;
//!
//! let dev = Device::new(0)?;
//! let module = Module::from_ptx(&dev, PTX)?;
//! let kernel = module.function("nothing")?;
//! let stream = Stream::new(&dev)?;
//! let mut arg: u64 = 0;
//! let mut params = [&mut arg as *mut u64 as *mut c_void];
//! // SAFETY: `nothing` takes one u64 and touches no memory.
//! unsafe { kernel.launch(&stream, (1, 1, 1), (1, 1, 1), 0, &mut params)? };
//! stream.synchronize()?;
//! # Ok::<(), cudars_core::Error>(())
//! ```

use std::ffi::{c_void, CString};
use std::sync::Arc;

use cudars_sys::{CUfunction, CUjit_option, CUmodule};

use crate::driver::drv;
use crate::error::{Error, Result};
use crate::stream::Stream;
use crate::Device;

/// Bytes kept of the JIT compiler's error log.
const JIT_LOG_BYTES: usize = 16 * 1024;

/// The loaded module; unloaded when the last [`Module`] or [`Function`] holding it drops.
#[derive(Debug)]
struct ModuleInner {
    raw: CUmodule,
    device: Device,
}

// SAFETY: a CUmodule is a driver handle usable from any thread; the struct holds no
// thread-affine state.
unsafe impl Send for ModuleInner {}
// SAFETY: as above; the driver's module calls are thread-safe.
unsafe impl Sync for ModuleInner {}

impl Drop for ModuleInner {
    fn drop(&mut self) {
        let Ok(_ctx) = self.device.bind() else {
            return;
        };
        // SAFETY: we loaded the module in this device's context, which is current; every
        // Function of it holds this inner value, so none is left to launch.
        let _ = unsafe { drv!(cuModuleUnload(self.raw)) };
    }
}

/// A module loaded into a device's primary context (PTX JIT-compiled by the driver).
///
/// Cheap to clone (the handle is shared); unloaded when the last clone and the last
/// [`Function`] taken from it drop. `Send` and `Sync`: the driver's module calls are
/// thread-safe.
#[derive(Debug, Clone)]
pub struct Module {
    inner: Arc<ModuleInner>,
}

impl Module {
    /// JIT-compiles `ptx` for `device` and loads it (`cuModuleLoadDataEx`).
    ///
    /// When compilation fails the error is [`Error::InvalidArgument`] carrying the driver
    /// error and the JIT compiler's log. PTX text containing a NUL byte is rejected before
    /// the driver is called.
    pub fn from_ptx(device: &Device, ptx: &str) -> Result<Module> {
        let image = CString::new(ptx)
            .map_err(|_| Error::InvalidArgument("PTX text contains a NUL byte".into()))?;
        let _ctx = device.bind()?;
        let mut log = vec![0u8; JIT_LOG_BYTES];
        let mut options = [
            CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
            CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        ];
        // The size option is passed by value in the pointer slot, as the driver API defines.
        let mut values = [
            log.as_mut_ptr() as *mut c_void,
            JIT_LOG_BYTES as *mut c_void,
        ];
        let mut raw: CUmodule = std::ptr::null_mut();
        // SAFETY: the device's context is current; `image` is NUL-terminated and outlives the
        // call; the option arrays have matching lengths and the log buffer holds
        // JIT_LOG_BYTES bytes.
        let loaded = unsafe {
            drv!(cuModuleLoadDataEx(
                &mut raw,
                image.as_ptr() as *const c_void,
                options.len() as u32,
                options.as_mut_ptr(),
                values.as_mut_ptr(),
            ))
        };
        match loaded {
            Ok(()) => Ok(Module {
                inner: Arc::new(ModuleInner {
                    raw,
                    device: *device,
                }),
            }),
            Err(Error::Driver(e)) => {
                let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                let text = String::from_utf8_lossy(&log[..end]);
                Err(Error::InvalidArgument(format!(
                    "PTX did not load: {e}; JIT log: {}",
                    if text.trim().is_empty() {
                        "(empty)"
                    } else {
                        text.trim()
                    }
                )))
            }
            Err(e) => Err(e),
        }
    }

    /// The kernel named `name` (its `.entry` name; C++ kernels need `extern "C"` or their
    /// mangled name).
    pub fn function(&self, name: &str) -> Result<Function> {
        let cname = CString::new(name)
            .map_err(|_| Error::InvalidArgument("kernel name contains a NUL byte".into()))?;
        let mut raw: CUfunction = std::ptr::null_mut();
        crate::stream::with_context(self.inner.device, false, |_| {
            // SAFETY: a live module; NUL-terminated name; valid out-pointer; a context is
            // current.
            unsafe {
                drv!(cuModuleGetFunction(
                    &mut raw,
                    self.inner.raw,
                    cname.as_ptr()
                ))
            }
        })?;
        Ok(Function {
            raw,
            name: name.into(),
            module: Arc::clone(&self.inner),
        })
    }

    /// The driver handle.
    pub fn raw(&self) -> CUmodule {
        self.inner.raw
    }

    /// The device the module is loaded on.
    pub fn device(&self) -> Device {
        self.inner.device
    }
}

/// A kernel of a [`Module`]; keeps its module loaded.
///
/// Cheap to clone. `Send` and `Sync`: a `CUfunction` may be launched from any thread.
#[derive(Debug, Clone)]
pub struct Function {
    raw: CUfunction,
    name: Arc<str>,
    module: Arc<ModuleInner>,
}

// SAFETY: a CUfunction is a driver handle usable from any thread; its module is kept alive by
// the Arc.
unsafe impl Send for Function {}
// SAFETY: as above; cuLaunchKernel is thread-safe.
unsafe impl Sync for Function {}

impl Function {
    /// The driver handle.
    pub fn raw(&self) -> CUfunction {
        self.raw
    }

    /// The kernel's entry name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device the kernel's module is loaded on.
    pub fn device(&self) -> Device {
        self.module.device
    }

    /// Queues the kernel on `stream` with `grid` blocks of `block` threads and
    /// `shared_bytes` of dynamic shared memory (`cuLaunchKernel`).
    ///
    /// `params` holds one pointer per kernel parameter, in order, each pointing to a value
    /// of exactly the parameter's type; the driver copies the values before this returns, so
    /// they need only live for the call.
    ///
    /// A zero dimension is [`Error::InvalidArgument`] and a stream of another device is
    /// [`Error::WrongDevice`], both before the driver is called.
    ///
    /// # Safety
    ///
    /// - `params.len()` equals the kernel's parameter count and each pointer points to a
    ///   live, initialised value of that parameter's type and size;
    /// - every pointer the kernel dereferences (device pointers passed as parameters) is
    ///   valid for the accesses the kernel makes, from the stream's device, until the kernel
    ///   finishes, and nothing else accesses that memory in a conflicting way meanwhile;
    /// - the kernel itself is free of undefined behaviour for these arguments (out-of-bounds
    ///   accesses, data races between its threads).
    pub unsafe fn launch(
        &self,
        stream: &Stream,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared_bytes: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 || block.0 == 0 || block.1 == 0 || block.2 == 0
        {
            return Err(Error::InvalidArgument(format!(
                "launch of {}: grid {grid:?} and block {block:?} must have no zero dimension",
                self.name
            )));
        }
        let device = self.module.device;
        if stream.device() != device {
            return Err(Error::WrongDevice {
                what: "stream",
                expected: device.ordinal() as i32,
                actual: stream.device().ordinal() as i32,
            });
        }
        let _ctx = device.bind()?;
        let kernel_params = if params.is_empty() {
            std::ptr::null_mut()
        } else {
            params.as_mut_ptr()
        };
        // SAFETY: the module's context is current and the stream belongs to its device; the
        // caller upholds the parameter and memory contract above.
        unsafe {
            drv!(cuLaunchKernel(
                self.raw,
                grid.0,
                grid.1,
                grid.2,
                block.0,
                block.1,
                block.2,
                shared_bytes,
                stream.raw(),
                kernel_params,
                std::ptr::null_mut(),
            ))
        }
    }
}

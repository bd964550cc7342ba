//! Modules and kernels: PTX text JIT-compiled by the driver, or cubin and fatbin images
//! (`cuModuleLoadDataEx`), and their functions launched on a [`Stream`](crate::Stream) (`cuLaunchKernel`, or
//! `cuLaunchKernelEx` with thread-block clusters).
//!
//! CuPy reaches kernels through `RawModule`/`RawKernel`; here the thin driver-level pair is
//! [`Module`] and [`Function`]. The `cuda-rtc` crate compiles CUDA C++ into the images loaded
//! here and adds typed, checked launches on top.
//!
//! | what | call |
//! | --- | --- |
//! | load PTX text (safe), a cubin / a fatbin, or any of them by its first bytes (`unsafe`: the driver trusts the bytes) | [`Module::from_ptx`], [`Module::from_cubin`], [`Module::from_fatbin`], [`Module::from_image`] |
//! | a kernel by its (lowered) name | [`Module::function`] |
//! | its parameters' offsets and sizes (CUDA 12.4+ drivers) | [`Function::param_info`] |
//! | occupancy: block size for the most resident threads, blocks per SM | [`Function::max_potential_block_size`], [`Function::max_active_blocks_per_sm`] |
//! | attributes (registers, max threads, shared memory) | [`Function::attribute`], [`Function::set_attribute`] |
//! | launch with a [`LaunchConfig`] (grid, block, dynamic shared memory, cluster) | [`Function::launch_with`] (`unsafe`) |
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
//! // The issue checks the stream's device and holds the capture gate until it drops.
//! let issue = stream.issue(dev)?;
//! // SAFETY: `nothing` takes one u64 and touches no memory.
//! unsafe { kernel.launch(&issue, (1, 1, 1), (1, 1, 1), 0, &mut params)? };
//! drop(issue);
//! stream.synchronize()?;
//! # Ok::<(), cudars_core::Error>(())
//! ```

use std::ffi::{c_void, CString};
use std::sync::Arc;

use cudars_sys::{
    CUfunction, CUfunction_attribute, CUjit_option, CUlaunchAttribute, CUlaunchAttributeID,
    CUlaunchAttributeValue, CUlaunchConfig, CUmodule, CUresult,
};

use crate::driver::drv;
use crate::error::{Error, Result};
use crate::issue::Issue;
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
        // SAFETY: a NUL-terminated PTX string is a complete image for the driver.
        unsafe { Self::load_data(device, image.as_ptr() as *const c_void, "PTX") }
    }

    /// Loads a cubin (an ELF image for `device`'s architecture, as NVRTC, nvJitLink, `ptxas`
    /// or `nvcc -cubin` make it). The image is checked first (ELF magic, 64-bit, its header,
    /// section and program tables inside `image`): anything else is
    /// [`Error::InvalidArgument`], and the driver is not called. A cubin for another
    /// architecture is the driver's `CUDA_ERROR_NO_BINARY_FOR_GPU`, with the JIT log.
    ///
    /// # Safety
    ///
    /// `image` must be a cubin made by NVIDIA's tools (NVRTC, nvJitLink, `ptxas`, `nvcc`,
    /// `fatbinary`), unmodified, or come from a source the caller trusts as much. The driver's
    /// loader (`cuModuleLoadDataEx`, which is given no length) follows the section indices,
    /// string offsets, symbol indices, relocations and `.nv.info` records inside the image
    /// without checking them, and the check above covers only the tables' extents: crafted
    /// or corrupted bytes that pass it can make the loader read or write out of bounds, crash
    /// or hang the process (reproduced on driver 580 with a changed section-name index, a
    /// section name offset, a symbol's section index and a relocation offset). Images that
    /// `cudars-rtc` compiled itself (`Compiled::load`) are loaded safely.
    pub unsafe fn from_cubin(device: &Device, image: &[u8]) -> Result<Module> {
        check_elf(image)?;
        let aligned = aligned_copy(image);
        // SAFETY: a checked ELF image whose tables lie inside the 8-aligned copy, which
        // outlives the call; the caller vouches for everything inside it (see `# Safety`).
        unsafe { Self::load_data(device, aligned.as_ptr() as *const c_void, "cubin") }
    }

    /// Loads a fatbin (`nvcc -fatbin`, nvJitLink's linked output of several architectures):
    /// the driver picks the cubin for `device`, or JIT-compiles its PTX. Checked first (magic,
    /// and the size its header declares lies inside `image`): anything else is
    /// [`Error::InvalidArgument`], and the driver is not called.
    ///
    /// # Safety
    ///
    /// As for [`from_cubin`](Self::from_cubin): the image must come from NVIDIA's tools,
    /// unmodified, or a source trusted as much; the driver follows the offsets inside it, and
    /// inside the cubins it holds, without checking them.
    pub unsafe fn from_fatbin(device: &Device, image: &[u8]) -> Result<Module> {
        check_fatbin(image)?;
        let aligned = aligned_copy(image);
        // SAFETY: a checked fatbin whose declared size lies inside the 8-aligned copy, which
        // outlives the call; the caller vouches for everything inside it (see `# Safety`).
        unsafe { Self::load_data(device, aligned.as_ptr() as *const c_void, "fatbin") }
    }

    /// Loads any image by its first bytes ([`ImageKind::detect`]): a cubin, a fatbin, or PTX
    /// text (a trailing NUL is allowed). Anything else is [`Error::InvalidArgument`]. PTX
    /// alone needs no promise: [`from_ptx`](Self::from_ptx) is safe.
    ///
    /// # Safety
    ///
    /// A cubin or a fatbin must meet [`from_cubin`](Self::from_cubin)'s contract.
    pub unsafe fn from_image(device: &Device, image: &[u8]) -> Result<Module> {
        match ImageKind::detect(image) {
            // SAFETY: the caller's promise about cubins.
            Some(ImageKind::Cubin) => unsafe { Self::from_cubin(device, image) },
            // SAFETY: the caller's promise about fatbins.
            Some(ImageKind::Fatbin) => unsafe { Self::from_fatbin(device, image) },
            Some(ImageKind::Ptx) => {
                let text = image.strip_suffix(&[0]).unwrap_or(image);
                match std::str::from_utf8(text) {
                    Ok(ptx) => Self::from_ptx(device, ptx),
                    Err(_) => Err(Error::InvalidArgument(
                        "the image is neither a cubin, a fatbin nor PTX text".into(),
                    )),
                }
            }
            None => Err(Error::InvalidArgument(
                "the image is neither a cubin, a fatbin nor PTX text".into(),
            )),
        }
    }

    /// `cuModuleLoadDataEx` with an error log.
    ///
    /// # Safety
    ///
    /// `image` points to a complete image the driver can read whole (NUL-terminated PTX, or a
    /// cubin / fatbin whose declared sizes lie inside the allocation) that outlives the call.
    unsafe fn load_data(device: &Device, image: *const c_void, what: &str) -> Result<Module> {
        // Stamped before binding: a reset in between is refused (see `health`).
        let device = &device.stamped();
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
        // SAFETY: the device's context is current; the caller vouches for `image`; the option
        // arrays have matching lengths and the log buffer holds JIT_LOG_BYTES bytes.
        let loaded = unsafe {
            drv!(cuModuleLoadDataEx(
                &mut raw,
                image,
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
                    "{what} did not load: {e}; JIT log: {}",
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

    /// The kernel's parameters, in order: each one's offset in the parameter buffer and its
    /// size in bytes (`cuFuncGetParamInfo`). `Ok(None)` when the driver is older than CUDA
    /// 12.4 and cannot say; `Ok(Some(empty))` for a kernel without parameters.
    pub fn param_info(&self) -> Result<Option<Vec<ParamInfo>>> {
        let mut params = Vec::new();
        // The driver bounds a kernel's parameter buffer (32764 bytes since 12.1): no kernel has
        // more parameters than bytes.
        for index in 0..MAX_PARAMS {
            let (mut offset, mut size) = (0usize, 0usize);
            // SAFETY: a live function handle (its module is held) and valid out-pointers; an
            // index past the last parameter is the driver's CUDA_ERROR_INVALID_VALUE.
            match unsafe {
                drv!(func_get_param_info as "cuFuncGetParamInfo" (self.raw, index, &mut offset, &mut size))
            } {
                Ok(()) => params.push(ParamInfo { offset, size }),
                Err(Error::Driver(e))
                    if e.result() == CUresult::CUDA_ERROR_INVALID_VALUE && index > 0 =>
                {
                    return Ok(Some(params))
                }
                Err(Error::Driver(e)) if e.result() == CUresult::CUDA_ERROR_INVALID_VALUE => {
                    // Index 0 refused: no parameters at all.
                    return Ok(Some(params));
                }
                Err(Error::DriverTooOld { .. } | Error::MissingSymbol(_)) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        Ok(Some(params))
    }

    /// A function attribute (`cuFuncGetAttribute`): registers per thread, the most threads a
    /// block may have, static shared memory, ...
    pub fn attribute(&self, attribute: CUfunction_attribute) -> Result<i32> {
        let mut value = 0;
        let _ctx = self.module.device.bind()?;
        // SAFETY: a live function handle, a valid out-pointer, its context current.
        unsafe { drv!(cuFuncGetAttribute(&mut value, attribute, self.raw)) }?;
        Ok(value)
    }

    /// Sets a function attribute (`cuFuncSetAttribute`), e.g.
    /// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` before a launch with more than 48 KiB
    /// of dynamic shared memory.
    pub fn set_attribute(&self, attribute: CUfunction_attribute, value: i32) -> Result<()> {
        let _ctx = self.module.device.bind()?;
        // SAFETY: a live function handle, its context current; the driver validates the value.
        unsafe { drv!(cuFuncSetAttribute(self.raw, attribute, value)) }
    }

    /// The block size that gives the most resident threads per SM for this kernel with
    /// `dynamic_shared_bytes` of dynamic shared memory per block, and the smallest grid that
    /// fills the device at that size: `(min_grid, block)`
    /// (`cuOccupancyMaxPotentialBlockSize`). `block_size_limit` caps the block (0: none).
    pub fn max_potential_block_size(
        &self,
        dynamic_shared_bytes: usize,
        block_size_limit: u32,
    ) -> Result<(u32, u32)> {
        let (mut min_grid, mut block) = (0i32, 0i32);
        let limit = i32::try_from(block_size_limit).unwrap_or(i32::MAX);
        let _ctx = self.module.device.bind()?;
        // SAFETY: a live function handle, valid out-pointers, no size callback, its context
        // current.
        unsafe {
            drv!(cuOccupancyMaxPotentialBlockSize(
                &mut min_grid,
                &mut block,
                self.raw,
                None,
                dynamic_shared_bytes,
                limit,
            ))
        }?;
        Ok((min_grid.max(0) as u32, block.max(0) as u32))
    }

    /// How many blocks of `block` threads with `dynamic_shared_bytes` each can be resident on
    /// one SM at once (`cuOccupancyMaxActiveBlocksPerMultiprocessor`).
    pub fn max_active_blocks_per_sm(&self, block: u32, dynamic_shared_bytes: usize) -> Result<u32> {
        let mut blocks = 0i32;
        let block = i32::try_from(block)
            .map_err(|_| Error::InvalidArgument(format!("block size {block} is too large")))?;
        let _ctx = self.module.device.bind()?;
        // SAFETY: a live function handle, a valid out-pointer, its context current.
        unsafe {
            drv!(cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut blocks,
                self.raw,
                block,
                dynamic_shared_bytes,
            ))
        }?;
        Ok(blocks.max(0) as u32)
    }

    /// Queues the kernel on `stream` as `config` says: `cuLaunchKernel`, or `cuLaunchKernelEx`
    /// with the cluster dimension attribute when [`LaunchConfig::cluster`] is set (compute
    /// capability 9.0 and up; the grid must be a multiple of the cluster).
    ///
    /// A zero dimension is [`Error::InvalidArgument`] and a stream of another device is
    /// [`Error::WrongDevice`], both before the driver is called.
    ///
    /// # Safety
    ///
    /// As [`launch`](Self::launch): `params` holds one pointer per kernel parameter, each to a
    /// live value of exactly that parameter's type and size; every pointer the kernel
    /// dereferences is valid for its accesses until the kernel finishes, and nothing else
    /// accesses that memory in a conflicting way meanwhile; the kernel itself is free of
    /// undefined behaviour for these arguments.
    #[inline]
    pub unsafe fn launch_with(
        &self,
        issue: &Issue<'_>,
        config: &LaunchConfig,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let Some(cluster) = config.cluster else {
            // SAFETY: the caller's contract is `launch`'s.
            return unsafe {
                self.launch(
                    issue,
                    config.grid,
                    config.block,
                    config.shared_mem_bytes,
                    params,
                )
            };
        };
        self.check_launch(issue, config.grid, config.block)?;
        let (g, c) = (config.grid, cluster);
        if c.0 == 0 || c.1 == 0 || c.2 == 0 || g.0 % c.0 != 0 || g.1 % c.1 != 0 || g.2 % c.2 != 0 {
            return Err(Error::InvalidArgument(format!(
                "launch of {}: the grid {g:?} must be a whole number of clusters {c:?}",
                self.name
            )));
        }
        let mut value = CUlaunchAttributeValue { pad: [0; 64] };
        value.clusterDim.x = c.0;
        value.clusterDim.y = c.1;
        value.clusterDim.z = c.2;
        let mut attrs = [CUlaunchAttribute {
            id: CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
            pad: [0; 4],
            value,
        }];
        let raw_config = CUlaunchConfig {
            gridDimX: g.0,
            gridDimY: g.1,
            gridDimZ: g.2,
            blockDimX: config.block.0,
            blockDimY: config.block.1,
            blockDimZ: config.block.2,
            sharedMemBytes: config.shared_mem_bytes,
            hStream: issue.raw(),
            attrs: attrs.as_mut_ptr(),
            numAttrs: attrs.len() as u32,
        };
        let kernel_params = if params.is_empty() {
            std::ptr::null_mut()
        } else {
            params.as_mut_ptr()
        };
        crate::stream::launch_in_context(self.module.device, issue.stream(), || {
            // SAFETY: the module's context is current (or the driver refuses the launch and
            // it is retried with it current: `launch_in_context`), and the stream belongs to
            // its device; the config and its one attribute live for the call; the caller
            // upholds the parameter and memory contract above.
            unsafe {
                drv!(cuLaunchKernelEx(
                    &raw_config,
                    self.raw,
                    kernel_params,
                    std::ptr::null_mut(),
                ))
            }
        })
    }

    /// The checks every launch makes before the driver is called.
    #[inline]
    fn check_launch(
        &self,
        issue: &Issue<'_>,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
    ) -> Result<()> {
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 || block.0 == 0 || block.1 == 0 || block.2 == 0
        {
            return Err(Error::InvalidArgument(format!(
                "launch of {}: grid {grid:?} and block {block:?} must have no zero dimension",
                self.name
            )));
        }
        issue.expect_device("stream", self.module.device)
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
        issue: &Issue<'_>,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared_bytes: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        self.check_launch(issue, grid, block)?;
        let kernel_params = if params.is_empty() {
            std::ptr::null_mut()
        } else {
            params.as_mut_ptr()
        };
        crate::stream::launch_in_context(self.module.device, issue.stream(), || {
            // SAFETY: the module's context is current (or the driver refuses the launch and
            // it is retried with it current: `launch_in_context`), and the stream belongs to
            // its device; the caller upholds the parameter and memory contract above.
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
                    issue.raw(),
                    kernel_params,
                    std::ptr::null_mut(),
                ))
            }
        })
    }
}

/// Most parameters [`Function::param_info`] asks about.
const MAX_PARAMS: usize = 32 * 1024;

/// One kernel parameter as the driver lays it out: where it starts in the parameter buffer and
/// how many bytes it takes ([`Function::param_info`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ParamInfo {
    /// Offset in the kernel's parameter buffer, in bytes.
    pub offset: usize,
    /// Size in bytes.
    pub size: usize,
}

/// How a kernel is launched: grid and block dimensions, dynamic shared memory per block, and
/// optionally thread-block cluster dimensions (compute capability 9.0+).
///
/// ```
/// use cudars_core::module::LaunchConfig;
/// let cfg = LaunchConfig::for_elements(1_000_000, 256).shared_mem(1024);
/// assert_eq!(cfg.grid, (3907, 1, 1));
/// assert_eq!(cfg.block, (256, 1, 1));
/// let clustered = LaunchConfig::new((8, 1, 1), (128, 1, 1)).cluster((2, 1, 1));
/// assert_eq!(clustered.cluster, Some((2, 1, 1)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LaunchConfig {
    /// Blocks in the grid, per dimension.
    pub grid: (u32, u32, u32),
    /// Threads per block, per dimension.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem_bytes: u32,
    /// Blocks per cluster, per dimension (`None`: no clusters).
    pub cluster: Option<(u32, u32, u32)>,
}

impl LaunchConfig {
    /// `grid` blocks of `block` threads, no dynamic shared memory, no clusters.
    pub fn new(grid: (u32, u32, u32), block: (u32, u32, u32)) -> LaunchConfig {
        LaunchConfig {
            grid,
            block,
            shared_mem_bytes: 0,
            cluster: None,
        }
    }

    /// A one-dimensional launch of `block` threads per block and enough blocks for one
    /// thread per element of `n` (at least one block; at most `u32::MAX` blocks, so a kernel
    /// over more elements needs a grid-stride loop).
    pub fn for_elements(n: u64, block: u32) -> LaunchConfig {
        let block = block.max(1);
        let blocks = n.div_ceil(u64::from(block)).clamp(1, u64::from(u32::MAX)) as u32;
        LaunchConfig::new((blocks, 1, 1), (block, 1, 1))
    }

    /// The same launch with `bytes` of dynamic shared memory per block.
    pub fn shared_mem(mut self, bytes: u32) -> LaunchConfig {
        self.shared_mem_bytes = bytes;
        self
    }

    /// The same launch in clusters of `dims` blocks.
    pub fn cluster(mut self, dims: (u32, u32, u32)) -> LaunchConfig {
        self.cluster = Some(dims);
        self
    }
}

/// What kind of image a byte string is, by its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageKind {
    /// An ELF cubin (`\x7fELF`).
    Cubin,
    /// A fatbin (magic `0xBA55ED50`).
    Fatbin,
    /// Anything else that is not empty: taken for PTX text.
    Ptx,
}

/// The fatbin magic, little-endian at offset 0.
const FATBIN_MAGIC: u32 = 0xBA55_ED50;

impl ImageKind {
    /// Checks `image` as [`Module::from_image`] does before the driver reads it: a cubin's
    /// ELF tables and sections, and a fatbin's declared size, must lie inside the bytes; PTX
    /// is any other non-empty text. Returns the kind, or [`Error::InvalidArgument`].
    ///
    /// Passing finds truncated and mislabelled images; it does not make bytes safe to load
    /// (see [`Module::from_cubin`]'s `# Safety`).
    pub fn check(image: &[u8]) -> Result<ImageKind> {
        match ImageKind::detect(image) {
            Some(ImageKind::Cubin) => check_elf(image).map(|()| ImageKind::Cubin),
            Some(ImageKind::Fatbin) => check_fatbin(image).map(|()| ImageKind::Fatbin),
            Some(ImageKind::Ptx)
                if std::str::from_utf8(image.strip_suffix(&[0]).unwrap_or(image)).is_ok() =>
            {
                Ok(ImageKind::Ptx)
            }
            _ => Err(Error::InvalidArgument(
                "the image is neither a cubin, a fatbin nor PTX text".into(),
            )),
        }
    }

    /// The kind of `image`, or `None` when it is empty.
    pub fn detect(image: &[u8]) -> Option<ImageKind> {
        if image.starts_with(b"\x7fELF") {
            Some(ImageKind::Cubin)
        } else if image.len() >= 4 && read_u32(image, 0) == Some(FATBIN_MAGIC) {
            Some(ImageKind::Fatbin)
        } else if image.is_empty() {
            None
        } else {
            Some(ImageKind::Ptx)
        }
    }
}

fn read_u16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn read_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn read_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// `true` when `count` entries of `size` bytes from `offset` lie inside `len` bytes.
fn table_fits(offset: u64, count: u64, size: u64, len: usize) -> bool {
    count
        .checked_mul(size)
        .and_then(|bytes| bytes.checked_add(offset))
        .is_some_and(|end| end <= len as u64)
}

/// A 64-bit little-endian ELF whose header, program headers, section headers and section
/// contents lie inside `image`: what the driver reads of a cubin.
fn check_elf(image: &[u8]) -> Result<()> {
    let bad = |why: &str| {
        Err(Error::InvalidArgument(format!(
            "not a loadable cubin: {why}"
        )))
    };
    if !image.starts_with(b"\x7fELF") {
        return bad("no ELF magic");
    }
    if image.len() < 64 {
        return bad("shorter than an ELF header");
    }
    if image[4] != 2 || image[5] != 1 {
        return bad("not a 64-bit little-endian ELF");
    }
    let field = |v: Option<u64>| v.unwrap_or(u64::MAX);
    let phoff = field(read_u64(image, 0x20));
    let shoff = field(read_u64(image, 0x28));
    let phentsize = u64::from(read_u16(image, 0x36).unwrap_or(u16::MAX));
    let phnum = u64::from(read_u16(image, 0x38).unwrap_or(u16::MAX));
    let shentsize = u64::from(read_u16(image, 0x3A).unwrap_or(u16::MAX));
    let shnum = u64::from(read_u16(image, 0x3C).unwrap_or(u16::MAX));
    if phnum > 0 && !table_fits(phoff, phnum, phentsize, image.len()) {
        return bad("its program headers reach past the end (truncated?)");
    }
    if shnum > 0 {
        if shentsize < 64 || !table_fits(shoff, shnum, shentsize, image.len()) {
            return bad("its section headers reach past the end (truncated?)");
        }
        for i in 0..shnum {
            let at = (shoff + i * shentsize) as usize;
            let kind = read_u32(image, at + 4).unwrap_or(0);
            let offset = field(read_u64(image, at + 0x18));
            let size = field(read_u64(image, at + 0x20));
            // SHT_NOBITS (8) takes no bytes of the file.
            if kind != 8 && size > 0 && !table_fits(offset, 1, size, image.len()) {
                return bad("a section reaches past the end (truncated?)");
            }
        }
    }
    Ok(())
}

/// A fatbin whose header's declared size lies inside `image`.
fn check_fatbin(image: &[u8]) -> Result<()> {
    let bad = |why: &str| {
        Err(Error::InvalidArgument(format!(
            "not a loadable fatbin: {why}"
        )))
    };
    if read_u32(image, 0) != Some(FATBIN_MAGIC) {
        return bad("no fatbin magic");
    }
    let (Some(header), Some(body)) = (read_u16(image, 6), read_u64(image, 8)) else {
        return bad("shorter than a fatbin header");
    };
    if header < 16 || !table_fits(u64::from(header), 1, body, image.len()) {
        return bad("its declared size reaches past the end (truncated?)");
    }
    Ok(())
}

/// `image` copied into 8-byte aligned memory (the driver reads ELF and fatbin headers as
/// aligned structures).
fn aligned_copy(image: &[u8]) -> Vec<u64> {
    let mut words = vec![0u64; image.len().div_ceil(8)];
    bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..image.len()].copy_from_slice(image);
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal 64-bit ELF: the header, then `sections` section headers at offset 64, the
    /// first of them (if any) covering `section_len` bytes from offset 0.
    fn elf(sections: u16, section_len: u64) -> Vec<u8> {
        let mut b = vec![0u8; 64 + usize::from(sections) * 64];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2;
        b[5] = 1;
        b[0x28..0x30].copy_from_slice(&64u64.to_le_bytes());
        b[0x3A..0x3C].copy_from_slice(&64u16.to_le_bytes());
        b[0x3C..0x3E].copy_from_slice(&sections.to_le_bytes());
        if sections > 0 {
            b[64 + 4..64 + 8].copy_from_slice(&1u32.to_le_bytes());
            b[64 + 0x20..64 + 0x28].copy_from_slice(&section_len.to_le_bytes());
        }
        b
    }

    #[test]
    fn images_are_recognised_by_their_first_bytes() {
        assert_eq!(ImageKind::detect(&elf(0, 0)), Some(ImageKind::Cubin));
        let mut fat = vec![0u8; 16];
        fat[..4].copy_from_slice(&FATBIN_MAGIC.to_le_bytes());
        assert_eq!(ImageKind::detect(&fat), Some(ImageKind::Fatbin));
        assert_eq!(ImageKind::detect(b".version 8.0"), Some(ImageKind::Ptx));
        assert_eq!(ImageKind::detect(b""), None);
    }

    #[test]
    fn truncated_or_malformed_cubins_are_refused_before_the_driver() {
        assert!(check_elf(&elf(2, 100)).is_ok());
        let whole = elf(2, 100);
        // Cut inside the section table, and a section reaching past the end.
        assert!(check_elf(&whole[..100]).is_err());
        assert!(check_elf(&elf(2, 10_000)).is_err());
        assert!(check_elf(&whole[..40]).is_err());
        let mut be = elf(0, 0);
        be[5] = 2;
        assert!(check_elf(&be).is_err());
        assert!(
            check_elf(b"not an elf at all, but long enough to have a header.............").is_err()
        );
    }

    #[test]
    fn fatbins_must_hold_their_declared_size() {
        let mut fat = vec![0u8; 48];
        fat[..4].copy_from_slice(&FATBIN_MAGIC.to_le_bytes());
        fat[6..8].copy_from_slice(&16u16.to_le_bytes());
        fat[8..16].copy_from_slice(&32u64.to_le_bytes());
        assert!(check_fatbin(&fat).is_ok());
        assert!(check_fatbin(&fat[..47]).is_err());
        fat[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(check_fatbin(&fat).is_err());
        assert!(check_fatbin(&fat[..10]).is_err());
    }

    #[test]
    fn aligned_copies_keep_every_byte() {
        let bytes: Vec<u8> = (0..13).collect();
        let words = aligned_copy(&bytes);
        assert_eq!(&bytemuck::cast_slice::<u64, u8>(&words)[..13], &bytes[..]);
    }

    #[test]
    fn launch_configs_cover_every_element() {
        assert_eq!(LaunchConfig::for_elements(0, 256).grid, (1, 1, 1));
        assert_eq!(LaunchConfig::for_elements(256, 256).grid, (1, 1, 1));
        assert_eq!(LaunchConfig::for_elements(257, 256).grid, (2, 1, 1));
        assert_eq!(LaunchConfig::for_elements(10, 0).block, (1, 1, 1));
        assert_eq!(
            LaunchConfig::for_elements(u64::MAX, 1).grid,
            (u32::MAX, 1, 1)
        );
    }
}

//! The tests' and benchmarks' kernels as CUDA C++ compiled at run time by NVRTC
//! (`cuda-rtc`): the same seven entry points, parameters, launch geometry and checks as
//! `cuda-core`'s hand-written PTX ([`cudars_core::kernels`]), so a test switches between the
//! two by its `use` line.
//!
//! | name | parameters | what it does |
//! | --- | --- | --- |
//! | `fill_u32` | `u32* ptr, u32 value, u64 n` | `ptr[i] = value` for `i < n` (grid-stride loop) |
//! | `add_u32` | `u32* ptr, u32 value, u64 n` | `ptr[i] += value` for `i < n` |
//! | `copy_u32` | `u32* dst, const u32* src, u64 n` | `dst[i] = src[i]` for `i < n` |
//! | `checksum_u32` | `const u32* src, u64 n, u64* out` | `*out +=` the wrapping sum of `src[i]` as `u64` ([`checksum_host`]) |
//! | `spin` | `u64 cycles` | each thread busy-waits until `clock64()` advanced by `cycles` |
//! | `spin_then_fill` | `u32* ptr, u32 value, u64 n, u64 cycles` | each thread spins, then fills |
//! | `wait_flag` | `u32* flag, u64 max_cycles` | spins until `*flag != 0` (volatile loads) or `max_cycles` passed |
//!
//! [`Kernels::load`] compiles [`SOURCE`] for the device's architecture to a cubin through
//! [`Cache::global`](cudars_rtc::Cache::global) (NVRTC once per process and architecture;
//! later processes read the disk cache) and loads it. Every launch goes through
//! [`cudars_rtc::Kernel::launch`], which checks the arguments against the parameters the
//! driver reports; [`Kernels::load`] checks every entry point's parameters against the
//! arguments its launcher passes first, so a mismatch fails the load, not a launch.
//!
//! The safe launchers take [`DevicePtr`] views and check what `cuda-core`'s do, in the same
//! order and with the same errors: whole aligned `u32`s ([`Error::InvalidArgument`]), the
//! module's device ([`Error::WrongDevice`]), equal lengths for `copy`
//! ([`Error::SizeMismatch`]), no overlap between a view read and a view written (`copy`,
//! `checksum`: [`Error::InvalidArgument`]), the stream's device. The views go to the kernel
//! as `cuda-rtc` arguments, which mark them as used by the stream
//! ([`DevicePtr::record_stream`]: hand-over ordering, pool reuse, graphs keeping them alive
//! under capture) under `cuda-core`'s issue guard. The `*_raw` launchers take bare addresses
//! and are `unsafe`, with `cuda-core`'s contracts.
//!
//! NVRTC must load (`$CUDA_NVRTC_LIBRARY`, or a library on the loader's path; the bundle's
//! `run.sh` takes pip's): without it [`Kernels::load`] returns the loader's error. The
//! hand-written PTX stays `cuda-core`'s, and the tests about it use it
//! (`tests/tests/gpu_soundness_core.rs`, and in `tests/tests/gpu_stream_event.rs` the tests
//! of `cudars_core::kernels` and of loading a PTX module).

use std::time::Duration;

use cudars_core::module::{LaunchConfig, ParamInfo};
use cudars_core::sys::{CUdevice_attribute, CUdeviceptr};
use cudars_core::{Device, DevicePtr, Error, Module, Result, Stream};
use cudars_rtc::{Kernel, KernelArgs, KernelModule, Program};

/// What `checksum_u32` computes, on the host (`cuda-core`'s definition).
pub use cudars_core::kernels::checksum_host;
/// The entry points' names: `cuda-core`'s, which [`SOURCE`] defines under the same names.
pub use cudars_core::kernels::{
    ADD_U32, CHECKSUM_U32, COPY_U32, ENTRY_POINTS, FILL_U32, SPIN, SPIN_THEN_FILL, WAIT_FLAG,
};

/// The program's name (in NVRTC's messages and the cache key).
pub const PROGRAM_NAME: &str = "test_kernels.cu";

/// CUDA C++ of the kernels (see the [module documentation](self)): `cuda-core`'s PTX
/// kernels, kernel for kernel (NVRTC's PTX of them is the hand-written PTX, reordered).
pub const SOURCE: &str = r#"
typedef unsigned int u32;
typedef unsigned long long u64;

// This thread's first element and the grid's stride, as 64-bit numbers.
__device__ __forceinline__ u64 first_index() {
    return (u64)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ u64 grid_stride() {
    return (u64)gridDim.x * blockDim.x;
}

// Busy-waits until the SM clock has advanced by `cycles` since the call.
__device__ __forceinline__ void spin_for(u64 cycles) {
    u64 start = (u64)clock64();
    while ((u64)clock64() - start < cycles) {
    }
}

extern "C" __global__ void spin(u64 cycles) {
    spin_for(cycles);
}

extern "C" __global__ void fill_u32(u32* ptr, u32 value, u64 n) {
    for (u64 i = first_index(); i < n; i += grid_stride()) ptr[i] = value;
}

extern "C" __global__ void add_u32(u32* ptr, u32 value, u64 n) {
    for (u64 i = first_index(); i < n; i += grid_stride()) ptr[i] += value;
}

extern "C" __global__ void copy_u32(u32* dst, const u32* src, u64 n) {
    for (u64 i = first_index(); i < n; i += grid_stride()) dst[i] = src[i];
}

// *out += the wrapping sum of src[..n] as u64: each thread sums its grid-stride share, then
// adds it with one atomic.
extern "C" __global__ void checksum_u32(const u32* src, u64 n, u64* out) {
    u64 sum = 0;
    for (u64 i = first_index(); i < n; i += grid_stride()) sum += src[i];
    atomicAdd(out, sum);
}

// Each thread spins for `cycles`, then fills: the slow writer of ordering tests.
extern "C" __global__ void spin_then_fill(u32* ptr, u32 value, u64 n, u64 cycles) {
    spin_for(cycles);
    for (u64 i = first_index(); i < n; i += grid_stride()) ptr[i] = value;
}

// Spins until *flag != 0 (volatile loads: a host write to mapped pinned memory ends it) or
// `max_cycles` clocks passed.
extern "C" __global__ void wait_flag(const u32* flag, u64 max_cycles) {
    const volatile u32* f = flag;
    u64 start = (u64)clock64();
    while (*f == 0 && (u64)clock64() - start < max_cycles) {
    }
}
"#;

/// Threads per block of the element-wise kernels (`cuda-core`'s).
pub use cudars_core::kernels::BLOCK;

/// [`SOURCE`] as a program (NVRTC's default options, a cubin, the global cache), before its
/// architecture is set.
pub fn program() -> Program<'static> {
    Program::new(SOURCE).name(PROGRAM_NAME)
}

/// The arguments each entry point's launchers pass (device addresses as `u64`, as the
/// views pass themselves), for [`check_signatures`].
type SpinArgs = (u64,);
type PtrValueNArgs = (u64, u32, u64);
type CopyArgs = (u64, u64, u64);
type ChecksumArgs = (u64, u64, u64);
type SpinThenFillArgs = (u64, u32, u64, u64);
type WaitFlagArgs = (u64, u64);

/// Checks every entry point's parameters, as `params` reports them, against the arguments
/// the launchers of [`Kernels`] pass: [`cudars_rtc::Error::ArgCount`] or
/// [`cudars_rtc::Error::ArgSize`] on a mismatch, or `params`' error.
pub fn check_signatures(
    params: &dyn Fn(&str) -> cudars_rtc::Result<Vec<ParamInfo>>,
) -> cudars_rtc::Result<()> {
    SpinArgs::check(SPIN, &params(SPIN)?)?;
    PtrValueNArgs::check(FILL_U32, &params(FILL_U32)?)?;
    PtrValueNArgs::check(ADD_U32, &params(ADD_U32)?)?;
    CopyArgs::check(COPY_U32, &params(COPY_U32)?)?;
    ChecksumArgs::check(CHECKSUM_U32, &params(CHECKSUM_U32)?)?;
    SpinThenFillArgs::check(SPIN_THEN_FILL, &params(SPIN_THEN_FILL)?)?;
    WaitFlagArgs::check(WAIT_FLAG, &params(WAIT_FLAG)?)?;
    Ok(())
}

/// [`SOURCE`] compiled and loaded on one device, with a launcher for each kernel: the
/// methods of [`cudars_core::kernels::Kernels`], same names, same semantics.
///
/// `Send` and `Sync`; cloning shares the module.
#[derive(Debug, Clone)]
pub struct Kernels {
    module: KernelModule,
    spin: Kernel,
    fill: Kernel,
    add: Kernel,
    copy: Kernel,
    checksum: Kernel,
    spin_then_fill: Kernel,
    wait_flag: Kernel,
    sm_count: u32,
    clock_khz: u32,
}

// The checks are cuda-core's own (`cudars_core::kernels::checks`): same errors, same order.
#[cfg(test)]
use cudars_core::kernels::checks::ranges_overlap;
use cudars_core::kernels::checks::{disjoint, grid, same_device, u32_words as words};

/// A one-dimensional launch of [`BLOCK`]-thread blocks for `n` elements, at most `cap`.
fn config_1d(n: u64, cap: u32) -> LaunchConfig {
    LaunchConfig::new((grid(n, cap), 1, 1), (BLOCK, 1, 1))
}

/// One block of one thread.
fn one_thread() -> LaunchConfig {
    LaunchConfig::new((1, 1, 1), (1, 1, 1))
}

/// A launch checked against the kernel's parameters where the driver reports them
/// (`cuFuncGetParamInfo`, CUDA 12.4+), unchecked before.
trait LaunchKnown {
    /// # Safety
    ///
    /// `cudars_rtc::Kernel::launch`'s contract; on a driver without parameter info, also
    /// `launch_unchecked`'s (the launchers of this module pass each kernel's declared
    /// parameters).
    unsafe fn launch_known<A: KernelArgs>(
        &self,
        stream: &Stream,
        config: &LaunchConfig,
        args: A,
    ) -> cudars_rtc::Result<()>;
}

impl LaunchKnown for Kernel {
    unsafe fn launch_known<A: KernelArgs>(
        &self,
        stream: &Stream,
        config: &LaunchConfig,
        args: A,
    ) -> cudars_rtc::Result<()> {
        if self.params().is_some() {
            // SAFETY: the caller's contract, which is `launch`'s.
            unsafe { self.launch(stream, config, args) }
        } else {
            // SAFETY: the caller's contract; the arguments are the declared parameters.
            unsafe { self.launch_unchecked(stream, config, args) }
        }
    }
}

impl Kernels {
    /// Compiles [`SOURCE`] for `device` (or finds it in the cache), loads it, and checks every
    /// kernel's parameters, as the driver reports them, against its launcher's arguments.
    /// Fails with the loader's error without NVRTC. A driver older than CUDA 12.4 cannot
    /// report parameters: then nothing is checked here and the launches go unchecked (the
    /// source's parameter layouts equal `cuda-core`'s PTX ones: a CPU test compares them).
    pub fn load(device: &Device) -> Result<Kernels> {
        let module = program().device(device)?.compile()?.load(device)?;
        let kernel = |name: &str| -> Result<Kernel> { Ok(module.kernel(name)?) };
        let kernels = Kernels {
            spin: kernel(SPIN)?,
            fill: kernel(FILL_U32)?,
            add: kernel(ADD_U32)?,
            copy: kernel(COPY_U32)?,
            checksum: kernel(CHECKSUM_U32)?,
            spin_then_fill: kernel(SPIN_THEN_FILL)?,
            wait_flag: kernel(WAIT_FLAG)?,
            module: module.clone(),
            sm_count: device
                .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
                .max(1) as u32,
            clock_khz: device
                .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)?
                .max(1) as u32,
        };
        // A driver without parameter info (before CUDA 12.4) reports none: nothing to check.
        let known = ENTRY_POINTS
            .iter()
            .all(|n| kernels.by_name(n).is_some_and(|k| k.params().is_some()));
        if known {
            check_signatures(&|name| {
                let kernel = kernels.by_name(name).ok_or_else(|| {
                    cudars_rtc::Error::InvalidArgument(format!("{name} is not an entry point"))
                })?;
                kernel.params().map(<[ParamInfo]>::to_vec).ok_or_else(|| {
                    cudars_rtc::Error::SignatureUnknown {
                        kernel: name.to_string(),
                    }
                })
            })?;
        }
        Ok(kernels)
    }

    /// The kernel of entry point `name`.
    fn by_name(&self, name: &str) -> Option<&Kernel> {
        Some(match name {
            SPIN => &self.spin,
            FILL_U32 => &self.fill,
            ADD_U32 => &self.add,
            COPY_U32 => &self.copy,
            CHECKSUM_U32 => &self.checksum,
            SPIN_THEN_FILL => &self.spin_then_fill,
            WAIT_FLAG => &self.wait_flag,
            _ => return None,
        })
    }

    /// The `cuda-rtc` kernel of entry point `name` (one of [`ENTRY_POINTS`]), for launches
    /// of your own.
    pub fn kernel(&self, name: &str) -> Option<&Kernel> {
        self.by_name(name)
    }

    /// The loaded `cuda-core` module (as `cudars_core::kernels::Kernels::module`).
    pub fn module(&self) -> &Module {
        self.module.module()
    }

    /// The loaded `cuda-rtc` module.
    pub fn rtc_module(&self) -> &KernelModule {
        &self.module
    }

    /// The device the module is loaded on.
    pub fn device(&self) -> Device {
        self.module.device()
    }

    /// SM clocks in `duration` at the device's peak clock (`CU_DEVICE_ATTRIBUTE_CLOCK_RATE`):
    /// the `cycles` argument of [`spin`](Self::spin) for about that long. A running device
    /// may clock lower, so the kernel then takes longer, never shorter.
    pub fn cycles_for(&self, duration: Duration) -> u64 {
        let cycles = duration
            .as_micros()
            .saturating_mul(u128::from(self.clock_khz))
            / 1000;
        u64::try_from(cycles).unwrap_or(u64::MAX)
    }

    /// Queues `spin(cycles)` on `stream` as one thread: the kernel takes about `cycles` SM
    /// clocks and touches no memory.
    pub fn spin(&self, stream: &Stream, cycles: u64) -> Result<()> {
        // SAFETY: `spin` takes one u64 (checked) and touches no memory.
        unsafe { self.spin.launch_known(stream, &one_thread(), (cycles,)) }?;
        Ok(())
    }

    /// Queues `fill_u32` over every element of `view` on `stream`. The view must be a whole
    /// number of aligned `u32`s ([`Error::InvalidArgument`]) of the module's device
    /// ([`Error::WrongDevice`]). Nothing is launched for an empty view (it is still marked
    /// as used by the stream, as `cuda-core` does).
    pub fn fill(&self, stream: &Stream, view: &DevicePtr, value: u32) -> Result<()> {
        let n = words(view, "fill")?;
        same_device(view, self.device(), "view")?;
        let issue = stream.issue(self.device())?;
        if n == 0 {
            return view.record_stream(&issue);
        }
        // SAFETY: `fill_u32` writes `ptr[i]` for `i < n` only, each element from one thread;
        // the view holds `n` aligned u32s of the module's device, and the launch marks it as
        // used by `stream` (ordered after its earlier owners, not freed or reused before the
        // kernel is done).
        unsafe {
            self.fill
                .launch_known(stream, &self.elementwise(n), (view, value, n))
        }?;
        Ok(())
    }

    /// Queues `add_u32` over every element of `view` on `stream`; checks as
    /// [`fill`](Self::fill).
    pub fn add(&self, stream: &Stream, view: &DevicePtr, value: u32) -> Result<()> {
        let n = words(view, "add")?;
        same_device(view, self.device(), "view")?;
        let issue = stream.issue(self.device())?;
        if n == 0 {
            return view.record_stream(&issue);
        }
        // SAFETY: as in `fill`: `add_u32` reads and writes `ptr[i]` for `i < n` only, each
        // element from one thread.
        unsafe {
            self.add
                .launch_known(stream, &self.elementwise(n), (view, value, n))
        }?;
        Ok(())
    }

    /// Queues `copy_u32` from `src` into `dst` on `stream`. Both must be whole numbers of
    /// aligned `u32`s of the module's device, of the same length ([`Error::SizeMismatch`]),
    /// and must not overlap ([`Error::InvalidArgument`], as `cuda-core`: the kernel's
    /// threads would read elements that others have already overwritten).
    pub fn copy(&self, stream: &Stream, dst: &DevicePtr, src: &DevicePtr) -> Result<()> {
        let n = words(dst, "copy")?;
        words(src, "copy")?;
        if dst.len() != src.len() {
            return Err(Error::SizeMismatch {
                op: "copy",
                dst: dst.len(),
                src: src.len(),
            });
        }
        same_device(dst, self.device(), "destination")?;
        same_device(src, self.device(), "source")?;
        disjoint("copy", "destination", dst, "source", src)?;
        let issue = stream.issue(self.device())?;
        if n == 0 {
            dst.record_stream(&issue)?;
            return src.record_stream(&issue);
        }
        // SAFETY: `copy_u32` reads `src[i]` and writes `dst[i]` for `i < n` only, each element
        // from one thread; both views hold `n` aligned u32s of the module's device and do not
        // overlap (checked above); the launch marks both as used by `stream`.
        unsafe {
            self.copy
                .launch_known(stream, &self.elementwise(n), (dst, src, n))
        }?;
        Ok(())
    }

    /// Queues zeroing `out` and then `checksum_u32` over `src` on `stream`: once the stream
    /// reaches this point, the first 8 bytes of `out` hold [`checksum_host`] of `src`'s
    /// elements. `out` must be at least 8 bytes, 8-aligned; `src` a whole number of aligned
    /// `u32`s; both of the module's device; and those 8 bytes of `out` must not overlap `src`
    /// ([`Error::InvalidArgument`]: the kernel would sum elements it is adding into).
    pub fn checksum(&self, stream: &Stream, src: &DevicePtr, out: &DevicePtr) -> Result<()> {
        let n = words(src, "checksum")?;
        if out.len() < 8 || !out.as_raw().is_multiple_of(8) {
            return Err(Error::InvalidArgument(format!(
                "checksum: the output at {:#x} of {} bytes must be at least 8 bytes, 8-aligned",
                out.as_raw(),
                out.len()
            )));
        }
        same_device(src, self.device(), "source")?;
        same_device(out, self.device(), "output")?;
        let out8 = out.slice(..8)?;
        disjoint("checksum", "output", &out8, "source", src)?;
        let issue = stream.issue(self.device())?;
        src.record_stream(&issue)?;
        out8.memset_async(0, stream)?;
        // SAFETY: `checksum_u32` reads `src[i]` for `i < n` and adds atomically to the one
        // 8-aligned u64 at `out8`; `src` holds `n` aligned u32s, neither overlaps the other
        // (checked above), both are of the module's device, and the launch marks both as used
        // by `stream`.
        unsafe {
            self.checksum
                .launch_known(stream, &self.elementwise(n.max(1)), (src, n, &out8))
        }?;
        Ok(())
    }

    /// Queues `spin_then_fill` over every element of `view` on `stream`: about `cycles` SM
    /// clocks of nothing, then the fill (one block per SM at most, so every block is
    /// resident at once). Checks as [`fill`](Self::fill); an empty view still spins.
    pub fn fill_after_spin(
        &self,
        stream: &Stream,
        view: &DevicePtr,
        value: u32,
        cycles: u64,
    ) -> Result<()> {
        let n = words(view, "fill_after_spin")?;
        same_device(view, self.device(), "view")?;
        stream.expect_device(self.device())?;
        // SAFETY: as in `fill` (no write at all when `n` is 0).
        unsafe {
            self.spin_then_fill
                .launch_known(stream, &self.resident(n), (view, value, n, cycles))
        }?;
        Ok(())
    }

    /// Queues `fill_u32(ptr, value, n)` on `stream`. Does nothing when `n` is 0.
    ///
    /// # Safety
    ///
    /// `ptr` must address at least `n` `u32`s of device memory usable by the stream's device
    /// that stay allocated until the kernel finishes, and no other work may access them
    /// concurrently.
    pub unsafe fn fill_u32_raw(
        &self,
        stream: &Stream,
        ptr: CUdeviceptr,
        value: u32,
        n: u64,
    ) -> Result<()> {
        // SAFETY: the caller's contract; `fill_u32` takes `(u32*, u32, u64)`.
        unsafe { self.ptr_value_n(&self.fill, stream, ptr, value, n) }
    }

    /// Queues `add_u32(ptr, value, n)` on `stream`. Does nothing when `n` is 0.
    ///
    /// # Safety
    ///
    /// As [`Kernels::fill_u32_raw`].
    pub unsafe fn add_u32_raw(
        &self,
        stream: &Stream,
        ptr: CUdeviceptr,
        value: u32,
        n: u64,
    ) -> Result<()> {
        // SAFETY: the caller's contract; `add_u32` takes `(u32*, u32, u64)`.
        unsafe { self.ptr_value_n(&self.add, stream, ptr, value, n) }
    }

    /// `kernel(ptr, value, n)` for the fill and add kernels, element-wise; nothing when `n` is
    /// 0.
    ///
    /// # Safety
    ///
    /// As [`Kernels::fill_u32_raw`]; `kernel` takes `(u32* ptr, u32 value, u64 n)`.
    unsafe fn ptr_value_n(
        &self,
        kernel: &Kernel,
        stream: &Stream,
        ptr: CUdeviceptr,
        value: u32,
        n: u64,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        // SAFETY: the caller's contract covers the memory; each element is read and written
        // by one thread.
        unsafe { kernel.launch_known(stream, &self.elementwise(n), (ptr, value, n)) }?;
        Ok(())
    }

    /// Queues `copy_u32(dst, src, n)` on `stream`. Does nothing when `n` is 0.
    ///
    /// # Safety
    ///
    /// `dst` and `src` must each address at least `n` `u32`s of device memory usable by the
    /// stream's device, not overlapping, that stay allocated until the kernel finishes; no
    /// other work may write `src` or access `dst` concurrently.
    pub unsafe fn copy_u32_raw(
        &self,
        stream: &Stream,
        dst: CUdeviceptr,
        src: CUdeviceptr,
        n: u64,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        // SAFETY: the caller's contract covers the memory; each element is copied by one
        // thread.
        unsafe {
            self.copy
                .launch_known(stream, &self.elementwise(n), (dst, src, n))
        }?;
        Ok(())
    }

    /// Queues `checksum_u32(src, n, out)` on `stream`: adds the wrapping sum of the `n`
    /// elements at `src` to the `u64` at `out` (which it does not zero first).
    ///
    /// # Safety
    ///
    /// `src` must address at least `n` `u32`s and `out` one 8-aligned `u64` of device memory
    /// usable by the stream's device, allocated until the kernel finishes; no other work may
    /// write `src` or access `out` concurrently.
    pub unsafe fn checksum_u32_raw(
        &self,
        stream: &Stream,
        src: CUdeviceptr,
        n: u64,
        out: CUdeviceptr,
    ) -> Result<()> {
        // SAFETY: the caller's contract covers the memory; the threads add to `out`
        // atomically.
        unsafe {
            self.checksum
                .launch_known(stream, &self.elementwise(n.max(1)), (src, n, out))
        }?;
        Ok(())
    }

    /// Queues `spin_then_fill(ptr, value, n, cycles)` on `stream`, with at most one block per
    /// SM so every block is resident at once and the kernel takes about `cycles` clocks before
    /// its writes. Launches (spin only, no write) even when `n` is 0.
    ///
    /// # Safety
    ///
    /// As [`Kernels::fill_u32_raw`].
    pub unsafe fn spin_then_fill_raw(
        &self,
        stream: &Stream,
        ptr: CUdeviceptr,
        value: u32,
        n: u64,
        cycles: u64,
    ) -> Result<()> {
        // SAFETY: the caller's contract covers the memory; each element is written by one
        // thread.
        unsafe {
            self.spin_then_fill
                .launch_known(stream, &self.resident(n), (ptr, value, n, cycles))
        }?;
        Ok(())
    }

    /// Queues `wait_flag(flag, max_cycles)` on `stream` as one thread: the kernel runs until
    /// the `u32` at `flag` becomes nonzero or `max_cycles` SM clocks pass, whichever is first.
    ///
    /// # Safety
    ///
    /// `flag` must address a `u32` the device can read (mapped pinned host memory for a
    /// host-set flag) that stays allocated until the kernel finishes.
    pub unsafe fn wait_flag_raw(
        &self,
        stream: &Stream,
        flag: CUdeviceptr,
        max_cycles: u64,
    ) -> Result<()> {
        // SAFETY: the caller's contract covers the flag, which the kernel only reads.
        unsafe {
            self.wait_flag
                .launch_known(stream, &one_thread(), (flag, max_cycles))
        }?;
        Ok(())
    }

    /// The element-wise kernels' launch: up to 8 blocks per SM.
    fn elementwise(&self, n: u64) -> LaunchConfig {
        config_1d(n, self.sm_count.saturating_mul(8))
    }

    /// `spin_then_fill`'s launch: at most one block per SM, so all are resident at once; at
    /// least one block, so an empty fill still spins.
    fn resident(&self, n: u64) -> LaunchConfig {
        config_1d(n.max(1), self.sm_count)
    }
}

/// The safe launchers that [`Kernels`] and `cuda-core`'s PTX
/// [`cudars_core::kernels::Kernels`] share, so one test body runs against both and shows
/// they behave alike (results, refusals and their errors).
pub trait SafeKernels {
    /// The device the module is loaded on.
    fn device(&self) -> Device;
    /// SM clocks in `duration` at the device's peak clock.
    fn cycles_for(&self, duration: Duration) -> u64;
    /// `spin(cycles)` as one thread.
    fn spin(&self, stream: &Stream, cycles: u64) -> Result<()>;
    /// `fill_u32` over the view.
    fn fill(&self, stream: &Stream, view: &DevicePtr, value: u32) -> Result<()>;
    /// `add_u32` over the view.
    fn add(&self, stream: &Stream, view: &DevicePtr, value: u32) -> Result<()>;
    /// `copy_u32` from `src` into `dst`.
    fn copy(&self, stream: &Stream, dst: &DevicePtr, src: &DevicePtr) -> Result<()>;
    /// Zeroes `out`'s first 8 bytes, then `checksum_u32` over `src` into them.
    fn checksum(&self, stream: &Stream, src: &DevicePtr, out: &DevicePtr) -> Result<()>;
    /// `spin_then_fill` over the view.
    fn fill_after_spin(
        &self,
        stream: &Stream,
        view: &DevicePtr,
        value: u32,
        cycles: u64,
    ) -> Result<()>;
}

macro_rules! safe_kernels {
    ($t:ty) => {
        impl SafeKernels for $t {
            fn device(&self) -> Device {
                <$t>::device(self)
            }
            fn cycles_for(&self, duration: Duration) -> u64 {
                <$t>::cycles_for(self, duration)
            }
            fn spin(&self, stream: &Stream, cycles: u64) -> Result<()> {
                <$t>::spin(self, stream, cycles)
            }
            fn fill(&self, stream: &Stream, view: &DevicePtr, value: u32) -> Result<()> {
                <$t>::fill(self, stream, view, value)
            }
            fn add(&self, stream: &Stream, view: &DevicePtr, value: u32) -> Result<()> {
                <$t>::add(self, stream, view, value)
            }
            fn copy(&self, stream: &Stream, dst: &DevicePtr, src: &DevicePtr) -> Result<()> {
                <$t>::copy(self, stream, dst, src)
            }
            fn checksum(&self, stream: &Stream, src: &DevicePtr, out: &DevicePtr) -> Result<()> {
                <$t>::checksum(self, stream, src, out)
            }
            fn fill_after_spin(
                &self,
                stream: &Stream,
                view: &DevicePtr,
                value: u32,
                cycles: u64,
            ) -> Result<()> {
                <$t>::fill_after_spin(self, stream, view, value, cycles)
            }
        }
    };
}
safe_kernels!(Kernels);
safe_kernels!(cudars_core::kernels::Kernels);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_match_cuda_core() {
        assert_eq!(grid(0, 10), 0);
        assert_eq!(grid(1, 10), 1);
        assert_eq!(grid(256, 10), 1);
        assert_eq!(grid(257, 10), 2);
        assert_eq!(grid(1 << 30, 10), 10);
        assert_eq!(grid(1 << 30, 0), 1);
        let c = config_1d(1000, 132 * 8);
        assert_eq!((c.grid, c.block), ((4, 1, 1), (BLOCK, 1, 1)));
        assert_eq!(c.shared_mem_bytes, 0);
    }

    #[test]
    fn overlapping_ranges_are_detected() {
        assert!(!ranges_overlap(0x1000, 16, 0x1010, 16));
        assert!(!ranges_overlap(0x1010, 16, 0x1000, 16));
        assert!(ranges_overlap(0x1000, 17, 0x1010, 16));
        assert!(ranges_overlap(0x1010, 16, 0x1000, 17));
        assert!(ranges_overlap(0x1000, 64, 0x1008, 8));
        assert!(!ranges_overlap(0x1000, 0, 0x1000, 16));
        assert!(!ranges_overlap(0x1000, 16, 0x1008, 0));
        assert!(ranges_overlap(u64::MAX - 8, 8, u64::MAX - 4, 4));
        assert!(!ranges_overlap(u64::MAX - 8, 4, 0, 16));
    }

    #[test]
    fn the_source_defines_every_entry_point_once() {
        for name in ENTRY_POINTS {
            let decl = format!("extern \"C\" __global__ void {name}(");
            assert_eq!(SOURCE.matches(&decl).count(), 1, "{name}");
        }
        assert_eq!(SOURCE.matches("__global__").count(), ENTRY_POINTS.len());
    }

    #[test]
    fn the_signatures_match_cuda_core_s_ptx() {
        // cuda-core's PTX declares the parameters these launchers pass.
        check_signatures(&|name| {
            cudars_rtc::kernel::ptx_params(cudars_core::kernels::PTX, name)
                .ok_or_else(|| cudars_rtc::Error::InvalidArgument(name.into()))
        })
        .unwrap();
    }
}

/// CPU, with NVRTC (feature `nvrtc-tests`; `cargo xtask ci` runs them when it finds the
/// library): [`SOURCE`] compiles, and its entry points take what the launchers pass. They
/// fail, never pass, when NVRTC cannot be loaded.
#[cfg(all(test, feature = "nvrtc-tests"))]
mod nvrtc_tests {
    use super::*;
    use cudars_core::module::ImageKind;
    use cudars_rtc::kernel::ptx_params;
    use cudars_rtc::{Arch, Compiler, Output};

    fn compiler() -> &'static Compiler {
        Compiler::global().expect("NVRTC must load for these tests (set CUDA_NVRTC_LIBRARY)")
    }

    fn ptx_for(arch: Arch) -> String {
        let compiled = program()
            .arch(arch)
            .output(Output::Ptx)
            .no_cache()
            .compile_with(compiler())
            .unwrap_or_else(|e| panic!("{arch}: {e}"));
        assert!(compiled.log().is_empty(), "{arch}: {}", compiled.log());
        compiled.ptx().unwrap().to_string()
    }

    /// The body of entry point `name` in `ptx`: from its `.entry` to the next one.
    fn body<'a>(ptx: &'a str, name: &str) -> &'a str {
        let start = ptx
            .find(&format!(".entry {name}("))
            .unwrap_or_else(|| panic!("no entry {name}"));
        let rest = &ptx[start + 1..];
        &ptx[start..start + 1 + rest.find(".entry").unwrap_or(rest.len())]
    }

    #[test]
    fn cubins_compile_for_hopper_and_the_oldest_architecture() {
        let oldest = *compiler().supported_archs().iter().min().unwrap();
        for arch in [Arch::new(oldest / 10, oldest % 10), Arch::new(9, 0)] {
            let compiled = program()
                .arch(arch)
                .no_cache()
                .compile_with(compiler())
                .unwrap_or_else(|e| panic!("{arch}: {e}"));
            assert_eq!(compiled.output(), Output::Cubin);
            assert_eq!(ImageKind::detect(compiled.image()), Some(ImageKind::Cubin));
            assert!(compiled.log().is_empty(), "{arch}: {}", compiled.log());
            // The entry points' names are in the cubin's symbol table, unmangled.
            for name in ENTRY_POINTS {
                let needle = format!("\0{name}\0");
                assert!(
                    compiled
                        .image()
                        .windows(needle.len())
                        .any(|w| w == needle.as_bytes()),
                    "{arch}: {name} is not in the cubin"
                );
            }
        }
    }

    #[test]
    fn every_entry_point_takes_what_its_launcher_passes() {
        let ptx = ptx_for(Arch::new(9, 0));
        assert_eq!(ptx.matches(".visible .entry").count(), ENTRY_POINTS.len());
        check_signatures(&|name| {
            ptx_params(&ptx, name).ok_or_else(|| cudars_rtc::Error::InvalidArgument(name.into()))
        })
        .unwrap();
        // The same parameter layout as cuda-core's PTX kernels, entry point by entry point.
        for name in ENTRY_POINTS {
            let ours = ptx_params(&ptx, name).unwrap();
            let core = ptx_params(cudars_core::kernels::PTX, name).unwrap();
            let layout = |p: &[ParamInfo]| p.iter().map(|p| (p.offset, p.size)).collect::<Vec<_>>();
            assert_eq!(layout(&ours), layout(&core), "{name}");
        }
    }

    #[test]
    fn the_kernels_use_the_sm_clock_volatile_loads_and_one_atomic_add() {
        let ptx = ptx_for(Arch::new(9, 0));
        for name in [SPIN, SPIN_THEN_FILL, WAIT_FLAG] {
            assert!(body(&ptx, name).contains("%clock64"), "{name}");
        }
        for name in [FILL_U32, ADD_U32, COPY_U32, CHECKSUM_U32] {
            assert!(!body(&ptx, name).contains("%clock64"), "{name}");
        }
        // The flag is read with volatile loads, so a host write ends the wait.
        assert!(
            body(&ptx, WAIT_FLAG).contains("ld.volatile"),
            "{}",
            body(&ptx, WAIT_FLAG)
        );
        // One 64-bit atomic add per thread (`red` or `atom`), nothing else writes `out`.
        let ck = body(&ptx, CHECKSUM_U32);
        assert_eq!(
            ck.matches("red.global.add.u64").count() + ck.matches("atom.global.add.u64").count(),
            1,
            "{ck}"
        );
        assert!(!ck.contains("st.global"), "{ck}");
    }
}

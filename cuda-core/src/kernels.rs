//! Ready-made kernels to try the workspace with: fill, add, copy, checksum, and slow
//! kernels for ordering tests, as PTX text that the driver JIT-compiles
//! ([`Module::from_ptx`]), so nothing needs `nvcc` or a CUDA toolkit at build time.
//!
//! `cuda-core` compiles no CUDA C++ (`cuda-rtc`, which does, depends on this crate), so this
//! is the quickest way to put real device work on a stream with `cuda-core` alone: its
//! examples use it, and so can a downstream crate (an example, a test of its allocator, a
//! benchmark of its stream ordering). The workspace's GPU tests of these kernels use them;
//! its other GPU tests and benchmarks use the same kernels written in CUDA C++ and compiled
//! by `cuda-rtc` (the `workspace-tests` crate's `kernels` module).
//!
//! [`PTX`] holds seven entry points over `u32` elements:
//!
//! | name | parameters | what it does |
//! | --- | --- | --- |
//! | `fill_u32` | `u32* ptr, u32 value, u64 n` | `ptr[i] = value` for `i < n` (grid-stride loop) |
//! | `add_u32` | `u32* ptr, u32 value, u64 n` | `ptr[i] += value` for `i < n` |
//! | `copy_u32` | `u32* dst, const u32* src, u64 n` | `dst[i] = src[i]` for `i < n` |
//! | `checksum_u32` | `const u32* src, u64 n, u64* out` | `*out +=` the wrapping sum of `src[i]` as `u64` ([`checksum_host`] is the same on the host) |
//! | `spin` | `u64 cycles` | each thread busy-waits until `clock64` advanced by `cycles` |
//! | `spin_then_fill` | `u32* ptr, u32 value, u64 n, u64 cycles` | each thread spins, then fills: the slow writer of ordering tests |
//! | `wait_flag` | `u32* flag, u64 max_cycles` | spins until `*flag != 0` (volatile loads, so a host write to mapped pinned memory ends it) or `max_cycles` passed |
//!
//! [`Kernels`] loads the module on a device and launches each kernel with a sensible grid.
//! The launchers that take [`DevicePtr`] views are safe, as the views' own asynchronous
//! operations are: they check the device, the stream and the sizes, refuse views that
//! overlap where a kernel reads one and writes the other (`copy`, `checksum`; `fill`, `add`
//! and `fill_after_spin` take one view), and mark the view's
//! memory as used by the stream ([`DevicePtr::record_stream`]), so a pool block is not
//! reused before the kernel is done. The `*_raw` launchers take bare addresses and are
//! `unsafe`.
//!
//! `spin_then_fill` is the slow writer used to prove cross-stream safety: launched with a
//! grid that fits on the device at once, it writes nothing for about `cycles` SM clocks and
//! then overwrites the buffer, so a reader or allocator that does not respect stream order
//! sees it. [`Kernels::cycles_for`] turns a duration into clocks.
//!
//! ```no_run
//! use cudars_core::kernels::{checksum_host, Kernels};
//! use cudars_core::{Device, DevicePtr, Stream};
//! use std::time::Duration;
//!
//! let dev = Device::new(0)?;
//! let stream = Stream::new(&dev)?;
//! let k = Kernels::load(&dev)?; // JIT-compiles the PTX for this device
//! let data = DevicePtr::alloc(&dev, 1 << 20)?;
//! let copy = DevicePtr::alloc(&dev, 1 << 20)?;
//! let sum = DevicePtr::alloc(&dev, 8)?;
//! k.spin(&stream, k.cycles_for(Duration::from_millis(1)))?; // about 1 ms of nothing
//! k.fill(&stream, &data, 3)?;
//! k.copy(&stream, &copy, &data)?;
//! k.checksum(&stream, &copy, &sum)?; // zeroes `sum`, then adds every element
//! stream.synchronize()?;
//! let mut out = [0u64];
//! sum.copy_to_host(&mut out)?;
//! assert_eq!(out[0], checksum_host(&vec![3u32; (1 << 20) / 4]));
//! # Ok::<(), cudars_core::Error>(())
//! ```

use std::ffi::c_void;
use std::time::Duration;

use cudars_sys::{CUdevice_attribute, CUdeviceptr};

use crate::error::{Error, Result};
use crate::memory::DevicePtr;
use crate::module::{Function, Module};
use crate::{Device, Stream};

/// Entry-point name of the spin kernel in [`PTX`].
pub const SPIN: &str = "spin";
/// Entry-point name of the fill kernel in [`PTX`].
pub const FILL_U32: &str = "fill_u32";
/// Entry-point name of the add kernel in [`PTX`].
pub const ADD_U32: &str = "add_u32";
/// Entry-point name of the copy kernel in [`PTX`].
pub const COPY_U32: &str = "copy_u32";
/// Entry-point name of the checksum kernel in [`PTX`].
pub const CHECKSUM_U32: &str = "checksum_u32";
/// Entry-point name of the spin-then-fill kernel in [`PTX`].
pub const SPIN_THEN_FILL: &str = "spin_then_fill";
/// Entry-point name of the wait-for-flag kernel in [`PTX`].
pub const WAIT_FLAG: &str = "wait_flag";

/// Every entry point of [`PTX`].
pub const ENTRY_POINTS: [&str; 7] = [
    SPIN,
    FILL_U32,
    ADD_U32,
    COPY_U32,
    CHECKSUM_U32,
    SPIN_THEN_FILL,
    WAIT_FLAG,
];

/// PTX of the kernels (see the [module documentation](self)), for [`Module::from_ptx`]. ISA
/// 7.0 for `sm_70`: any driver from CUDA 11.0 on JIT-compiles it for the device at hand.
pub const PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64

// spin(u64 cycles): busy-wait until clock64 has advanced by `cycles`.
.visible .entry spin(
    .param .u64 spin_param_cycles
)
{
    .reg .pred  %p<2>;
    .reg .b64   %rd<6>;

    ld.param.u64    %rd1, [spin_param_cycles];
    mov.u64         %rd2, %clock64;
SPIN_LOOP:
    mov.u64         %rd3, %clock64;
    sub.s64         %rd4, %rd3, %rd2;
    setp.lt.u64     %p1, %rd4, %rd1;
    @%p1 bra        SPIN_LOOP;
    ret;
}

// fill_u32(u32* ptr, u32 value, u64 n): ptr[i] = value for i < n, grid-stride.
.visible .entry fill_u32(
    .param .u64 fill_u32_param_ptr,
    .param .u32 fill_u32_param_value,
    .param .u64 fill_u32_param_n
)
{
    .reg .pred  %p<2>;
    .reg .b32   %r<6>;
    .reg .b64   %rd<9>;

    ld.param.u64        %rd1, [fill_u32_param_ptr];
    cvta.to.global.u64  %rd1, %rd1;
    ld.param.u32        %r1, [fill_u32_param_value];
    ld.param.u64        %rd2, [fill_u32_param_n];
    mov.u32             %r2, %ctaid.x;
    mov.u32             %r3, %ntid.x;
    mov.u32             %r4, %tid.x;
    mov.u32             %r5, %nctaid.x;
    mul.wide.u32        %rd3, %r2, %r3;
    cvt.u64.u32         %rd4, %r4;
    add.u64             %rd3, %rd3, %rd4;
    mul.wide.u32        %rd5, %r5, %r3;
FILL_LOOP:
    setp.ge.u64         %p1, %rd3, %rd2;
    @%p1 bra            FILL_DONE;
    shl.b64             %rd6, %rd3, 2;
    add.u64             %rd7, %rd1, %rd6;
    st.global.u32       [%rd7], %r1;
    add.u64             %rd3, %rd3, %rd5;
    bra.uni             FILL_LOOP;
FILL_DONE:
    ret;
}

// add_u32(u32* ptr, u32 value, u64 n): ptr[i] += value for i < n, grid-stride.
.visible .entry add_u32(
    .param .u64 add_u32_param_ptr,
    .param .u32 add_u32_param_value,
    .param .u64 add_u32_param_n
)
{
    .reg .pred  %p<2>;
    .reg .b32   %r<8>;
    .reg .b64   %rd<9>;

    ld.param.u64        %rd1, [add_u32_param_ptr];
    cvta.to.global.u64  %rd1, %rd1;
    ld.param.u32        %r1, [add_u32_param_value];
    ld.param.u64        %rd2, [add_u32_param_n];
    mov.u32             %r2, %ctaid.x;
    mov.u32             %r3, %ntid.x;
    mov.u32             %r4, %tid.x;
    mov.u32             %r5, %nctaid.x;
    mul.wide.u32        %rd3, %r2, %r3;
    cvt.u64.u32         %rd4, %r4;
    add.u64             %rd3, %rd3, %rd4;
    mul.wide.u32        %rd5, %r5, %r3;
ADD_LOOP:
    setp.ge.u64         %p1, %rd3, %rd2;
    @%p1 bra            ADD_DONE;
    shl.b64             %rd6, %rd3, 2;
    add.u64             %rd7, %rd1, %rd6;
    ld.global.u32       %r6, [%rd7];
    add.u32             %r7, %r6, %r1;
    st.global.u32       [%rd7], %r7;
    add.u64             %rd3, %rd3, %rd5;
    bra.uni             ADD_LOOP;
ADD_DONE:
    ret;
}

// spin_then_fill(u32* ptr, u32 value, u64 n, u64 cycles): each thread spins for `cycles`
// clocks, then ptr[i] = value for i < n, grid-stride.
.visible .entry spin_then_fill(
    .param .u64 stf_param_ptr,
    .param .u32 stf_param_value,
    .param .u64 stf_param_n,
    .param .u64 stf_param_cycles
)
{
    .reg .pred  %p<3>;
    .reg .b32   %r<6>;
    .reg .b64   %rd<13>;

    ld.param.u64        %rd8, [stf_param_cycles];
    mov.u64             %rd9, %clock64;
STF_SPIN:
    mov.u64             %rd10, %clock64;
    sub.s64             %rd11, %rd10, %rd9;
    setp.lt.u64         %p2, %rd11, %rd8;
    @%p2 bra            STF_SPIN;

    ld.param.u64        %rd1, [stf_param_ptr];
    cvta.to.global.u64  %rd1, %rd1;
    ld.param.u32        %r1, [stf_param_value];
    ld.param.u64        %rd2, [stf_param_n];
    mov.u32             %r2, %ctaid.x;
    mov.u32             %r3, %ntid.x;
    mov.u32             %r4, %tid.x;
    mov.u32             %r5, %nctaid.x;
    mul.wide.u32        %rd3, %r2, %r3;
    cvt.u64.u32         %rd4, %r4;
    add.u64             %rd3, %rd3, %rd4;
    mul.wide.u32        %rd5, %r5, %r3;
STF_LOOP:
    setp.ge.u64         %p1, %rd3, %rd2;
    @%p1 bra            STF_DONE;
    shl.b64             %rd6, %rd3, 2;
    add.u64             %rd7, %rd1, %rd6;
    st.global.u32       [%rd7], %r1;
    add.u64             %rd3, %rd3, %rd5;
    bra.uni             STF_LOOP;
STF_DONE:
    ret;
}

// wait_flag(u32* flag, u64 max_cycles): spin until *flag != 0 or max_cycles clocks passed.
.visible .entry wait_flag(
    .param .u64 wf_param_flag,
    .param .u64 wf_param_max
)
{
    .reg .pred  %p<3>;
    .reg .b32   %r<2>;
    .reg .b64   %rd<6>;

    ld.param.u64            %rd1, [wf_param_flag];
    cvta.to.global.u64      %rd1, %rd1;
    ld.param.u64            %rd2, [wf_param_max];
    mov.u64                 %rd3, %clock64;
WF_LOOP:
    ld.volatile.global.u32  %r1, [%rd1];
    setp.ne.u32             %p1, %r1, 0;
    @%p1 bra                WF_DONE;
    mov.u64                 %rd4, %clock64;
    sub.s64                 %rd5, %rd4, %rd3;
    setp.lt.u64             %p2, %rd5, %rd2;
    @%p2 bra                WF_LOOP;
WF_DONE:
    ret;
}

// copy_u32(u32* dst, const u32* src, u64 n): dst[i] = src[i] for i < n, grid-stride.
.visible .entry copy_u32(
    .param .u64 copy_u32_param_dst,
    .param .u64 copy_u32_param_src,
    .param .u64 copy_u32_param_n
)
{
    .reg .pred  %p<2>;
    .reg .b32   %r<6>;
    .reg .b64   %rd<11>;

    ld.param.u64        %rd1, [copy_u32_param_dst];
    cvta.to.global.u64  %rd1, %rd1;
    ld.param.u64        %rd8, [copy_u32_param_src];
    cvta.to.global.u64  %rd8, %rd8;
    ld.param.u64        %rd2, [copy_u32_param_n];
    mov.u32             %r2, %ctaid.x;
    mov.u32             %r3, %ntid.x;
    mov.u32             %r4, %tid.x;
    mov.u32             %r5, %nctaid.x;
    mul.wide.u32        %rd3, %r2, %r3;
    cvt.u64.u32         %rd4, %r4;
    add.u64             %rd3, %rd3, %rd4;
    mul.wide.u32        %rd5, %r5, %r3;
COPY_LOOP:
    setp.ge.u64         %p1, %rd3, %rd2;
    @%p1 bra            COPY_DONE;
    shl.b64             %rd6, %rd3, 2;
    add.u64             %rd9, %rd8, %rd6;
    ld.global.u32       %r1, [%rd9];
    add.u64             %rd7, %rd1, %rd6;
    st.global.u32       [%rd7], %r1;
    add.u64             %rd3, %rd3, %rd5;
    bra.uni             COPY_LOOP;
COPY_DONE:
    ret;
}

// checksum_u32(const u32* src, u64 n, u64* out): *out += the sum of src[i] as u64 for
// i < n (wrapping), each thread summing its grid-stride share, then one atomic add.
.visible .entry checksum_u32(
    .param .u64 ck_param_src,
    .param .u64 ck_param_n,
    .param .u64 ck_param_out
)
{
    .reg .pred  %p<2>;
    .reg .b32   %r<6>;
    .reg .b64   %rd<12>;

    ld.param.u64        %rd1, [ck_param_src];
    cvta.to.global.u64  %rd1, %rd1;
    ld.param.u64        %rd2, [ck_param_n];
    ld.param.u64        %rd8, [ck_param_out];
    cvta.to.global.u64  %rd8, %rd8;
    mov.u32             %r2, %ctaid.x;
    mov.u32             %r3, %ntid.x;
    mov.u32             %r4, %tid.x;
    mov.u32             %r5, %nctaid.x;
    mul.wide.u32        %rd3, %r2, %r3;
    cvt.u64.u32         %rd4, %r4;
    add.u64             %rd3, %rd3, %rd4;
    mul.wide.u32        %rd5, %r5, %r3;
    mov.u64             %rd9, 0;
CK_LOOP:
    setp.ge.u64         %p1, %rd3, %rd2;
    @%p1 bra            CK_DONE;
    shl.b64             %rd6, %rd3, 2;
    add.u64             %rd7, %rd1, %rd6;
    ld.global.u32       %r1, [%rd7];
    cvt.u64.u32         %rd10, %r1;
    add.u64             %rd9, %rd9, %rd10;
    add.u64             %rd3, %rd3, %rd5;
    bra.uni             CK_LOOP;
CK_DONE:
    red.global.add.u64  [%rd8], %rd9;
    ret;
}
"#;

/// What `checksum_u32` computes, on the host: the wrapping sum of the elements as `u64`.
pub fn checksum_host(data: &[u32]) -> u64 {
    data.iter().fold(0u64, |s, &x| s.wrapping_add(u64::from(x)))
}

pub use checks::BLOCK;
use checks::{disjoint, same_device, u32_words as words};

/// The checks this module's safe launchers make before anything is issued, for launchers
/// of your own kernels over [`DevicePtr`] views (the workspace's NVRTC test kernels use
/// them): whole aligned `u32` views, the module's device, views read and written not
/// overlapping, and the one-dimensional grid the element-wise kernels use.
pub mod checks {
    use crate::device::Device;
    use crate::error::{Error, Result};
    use crate::memory::DevicePtr;
    use crate::sys::CUdeviceptr;

    /// Threads per block for the element-wise kernels.
    pub const BLOCK: u32 = 256;

    /// The number of whole `u32` elements of `view`, or [`Error::InvalidArgument`] (naming
    /// `what`) when its address or length is not a multiple of 4.
    pub fn u32_words(view: &DevicePtr, what: &str) -> Result<u64> {
        if !view.as_raw().is_multiple_of(4) || !view.len().is_multiple_of(4) {
            return Err(Error::InvalidArgument(format!(
                "{what}: a view at {:#x} of {} bytes is not a whole number of aligned u32s",
                view.as_raw(),
                view.len()
            )));
        }
        Ok(view.len() as u64 / 4)
    }

    /// [`Error::WrongDevice`] (naming `what`) unless `view` is memory of `device`.
    pub fn same_device(view: &DevicePtr, device: Device, what: &'static str) -> Result<()> {
        if view.device() == device {
            Ok(())
        } else {
            Err(Error::WrongDevice {
                what,
                expected: device.ordinal(),
                actual: view.device().ordinal(),
            })
        }
    }

    /// `true` when the byte ranges `a..a + a_len` and `b..b + b_len` share a byte (empty
    /// ranges share none).
    pub fn ranges_overlap(a: CUdeviceptr, a_len: usize, b: CUdeviceptr, b_len: usize) -> bool {
        a_len != 0
            && b_len != 0
            && b < a.saturating_add(a_len as CUdeviceptr)
            && a < b.saturating_add(b_len as CUdeviceptr)
    }

    /// [`Error::InvalidArgument`] when two views of one device overlap: what a kernel that
    /// reads one and writes the other forbids, refused as
    /// [`DevicePtr::copy_from_device`] refuses it. Views of different devices never overlap
    /// (each device's addresses are its own); the launchers reject them anyway.
    pub fn disjoint(
        op: &str,
        a_what: &str,
        a: &DevicePtr,
        b_what: &str,
        b: &DevicePtr,
    ) -> Result<()> {
        if a.device() == b.device() && ranges_overlap(a.as_raw(), a.len(), b.as_raw(), b.len()) {
            return Err(Error::InvalidArgument(format!(
                "{op}: {a_what} {:#x}+{} and {b_what} {:#x}+{} overlap",
                a.as_raw(),
                a.len(),
                b.as_raw(),
                b.len()
            )));
        }
        Ok(())
    }

    /// Blocks of [`BLOCK`] threads for `n` elements, at most `cap` blocks (at least one
    /// when `cap` is 0; none for no elements).
    pub fn grid(n: u64, cap: u32) -> u32 {
        let blocks = n.div_ceil(u64::from(BLOCK));
        blocks.min(u64::from(cap.max(1))) as u32
    }
}

/// The [`PTX`] module loaded on one device, with a launcher for each kernel.
///
/// `Send` and `Sync`, like the [`Function`]s it holds; cloning shares the module.
#[derive(Debug, Clone)]
pub struct Kernels {
    module: Module,
    spin: Function,
    fill: Function,
    add: Function,
    copy: Function,
    checksum: Function,
    spin_then_fill: Function,
    wait_flag: Function,
    sm_count: u32,
    clock_khz: u32,
}

impl Kernels {
    /// JIT-compiles [`PTX`] for `device`.
    pub fn load(device: &Device) -> Result<Kernels> {
        let module = Module::from_ptx(device, PTX)?;
        let sm_count = device
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
            .max(1) as u32;
        let clock_khz = device
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)?
            .max(1) as u32;
        Ok(Kernels {
            spin: module.function(SPIN)?,
            fill: module.function(FILL_U32)?,
            add: module.function(ADD_U32)?,
            copy: module.function(COPY_U32)?,
            checksum: module.function(CHECKSUM_U32)?,
            spin_then_fill: module.function(SPIN_THEN_FILL)?,
            wait_flag: module.function(WAIT_FLAG)?,
            module,
            sm_count,
            clock_khz,
        })
    }

    /// The loaded module.
    pub fn module(&self) -> &Module {
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

    /// Launches `f` in `BLOCK`-thread blocks, enough for `n` elements and at most `cap`.
    ///
    /// # Safety
    ///
    /// `params` match `f`'s signature, and the memory they name is valid for the launch (the
    /// public launchers' contracts).
    unsafe fn launch_1d(
        f: &Function,
        stream: &Stream,
        n: u64,
        cap: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let grid = checks::grid(n, cap);
        // SAFETY: the caller's contract.
        unsafe { f.launch(&stream.issue_any(), (grid, 1, 1), (BLOCK, 1, 1), 0, params) }
    }

    /// `f(ptr, value, n)` for the fill and add kernels; nothing when `n` is 0.
    ///
    /// # Safety
    ///
    /// As [`Kernels::fill_u32_raw`]; `f` takes `(u64 ptr, u32 value, u64 n)`.
    unsafe fn ptr_value_n(
        &self,
        f: &Function,
        stream: &Stream,
        ptr: CUdeviceptr,
        value: u32,
        n: u64,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let (mut p, mut v, mut n_) = (ptr, value, n);
        let mut params = [
            &mut p as *mut CUdeviceptr as *mut c_void,
            &mut v as *mut u32 as *mut c_void,
            &mut n_ as *mut u64 as *mut c_void,
        ];
        // SAFETY: the parameters match `f`'s signature; the caller vouches for the memory.
        unsafe { Self::launch_1d(f, stream, n, self.sm_count * 8, &mut params) }
    }

    /// Queues `spin(cycles)` on `stream` as one thread: the kernel takes about `cycles` SM
    /// clocks and touches no memory.
    pub fn spin(&self, stream: &Stream, cycles: u64) -> Result<()> {
        let mut cycles = cycles;
        let mut params = [&mut cycles as *mut u64 as *mut c_void];
        // SAFETY: `spin` takes one u64, which `params` points to for the call; it touches no
        // memory.
        unsafe {
            self.spin
                .launch(&stream.issue_any(), (1, 1, 1), (1, 1, 1), 0, &mut params)
        }
    }

    /// Queues `fill_u32` over every element of `view` on `stream`. The view must be a whole
    /// number of aligned `u32`s ([`Error::InvalidArgument`]) of the module's device
    /// ([`Error::WrongDevice`]). Nothing is launched for an empty view.
    pub fn fill(&self, stream: &Stream, view: &DevicePtr, value: u32) -> Result<()> {
        let n = words(view, "fill")?;
        same_device(view, self.device(), "view")?;
        let issue = stream.issue(self.device())?;
        view.record_stream(&issue)?;
        // SAFETY: the view is live device memory of the module's device, `n` aligned u32s,
        // kept from being freed or reused before the kernel is done by `record_stream`
        // above (as the view's own asynchronous operations do); `launch` checks the stream.
        unsafe { self.fill_u32_raw(stream, view.as_raw(), value, n) }
    }

    /// Queues `add_u32` over every element of `view` on `stream`; checks as
    /// [`fill`](Self::fill).
    pub fn add(&self, stream: &Stream, view: &DevicePtr, value: u32) -> Result<()> {
        let n = words(view, "add")?;
        same_device(view, self.device(), "view")?;
        let issue = stream.issue(self.device())?;
        view.record_stream(&issue)?;
        // SAFETY: as in `fill`.
        unsafe { self.add_u32_raw(stream, view.as_raw(), value, n) }
    }

    /// Queues `copy_u32` from `src` into `dst` on `stream`. Both must be whole numbers of
    /// aligned `u32`s of the module's device, of the same length
    /// ([`Error::SizeMismatch`]), and must not overlap ([`Error::InvalidArgument`], as
    /// [`DevicePtr::copy_from_device`]: the kernel's threads would read elements that others
    /// have already overwritten).
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
        dst.record_stream(&issue)?;
        src.record_stream(&issue)?;
        // SAFETY: both views are live device memory of the module's device, `n` aligned u32s
        // each, not overlapping (checked above), marked as used by `stream` above; `launch`
        // checks the stream.
        unsafe { self.copy_u32_raw(stream, dst.as_raw(), src.as_raw(), n) }
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
        // SAFETY: `src` is `n` aligned u32s and `out8` 8 aligned bytes of live device memory
        // of the module's device, not overlapping (checked above), marked as used by `stream`
        // (memset_async did it for `out8`); `launch` checks the stream.
        unsafe { self.checksum_u32_raw(stream, src.as_raw(), n, out8.as_raw()) }
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
        let issue = stream.issue(self.device())?;
        view.record_stream(&issue)?;
        // SAFETY: as in `fill`.
        unsafe { self.spin_then_fill_raw(stream, view.as_raw(), value, n, cycles) }
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
        // SAFETY: `fill_u32` takes (ptr, value, n); the caller's contract covers the memory.
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
        // SAFETY: `add_u32` takes (ptr, value, n); the caller's contract covers the memory.
        unsafe { self.ptr_value_n(&self.add, stream, ptr, value, n) }
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
        let (mut d, mut s, mut n_) = (dst, src, n);
        let mut params = [
            &mut d as *mut CUdeviceptr as *mut c_void,
            &mut s as *mut CUdeviceptr as *mut c_void,
            &mut n_ as *mut u64 as *mut c_void,
        ];
        // SAFETY: parameters match the kernel's signature; the caller vouches for the memory.
        unsafe { Self::launch_1d(&self.copy, stream, n, self.sm_count * 8, &mut params) }
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
        let (mut s, mut n_, mut o) = (src, n, out);
        let mut params = [
            &mut s as *mut CUdeviceptr as *mut c_void,
            &mut n_ as *mut u64 as *mut c_void,
            &mut o as *mut CUdeviceptr as *mut c_void,
        ];
        // SAFETY: parameters match the kernel's signature; the caller vouches for the memory.
        unsafe {
            Self::launch_1d(
                &self.checksum,
                stream,
                n.max(1),
                self.sm_count * 8,
                &mut params,
            )
        }
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
        let (mut p, mut v, mut n_, mut c) = (ptr, value, n, cycles);
        let mut params = [
            &mut p as *mut CUdeviceptr as *mut c_void,
            &mut v as *mut u32 as *mut c_void,
            &mut n_ as *mut u64 as *mut c_void,
            &mut c as *mut u64 as *mut c_void,
        ];
        // SAFETY: parameters match the kernel's signature; the caller vouches for the memory.
        unsafe {
            Self::launch_1d(
                &self.spin_then_fill,
                stream,
                n.max(1),
                self.sm_count,
                &mut params,
            )
        }
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
        let (mut f, mut m) = (flag, max_cycles);
        let mut params = [
            &mut f as *mut CUdeviceptr as *mut c_void,
            &mut m as *mut u64 as *mut c_void,
        ];
        // SAFETY: parameters match the kernel's signature; the caller vouches for the memory.
        unsafe {
            self.wait_flag
                .launch(&stream.issue_any(), (1, 1, 1), (1, 1, 1), 0, &mut params)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::checks::ranges_overlap;
    use super::*;

    #[test]
    fn every_entry_point_is_in_the_ptx_once() {
        for name in ENTRY_POINTS {
            let decl = format!(".visible .entry {name}(");
            assert_eq!(PTX.matches(&decl).count(), 1, "{name}");
        }
        assert_eq!(PTX.matches(".visible .entry").count(), ENTRY_POINTS.len());
    }

    #[test]
    fn labels_are_unique_in_the_module() {
        let mut labels: Vec<&str> = PTX
            .lines()
            .map(str::trim)
            .filter(|l| l.ends_with(':') && !l.starts_with("//"))
            .collect();
        let n = labels.len();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), n);
    }

    #[test]
    fn checksum_host_wraps() {
        assert_eq!(checksum_host(&[]), 0);
        assert_eq!(checksum_host(&[u32::MAX, 1]), u64::from(u32::MAX) + 1);
    }

    #[test]
    fn overlapping_ranges_are_detected() {
        // Disjoint, touching at the boundary, and far apart.
        assert!(!ranges_overlap(0x1000, 16, 0x1010, 16));
        assert!(!ranges_overlap(0x1010, 16, 0x1000, 16));
        assert!(!ranges_overlap(0x1000, 16, 0x9000, 16));
        // One byte in common, either way round.
        assert!(ranges_overlap(0x1000, 17, 0x1010, 16));
        assert!(ranges_overlap(0x1010, 16, 0x1000, 17));
        // The same range, and one inside the other.
        assert!(ranges_overlap(0x1000, 16, 0x1000, 16));
        assert!(ranges_overlap(0x1000, 64, 0x1008, 8));
        assert!(ranges_overlap(0x1008, 8, 0x1000, 64));
        // Empty ranges overlap nothing, even at the same address.
        assert!(!ranges_overlap(0x1000, 0, 0x1000, 16));
        assert!(!ranges_overlap(0x1000, 16, 0x1008, 0));
        // Ranges reaching the top of the address space do not wrap.
        assert!(ranges_overlap(u64::MAX - 8, 8, u64::MAX - 4, 4));
        assert!(!ranges_overlap(u64::MAX - 8, 4, 0, 16));
    }

    /// Device memory that is never touched: an address range for checks that never reach
    /// the driver.
    struct Fake {
        device: Device,
        addr: CUdeviceptr,
        size: usize,
    }

    // SAFETY: no test hands these views to the driver; they only feed the argument checks.
    unsafe impl crate::memory::DeviceAlloc for Fake {
        fn device(&self) -> Device {
            self.device
        }
        fn as_raw(&self) -> CUdeviceptr {
            self.addr
        }
        fn size(&self) -> usize {
            self.size
        }
    }

    fn fake(device: i32, addr: CUdeviceptr, size: usize) -> DevicePtr {
        DevicePtr::new(Fake {
            device: Device::test_only(device),
            addr,
            size,
        })
    }

    #[test]
    fn overlapping_views_of_one_device_are_refused() {
        let buf = fake(0, 0x10_0000, 4096);
        let (lo, hi) = buf.split_at(2048).unwrap();
        // Halves of one buffer are disjoint; a view against itself, or shifted by one
        // element, overlaps.
        assert!(disjoint("copy", "destination", &lo, "source", &hi).is_ok());
        assert!(disjoint("copy", "destination", &hi, "source", &lo).is_ok());
        let shifted = buf.slice(4..2052).unwrap();
        for (a, b) in [(&lo, &lo), (&lo, &shifted), (&shifted, &lo), (&buf, &hi)] {
            match disjoint("copy", "destination", a, "source", b) {
                Err(Error::InvalidArgument(m)) => assert!(m.contains("overlap"), "{m}"),
                other => panic!("expected InvalidArgument, got {other:?}"),
            }
        }
        // Another allocation at the same addresses on another device is no overlap; an
        // alias on the same device (two owners of one range) is.
        let other_device = fake(1, 0x10_0000, 4096);
        assert!(disjoint("copy", "destination", &buf, "source", &other_device).is_ok());
        let alias = fake(0, 0x10_0800, 8);
        assert!(disjoint("checksum", "output", &alias, "source", &hi).is_err());
        assert!(disjoint("checksum", "output", &alias, "source", &lo).is_ok());
        // Empty views overlap nothing.
        let empty = buf.slice(100..100).unwrap();
        assert!(disjoint("copy", "destination", &empty, "source", &buf).is_ok());
    }

    #[test]
    fn grids_are_capped_and_never_empty() {
        assert_eq!(checks::grid(0, 10), 0);
        assert_eq!(checks::grid(1, 10), 1);
        assert_eq!(checks::grid(257, 10), 2);
        assert_eq!(checks::grid(1 << 30, 10), 10);
        assert_eq!(checks::grid(1 << 30, 0), 1);
    }
}

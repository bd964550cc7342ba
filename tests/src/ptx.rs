//! Test kernels as PTX text, JIT-compiled by the driver (`cuModuleLoadDataEx`), so nothing
//! needs `nvcc` at build time.
//!
//! [`KERNELS`] holds five entry points:
//!
//! | name | parameters | what it does |
//! | --- | --- | --- |
//! | `spin` | `u64 cycles` | each thread busy-waits until `clock64` advanced by `cycles` |
//! | `fill_u32` | `u32* ptr, u32 value, u64 n` | `ptr[i] = value` for `i < n` (grid-stride loop) |
//! | `add_u32` | `u32* ptr, u32 value, u64 n` | `ptr[i] += value` for `i < n` (grid-stride loop) |
//! | `spin_then_fill` | `u32* ptr, u32 value, u64 n, u64 cycles` | each thread spins, then fills |
//! | `wait_flag` | `u32* flag, u64 max_cycles` | spins until `*flag != 0` (volatile loads, so a host write to mapped pinned memory ends it) or `max_cycles` passed |
//!
//! `spin_then_fill` is the slow writer used to prove cross-stream safety: launched with a grid
//! that fits on the device at once, it writes nothing for about `cycles` SM clocks and then
//! overwrites the buffer, so a reader or allocator that does not respect stream order sees it.
//!
//! [`TestKernels`] loads the module for a device and launches each kernel with a sensible
//! grid.
//!
//! ```no_run
//! use cuda_core::{Device, Stream};
//! let dev = Device::new(0)?;
//! let kernels = tests::ptx::TestKernels::load(&dev)?;
//! let stream = Stream::new(&dev)?;
//! kernels.spin(&stream, 1_000_000)?; // about 0.5 ms at 2 GHz
//! stream.synchronize()?;
//! # Ok::<(), cuda_core::Error>(())
//! ```
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use std::ffi::c_void;

use cuda_core::module::{Function, Module};
use cuda_core::sys::{CUdevice_attribute, CUdeviceptr};
use cuda_core::{Device, Result, Stream};

/// Entry-point name of the spin kernel in [`KERNELS`].
pub const SPIN: &str = "spin";
/// Entry-point name of the fill kernel in [`KERNELS`].
pub const FILL_U32: &str = "fill_u32";
/// Entry-point name of the add kernel in [`KERNELS`].
pub const ADD_U32: &str = "add_u32";
/// Entry-point name of the spin-then-fill kernel in [`KERNELS`].
pub const SPIN_THEN_FILL: &str = "spin_then_fill";
/// Entry-point name of the wait-for-flag kernel in [`KERNELS`].
pub const WAIT_FLAG: &str = "wait_flag";

/// PTX of the test kernels (`spin`, `fill_u32`, `add_u32`, `spin_then_fill`, `wait_flag`), for
/// [`Module::from_ptx`]. ISA 7.0 for `sm_70`: any driver from CUDA 11.0 on JIT-compiles it
/// for the device at hand.
pub const KERNELS: &str = r#"
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
"#;

/// Threads per block for the element-wise kernels.
const BLOCK: u32 = 256;

/// The [`KERNELS`] module loaded on one device, with a launcher for each kernel.
///
/// `Send` and `Sync`, like the [`Function`]s it holds.
#[derive(Debug, Clone)]
pub struct TestKernels {
    module: Module,
    spin: Function,
    fill: Function,
    add: Function,
    spin_then_fill: Function,
    wait_flag: Function,
    sm_count: u32,
}

impl TestKernels {
    /// JIT-compiles [`KERNELS`] for `device`.
    pub fn load(device: &Device) -> Result<TestKernels> {
        let module = Module::from_ptx(device, KERNELS)?;
        let sm_count = device
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
            .max(1) as u32;
        Ok(TestKernels {
            spin: module.function(SPIN)?,
            fill: module.function(FILL_U32)?,
            add: module.function(ADD_U32)?,
            spin_then_fill: module.function(SPIN_THEN_FILL)?,
            wait_flag: module.function(WAIT_FLAG)?,
            module,
            sm_count,
        })
    }

    /// The loaded module.
    pub fn module(&self) -> &Module {
        &self.module
    }

    /// Queues `spin(cycles)` on `stream` as one thread: the kernel takes about `cycles` SM
    /// clocks.
    pub fn spin(&self, stream: &Stream, cycles: u64) -> Result<()> {
        let mut cycles = cycles;
        let mut params = [&mut cycles as *mut u64 as *mut c_void];
        // SAFETY: `spin` takes one u64, which `params` points to for the call; it touches no
        // memory.
        unsafe {
            self.spin
                .launch(stream, (1, 1, 1), (1, 1, 1), 0, &mut params)
        }
    }

    /// Blocks of [`BLOCK`] threads for `n` elements, at most `cap` blocks.
    fn grid(n: u64, cap: u32) -> u32 {
        let blocks = n.div_ceil(BLOCK as u64);
        blocks.min(cap.max(1) as u64) as u32
    }

    /// Queues `fill_u32(ptr, value, n)` on `stream`. Does nothing when `n` is 0.
    ///
    /// # Safety
    ///
    /// `ptr` must address at least `n` `u32`s of device memory usable by the stream's device
    /// that stay allocated until the kernel finishes, and no other work may access them
    /// concurrently.
    pub unsafe fn fill_u32(
        &self,
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
        let grid = Self::grid(n, self.sm_count * 8);
        // SAFETY: parameters match the kernel's signature; the caller vouches for the memory.
        unsafe {
            self.fill
                .launch(stream, (grid, 1, 1), (BLOCK, 1, 1), 0, &mut params)
        }
    }

    /// Queues `add_u32(ptr, value, n)` on `stream`. Does nothing when `n` is 0.
    ///
    /// # Safety
    ///
    /// As [`TestKernels::fill_u32`].
    pub unsafe fn add_u32(
        &self,
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
        let grid = Self::grid(n, self.sm_count * 8);
        // SAFETY: parameters match the kernel's signature; the caller vouches for the memory.
        unsafe {
            self.add
                .launch(stream, (grid, 1, 1), (BLOCK, 1, 1), 0, &mut params)
        }
    }

    /// Queues `spin_then_fill(ptr, value, n, cycles)` on `stream`, with at most one block per
    /// SM so every block is resident at once and the kernel takes about `cycles` clocks before
    /// its writes. Launches (spin only, no write) even when `n` is 0.
    ///
    /// # Safety
    ///
    /// As [`TestKernels::fill_u32`].
    pub unsafe fn spin_then_fill(
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
        let grid = Self::grid(n.max(1), self.sm_count);
        // SAFETY: parameters match the kernel's signature; the caller vouches for the memory.
        unsafe {
            self.spin_then_fill
                .launch(stream, (grid, 1, 1), (BLOCK, 1, 1), 0, &mut params)
        }
    }

    /// Queues `wait_flag(flag, max_cycles)` on `stream` as one thread: the kernel runs until
    /// the `u32` at `flag` becomes nonzero or `max_cycles` SM clocks pass, whichever is first.
    ///
    /// # Safety
    ///
    /// `flag` must address a `u32` the device can read (mapped pinned host memory for a
    /// host-set flag) that stays allocated until the kernel finishes.
    pub unsafe fn wait_flag(
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
                .launch(stream, (1, 1, 1), (1, 1, 1), 0, &mut params)
        }
    }
}

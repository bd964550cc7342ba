//! Devices, their primary contexts, and the thread's current device.
//!
//! CuPy's `Device(id)`, `with Device(1):`, `Device.use()` and `Device.synchronize()`.
//! `cuda-core` works on each device's *primary* context, the one the CUDA runtime uses, so it
//! shares devices, memory and streams with PyTorch, CuPy or any runtime-API code in the same
//! process. The primary context is retained on first use and kept for the life of the process.

use std::ffi::{c_char, c_int, CStr};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use cudars_sys::{CUcontext, CUdevice, CUdevice_attribute, CUresult};

use crate::driver::drv;
use crate::error::{Error, Result};

/// Most devices a process can address through `cuda-core`.
pub const MAX_DEVICES: usize = 64;

/// A CUDA device (a GPU), identified by its ordinal.
///
/// `Device` is a small `Copy` value, `Send` and `Sync`: it names a device, it owns nothing.
///
/// ```no_run
/// use cudars_core::Device;
/// let dev = Device::new(0)?;
/// println!("{} (sm_{}{})", dev.name()?, dev.compute_capability()?.0, dev.compute_capability()?.1);
/// {
///     let _scope = dev.scope()?; // like `with Device(0):`
///     dev.synchronize()?;
/// } // the previous current device is restored here
/// # Ok::<(), cudars_core::Error>(())
/// ```
///
/// A `Device` also carries the context generation it was made in (see [`crate::health`]):
/// handles made with it remember it and fail closed after a [`Device::reset_after_fault`].
/// Equality and hashing look at the device only, not the generation.
#[derive(Debug, Clone, Copy)]
pub struct Device {
    ordinal: i32,
    raw: CUdevice,
    generation: u32,
}

impl PartialEq for Device {
    fn eq(&self, other: &Device) -> bool {
        self.ordinal == other.ordinal && self.raw == other.raw
    }
}

impl Eq for Device {}

impl std::hash::Hash for Device {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.ordinal.hash(state);
        self.raw.hash(state);
    }
}

/// The primary context of each device, once retained (0: not yet). A reset keeps the retain
/// and asks again (the driver may hand back another handle).
static PRIMARY: [AtomicUsize; MAX_DEVICES] = [const { AtomicUsize::new(0) }; MAX_DEVICES];
static PRIMARY_INIT: Mutex<()> = Mutex::new(());

/// The ordinals of the devices whose primary context this crate has retained.
pub(crate) fn retained_ordinals() -> Vec<usize> {
    (0..MAX_DEVICES)
        .filter(|&o| PRIMARY[o].load(Ordering::Acquire) != 0)
        .collect()
}

/// The ordinal of the device whose primary context is current on this thread, if any (no
/// error checking: this runs while an error is being built).
pub(crate) fn current_primary_ordinal() -> Option<usize> {
    let d = crate::driver::api().ok()?;
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    let r = unsafe { d.cuCtxGetCurrent(&mut ctx) }.ok()?;
    if !r.is_success() || ctx.is_null() {
        return None;
    }
    PRIMARY
        .iter()
        .position(|p| p.load(Ordering::Acquire) == ctx as usize)
}

/// How long [`reset_primary`] tries to get a usable context after the driver's reset.
const RESET_RECOVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// `cuDevicePrimaryCtxReset`, then the primary context asked for again and tried (a
/// synchronisation on it). `Err`: the driver did not reset (nothing was destroyed).
/// `Ok(Err)`: the driver destroyed the old context, but the new one still fails (tried again,
/// with a new reset each time, for [`RESET_RECOVERY`]): the error it gave.
pub(crate) fn reset_primary(device: &Device) -> Result<Result<()>> {
    let _init = PRIMARY_INIT.lock().unwrap_or_else(PoisonError::into_inner);
    let d = crate::driver::api()?;
    let raw = |r: std::result::Result<CUresult, cudars_sys::MissingSymbol>, call| -> Result<()> {
        match r {
            Ok(r) if r.is_success() => Ok(()),
            Ok(r) => Err(Error::Driver(crate::error::DriverError::new(r, call))),
            Err(missing) => Err(Error::from(missing)),
        }
    };
    // Nothing of the device current on this thread while the driver destroys it.
    let mut current: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    let _ = unsafe { d.cuCtxGetCurrent(&mut current) };
    let ours = PRIMARY[device.ordinal as usize].load(Ordering::Acquire);
    if !current.is_null() && current as usize == ours {
        // SAFETY: null unbinds the calling thread's context.
        let _ = unsafe { d.cuCtxSetCurrent(std::ptr::null_mut()) };
    }
    crate::context_note::forget_context();
    let reset = {
        // SAFETY: a valid device; the caller (health::reset) made sure no call of this
        // crate is inside the context.
        unsafe { d.cuDevicePrimaryCtxReset(device.raw) }
    };
    raw(reset, "cuDevicePrimaryCtxReset")?;
    let started = std::time::Instant::now();
    loop {
        let tried = (|| -> Result<CUcontext> {
            let mut ctx: CUcontext = std::ptr::null_mut();
            let retained = {
                // SAFETY: valid device and out-pointer; released below when the try fails.
                unsafe { d.cuDevicePrimaryCtxRetain(&mut ctx, device.raw) }
            };
            raw(retained, "cuDevicePrimaryCtxRetain")?;
            // SAFETY: the context just retained; popped below.
            let pushed = raw(unsafe { d.cuCtxPushCurrent(ctx) }, "cuCtxPushCurrent");
            let was_pushed = pushed.is_ok();
            let synced = pushed.and_then(|()| {
                // SAFETY: the context is current.
                raw(unsafe { d.cuCtxSynchronize() }, "cuCtxSynchronize")
            });
            if was_pushed {
                let mut popped: CUcontext = std::ptr::null_mut();
                // SAFETY: pops the context pushed above (only when the push succeeded: else
                // this would pop the caller's own).
                let _ = unsafe { d.cuCtxPopCurrent(&mut popped) };
            }
            match synced {
                Ok(()) => Ok(ctx),
                Err(e) => {
                    // SAFETY: the retain made above.
                    let _ = unsafe { d.cuDevicePrimaryCtxRelease(device.raw) };
                    Err(e)
                }
            }
        })();
        match tried {
            Ok(ctx) => {
                if ours != 0 {
                    // The reset kept this crate's earlier retain: give back this one, so that
                    // the count stays one. (A device this crate never retained keeps this
                    // one, as `primary_context` would have made it.)
                    // SAFETY: the retain made in the try.
                    let _ = unsafe { d.cuDevicePrimaryCtxRelease(device.raw) };
                }
                PRIMARY[device.ordinal as usize].store(ctx as usize, Ordering::Release);
                return Ok(Ok(()));
            }
            Err(e) if started.elapsed() >= RESET_RECOVERY => return Ok(Err(e)),
            Err(_) => {
                std::thread::sleep(std::time::Duration::from_millis(100));
                // SAFETY: as the first reset; the device's state is still closed.
                let _ = unsafe { d.cuDevicePrimaryCtxReset(device.raw) };
            }
        }
    }
}

impl Device {
    /// A device value for unit tests that never reach the driver.
    #[cfg(test)]
    pub(crate) fn test_only(ordinal: i32) -> Device {
        Device {
            ordinal,
            raw: ordinal,
            generation: 0,
        }
    }

    /// This device value with another generation (tests of stale handles).
    #[cfg(test)]
    pub(crate) fn with_generation(self, generation: u32) -> Device {
        Device { generation, ..self }
    }

    /// The device with this ordinal; [`Error::InvalidDevice`] when it does not exist.
    pub fn new(ordinal: usize) -> Result<Device> {
        let count = crate::device_count()?;
        if ordinal >= count || ordinal >= MAX_DEVICES {
            return Err(Error::InvalidDevice { ordinal, count });
        }
        let mut raw = 0;
        // SAFETY: valid out-pointer, ordinal checked against the count.
        unsafe { drv!(cuDeviceGet(&mut raw, ordinal as c_int)) }?;
        Ok(Device {
            ordinal: ordinal as i32,
            raw,
            generation: crate::health::generation(ordinal),
        })
    }

    /// The context generation this value carries (see [`crate::health`]).
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// This device with the current generation: what a new handle stores.
    pub fn stamped(&self) -> Device {
        Device {
            generation: crate::health::generation(self.ordinal as usize),
            ..*self
        }
    }

    /// The state of this device's context: healthy, or lost with the sticky error that
    /// lost it, and its generation. Asks no driver.
    pub fn health(&self) -> crate::health::Health {
        crate::health::health(self.ordinal as usize)
    }

    /// Resets this device's primary context after a fault (`cuDevicePrimaryCtxReset`), once
    /// no thread is inside a call of this crate on it (calls that start meanwhile fail with
    /// [`Error::ContextLost`]; after [`crate::health::RESET_WAIT`], [`Error::Timeout`] and
    /// nothing is reset), and starts a new context generation.
    ///
    /// Every handle of the old context (streams, events, memory, pool blocks, modules,
    /// graphs) fails closed afterwards with [`Error::ContextLost`], and dropping one frees
    /// nothing. New handles work. A healthy context may be reset too: its handles fail
    /// closed the same way. See [`crate::health`] for what a service does around it.
    pub fn reset_after_fault(&self) -> Result<()> {
        crate::health::reset(self)
    }

    /// Every device, in ordinal order.
    pub fn all() -> Result<Vec<Device>> {
        (0..crate::device_count()?).map(Device::new).collect()
    }

    /// The thread's current device: the device of the current context, or device 0 when no
    /// context is current (CuPy's default).
    pub fn current() -> Result<Device> {
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        unsafe { drv!(cuCtxGetCurrent(&mut ctx)) }?;
        if ctx.is_null() {
            return Device::new(0);
        }
        let mut raw = 0;
        // SAFETY: a context is current; valid out-pointer.
        unsafe { drv!(cuCtxGetDevice(&mut raw)) }?;
        Device::from_raw(raw)
    }

    /// The `Device` for a driver `CUdevice` handle.
    pub fn from_raw(raw: CUdevice) -> Result<Device> {
        // On every current driver the handle equals the ordinal; check rather than assume.
        let count = crate::device_count()?;
        for ordinal in 0..count.min(MAX_DEVICES) {
            let dev = Device::new(ordinal)?;
            if dev.raw == raw {
                return Ok(dev);
            }
        }
        Err(Error::InvalidDevice {
            ordinal: usize::try_from(raw).unwrap_or(usize::MAX),
            count,
        })
    }

    /// The ordinal (CuPy's `Device.id`).
    pub fn ordinal(&self) -> usize {
        self.ordinal as usize
    }

    /// The driver handle.
    pub fn raw(&self) -> CUdevice {
        self.raw
    }

    /// The device's primary context, retained on first use and kept for the process's life.
    pub fn primary_context(&self) -> Result<CUcontext> {
        let slot = &PRIMARY[self.ordinal as usize];
        let known = slot.load(Ordering::Acquire);
        if known != 0 {
            return Ok(known as CUcontext);
        }
        let _init = PRIMARY_INIT.lock().unwrap_or_else(PoisonError::into_inner);
        let known = slot.load(Ordering::Acquire);
        if known != 0 {
            return Ok(known as CUcontext);
        }
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: valid device and out-pointer. The retain is never released: the context
        // lives as long as the process, as the runtime's does.
        unsafe { drv!(cuDevicePrimaryCtxRetain(&mut ctx, self.raw)) }?;
        slot.store(ctx as usize, Ordering::Release);
        Ok(ctx)
    }

    /// Makes this device current on the calling thread (CuPy's `Device.use()`).
    pub fn make_current(&self) -> Result<()> {
        let ctx = self.primary_context()?;
        crate::context_note::forget_context();
        // SAFETY: a retained primary context.
        unsafe { drv!(cuCtxSetCurrent(ctx)) }
    }

    /// Makes this device current until the guard drops, then restores whatever was current
    /// before (CuPy's `with Device(n):`). Guards nest. The guard stays on its thread.
    pub fn scope(&self) -> Result<DeviceScope> {
        let mut previous: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        unsafe { drv!(cuCtxGetCurrent(&mut previous)) }?;
        self.make_current()?;
        Ok(DeviceScope {
            previous,
            _not_send: PhantomData,
        })
    }

    /// Blocks until all work on this device is done.
    pub fn synchronize(&self) -> Result<()> {
        let _ctx = self.stamped().bind()?;
        // SAFETY: this device's context is current.
        unsafe { drv!(cuCtxSynchronize()) }
    }

    /// Makes this device's context current for the life of the returned guard, only if it is
    /// not already (then the guard does nothing). Every `cuda-core` operation that needs a
    /// current context goes through this, so it never depends on what the caller made current.
    ///
    /// Fails with [`Error::ContextLost`], without calling the driver, while the device's
    /// context is lost or being reset, and for a value of an ended context generation (the
    /// device of a handle made before a [`Device::reset_after_fault`]; a `Device` kept from
    /// before the reset binds with [`Device::stamped`]). The device's own methods
    /// (`synchronize`, `memory_info`, ...) and the constructors of handles take any `Device`
    /// value: they stamp it with the current generation first.
    pub fn bind(&self) -> Result<ContextBinding> {
        let call = crate::health::enter(self)?;
        let target = self.primary_context()?;
        let mut current: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        unsafe { drv!(cuCtxGetCurrent(&mut current)) }?;
        if current == target {
            return Ok(ContextBinding {
                pushed: false,
                _call: call,
                _not_send: PhantomData,
            });
        }
        // The thread's current context changes: what this crate noted about it is stale.
        crate::context_note::forget_context();
        // SAFETY: a retained primary context; popped by the binding's Drop.
        unsafe { drv!(cuCtxPushCurrent(target)) }?;
        Ok(ContextBinding {
            pushed: true,
            _call: call,
            _not_send: PhantomData,
        })
    }

    /// Any device attribute (`cuDeviceGetAttribute`).
    pub fn attribute(&self, attribute: CUdevice_attribute) -> Result<i32> {
        let mut value = 0;
        // SAFETY: valid out-pointer and device.
        unsafe { drv!(cuDeviceGetAttribute(&mut value, attribute, self.raw)) }?;
        Ok(value)
    }

    /// The device's name ("NVIDIA H200").
    pub fn name(&self) -> Result<String> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: the buffer holds `len` bytes.
        unsafe {
            drv!(cuDeviceGetName(
                buf.as_mut_ptr(),
                buf.len() as c_int,
                self.raw
            ))
        }?;
        // SAFETY: the driver wrote a NUL-terminated string into the buffer.
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    /// Compute capability as `(major, minor)`: `(9, 0)` on Hopper.
    pub fn compute_capability(&self) -> Result<(u32, u32)> {
        let major =
            self.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor =
            self.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        Ok((major as u32, minor as u32))
    }

    /// Total device memory in bytes.
    pub fn total_memory(&self) -> Result<usize> {
        let mut bytes = 0;
        // SAFETY: valid out-pointer and device.
        unsafe { drv!(cuDeviceTotalMem(&mut bytes, self.raw)) }?;
        Ok(bytes)
    }

    /// `(free, total)` device memory in bytes right now (`cuMemGetInfo`).
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        let _ctx = self.stamped().bind()?;
        let (mut free, mut total) = (0, 0);
        // SAFETY: this device's context is current; valid out-pointers.
        unsafe { drv!(cuMemGetInfo(&mut free, &mut total)) }?;
        Ok((free, total))
    }

    /// Number of streaming multiprocessors.
    pub fn multiprocessor_count(&self) -> Result<u32> {
        Ok(self.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32)
    }

    /// The device's UUID.
    pub fn uuid(&self) -> Result<Uuid> {
        let mut uuid = cudars_sys::CUuuid::default();
        // SAFETY: valid out-pointer and device.
        unsafe { drv!(cuDeviceGetUuid(&mut uuid, self.raw)) }?;
        Ok(Uuid(uuid.bytes.map(|b| b as u8)))
    }

    /// PCI bus id, `domain:bus:device.function` ("0000:19:00.0").
    pub fn pci_bus_id(&self) -> Result<String> {
        let mut buf = [0 as c_char; 64];
        // SAFETY: the buffer holds `len` bytes.
        unsafe {
            drv!(cuDeviceGetPCIBusId(
                buf.as_mut_ptr(),
                buf.len() as c_int,
                self.raw
            ))
        }?;
        // SAFETY: the driver wrote a NUL-terminated string.
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    /// Stream priorities this device supports, as `(least, greatest)`; numerically the
    /// greatest priority is the smallest number (`(0, -5)` on Hopper).
    pub fn stream_priority_range(&self) -> Result<(i32, i32)> {
        let _ctx = self.stamped().bind()?;
        let (mut least, mut greatest) = (0, 0);
        // SAFETY: context current; valid out-pointers.
        unsafe { drv!(cuCtxGetStreamPriorityRange(&mut least, &mut greatest)) }?;
        Ok((least, greatest))
    }

    /// Whether this device can address `peer`'s memory directly.
    pub fn can_access_peer(&self, peer: &Device) -> Result<bool> {
        if peer == self {
            return Ok(false);
        }
        let mut can = 0;
        // SAFETY: valid out-pointer and devices.
        unsafe { drv!(cuDeviceCanAccessPeer(&mut can, self.raw, peer.raw)) }?;
        Ok(can != 0)
    }

    /// Lets this device's context address `peer`'s memory. Enabling twice is not an error.
    pub fn enable_peer_access(&self, peer: &Device) -> Result<()> {
        if peer == self {
            return Err(Error::InvalidArgument(
                "peer access from a device to itself".into(),
            ));
        }
        // The peer's context is used for the whole call: a reset of the peer waits for it.
        let _peer = crate::health::enter(&peer.stamped())?;
        let peer_ctx = peer.primary_context()?;
        let _ctx = self.stamped().bind()?;
        // SAFETY: this device's context is current; the peer context is retained.
        match unsafe { drv!(cuCtxEnablePeerAccess(peer_ctx, 0)) } {
            Err(Error::Driver(e))
                if e.result() == CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED =>
            {
                Ok(())
            }
            other => other,
        }
    }
}

/// A device UUID (16 bytes); displays as `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` like
/// `nvidia-smi`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Uuid(pub [u8; 16]);

impl std::fmt::Display for Uuid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GPU-")?;
        for (i, b) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                write!(f, "-")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// Restores the previously current context when dropped (see [`Device::scope`]).
/// Not `Send`: the current context is per thread.
#[must_use = "the previous device is restored when the guard drops"]
#[derive(Debug)]
pub struct DeviceScope {
    previous: CUcontext,
    _not_send: PhantomData<*const ()>,
}

impl Drop for DeviceScope {
    fn drop(&mut self) {
        // SAFETY: `previous` was current on this thread (or null) when the scope began.
        // A failure here cannot be reported from Drop; the driver keeps its state.
        let _ = unsafe { drv!(cuCtxSetCurrent(self.previous)) };
        crate::context_note::forget_context();
    }
}

/// Keeps a device's context current for an operation (see [`Device::bind`]).
#[must_use]
#[derive(Debug)]
pub struct ContextBinding {
    pushed: bool,
    /// Counts this thread inside a call on the device until the binding drops (a reset
    /// waits for it).
    _call: crate::health::InCall,
    _not_send: PhantomData<*const ()>,
}

impl ContextBinding {
    /// Whether the binding pushed the context (it was not current).
    pub(crate) fn pushed(&self) -> bool {
        self.pushed
    }
}

impl Drop for ContextBinding {
    fn drop(&mut self) {
        if self.pushed {
            let mut popped: CUcontext = std::ptr::null_mut();
            // SAFETY: we pushed exactly one context on this thread.
            let _ = unsafe { drv!(cuCtxPopCurrent(&mut popped)) };
            crate::context_note::forget_context();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn equality_and_hashing_name_the_device_not_its_generation() {
        let a = Device::test_only(3);
        let b = a.with_generation(5);
        assert_eq!(a, b, "one device, whatever the generation");
        assert_ne!(a.generation(), b.generation());
        assert_ne!(a, Device::test_only(4));
        let set: HashSet<Device> = [a, b].into_iter().collect();
        assert_eq!(set.len(), 1);
    }
}

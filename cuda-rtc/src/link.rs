//! [`Linker`]: nvJitLink over cubins, PTX and LTO-IR, into one cubin.

use std::ffi::{c_char, c_void, CString};

use cudars_rtc_sys::{nvJitLinkHandle, nvJitLinkInputType, nvJitLinkResult, NvJitLink};

use crate::arch::Arch;
use crate::compiler::Compiler;
use crate::error::{link_error, Error, Result};

/// An nvJitLink session: add inputs, then [`finish`](Self::finish) for the linked cubin and
/// the info log. nvJitLink is opened on first use (see [`Compiler`]).
///
/// ```no_run
/// use cudars_rtc::{Arch, Compiler, Linker, Output, Program};
/// let arch = Arch::new(9, 0);
/// let a = Program::new("extern __device__ float twice(float);\n\
///                       extern \"C\" __global__ void k(float* x) { x[0] = twice(x[0]); }")
///     .option("-rdc=true").arch(arch).output(Output::LtoIr).compile()?;
/// let b = Program::new("__device__ float twice(float v) { return 2 * v; }")
///     .option("-rdc=true").arch(arch).output(Output::LtoIr).compile()?;
/// let mut linker = Linker::new(Compiler::global()?, arch, &["-lto"])?;
/// linker.add_compiled(&a)?;
/// linker.add_compiled(&b)?;
/// let (cubin, _log) = linker.finish()?;
/// # Ok::<(), cudars_rtc::Error>(())
/// ```
pub struct Linker<'a> {
    jit: &'a NvJitLink,
    handle: nvJitLinkHandle,
}

impl<'a> Linker<'a> {
    /// A session for `arch` with nvJitLink `options` (`-lto`, `-O3`, `-lineinfo`, ...; the
    /// architecture option is added).
    pub fn new(compiler: &'a Compiler, arch: Arch, options: &[&str]) -> Result<Linker<'a>> {
        let jit = compiler.nvjitlink()?;
        let mut all = vec![format!("-arch={}", arch.sm())];
        all.extend(options.iter().map(|o| o.to_string()));
        let c: Vec<CString> = all
            .iter()
            .map(|o| {
                CString::new(o.as_str())
                    .map_err(|_| Error::InvalidArgument(format!("option `{o}` has a NUL byte")))
            })
            .collect::<Result<_>>()?;
        let mut ptrs: Vec<*const c_char> = c.iter().map(|o| o.as_ptr()).collect();
        let mut handle: nvJitLinkHandle = std::ptr::null_mut();
        // SAFETY: a valid out-pointer and an array of NUL-terminated options that outlive the
        // call (nvJitLink copies them).
        let r = unsafe { jit.nvJitLinkCreate(&mut handle, ptrs.len() as u32, ptrs.as_mut_ptr()) }?;
        if !r.is_success() {
            return Err(link_error(r, "nvJitLinkCreate", String::new()));
        }
        Ok(Linker { jit, handle })
    }

    fn add(&mut self, kind: nvJitLinkInputType, data: &[u8], name: &str) -> Result<()> {
        let cname = CString::new(name)
            .map_err(|_| Error::InvalidArgument("input name has a NUL byte".into()))?;
        // SAFETY: a live handle; `data` is `len` readable bytes for the call (nvJitLink copies
        // them); a NUL-terminated name.
        let r = unsafe {
            self.jit.nvJitLinkAddData(
                self.handle,
                kind,
                data.as_ptr() as *const c_void,
                data.len(),
                cname.as_ptr(),
            )
        }?;
        self.check(r, "nvJitLinkAddData")
    }

    /// Adds LTO-IR ([`Output::LtoIr`](crate::Output::LtoIr)) as bytes.
    ///
    /// # Safety
    ///
    /// `data` must be LTO-IR made by NVIDIA's tools (NVRTC with `-dlto`, `nvcc -dlto`),
    /// unmodified, or come from a source trusted as much: nvJitLink parses the bytes as
    /// NVVM bitcode and does not promise to survive crafted input.
    /// [`add_compiled`](Self::add_compiled) needs no such promise.
    pub unsafe fn add_ltoir(&mut self, data: &[u8], name: &str) -> Result<()> {
        self.add(nvJitLinkInputType::NVJITLINK_INPUT_LTOIR, data, name)
    }

    /// Adds a program this crate compiled ([`Output::LtoIr`](crate::Output::LtoIr),
    /// [`Output::Ptx`](crate::Output::Ptx), [`Output::Cubin`](crate::Output::Cubin) or
    /// [`Output::LtoCubin`](crate::Output::LtoCubin)), under its name.
    pub fn add_compiled(&mut self, compiled: &crate::Compiled) -> Result<()> {
        use crate::Output;
        let kind = match compiled.output() {
            Output::LtoIr => nvJitLinkInputType::NVJITLINK_INPUT_LTOIR,
            Output::Ptx => nvJitLinkInputType::NVJITLINK_INPUT_PTX,
            Output::Cubin | Output::LtoCubin => {
                match cudars_core::module::ImageKind::detect(compiled.image()) {
                    Some(cudars_core::module::ImageKind::Fatbin) => {
                        nvJitLinkInputType::NVJITLINK_INPUT_FATBIN
                    }
                    _ => nvJitLinkInputType::NVJITLINK_INPUT_CUBIN,
                }
            }
        };
        // The image is NVRTC's or nvJitLink's own output (compiled in this process, or read
        // from a cache entry this user wrote): what nvJitLink was made to read.
        self.add(kind, compiled.image(), compiled.name())
    }

    /// Adds PTX text.
    pub fn add_ptx(&mut self, ptx: &str, name: &str) -> Result<()> {
        self.add(
            nvJitLinkInputType::NVJITLINK_INPUT_PTX,
            ptx.as_bytes(),
            name,
        )
    }

    /// Adds a cubin as bytes.
    ///
    /// # Safety
    ///
    /// `data` must be a cubin made by NVIDIA's tools, unmodified, or come from a source
    /// trusted as much (the contract of `cudars_core::Module::from_cubin`): nvJitLink follows
    /// the indices and offsets inside it.
    pub unsafe fn add_cubin(&mut self, data: &[u8], name: &str) -> Result<()> {
        self.add(nvJitLinkInputType::NVJITLINK_INPUT_CUBIN, data, name)
    }

    fn log(&self, info: bool) -> String {
        let mut size = 0usize;
        // SAFETY: a live handle, valid out-pointers, a buffer of the size just reported.
        unsafe {
            let sized = if info {
                self.jit.nvJitLinkGetInfoLogSize(self.handle, &mut size)
            } else {
                self.jit.nvJitLinkGetErrorLogSize(self.handle, &mut size)
            };
            if !matches!(sized, Ok(r) if r.is_success()) || size == 0 {
                return String::new();
            }
            let mut buf = vec![0u8; size];
            let p = buf.as_mut_ptr() as *mut c_char;
            let got = if info {
                self.jit.nvJitLinkGetInfoLog(self.handle, p)
            } else {
                self.jit.nvJitLinkGetErrorLog(self.handle, p)
            };
            if !matches!(got, Ok(r) if r.is_success()) {
                return String::new();
            }
            let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
            String::from_utf8_lossy(&buf[..end]).trim_end().to_string()
        }
    }

    fn check(&self, r: nvJitLinkResult, call: &'static str) -> Result<()> {
        if r.is_success() {
            Ok(())
        } else {
            Err(link_error(r, call, self.log(false)))
        }
    }

    /// Links: the cubin, and nvJitLink's info log.
    pub fn finish(self) -> Result<(Vec<u8>, String)> {
        // SAFETY: a live handle.
        let r = unsafe { self.jit.nvJitLinkComplete(self.handle) }?;
        self.check(r, "nvJitLinkComplete")?;
        let mut size = 0usize;
        // SAFETY: a live, completed handle; valid out-pointer.
        let r = unsafe { self.jit.nvJitLinkGetLinkedCubinSize(self.handle, &mut size) }?;
        self.check(r, "nvJitLinkGetLinkedCubinSize")?;
        let mut cubin = vec![0u8; size];
        // SAFETY: the buffer holds the `size` bytes just reported.
        let r = unsafe {
            self.jit
                .nvJitLinkGetLinkedCubin(self.handle, cubin.as_mut_ptr() as *mut c_void)
        }?;
        self.check(r, "nvJitLinkGetLinkedCubin")?;
        Ok((cubin, self.log(true)))
    }

    /// Links and loads the cubin on `device`: the module, and nvJitLink's info log. Safe
    /// where loading [`finish`](Self::finish)'s bytes yourself is not: these are nvJitLink's
    /// own output, never touched in between.
    pub fn load(self, device: &cudars_core::Device) -> Result<(crate::KernelModule, String)> {
        let (cubin, log) = self.finish()?;
        // SAFETY: nvJitLink's linked cubin, unmodified (it has not left this function).
        let module = unsafe { cudars_core::Module::from_cubin(device, &cubin)? };
        Ok((crate::KernelModule::new(module, Vec::new(), None), log))
    }
}

impl Drop for Linker<'_> {
    fn drop(&mut self) {
        // SAFETY: a live handle, destroyed once.
        let _ = unsafe { self.jit.nvJitLinkDestroy(&mut self.handle) };
    }
}

//! [`Program`]: CUDA C++ source, its in-memory headers and options, compiled by NVRTC into PTX,
//! a cubin, or LTO-IR (linked by nvJitLink into a cubin), through the [`Cache`].

use std::ffi::{c_char, CString};
use std::sync::Arc;

use cudars_core::module::ImageKind;
use cudars_core::Device;
use cudars_rtc_sys::{nvrtcProgram, nvrtcResult};

use crate::arch::Arch;
use crate::cache::{Cache, CacheKey, Entry, KeyInputs, Origin};
use crate::compiler::Compiler;
use crate::error::{check, nvrtc_error, Error, Result};
use crate::includes::{self, Scan};
use crate::kernel::KernelModule;
use crate::link::Linker;
pub use crate::output::Output;

/// Which cache a compile goes through.
#[derive(Debug, Clone, Copy)]
enum CacheChoice<'c> {
    Global,
    This(&'c Cache),
    None,
}

/// CUDA C++ source to compile at run time (CuPy's `RawModule(code=...)`, NVIDIA's
/// `cuda.core.Program`).
///
/// ```no_run
/// use cudars_rtc::{Output, Program};
/// let dev = cudars_core::Device::new(0)?;
/// let compiled = Program::new(r#"
///     #include "scale.h"
///     template <typename T>
///     __global__ void scale(T* x, T a, unsigned long long n) {
///         unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
///         if (i < n) x[i] = SCALE(x[i], a);
///     }
/// "#)
/// .name("scale.cu")
/// .header("scale.h", "#define SCALE(x, a) ((x) * (a))")
/// .std(17)
/// .fast_math()
/// .name_expression("scale<float>")
/// .device(&dev)?
/// .output(Output::Cubin)
/// .compile()?;
/// println!("compiled from {:?}; warnings: {}", compiled.origin(), compiled.log());
/// let module = compiled.load(&dev)?;
/// let kernel = module.kernel("scale<float>")?; // found by its lowered (mangled) name
/// # Ok::<(), cudars_rtc::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Program<'c> {
    source: String,
    name: String,
    headers: Vec<(String, String)>,
    options: Vec<String>,
    name_expressions: Vec<String>,
    arch: Option<Arch>,
    output: Output,
    cache: CacheChoice<'c>,
}

impl<'c> Program<'c> {
    /// A program of `source`, named `program.cu`, no headers or options, compiled to a cubin
    /// through [`Cache::global`].
    pub fn new(source: impl Into<String>) -> Program<'c> {
        Program {
            source: source.into(),
            name: "program.cu".into(),
            headers: Vec::new(),
            options: Vec::new(),
            name_expressions: Vec::new(),
            arch: None,
            output: Output::Cubin,
            cache: CacheChoice::Global,
        }
    }

    /// The program's name (as the compiler's messages show it).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// An in-memory header: `#include "<name>"` in the source (or another header) gets `text`.
    pub fn header(mut self, name: impl Into<String>, text: impl Into<String>) -> Self {
        self.headers.push((name.into(), text.into()));
        self
    }

    /// One NVRTC option, as `nvcc` spells it (`-lineinfo`, `--use_fast_math`, `-DN=4`,
    /// `-I/path`, `--std=c++17`, `-G`). The architecture is set by [`arch`](Self::arch) or
    /// [`device`](Self::device), not by an option.
    pub fn option(mut self, option: impl Into<String>) -> Self {
        self.options.push(option.into());
        self
    }

    /// Several options, in order.
    pub fn options<I, S>(mut self, options: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.options.extend(options.into_iter().map(Into::into));
        self
    }

    /// `--std=c++<year>` (`11`, `14`, `17`, `20`).
    pub fn std(self, year: u32) -> Self {
        self.option(format!("--std=c++{year}"))
    }

    /// `-D<name>=<value>`.
    pub fn define(self, name: &str, value: impl std::fmt::Display) -> Self {
        self.option(format!("-D{name}={value}"))
    }

    /// `--use_fast_math`.
    pub fn fast_math(self) -> Self {
        self.option("--use_fast_math")
    }

    /// `-I<dir>`: headers on disk. The cache key covers the files found there (see
    /// [`crate::includes`]).
    pub fn include_path(self, dir: impl AsRef<std::path::Path>) -> Self {
        self.option(format!("-I{}", dir.as_ref().display()))
    }

    /// `-lineinfo`: line information for profilers and compute-sanitizer.
    pub fn line_info(self) -> Self {
        self.option("-lineinfo")
    }

    /// `-G`: device debug information (slow code).
    pub fn device_debug(self) -> Self {
        self.option("-G")
    }

    /// A C++ name to instantiate and look up after compiling (`reduce<float, 256>`,
    /// `&ns::kernel`): [`KernelModule::kernel`] then finds the kernel by this expression,
    /// through its lowered (mangled) name.
    pub fn name_expression(mut self, expression: impl Into<String>) -> Self {
        self.name_expressions.push(expression.into());
        self
    }

    /// Compiles for `arch`.
    pub fn arch(mut self, arch: Arch) -> Self {
        self.arch = Some(arch);
        self
    }

    /// Compiles for `device`'s architecture (its compute capability).
    pub fn device(self, device: &Device) -> Result<Self> {
        Ok(self.arch(Arch::of(device)?))
    }

    /// What to produce ([`Output::Cubin`] by default).
    pub fn output(mut self, output: Output) -> Self {
        self.output = output;
        self
    }

    /// Compiles through `cache` instead of [`Cache::global`].
    pub fn cache(mut self, cache: &'c Cache) -> Self {
        self.cache = CacheChoice::This(cache);
        self
    }

    /// Compiles without any cache.
    pub fn no_cache(mut self) -> Self {
        self.cache = CacheChoice::None;
        self
    }

    /// The options NVRTC gets: the program's, then the architecture's.
    fn nvrtc_options(&self, arch: Arch) -> Vec<String> {
        let mut all = self.options.clone();
        match self.output {
            Output::Cubin => all.push(format!("--gpu-architecture={}", arch.sm())),
            Output::Ptx => all.push(format!("--gpu-architecture={}", arch.compute())),
            Output::LtoIr | Output::LtoCubin => {
                all.push(format!("--gpu-architecture={}", arch.compute()));
                all.push("-dlto".into());
            }
        }
        all
    }

    /// The cache key of this program with `compiler`, as of now: it covers the files its
    /// `#include`s reach on disk (see [`crate::includes`]), so it changes when they do.
    /// `None` when the program cannot be cached (a computed `#include MACRO`, too many files
    /// reached): such a program is compiled every time.
    pub fn cache_key(&self, compiler: &Compiler) -> Result<Option<CacheKey>> {
        let arch = self.arch.ok_or_else(no_arch)?;
        Ok(match self.scan_includes() {
            Scan::Complete { digest, .. } => Some(self.key_inputs(compiler, arch, digest).key()),
            Scan::Uncacheable(_) => None,
        })
    }

    /// Why this program cannot be cached, if it cannot: [`compile`](Self::compile) then runs
    /// NVRTC every time. `None` when it can.
    pub fn uncacheable_reason(&self) -> Option<String> {
        match self.scan_includes() {
            Scan::Complete { .. } => None,
            Scan::Uncacheable(why) => Some(why),
        }
    }

    fn scan_includes(&self) -> Scan {
        includes::scan(&self.name, &self.source, &self.headers, &self.options)
    }

    fn key_inputs<'a>(&'a self, compiler: &Compiler, arch: Arch, disk: [u8; 32]) -> KeyInputs<'a> {
        KeyInputs {
            name: &self.name,
            source: &self.source,
            headers: &self.headers,
            options: &self.options,
            name_expressions: &self.name_expressions,
            disk,
            compiler: compiler.version(),
            arch,
            output: self.output,
        }
    }

    /// Compiles with [`Compiler::global`], through the cache chosen (by default
    /// [`Cache::global`]): an entry in memory or on disk is used as it is; otherwise NVRTC
    /// compiles, and the result is cached.
    pub fn compile(&self) -> Result<Compiled> {
        self.compile_with(Compiler::global()?)
    }

    /// Compiles with `compiler`, through the cache chosen.
    ///
    /// The key covers every file the program's `#include`s can reach on disk (see
    /// [`crate::includes`]); a program whose includes cannot be resolved without the
    /// preprocessor ([`uncacheable_reason`](Self::uncacheable_reason)) is compiled every
    /// time and never cached ([`CacheStats::uncacheable`](crate::CacheStats::uncacheable)),
    /// and so is one whose headers changed while NVRTC read them.
    pub fn compile_with(&self, compiler: &Compiler) -> Result<Compiled> {
        let arch = self.arch.ok_or_else(no_arch)?;
        let cache = match self.cache {
            CacheChoice::Global => Some(Cache::global()),
            CacheChoice::This(c) => Some(c),
            CacheChoice::None => None,
        };
        let before = match (cache, self.scan_includes()) {
            (Some(_), Scan::Complete { digest, .. }) => Some(digest),
            (Some(c), Scan::Uncacheable(_)) => {
                c.note_uncacheable();
                None
            }
            (None, _) => None,
        };
        // An uncached compile still gets a key: of the program's own inputs, with no files.
        let key = self
            .key_inputs(compiler, arch, before.unwrap_or([0xff; 32]))
            .key();
        if let (Some(c), Some(_)) = (cache, before) {
            if let Some((entry, origin)) = c.get(&key) {
                return Ok(Compiled {
                    entry,
                    key,
                    origin,
                    name: self.name.clone(),
                });
            }
        }
        compiler.check_arch(arch)?;
        let entry = self.run_nvrtc(compiler, arch)?;
        let entry = match (cache, before) {
            // Only if nothing the compiler may have read changed while it ran.
            (Some(c), Some(digest)) => match self.scan_includes() {
                Scan::Complete { digest: after, .. } if after == digest => c.put(&key, entry),
                _ => {
                    c.note_uncacheable();
                    Arc::new(entry)
                }
            },
            _ => Arc::new(entry),
        };
        Ok(Compiled {
            entry,
            key,
            origin: Origin::Compiled,
            name: self.name.clone(),
        })
    }

    /// Compiles with NVRTC (and links with nvJitLink for [`Output::LtoCubin`]).
    fn run_nvrtc(&self, compiler: &Compiler, arch: Arch) -> Result<Entry> {
        let nvrtc = compiler.nvrtc();
        let nul = |what: &str, s: &str| {
            CString::new(s)
                .map_err(|_| Error::InvalidArgument(format!("{what} contains a NUL byte: {s:.40}")))
        };
        let source = nul("the source", &self.source)?;
        let name = nul("the program name", &self.name)?;
        let header_names = self
            .headers
            .iter()
            .map(|(n, _)| nul("a header name", n))
            .collect::<Result<Vec<_>>>()?;
        let header_texts = self
            .headers
            .iter()
            .map(|(n, t)| nul(&format!("header {n}"), t))
            .collect::<Result<Vec<_>>>()?;
        let exprs = self
            .name_expressions
            .iter()
            .map(|e| nul("a name expression", e))
            .collect::<Result<Vec<_>>>()?;
        let options = self.nvrtc_options(arch);
        let c_options = options
            .iter()
            .map(|o| nul("an option", o))
            .collect::<Result<Vec<_>>>()?;
        let text_ptrs: Vec<*const c_char> = header_texts.iter().map(|c| c.as_ptr()).collect();
        let name_ptrs: Vec<*const c_char> = header_names.iter().map(|c| c.as_ptr()).collect();
        let option_ptrs: Vec<*const c_char> = c_options.iter().map(|c| c.as_ptr()).collect();
        let n_headers = i32::try_from(self.headers.len())
            .map_err(|_| Error::InvalidArgument("too many headers".into()))?;
        let n_options = i32::try_from(options.len())
            .map_err(|_| Error::InvalidArgument("too many options".into()))?;

        let mut raw: nvrtcProgram = std::ptr::null_mut();
        // SAFETY: NUL-terminated strings and arrays of `n_headers` pointers that outlive the
        // call (NVRTC copies them); a valid out-pointer.
        let r = unsafe {
            nvrtc.nvrtcCreateProgram(
                &mut raw,
                source.as_ptr(),
                name.as_ptr(),
                n_headers,
                if text_ptrs.is_empty() {
                    std::ptr::null()
                } else {
                    text_ptrs.as_ptr()
                },
                if name_ptrs.is_empty() {
                    std::ptr::null()
                } else {
                    name_ptrs.as_ptr()
                },
            )
        }?;
        check(nvrtc, r, "nvrtcCreateProgram")?;
        let program = ProgramHandle { compiler, raw };
        for (expr, text) in exprs.iter().zip(&self.name_expressions) {
            // SAFETY: a live program, a NUL-terminated expression (NVRTC copies it).
            let r = unsafe { nvrtc.nvrtcAddNameExpression(program.raw, expr.as_ptr()) }?;
            if !r.is_success() {
                return Err(Error::NameExpression {
                    expression: text.clone(),
                    message: nvrtc_error(nvrtc, r, "nvrtcAddNameExpression").to_string(),
                });
            }
        }
        // SAFETY: a live program and an array of `n_options` NUL-terminated options that
        // outlive the call.
        let compiled = unsafe {
            nvrtc.nvrtcCompileProgram(
                program.raw,
                n_options,
                if option_ptrs.is_empty() {
                    std::ptr::null()
                } else {
                    option_ptrs.as_ptr()
                },
            )
        }?;
        let mut log = program.log()?;
        if compiled == nvrtcResult::NVRTC_ERROR_COMPILATION
            || compiled == nvrtcResult::NVRTC_ERROR_INVALID_OPTION
        {
            if compiled == nvrtcResult::NVRTC_ERROR_INVALID_OPTION {
                log = format!(
                    "{}\n{log}",
                    nvrtc_error(nvrtc, compiled, "nvrtcCompileProgram")
                );
            }
            return Err(Error::Compile {
                program: self.name.clone(),
                options: options.join(" "),
                log,
            });
        }
        check(nvrtc, compiled, "nvrtcCompileProgram")?;
        let mut lowered = Vec::new();
        for (expr, text) in exprs.iter().zip(&self.name_expressions) {
            let mut out: *const c_char = std::ptr::null();
            // SAFETY: a live, compiled program; the expression was added before compiling; a
            // valid out-pointer. The returned string lives as long as the program.
            let r = unsafe { nvrtc.nvrtcGetLoweredName(program.raw, expr.as_ptr(), &mut out) }?;
            if !r.is_success() || out.is_null() {
                return Err(Error::NameExpression {
                    expression: text.clone(),
                    message: nvrtc_error(nvrtc, r, "nvrtcGetLoweredName").to_string(),
                });
            }
            // SAFETY: NVRTC returned a NUL-terminated string owned by the live program; it is
            // copied at once.
            let name = unsafe { std::ffi::CStr::from_ptr(out) }
                .to_string_lossy()
                .into_owned();
            lowered.push((text.clone(), name));
        }
        let mut image = match self.output {
            Output::Ptx => program.output(OutputCall::Ptx)?,
            Output::Cubin => program.output(OutputCall::Cubin)?,
            Output::LtoIr | Output::LtoCubin => program.output(OutputCall::LtoIr)?,
        };
        if self.output == Output::Ptx {
            // NVRTC counts the terminating NUL: keep the text alone.
            while image.last() == Some(&0) {
                image.pop();
            }
        }
        drop(program);
        if self.output == Output::LtoCubin {
            let mut linker = Linker::new(compiler, arch, &["-lto"])?;
            // SAFETY: NVRTC's LTO-IR, made just above.
            unsafe { linker.add_ltoir(&image, &self.name)? };
            let (cubin, link_log) = linker.finish()?;
            image = cubin;
            if !link_log.trim().is_empty() {
                if !log.is_empty() && !log.ends_with('\n') {
                    log.push('\n');
                }
                log.push_str(&link_log);
            }
        }
        Ok(Entry {
            output: self.output,
            arch,
            image,
            log,
            lowered,
        })
    }
}

fn no_arch() -> Error {
    Error::InvalidArgument(
        "no architecture: call Program::arch(..) or Program::device(&device) before compiling"
            .into(),
    )
}

/// Which of NVRTC's outputs to fetch.
#[derive(Clone, Copy)]
enum OutputCall {
    Ptx,
    Cubin,
    LtoIr,
}

/// A live `nvrtcProgram`, destroyed on drop.
struct ProgramHandle<'a> {
    compiler: &'a Compiler,
    raw: nvrtcProgram,
}

impl ProgramHandle<'_> {
    /// The compile log (warnings, or errors).
    fn log(&self) -> Result<String> {
        let nvrtc = self.compiler.nvrtc();
        let mut size = 0usize;
        // SAFETY: a live program; valid out-pointer.
        let r = unsafe { nvrtc.nvrtcGetProgramLogSize(self.raw, &mut size) }?;
        check(nvrtc, r, "nvrtcGetProgramLogSize")?;
        let mut buf = vec![0u8; size.max(1)];
        // SAFETY: the buffer holds the `size` bytes NVRTC reported.
        let r = unsafe { nvrtc.nvrtcGetProgramLog(self.raw, buf.as_mut_ptr() as *mut c_char) }?;
        check(nvrtc, r, "nvrtcGetProgramLog")?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..end]).trim_end().to_string())
    }

    fn output(&self, which: OutputCall) -> Result<Vec<u8>> {
        let nvrtc = self.compiler.nvrtc();
        let mut size = 0usize;
        // SAFETY: a live, compiled program; valid out-pointers and a buffer of the size NVRTC
        // reported for the same output.
        unsafe {
            let (r, call) = match which {
                OutputCall::Ptx => (
                    nvrtc.nvrtcGetPTXSize(self.raw, &mut size)?,
                    "nvrtcGetPTXSize",
                ),
                OutputCall::Cubin => (
                    nvrtc.nvrtcGetCUBINSize(self.raw, &mut size)?,
                    "nvrtcGetCUBINSize",
                ),
                OutputCall::LtoIr => (
                    nvrtc.nvrtcGetLTOIRSize(self.raw, &mut size)?,
                    "nvrtcGetLTOIRSize",
                ),
            };
            check(nvrtc, r, call)?;
            let mut buf = vec![0u8; size];
            let p = buf.as_mut_ptr() as *mut c_char;
            let (r, call) = match which {
                OutputCall::Ptx => (nvrtc.nvrtcGetPTX(self.raw, p)?, "nvrtcGetPTX"),
                OutputCall::Cubin => (nvrtc.nvrtcGetCUBIN(self.raw, p)?, "nvrtcGetCUBIN"),
                OutputCall::LtoIr => (nvrtc.nvrtcGetLTOIR(self.raw, p)?, "nvrtcGetLTOIR"),
            };
            check(nvrtc, r, call)?;
            Ok(buf)
        }
    }
}

impl Drop for ProgramHandle<'_> {
    fn drop(&mut self) {
        // SAFETY: a live program, destroyed once; nothing uses it afterwards.
        let _ = unsafe { self.compiler.nvrtc().nvrtcDestroyProgram(&mut self.raw) };
    }
}

/// A compiled program: its image (PTX, cubin or LTO-IR), the compile log, the lowered names
/// of its name expressions, and where it came from ([`Origin`]). Cheap to clone.
#[derive(Debug, Clone)]
pub struct Compiled {
    entry: Arc<Entry>,
    key: CacheKey,
    origin: Origin,
    name: String,
}

impl Compiled {
    /// The image: PTX text (no NUL), a cubin, or LTO-IR.
    pub fn image(&self) -> &[u8] {
        &self.entry.image
    }

    /// The PTX text, when the output is PTX.
    pub fn ptx(&self) -> Option<&str> {
        match self.entry.output {
            Output::Ptx => std::str::from_utf8(&self.entry.image).ok(),
            _ => None,
        }
    }

    /// What the image is.
    pub fn output(&self) -> Output {
        self.entry.output
    }

    /// The architecture it was compiled for.
    pub fn arch(&self) -> Arch {
        self.entry.arch
    }

    /// NVRTC's log (warnings; empty when there were none), and nvJitLink's info log after it.
    pub fn log(&self) -> &str {
        &self.entry.log
    }

    /// The lowered (mangled) name of a name expression given to the program.
    pub fn lowered_name(&self, expression: &str) -> Option<&str> {
        self.entry
            .lowered
            .iter()
            .find(|(e, _)| e == expression)
            .map(|(_, l)| l.as_str())
    }

    /// Every `(name expression, lowered name)` pair.
    pub fn lowered_names(&self) -> &[(String, String)] {
        &self.entry.lowered
    }

    /// Compiled now, or found in memory or on disk.
    pub fn origin(&self) -> Origin {
        self.origin
    }

    /// The cache key.
    pub fn key(&self) -> CacheKey {
        self.key
    }

    /// The program's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Loads the image on `device` (a cubin directly; PTX through the driver's JIT). LTO-IR
    /// alone is not loadable: [`Error::InvalidArgument`].
    pub fn load(&self, device: &Device) -> Result<KernelModule> {
        let module =
            match self.entry.output {
                Output::LtoIr => return Err(Error::InvalidArgument(
                    "LTO-IR is not loadable: compile with Output::LtoCubin, or link it with Linker"
                        .into(),
                )),
                Output::Ptx => cudars_core::Module::from_ptx(
                    device,
                    self.ptx()
                        .ok_or_else(|| Error::InvalidArgument("PTX is not UTF-8".into()))?,
                )?,
                // The image is NVRTC's or nvJitLink's output, unmodified: compiled in this
                // process, or read from a disk cache entry that this user wrote (the cache
                // refuses entries and directories that another user owns or may write, and a
                // checksum finds accidental damage; see `cache`).
                Output::Cubin | Output::LtoCubin => match ImageKind::detect(&self.entry.image) {
                    // SAFETY: NVIDIA's tools made the image (above).
                    Some(ImageKind::Fatbin) => unsafe {
                        cudars_core::Module::from_fatbin(device, &self.entry.image)?
                    },
                    // SAFETY: NVIDIA's tools made the image (above).
                    _ => unsafe { cudars_core::Module::from_cubin(device, &self.entry.image)? },
                },
            };
        Ok(KernelModule::new(
            module,
            self.entry.lowered.clone(),
            self.ptx().map(Arc::from),
        ))
    }
}

//! [`KernelModule`]: a loaded program; [`Kernel`]: one of its kernels, with its parameters
//! known, launched with typed arguments ([`KernelArgs`]).

use std::collections::HashMap;
use std::sync::Arc;

use cudars_core::module::{Function, LaunchConfig, ParamInfo};
use cudars_core::{Device, Module, Stream};

use crate::args::KernelArgs;
use crate::error::{Error, Result};

/// A compiled program loaded on a device ([`Compiled::load`](crate::Compiled::load)).
/// Cheap to clone; `Send` and `Sync`.
#[derive(Debug, Clone)]
pub struct KernelModule {
    module: Module,
    lowered: Arc<HashMap<String, String>>,
    ptx: Option<Arc<str>>,
}

impl KernelModule {
    pub(crate) fn new(
        module: Module,
        lowered: Vec<(String, String)>,
        ptx: Option<Arc<str>>,
    ) -> Self {
        KernelModule {
            module,
            lowered: Arc::new(lowered.into_iter().collect()),
            ptx,
        }
    }

    /// The `cuda-core` module.
    pub fn module(&self) -> &Module {
        &self.module
    }

    /// The device it is loaded on.
    pub fn device(&self) -> Device {
        self.module.device()
    }

    /// The kernel `name`: a name expression given to the program (`reduce<float, 256>`),
    /// found by its lowered name, or else the kernel's symbol (an `extern "C"` name, or a
    /// mangled one). Its parameters come from the driver (`cuFuncGetParamInfo`, CUDA 12.4+),
    /// or, on an older driver, from the PTX when the program was compiled to PTX.
    pub fn kernel(&self, name: &str) -> Result<Kernel> {
        let symbol = self.lowered.get(name).map(String::as_str).unwrap_or(name);
        let function = self.module.function(symbol)?;
        let params = match function.param_info()? {
            Some(p) => Some(p),
            None => self.ptx.as_deref().and_then(|ptx| ptx_params(ptx, symbol)),
        };
        Ok(Kernel::with_params(function, params, name))
    }
}

/// A kernel, its parameters (when known) and its name: launched with typed arguments.
///
/// [`launch`](Self::launch) checks the arguments' count and sizes against the parameters the
/// driver reports and refuses a mismatch ([`Error::ArgCount`], [`Error::ArgSize`]) before
/// anything is issued; [`launch_unchecked`](Self::launch_unchecked) skips that check, for
/// kernels whose parameters are unknown. Both mark every buffer argument as used by the
/// launch stream (see [`KernelArg`](crate::KernelArg)), under `cuda-core`'s issue guard, as
/// `cuda-core`'s own safe launchers do. Cheap to clone; `Send` and `Sync`.
///
/// Both are `unsafe`: a kernel is C++ that Rust cannot see into. A size check cannot tell a
/// `float*` from a `long long`, nor whether the kernel stays inside the buffers it is given;
/// the caller vouches for that.
#[derive(Debug, Clone)]
pub struct Kernel {
    function: Function,
    params: Option<Arc<[ParamInfo]>>,
    name: Arc<str>,
}

impl Kernel {
    /// A kernel of a `cuda-core` function; its parameters are asked of the driver
    /// (`None` before CUDA 12.4).
    pub fn from_function(function: Function) -> Result<Kernel> {
        let params = function.param_info()?;
        let name = function.name().to_string();
        Ok(Kernel::with_params(function, params, &name))
    }

    /// A kernel whose parameters are `params` (recorded elsewhere, or `None`: unknown).
    pub fn with_params(function: Function, params: Option<Vec<ParamInfo>>, name: &str) -> Kernel {
        Kernel {
            function,
            params: params.map(Arc::from),
            name: Arc::from(name),
        }
    }

    /// The `cuda-core` function.
    pub fn function(&self) -> &Function {
        &self.function
    }

    /// The parameters' offsets and sizes, when known.
    pub fn params(&self) -> Option<&[ParamInfo]> {
        self.params.as_deref()
    }

    /// The name it was looked up by.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device of its module.
    pub fn device(&self) -> Device {
        self.function.device()
    }

    /// `Ok` when arguments of type `A` match the kernel's parameters in count and sizes;
    /// [`Error::SignatureUnknown`] when the parameters are unknown.
    pub fn check<A: KernelArgs>(&self) -> Result<()> {
        match &self.params {
            Some(p) => A::check(&self.name, p),
            None => Err(Error::SignatureUnknown {
                kernel: self.name.to_string(),
            }),
        }
    }

    /// The block size with the most resident threads for `dynamic_shared_bytes` of dynamic
    /// shared memory per block, and the smallest grid that fills the device at that size
    /// (`cuOccupancyMaxPotentialBlockSize`): `(min_grid, block)`.
    pub fn max_potential_block_size(&self, dynamic_shared_bytes: u32) -> Result<(u32, u32)> {
        Ok(self
            .function
            .max_potential_block_size(dynamic_shared_bytes as usize, 0)?)
    }

    /// A one-dimensional launch over `n` elements (one thread each), with the block size from
    /// [`max_potential_block_size`](Self::max_potential_block_size) and `dynamic_shared_bytes`
    /// per block.
    pub fn config_for_elements(&self, n: u64, dynamic_shared_bytes: u32) -> Result<LaunchConfig> {
        let (_, block) = self.max_potential_block_size(dynamic_shared_bytes)?;
        Ok(LaunchConfig::for_elements(n, block.max(1)).shared_mem(dynamic_shared_bytes))
    }

    /// Checks `args` against the kernel's parameters ([`check`](Self::check)), then launches
    /// as [`launch_unchecked`](Self::launch_unchecked). A mismatch, or unknown parameters,
    /// is an error and nothing is issued.
    ///
    /// # Safety
    ///
    /// The kernel, run with these arguments on `config`'s grid, is free of undefined
    /// behaviour: each pointer argument is used as the type the kernel declares, every access
    /// stays inside the buffers passed (the lengths passed describe them), threads of the
    /// kernel do not race, and nothing the kernel writes is read or written by other work not
    /// ordered with it (the buffers passed are ordered for you: see the type's docs).
    #[inline]
    pub unsafe fn launch<A: KernelArgs>(
        &self,
        stream: &Stream,
        config: &LaunchConfig,
        args: A,
    ) -> Result<()> {
        self.check::<A>()?;
        // SAFETY: the arguments match the parameters in count and size (checked above); the
        // caller upholds the rest of the contract.
        unsafe { self.launch_unchecked(stream, config, args) }
    }

    /// Launches without checking the arguments against the parameters: each argument is
    /// prepared ([`KernelArg::prepare`](crate::KernelArg::prepare): device checked, memory
    /// marked on `stream`), then the kernel is queued on `stream`
    /// ([`Function::launch_with`]).
    ///
    /// # Safety
    ///
    /// [`launch`](Self::launch)'s contract, and: the arguments are exactly the kernel's
    /// parameters, in number, order, size and type.
    #[inline]
    pub unsafe fn launch_unchecked<A: KernelArgs>(
        &self,
        stream: &Stream,
        config: &LaunchConfig,
        args: A,
    ) -> Result<()> {
        let issue = stream.issue(self.function.device())?;
        args.prepare(&issue)?;
        // SAFETY: the caller upholds the parameter and memory contract; the buffers are
        // marked as used by `stream` above, inside the same gate, so they outlive the kernel.
        args.with_params(|params| unsafe { self.function.launch_with(&issue, config, params) })?;
        Ok(())
    }
}

/// The parameters of `.entry <entry>` in PTX text: offsets and sizes as the PTX declares them
/// (`.param .u64 p`, `.param .align 8 .b8 s[24]`), laid out as the driver lays them out.
/// `None` when the entry is not found or a parameter cannot be read.
pub fn ptx_params(ptx: &str, entry: &str) -> Option<Vec<ParamInfo>> {
    let mut at = 0;
    let start = loop {
        let found = ptx[at..].find(".entry")? + at;
        let rest = ptx[found + ".entry".len()..].trim_start();
        let name_end = rest
            .find(|c: char| c == '(' || c.is_whitespace())
            .unwrap_or(rest.len());
        if &rest[..name_end] == entry {
            break found
                + ".entry".len()
                + (ptx[found + ".entry".len()..].len() - rest.len())
                + name_end;
        }
        at = found + ".entry".len();
    };
    let rest = ptx[start..].trim_start();
    let Some(list) = rest.strip_prefix('(') else {
        // `.entry k` with no parameter list.
        return Some(Vec::new());
    };
    let list = &list[..list.find(')')?];
    let mut params = Vec::new();
    let mut offset = 0usize;
    for decl in list.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let words: Vec<&str> = decl.split_whitespace().collect();
        if words.first() != Some(&".param") {
            return None;
        }
        let mut elem = None;
        let mut align = None;
        let mut count = 1usize;
        // After `.ptr`, `.align N` is the pointee's alignment, not the parameter's.
        let mut pointer = false;
        let mut i = 1;
        while i < words.len() {
            let w = words[i];
            match w {
                ".ptr" => pointer = true,
                ".align" => {
                    let n = words.get(i + 1)?.parse::<usize>().ok()?;
                    if !pointer {
                        align = Some(n);
                    }
                    i += 1;
                }
                ".u8" | ".s8" | ".b8" => elem = Some(1),
                ".u16" | ".s16" | ".b16" | ".f16" | ".bf16" => elem = Some(2),
                ".u32" | ".s32" | ".b32" | ".f32" | ".f16x2" | ".bf16x2" => elem = Some(4),
                ".u64" | ".s64" | ".b64" | ".f64" => elem = Some(8),
                w if w.starts_with('.') => {} // .ptr, .global, .const, ...
                name => {
                    if let Some(open) = name.find('[') {
                        let close = name.find(']')?;
                        count = name[open + 1..close].parse().ok()?;
                    }
                }
            }
            i += 1;
        }
        let elem = elem?;
        let align = align.unwrap_or(elem).max(1);
        offset = offset.div_ceil(align) * align;
        let size = elem * count;
        params.push(ParamInfo { offset, size });
        offset += size;
    }
    Some(params)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PTX: &str = r#"
.version 8.0
.target sm_90
.address_size 64

.visible .entry other(
    .param .u32 other_param_0
)
{ ret; }

.visible .entry _Z5saxpyfPKfPfy(
	.param .f32 _Z5saxpyfPKfPfy_param_0,
	.param .u64 .ptr .global .align 4 _Z5saxpyfPKfPfy_param_1,
	.param .u64 _Z5saxpyfPKfPfy_param_2,
	.param .align 8 .b8 _Z5saxpyfPKfPfy_param_3[24],
	.param .u8 _Z5saxpyfPKfPfy_param_4,
	.param .u16 _Z5saxpyfPKfPfy_param_5
)
{ ret; }

.visible .entry noargs()
{ ret; }
"#;

    #[test]
    fn ptx_parameters_are_laid_out_as_the_driver_does() {
        let p = ptx_params(PTX, "_Z5saxpyfPKfPfy").unwrap();
        let got: Vec<(usize, usize)> = p.iter().map(|p| (p.offset, p.size)).collect();
        assert_eq!(
            got,
            vec![(0, 4), (8, 8), (16, 8), (24, 24), (48, 1), (50, 2)]
        );
        assert_eq!(ptx_params(PTX, "other").unwrap().len(), 1);
        assert_eq!(ptx_params(PTX, "noargs").unwrap().len(), 0);
        assert!(ptx_params(PTX, "missing").is_none());
        // A prefix of another entry's name is not that entry.
        assert!(ptx_params(PTX, "oth").is_none());
    }
}

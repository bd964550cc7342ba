//! [`Compiler`]: an opened NVRTC (and, on demand, nvJitLink) with its version and the
//! architectures it knows.

use std::ffi::OsString;
use std::fmt;
use std::sync::OnceLock;

use cudars_rtc_sys::{NvJitLink, Nvrtc};

use crate::arch::Arch;
use crate::error::{check, Error, Result};

/// An opened NVRTC, its version and supported architectures; nvJitLink is opened the first
/// time a program needs linking.
///
/// [`Compiler::global`] is the process-wide one ([`Program::compile`](crate::Program::compile)
/// uses it): NVRTC from `$CUDA_NVRTC_LIBRARY`, then `libnvrtc.so.13`, `libnvrtc.so.12`,
/// `libnvrtc.so`; nvJitLink from `$CUDA_NVJITLINK_LIBRARY`, then `libnvJitLink.so.13`,
/// `libnvJitLink.so.12`, `libnvJitLink.so`. Without NVRTC every compile is [`Error::Load`]
/// naming what was tried; nothing panics.
pub struct Compiler {
    nvrtc: Nvrtc,
    version: (u32, u32),
    archs: Vec<u32>,
    jitlink_candidates: Option<Vec<OsString>>,
    jitlink: OnceLock<Result<NvJitLink, cudars_rtc_sys::LoadError>>,
}

impl fmt::Debug for Compiler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Compiler")
            .field("nvrtc", &self.nvrtc.path())
            .field("version", &self.version)
            .field("archs", &self.archs)
            .finish_non_exhaustive()
    }
}

/// Why the process-wide compiler could not be made, kept to report again.
enum GlobalFailure {
    Load(cudars_rtc_sys::LoadError),
    MissingSymbol(cudars_rtc_sys::MissingSymbol),
    Other(String),
}

static GLOBAL: OnceLock<std::result::Result<Compiler, GlobalFailure>> = OnceLock::new();

impl Compiler {
    /// The process-wide compiler, opened on first use. A failure is remembered: later calls
    /// return the same error.
    pub fn global() -> Result<&'static Compiler> {
        let made = GLOBAL.get_or_init(|| {
            Nvrtc::load()
                .map_err(Error::from)
                .and_then(|n| Compiler::with(n, None))
                .map_err(|e| match e {
                    Error::Load(l) => GlobalFailure::Load(l),
                    Error::MissingSymbol(m) => GlobalFailure::MissingSymbol(m),
                    other => GlobalFailure::Other(other.to_string()),
                })
        });
        match made {
            Ok(c) => Ok(c),
            Err(GlobalFailure::Load(l)) => Err(Error::Load(l.clone())),
            Err(GlobalFailure::MissingSymbol(m)) => Err(Error::MissingSymbol(*m)),
            Err(GlobalFailure::Other(text)) => Err(Error::InvalidArgument(text.clone())),
        }
    }

    /// A compiler over the first NVRTC of `nvrtc` that opens, and (when linking is needed) the
    /// first nvJitLink of `nvjitlink` (names or paths, as `dlopen` takes them).
    pub fn open(nvrtc: &[OsString], nvjitlink: &[OsString]) -> Result<Compiler> {
        Compiler::with(Nvrtc::load_from(nvrtc)?, Some(nvjitlink.to_vec()))
    }

    fn with(nvrtc: Nvrtc, jitlink_candidates: Option<Vec<OsString>>) -> Result<Compiler> {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: valid out-pointers.
        let r = unsafe { nvrtc.nvrtcVersion(&mut major, &mut minor) }?;
        check(&nvrtc, r, "nvrtcVersion")?;
        let mut n = 0;
        // SAFETY: valid out-pointer.
        let archs = match unsafe { nvrtc.nvrtcGetNumSupportedArchs(&mut n) } {
            Ok(r) if r.is_success() && n > 0 => {
                let mut list = vec![0i32; n as usize];
                // SAFETY: the buffer holds the `n` entries NVRTC just reported.
                let r = unsafe { nvrtc.nvrtcGetSupportedArchs(list.as_mut_ptr()) }?;
                check(&nvrtc, r, "nvrtcGetSupportedArchs")?;
                list.into_iter().map(|a| a.max(0) as u32).collect()
            }
            // NVRTC before 11.2 cannot say: do not refuse anything up front.
            _ => Vec::new(),
        };
        Ok(Compiler {
            nvrtc,
            version: (major.max(0) as u32, minor.max(0) as u32),
            archs,
            jitlink_candidates,
            jitlink: OnceLock::new(),
        })
    }

    /// NVRTC's version, `(major, minor)`.
    pub fn version(&self) -> (u32, u32) {
        self.version
    }

    /// Where NVRTC was opened from.
    pub fn path(&self) -> &str {
        self.nvrtc.path()
    }

    /// The architectures NVRTC can compile for (`90` for sm_90); empty when it cannot say.
    pub fn supported_archs(&self) -> &[u32] {
        &self.archs
    }

    /// `Ok` when NVRTC knows `arch` (or cannot say), else [`Error::ArchUnsupported`].
    pub fn check_arch(&self, arch: Arch) -> Result<()> {
        if self.archs.is_empty() || self.archs.contains(&arch.number()) {
            return Ok(());
        }
        Err(Error::ArchUnsupported {
            arch: arch.sm(),
            version: format!("{}.{}", self.version.0, self.version.1),
            supported: self
                .archs
                .iter()
                .map(|a| format!("sm_{a}"))
                .collect::<Vec<_>>()
                .join(" "),
        })
    }

    pub(crate) fn nvrtc(&self) -> &Nvrtc {
        &self.nvrtc
    }

    /// nvJitLink, opened on first use.
    pub(crate) fn nvjitlink(&self) -> Result<&NvJitLink> {
        self.jitlink
            .get_or_init(|| match &self.jitlink_candidates {
                Some(c) => NvJitLink::load_from(c),
                None => NvJitLink::load(),
            })
            .as_ref()
            .map_err(|e| Error::Load(e.clone()))
    }
}

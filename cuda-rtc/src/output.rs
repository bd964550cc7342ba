//! [`Output`]: what a program compiles to (PTX, a cubin, LTO-IR, or LTO-IR linked into a
//! cubin), and its code in cache entries.

/// What a [`Program`](crate::Program) compiles to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Output {
    /// PTX text for the virtual architecture (`compute_90`): the driver JIT-compiles it at
    /// load, for this device and newer ones.
    Ptx,
    /// A cubin for the real architecture (`sm_90`): loads without JIT, this device family only.
    #[default]
    Cubin,
    /// LTO-IR (`-dlto`): not loadable by itself; for [`Linker`](crate::Linker) with other LTO-IR.
    LtoIr,
    /// LTO-IR linked by nvJitLink (`-lto`) into a cubin: whole-program optimisation at run
    /// time.
    LtoCubin,
}

impl Output {
    pub(crate) fn code(self) -> u8 {
        match self {
            Output::Ptx => 0,
            Output::Cubin => 1,
            Output::LtoIr => 2,
            Output::LtoCubin => 3,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<Output> {
        Some(match code {
            0 => Output::Ptx,
            1 => Output::Cubin,
            2 => Output::LtoIr,
            3 => Output::LtoCubin,
            _ => return None,
        })
    }
}

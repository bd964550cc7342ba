//! CPU, with NVRTC (feature `nvrtc-tests`): a kernel that sets a conditional node's condition
//! compiles with [`SET_CONDITIONAL_PRELUDE`] alone, to a cubin and to PTX that calls the
//! device runtime's `cudaGraphSetConditional`. No GPU needed, but libnvrtc must load
//! (`$CUDA_NVRTC_LIBRARY`); `cargo xtask ci` runs it when it finds the library.
#![cfg(feature = "nvrtc-tests")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use cudars_graph::SET_CONDITIONAL_PRELUDE;
use cudars_rtc::{Arch, Output, Program};

const KERNEL: &str = r#"
extern "C" __global__ void keep_going(cudaGraphConditionalHandle h, const unsigned* left) {
    if (blockIdx.x == 0 && threadIdx.x == 0) cudaGraphSetConditional(h, *left > 0);
}
"#;

#[test]
fn the_prelude_lets_nvrtc_compile_a_condition_setter() {
    let source = format!("{SET_CONDITIONAL_PRELUDE}{KERNEL}");
    for arch in ["sm_80", "sm_90"] {
        let arch = Arch::parse(arch).unwrap();
        let cubin = Program::new(source.clone())
            .arch(arch)
            .output(Output::Cubin)
            .no_cache()
            .compile()
            .unwrap_or_else(|e| panic!("{arch:?} cubin: {e}"));
        assert!(!cubin.image().is_empty());
        let ptx = Program::new(source.clone())
            .arch(arch)
            .output(Output::Ptx)
            .no_cache()
            .compile()
            .unwrap_or_else(|e| panic!("{arch:?} PTX: {e}"));
        let text = ptx.ptx().expect("PTX output");
        assert!(
            text.contains(".extern .func cudaGraphSetConditional"),
            "the device runtime's entry point is called:\n{text}"
        );
        assert!(text.contains(".entry keep_going"), "{text}");
    }
}

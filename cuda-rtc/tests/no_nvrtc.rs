//! CPU: what a machine without NVRTC or nvJitLink gets: typed errors naming what was tried,
//! never a panic.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use cudars_rtc::{Compiler, Error, Program};

#[test]
fn a_missing_nvrtc_is_a_load_error_naming_the_path_and_variable() {
    let err = Compiler::open(&["/nonexistent/libnvrtc.so.13".into()], &[]).unwrap_err();
    match &err {
        Error::Load(cudars_rtc_sys::LoadError::NotFound { tried, library, .. }) => {
            assert_eq!(*library, "NVRTC");
            assert_eq!(tried[0].0, "/nonexistent/libnvrtc.so.13");
        }
        other => panic!("{other:?}"),
    }
    let text = err.to_string();
    assert!(text.contains("CUDA_NVRTC_LIBRARY"), "{text}");
    // It converts into the workspace's error and keeps its message.
    let core: cudars_core::Error = err.into();
    assert!(core.to_string().contains("/nonexistent/libnvrtc.so.13"));
}

#[test]
fn a_library_without_nvrtc_symbols_is_a_missing_symbol_error() {
    // libc loads, but has no nvrtcVersion: the compiler refuses it with the entry point's name.
    match Compiler::open(&["libc.so.6".into()], &[]) {
        Err(Error::MissingSymbol(m)) => assert_eq!(m.name, "nvrtcVersion"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_program_without_an_architecture_is_refused() {
    // Whatever the compiler, no architecture is an error before anything is compiled.
    if let Ok(compiler) = Compiler::global() {
        let err = Program::new("__global__ void k() {}")
            .no_cache()
            .compile_with(compiler)
            .unwrap_err();
        assert!(err.to_string().contains("no architecture"), "{err}");
    }
}

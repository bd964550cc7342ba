//! Build script of `cuda-fft-sys`: bindgen over `cufft.h` and `cufftXt.h`, or the checked-in snapshot without
//! it (see `cudars_loader::build`).

use cudars_loader::build::{run, Library, Spec};

fn main() {
    run(&Spec {
        krate: "cuda-fft-sys",
        headers: &["cufft.h", "cufftXt.h"],
        include_env: "CUDA_FFT_INCLUDE_DIR",
        snapshot_env: "CUDA_FFT_SYS_USE_SNAPSHOT",
        source_env: "CUDA_FFT_SYS_BINDINGS_SOURCE",
        generated: "fft.rs",
        functions: &["cufft.*"],
        types: &["cufft.*", "cudaDataType.*"],
        vars: &["CUFFT.*"],
        blocklist_functions: &[],
        must_use: &["cufftResult", "cufftResult_t"],
        libraries: &[Library {
            owner: "Cufft",
            accessor: "cufft",
            prefix: "CUFFT",
            header: "cufft.h",
            function_prefixes: &["cufft"],
            name: "cuFFT",
            env: "CUDA_CUFFT_LIBRARY",
            names: &["libcufft.so.12", "libcufft.so.11", "libcufft.so"],
            dependencies: &[],
            wheel: "nvidia-cufft",
        }],
    });
}

//! Build script of `cuda-blas-sys`: bindgen over `cublas_v2.h` and `cublasLt.h`, or the
//! checked-in snapshot without them (see `cudars_loader::build`).

use cudars_loader::build::{run, Library, Spec};

fn main() {
    run(&Spec {
        krate: "cuda-blas-sys",
        headers: &["cublas_v2.h", "cublasLt.h"],
        include_env: "CUDA_BLAS_INCLUDE_DIR",
        snapshot_env: "CUDA_BLAS_SYS_USE_SNAPSHOT",
        source_env: "CUDA_BLAS_SYS_BINDINGS_SOURCE",
        generated: "blas.rs",
        functions: &["cublas.*"],
        types: &[
            "cublas.*",
            "__half",
            "__nv_bfloat16",
            "cuComplex",
            "cuDoubleComplex",
            "cudaDataType.*",
            "cublasLt.*",
        ],
        vars: &["CUBLAS.*"],
        // The logger callbacks take C varargs-free function pointers but log through stdio;
        // the safe layer has no use for them.
        blocklist_functions: &["cublasLtLoggerSetFile", "cublasLoggerConfigure"],
        must_use: &["cublasStatus_t"],
        libraries: &[
            Library {
                owner: "CublasLt",
                accessor: "cublaslt",
                prefix: "CUBLASLT",
                header: "cublasLt.h",
                function_prefixes: &["cublasLt"],
                name: "cuBLASLt",
                env: "CUDA_CUBLASLT_LIBRARY",
                names: &["libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"],
                dependencies: &[],
                wheel: "nvidia-cublas",
            },
            Library {
                owner: "Cublas",
                accessor: "cublas",
                prefix: "CUBLAS",
                header: "cublas_api.h",
                function_prefixes: &["cublas"],
                name: "cuBLAS",
                env: "CUDA_CUBLAS_LIBRARY",
                names: &["libcublas.so.13", "libcublas.so.12", "libcublas.so"],
                dependencies: &[("libcublasLt.so.", "cublas")],
                wheel: "nvidia-cublas",
            },
        ],
    });
}

//! Build script of `cuda-solver-sys`: bindgen over `cusolverDn.h`, or the checked-in snapshot
//! without it (see `cudars_loader::build`).

use cudars_loader::build::{run, Library, Spec};

fn main() {
    run(&Spec {
        krate: "cuda-solver-sys",
        headers: &["cusolverDn.h"],
        include_env: "CUDA_SOLVER_INCLUDE_DIR",
        snapshot_env: "CUDA_SOLVER_SYS_USE_SNAPSHOT",
        source_env: "CUDA_SOLVER_SYS_BINDINGS_SOURCE",
        generated: "solver.rs",
        functions: &["cusolverDn.*", "cusolverGetProperty", "cusolverGetVersion"],
        types: &[
            "cusolver.*",
            "cublasFillMode_t",
            "cublasOperation_t",
            "cublasSideMode_t",
        ],
        vars: &["CUSOLVER.*"],
        // The logger takes a FILE*; the safe layer has no use for it.
        blocklist_functions: &["cusolverDnLoggerSetFile"],
        must_use: &["cusolverStatus_t"],
        libraries: &[Library {
            owner: "Cusolver",
            accessor: "cusolver",
            prefix: "CUSOLVER",
            header: "cusolverDn.h",
            function_prefixes: &["cusolver"],
            name: "cuSOLVER",
            env: "CUDA_CUSOLVER_LIBRARY",
            names: &["libcusolver.so.12", "libcusolver.so.11", "libcusolver.so"],
            dependencies: &[
                ("libcublasLt.so.", "cublas"),
                ("libcublas.so.", "cublas"),
                ("libcusparse.so.", "cusparse"),
                ("libnvJitLink.so.", "nvjitlink"),
            ],
            wheel: "nvidia-cusolver",
        }],
    });
}

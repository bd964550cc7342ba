//! Build script of `cuda-rand-sys`: bindgen over `curand.h`, or the checked-in snapshot
//! without it (see `cudars_loader::build`).

use cudars_loader::build::{run, Library, Spec};

fn main() {
    run(&Spec {
        krate: "cuda-rand-sys",
        headers: &["curand.h"],
        include_env: "CUDA_RAND_INCLUDE_DIR",
        snapshot_env: "CUDA_RAND_SYS_USE_SNAPSHOT",
        source_env: "CUDA_RAND_SYS_BINDINGS_SOURCE",
        generated: "rand.rs",
        functions: &["curand.*"],
        types: &["curand.*"],
        vars: &["CURAND.*"],
        blocklist_functions: &[],
        must_use: &["curandStatus", "curandStatus_t"],
        libraries: &[Library {
            owner: "Curand",
            accessor: "curand",
            prefix: "CURAND",
            header: "curand.h",
            function_prefixes: &["curand"],
            name: "cuRAND",
            env: "CUDA_CURAND_LIBRARY",
            names: &["libcurand.so.10", "libcurand.so"],
            dependencies: &[],
            wheel: "nvidia-curand",
        }],
    });
}

//! Build script of `cuda-sparse-sys`: bindgen over `cusparse.h`, or the checked-in snapshot
//! without it (see `cudars_loader::build`).

use cudars_loader::build::{run, Library, Spec};

fn main() {
    run(&Spec {
        krate: "cuda-sparse-sys",
        headers: &["cusparse.h"],
        include_env: "CUDA_SPARSE_INCLUDE_DIR",
        snapshot_env: "CUDA_SPARSE_SYS_USE_SNAPSHOT",
        source_env: "CUDA_SPARSE_SYS_BINDINGS_SOURCE",
        generated: "sparse.rs",
        // The generic API the safe layer uses (and its getters), not the legacy per-type
        // routines (most deprecated) nor SpGEMM, SpSV, SpSM, SDDMM yet.
        functions: &[
            "cusparseCreate",
            "cusparseDestroy",
            "cusparse(Set|Get)Stream",
            "cusparse(Set|Get)PointerMode",
            "cusparseGetVersion",
            "cusparseGetProperty",
            "cusparseGetError(Name|String)",
            "cusparseCreate(Const)?(Csr|Csc|Coo|DnVec|DnMat)",
            "cusparseDestroy(SpMat|DnVec|DnMat)",
            "cusparse(Const)?(Csr|Csc|Coo|DnVec|DnMat)Get",
            "cusparseSpMatGet(Size|Format|IndexBase)",
            "cusparseSpMV(_bufferSize|_preprocess)?",
            "cusparseSpMM(_bufferSize|_preprocess)?",
        ],
        types: &[
            "cusparseStatus_t",
            "cusparseHandle_t",
            "cusparsePointerMode_t",
            "cusparseOperation_t",
            "cusparseIndexType_t",
            "cusparseIndexBase_t",
            "cusparseOrder_t",
            "cusparseFormat_t",
            "cusparseSpMVAlg_t",
            "cusparseSpMMAlg_t",
            "cusparse(Const)?(SpMat|DnVec|DnMat)Descr_t",
            "cudaDataType.*",
            "libraryPropertyType.*",
        ],
        vars: &["CUSPARSE_VER.*"],
        blocklist_functions: &[],
        must_use: &["cusparseStatus_t"],
        libraries: &[Library {
            owner: "Cusparse",
            accessor: "cusparse",
            prefix: "CUSPARSE",
            header: "cusparse.h",
            function_prefixes: &["cusparse"],
            name: "cuSPARSE",
            env: "CUDA_CUSPARSE_LIBRARY",
            names: &["libcusparse.so.12", "libcusparse.so.11", "libcusparse.so"],
            dependencies: &[("libnvJitLink.so.", "nvjitlink")],
            wheel: "nvidia-cusparse",
        }],
    });
}

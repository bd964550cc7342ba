//! Compiles `src/torch_alloc.cpp`: the C++ half of `cuda_mempool_torch_alloc`, which turns a
//! failed allocation into a C++ exception that PyTorch carries to Python. Plain C++ (no CUDA
//! headers), so the crate still builds on a machine without CUDA. `cc` links libstdc++.

fn main() {
    println!("cargo:rerun-if-changed=src/torch_alloc.cpp");
    println!("cargo:rerun-if-changed=include/cuda_mempool.h");
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .include("include")
        .warnings(true)
        .extra_warnings(true)
        .file("src/torch_alloc.cpp")
        .compile("cuda_mempool_torch_alloc");
}

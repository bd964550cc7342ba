//! Compiles `src/torch_alloc.cpp`: the C++ half of `cuda_mempool_torch_alloc`, which turns a
//! failed allocation into a C++ exception that PyTorch carries to Python; and
//! `src/cupy_error.cpp`, which throws the C++ exception CuPy's Cython code turns into the
//! pending Python exception. Plain C++ (no CUDA headers), so the crate still builds on a
//! machine without CUDA. `cc` links libstdc++.

fn main() {
    println!("cargo:rerun-if-changed=src/torch_alloc.cpp");
    println!("cargo:rerun-if-changed=src/cupy_error.cpp");
    println!("cargo:rerun-if-changed=include/cuda_mempool.h");
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .include("include")
        .warnings(true)
        .extra_warnings(true)
        .file("src/torch_alloc.cpp")
        .file("src/cupy_error.cpp")
        .compile("cuda_mempool_torch_alloc");
}

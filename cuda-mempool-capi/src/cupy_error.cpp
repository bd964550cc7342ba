// The C++ exception behind a failed cuda_mempool_cupy_stream_malloc when the CuPy module has
// registered its error hooks.
//
// CuPy 14.1 and later declare the function type of a CFunctionAllocator's malloc `except +`:
// Cython wraps the call in a C++ try block, and its handler first looks for a pending Python
// exception, which it then raises as it is; only without one does it translate the C++
// exception (std::runtime_error becomes RuntimeError with what() as its message). The library
// sets the Python exception (CuPy's OutOfMemoryError with the pool's numbers) and then calls
// this function. It is called from the Rust export through an "C-unwind" declaration, so the
// exception may pass through that frame.

#include <stdexcept>
#include <string>

extern "C" [[noreturn]] void cuda_mempool_throw_runtime_error(const char *what) {
    throw std::runtime_error(what != nullptr ? std::string(what)
                                             : std::string("cuda-mempool: allocation failed"));
}

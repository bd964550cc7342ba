// PyTorch's allocation function for torch.cuda.memory.CUDAPluggableAllocator, in C++ so that a
// failed allocation can throw.
//
// PyTorch calls the pluggable allocator's function as `void* alloc(ssize_t, int, cudaStream_t)`
// and uses the pointer it returns without checking it for NULL: a NULL for a non-empty request
// becomes a tensor at address 0. A C++ exception thrown here instead travels up through
// PyTorch's C++ frames to its Python binding, whose exception translation turns any
// std::exception into a Python RuntimeError carrying what() as its message.
//
// PyTorch's own out-of-memory exception (torch.OutOfMemoryError) is the C++ type
// c10::OutOfMemoryError, and its CUDA error (torch.AcceleratorError) is c10::AcceleratorError,
// both defined in libc10; throwing them would mean compiling against PyTorch's headers and
// linking libc10, tying this library to one PyTorch build. So this throws std::runtime_error
// (RuntimeError in Python, the base class of both), with a message that starts like PyTorch's
// own ("CUDA out of memory. Tried to allocate 280.00 GiB. ..." with the pool's numbers; "CUDA
// error: an illegal memory access was encountered ..." after a fault lost the context).
//
// The exported symbol `cuda_mempool_torch_alloc` is a Rust `extern "C-unwind"` function that
// calls `cuda_mempool_torch_alloc_throwing` below: a cdylib's version script exports only Rust
// items, so a C++ definition would stay hidden, and the "C-unwind" ABI lets the exception pass
// through the Rust frame (the workspace builds with panic=unwind).

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "cuda_mempool.h"

namespace {

// A byte count the way PyTorch's messages write them: bytes, KiB, MiB or GiB, two decimals.
std::string format_size(int64_t bytes) {
    char buf[64];
    if (bytes < 0) {
        std::snprintf(buf, sizeof buf, "%lld bytes", static_cast<long long>(bytes));
    } else if (bytes <= 1024) {
        std::snprintf(buf, sizeof buf, "%lld bytes", static_cast<long long>(bytes));
    } else if (bytes <= (int64_t{1} << 20)) {
        std::snprintf(buf, sizeof buf, "%.2f KiB", static_cast<double>(bytes) / 1024.0);
    } else if (bytes <= (int64_t{1} << 30)) {
        std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / 1048576.0);
    } else {
        std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / 1073741824.0);
    }
    return buf;
}

std::string last_error_text() {
    const char *err = cuda_mempool_last_error();
    return err != nullptr ? std::string(err) : std::string("no error message recorded");
}

[[noreturn]] void throw_failure(ssize_t size, int device) {
    int64_t requested = 0, used = 0, reserved = 0, limit = 0;
    int lost_device = 0, lost_code = 0;
    std::string msg;
    if (cuda_mempool_last_context_lost(&lost_device, &lost_code) == 1) {
        // A lost context (a kernel faulted): the message starts as PyTorch's own CUDA errors
        // do, "CUDA error: " and the driver's text of the error that lost the context.
        msg = last_error_text() + " (raised by cuda_mempool_torch_alloc from "
              "libcudars_mempool_capi, allocating " + std::to_string(size) + " bytes)";
    } else if (cuda_mempool_last_oom(&requested, &used, &reserved, &limit) == 1) {
        msg = "CUDA out of memory. Tried to allocate " + format_size(requested) + ". GPU " +
              std::to_string(device) + ": the cuda-mempool pool holds " + format_size(reserved) +
              " reserved (" + std::to_string(reserved) + " bytes), of which " +
              format_size(used) + " (" + std::to_string(used) + " bytes) is allocated; limit " +
              (limit < 0 ? std::string("none")
                         : format_size(limit) + " (" + std::to_string(limit) + " bytes)") +
              ". The pool released its cached memory and kept nothing it reserved for this "
              "request. (raised by cuda_mempool_torch_alloc from libcudars_mempool_capi: " +
              last_error_text() + ")";
    } else {
        msg = "cuda_mempool_torch_alloc: allocating " + std::to_string(size) +
              " bytes on device " + std::to_string(device) + " failed: " + last_error_text();
    }
    throw std::runtime_error(msg);
}

}  // namespace

// The Rust allocation behind this trampoline (lib.rs): cuda_mempool_alloc with PyTorch's
// capture announcements.
extern "C" void *cuda_mempool_torch_alloc_inner(size_t size, int device,
                                                cuda_mempool_stream_t stream);

extern "C" void *cuda_mempool_torch_alloc_throwing(ssize_t size, int device,
                                                   cuda_mempool_stream_t stream) {
    if (size < 0) {
        throw std::runtime_error("cuda_mempool_torch_alloc: negative size " +
                                 std::to_string(size) + " requested on device " +
                                 std::to_string(device));
    }
    if (size == 0) {
        return nullptr;  // PyTorch's own allocator also hands out no memory for 0 bytes.
    }
    void *ptr = cuda_mempool_torch_alloc_inner(static_cast<size_t>(size), device, stream);
    if (ptr == nullptr) {
        throw_failure(size, device);
    }
    return ptr;
}

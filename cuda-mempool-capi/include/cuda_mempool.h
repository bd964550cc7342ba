/*
 * cuda_mempool.h - C interface of libcuda_mempool_capi.so, the cuda-mempool caching
 * pool as an allocator for C code, PyTorch and CuPy.
 *
 * Written by hand; the crate's tests check that every function declared here is
 * exported by the library with the same parameter and return types.
 *
 * One process-wide pool serves every device and every caller (Rust code using
 * cuda_mempool::default_pool() shares it). Sizes are rounded up to 512 bytes; a block
 * belongs to the stream it was allocated on: it is reused on that stream at once, and
 * on other streams only once the work issued before its free has completed.
 *
 * Errors: a failing call returns NULL (allocations) or a negative value (everything
 * else) and records a message that cuda_mempool_last_error() returns on the same
 * thread. The frees return nothing (the PyTorch and CuPy shapes have no error channel);
 * a failed free records its message too. No call ever lets a Rust panic unwind into C.
 *
 * Streams passed in (cudaStream_t / CUstream values) must stay alive while the pool
 * caches blocks allocated on them. Environment, read at the first call: CUDA_MEMPOOL_LIMIT
 * presets the limit (bytes, or a percentage such as "50%"); CUDA_MEMPOOL_CAPI_SEGMENTS=plain
 * makes the library use a pool of its own with plain cuMemAlloc segments instead of the
 * default pool (virtual-memory segments where supported).
 *
 * All functions are thread-safe.
 */
#ifndef CUDA_MEMPOOL_H
#define CUDA_MEMPOOL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h> /* ssize_t */

#ifdef __cplusplus
extern "C" {
#endif

/* A CUDA stream: the same type as cudaStream_t and CUstream (NULL: the legacy default
 * stream). */
typedef struct CUstream_st *cuda_mempool_stream_t;

/* ---- PyTorch: torch.cuda.memory.CUDAPluggableAllocator(path,
 *      "cuda_mempool_torch_alloc", "cuda_mempool_torch_free") ---- */

/* Allocates `size` bytes on `device` for use on `stream`. Returns NULL on failure
 * (negative size, invalid device, out of memory, no driver; see
 * cuda_mempool_last_error), and NULL without an error for size 0. */
void *cuda_mempool_torch_alloc(ssize_t size, int device, cuda_mempool_stream_t stream);

/* Frees a block of cuda_mempool_torch_alloc, found from `ptr` (`size` and `device` are
 * not needed). The block returns to the stream it was allocated on; if `stream` is a
 * different one, the block is also marked as used on `stream`. NULL is ignored; an
 * unknown pointer changes nothing and records an error. */
void cuda_mempool_torch_free(void *ptr, ssize_t size, int device, cuda_mempool_stream_t stream);

/* ---- CuPy: cupy.cuda.memory.CFunctionAllocator(param, malloc, free, owner), whose
 *      functions CuPy calls as void* malloc(void* param, size_t size, int device_id)
 *      and void free(void* param, void* ptr, int device_id) ---- */

/* Allocates `size` bytes on `device` for use on the calling thread's current stream
 * (see cuda_mempool_set_current_stream; the legacy NULL stream by default, which is
 * CuPy's default stream). `param` is not used. NULL on failure (see
 * cuda_mempool_last_error), and NULL without an error for size 0. CuPy does not check
 * the result: wrap the allocator in Python if out-of-memory must raise. */
void *cuda_mempool_cupy_malloc(void *param, size_t size, int device);

/* Frees a block of cuda_mempool_cupy_malloc on the stream it was allocated on. `param`
 * and `device` are not needed; NULL is ignored; an unknown pointer changes nothing and
 * records an error. */
void cuda_mempool_cupy_free(void *param, void *ptr, int device);

/* Makes `stream` the calling thread's current stream for `device` (NULL: the legacy
 * default stream), the stream cuda_mempool_cupy_malloc allocates on. `stream` must be a
 * valid stream of `device` that outlives its use. Returns 0, or -1 on failure. */
int cuda_mempool_set_current_stream(int device, cuda_mempool_stream_t stream);

/* ---- any caller ---- */

/* Marks the live block at `ptr` as used on `stream` too (PyTorch's record_stream):
 * after its free, no stream reuses it before the work issued to `stream` up to the free
 * has completed. Returns 0, or -1 on failure (unknown pointer). */
int cuda_mempool_record_stream(void *ptr, cuda_mempool_stream_t stream);

/* ---- statistics: a value >= 0, or -1 on failure ---- */

/* Bytes in live blocks on `device`, at the pool's 512-byte rounding. */
int64_t cuda_mempool_used_bytes(int device);

/* Physical device memory the pool holds on `device` (live and cached). */
int64_t cuda_mempool_reserved_bytes(int device);

/* The highest cuda_mempool_reserved_bytes of `device` so far. */
int64_t cuda_mempool_peak_reserved_bytes(int device);

/* Blocks allocated through this interface and not yet freed, on all devices. */
int64_t cuda_mempool_live_allocations(void);

/* ---- control: 0 on success, -1 on failure ---- */

/* Returns every cached block the pool can give back to the driver, on every device
 * (CuPy's free_all_blocks, PyTorch's empty_cache). Waits for the work that used the
 * freed memory. */
int cuda_mempool_free_all_blocks(void);

/* Caps the physical memory the pool holds on `device` at `bytes`; 0 removes the cap.
 * Fails, changing nothing, if live blocks already need more. */
int cuda_mempool_set_limit(int device, size_t bytes);

/* The cap of `device` in bytes, 0 if none, or -1 on failure. */
int64_t cuda_mempool_get_limit(int device);

/* ---- errors ---- */

/* The message of the calling thread's most recent failure, or NULL if there was none.
 * Valid until the thread's next failure or cuda_mempool_clear_error(); successful calls
 * leave it unchanged. */
const char *cuda_mempool_last_error(void);

/* Forgets the calling thread's last error. */
void cuda_mempool_clear_error(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CUDA_MEMPOOL_H */

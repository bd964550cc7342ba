/*
 * cuda_mempool.h - C interface of libcudars_mempool_capi.so, the cuda-mempool caching
 * pool as an allocator for C and C++ code, PyTorch and CuPy.
 *
 * Written by hand; the crate's tests check that every function declared here is
 * exported by the library with the same parameter and return types.
 *
 * One process-wide pool serves every device and every caller (Rust code using
 * cudars_mempool::default_pool() shares it). Sizes are rounded up to 512 bytes.
 *
 * Errors: a failing call returns NULL (allocations) or -1 (everything else) and records
 * a message that cuda_mempool_last_error() returns on the same thread. The frees return
 * nothing (the PyTorch and CuPy shapes have no error channel); a failed free records its
 * message too. No call lets a Rust panic unwind into C. The one function that throws is
 * cuda_mempool_torch_alloc (a C++ exception, for PyTorch; see below).
 *
 * Environment, read at the first call: CUDA_MEMPOOL_LIMIT presets the limit (bytes, or a
 * percentage such as "50%"); CUDA_MEMPOOL_CAPI_SEGMENTS=plain makes the library use a pool
 * of its own with plain cuMemAlloc segments instead of the default pool (virtual-memory
 * segments where supported).
 *
 * All functions are thread-safe.
 *
 * ---- Streams: what the library guarantees, and what it asks of callers ----
 *
 * A block belongs to the stream it was allocated on. After cuda_mempool_free it is
 * reused on that same stream at once (stream order makes that safe), and on any other
 * stream only once that stream is ordered after the work issued to its stream (and to every
 * stream named through cuda_mempool_record_stream) before the free: the work has completed,
 * or the new stream was made to wait for it on the device (cuStreamWaitEvent) before the
 * block is handed over.
 *
 * The contract for frameworks, in one sentence: a block is used on the stream it was
 * allocated on, and use on any other stream is declared with cuda_mempool_record_stream
 * (PyTorch's record_stream) after ordering that stream after the allocating one. Work a
 * framework issues on the allocating stream (PyTorch's tensor.copy_(cpu_tensor) and .cpu(),
 * CuPy's ndarray.set / get and cupy.asarray on its current stream) is then ordered after
 * the memory's previous owner, whichever stream that was.
 *
 * The library guarantees:
 *  - it passes a stream handle to the driver only during the calls that hand it in
 *    (cuda_mempool_alloc and the allocation shapes, cuda_mempool_record_stream, and the
 *    frees of blocks allocated on or marked with that stream): the fence that guards a
 *    freed block is recorded at the free, never later. After the last block allocated on
 *    (or marked with) a stream has been freed, the library never touches that handle
 *    again until a call hands it in again, so the stream may then be destroyed at once,
 *    even while the pool still caches memory freed on it. (A stream that keeps coming back,
 *    a framework's stream, is kept at the free of its last block without a fence: its cache
 *    serves it again at once when it comes back, recognised by the driver's id of the
 *    stream, and other streams reach that memory only after an allocation that ran out of
 *    memory has synchronised the device. A stream used once is fenced as before.);
 *  - a new stream that happens to get the handle value of a destroyed one never inherits
 *    the old stream's cached blocks without the old stream's fences;
 *  - a request that cannot be met leaves the pool as it was: whatever it reserved or
 *    mapped while trying (after releasing cached memory and retrying) is released before
 *    NULL is returned;
 *  - an allocation on a stream that is being captured into a CUDA graph (whoever began
 *    the capture: this library's users, PyTorch's torch.cuda.graph and torch.compile,
 *    CuPy's Stream.begin_capture) comes from a pool private to that capture, which is
 *    never reused outside it and is released when the graph and all its instantiations
 *    have been destroyed.
 *
 * The caller must:
 *  - keep each stream valid (not destroyed) from the call that hands it in until every
 *    block allocated on it, or marked with it through cuda_mempool_record_stream, has
 *    been freed;
 *  - pass a stream of the device it names;
 *  - not mark another stream's block with the per-thread default stream
 *    (cuda_mempool_record_stream refuses it: its handle names the calling thread's stream,
 *    and the block's free may come from any thread).
 *
 * The per-thread default stream (CU_STREAM_PER_THREAD, CuPy's Stream.ptds and
 * CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1) works: its handle names the calling thread's own
 * stream, so the library keeps a cache per thread and records fences on it, or makes it
 * wait, only from that thread. A block freed from another thread (a garbage collector) is
 * reused at once by its own thread's stream, and by other streams only after its thread has
 * fenced it (at that thread's next free of its last live block), or once an allocation that
 * ran out of memory, or cuda_mempool_free_all_blocks, has synchronised the device
 * (cuCtxSynchronize; never while a capture is known on the device: one begun through
 * cuda-core, one PyTorch announced through the capture hooks below, or one that allocated
 * from this library and whose graph still lives, since the synchronisation would invalidate
 * it; a capture that never allocated here is not known); until then it stays out of
 * cross-stream reuse. Such a stream never takes memory other streams still use. The same
 * holds for the cache of a lingering stream (see the guarantees above; at most 32 streams
 * of a device linger).
 *
 * Graph captures: while a stream is captured, the library never records a fence on it or
 * makes it wait; blocks whose fence would be due there stay out of cross-stream reuse until
 * a later call can record one.
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

/* ---- any caller ---- */

/* Allocates `size` bytes on `device` for use on `stream` (see the stream rules above).
 * Returns NULL without an error for size 0. On failure returns NULL and records an
 * error; if the failure is an out of memory, cuda_mempool_last_oom() gives its numbers
 * and the pool is as it was before the call. */
void *cuda_mempool_alloc(size_t size, int device, cuda_mempool_stream_t stream);

/* Gives a block back: reused on its own stream at once, on other streams only after the
 * work issued before the free has completed. NULL is ignored; an unknown pointer changes
 * nothing and records an error. */
void cuda_mempool_free(void *ptr);

/* Marks the live block at `ptr` as used on `stream` too (PyTorch's record_stream): after
 * its free, no other stream reuses it before it is ordered after the work issued to
 * `stream` up to the free. `stream` must stay valid until the block is freed. Returns 0, or
 * -1 on failure (unknown pointer; the per-thread default stream on another stream's
 * block). */
int cuda_mempool_record_stream(void *ptr, cuda_mempool_stream_t stream);

/* If the calling thread's most recent failure was an out of memory, returns 1 and stores
 * the bytes requested, the bytes in live blocks, the bytes reserved (all on the device of
 * the request) and the limit (-1 when there is none); otherwise returns 0 and stores
 * nothing. Any pointer may be NULL. */
int cuda_mempool_last_oom(int64_t *requested, int64_t *used, int64_t *reserved, int64_t *limit);

/* If the calling thread's most recent failure was an allocation on a device whose CUDA
 * context is lost (a kernel faulted: an illegal address, a trap, an uncorrectable ECC error;
 * seen first by this library or by the caller's own CUDA calls), returns 1 and stores the
 * device and the CUresult of the error that lost the context (0 when it was reset instead);
 * otherwise returns 0 and stores nothing. The pool hands out no memory of a lost context;
 * cuda_mempool_last_error() says which error lost it. Any pointer may be NULL. */
int cuda_mempool_last_context_lost(int *device, int *code);

/* ---- PyTorch: torch.cuda.memory.CUDAPluggableAllocator(path,
 *      "cuda_mempool_torch_alloc", "cuda_mempool_torch_free") ---- */

/* Allocates `size` bytes on `device` for use on `stream` through cuda_mempool_alloc.
 * Returns NULL for size 0. It never returns NULL for any other size: on failure
 * (negative size, out of memory, no driver) it THROWS a C++ std::runtime_error, because
 * PyTorch does not check the allocation function's result for NULL. PyTorch carries the
 * exception to Python as RuntimeError. For an out of memory the message starts like
 * PyTorch's own ("CUDA out of memory. Tried to allocate 280.00 GiB. ...") and gives the
 * pool's reserved, allocated and limit figures; otherwise it gives the library's error
 * text. It is not torch.OutOfMemoryError: that is PyTorch's C++ type c10::OutOfMemoryError,
 * which cannot be thrown without building against PyTorch's headers and linking its
 * libraries. Call it only from C++ code that can receive the exception (PyTorch); C callers
 * use cuda_mempool_alloc. */
void *cuda_mempool_torch_alloc(ssize_t size, int device, cuda_mempool_stream_t stream);

/* Frees a block, found from `ptr` (`size` and `device` are not needed). If `stream`
 * differs from the block's own stream, the block is also marked as used on `stream`.
 * NULL is ignored; an unknown pointer changes nothing and records an error. */
void cuda_mempool_torch_free(void *ptr, ssize_t size, int device, cuda_mempool_stream_t stream);

/* PyTorch's capture hooks, for the pluggable allocator's set_begin_allocate_to_pool,
 * set_end_allocate_to_pool_fn and set_release_pool. Their C++ types are
 * void(int, std::pair<uint64_t, uint64_t>, std::function<bool(cudaStream_t)>) and
 * void(int, std::pair<uint64_t, uint64_t>): on x86-64 Linux the pool id arrives as two
 * 64-bit values, the filter as a pointer to the caller's object (not used). Begin and end
 * count PyTorch's captures; release does nothing (a private pool goes with its graph). */
void cuda_mempool_torch_begin_allocate_to_pool(int device, uint64_t pool_a, uint64_t pool_b,
                                               void *filter);
void cuda_mempool_torch_end_allocate_to_pool(int device, uint64_t pool_a, uint64_t pool_b);
void cuda_mempool_torch_release_pool(int device, uint64_t pool_a, uint64_t pool_b);

/* Call once the three hooks are set on the allocator PyTorch uses, while no capture runs:
 * cuda_mempool_torch_alloc then asks the driver whether its stream is being captured only
 * while a PyTorch capture runs (PyTorch's own allocator works the same way), not at every
 * allocation. Streams PyTorch allocates on must then be captured only through PyTorch's
 * graph API, which announces its captures. Returns 0. */
int cuda_mempool_torch_announce_captures(void);

/* ---- CuPy: cupy.cuda.memory.CFunctionAllocator(param, malloc, free, owner), whose
 *      functions CuPy calls as void* malloc(void* param, size_t size, int device_id)
 *      and void free(void* param, void* ptr, int device_id). This plain route is the same
 *      allocator as python/cuda_mempool_cupy.py's: each block on CuPy's current stream of
 *      the calling thread, CuPy's OutOfMemoryError on failure. ---- */

/* Allocates `size` bytes on `device` for use on CuPy's current stream of the calling thread.
 * The first call registers the CuPy module's hooks (as cuda_mempool_cupy_set_stream_hooks)
 * when nobody has: through the process's Python interpreter it imports cuda_mempool_cupy (or
 * runs the copy embedded in this library) and calls its _plain_route, which learns CuPy's
 * C-level current-stream lookup. `param` is not used. On failure, called by CuPy >= 14.1
 * with the GIL held (CuPy declares this function `except +`): a Python exception is left
 * pending (OutOfMemoryError, a subclass of cupy.cuda.memory.OutOfMemoryError, for an out of
 * memory) and a C++ std::runtime_error THROWN, which CuPy raises as that exception.
 * Otherwise (an older CuPy, a caller without the GIL such as ctypes.CDLL) NULL with a
 * last-error message. Without a Python interpreter, or when CuPy's stream cannot be learnt,
 * it refuses (NULL): it never hands out memory it cannot order on the stream CuPy will use.
 * NULL without an error for size 0. */
void *cuda_mempool_cupy_malloc(void *param, size_t size, int device);

/* Frees a block of cuda_mempool_cupy_malloc or cuda_mempool_cupy_stream_malloc. `param`
 * and `device` are not needed; NULL is ignored; an unknown pointer changes nothing and
 * records an error. */
void cuda_mempool_cupy_free(void *param, void *ptr, int device);

/* Makes `stream` the calling thread's current stream of cuda-core for `device` (NULL: the
 * legacy default stream): the stream Rust code of the process allocates on by default. The
 * CuPy functions do not use it. The stream rules above apply to it. Returns 0, or -1 on
 * failure. */
int cuda_mempool_set_current_stream(int device, cuda_mempool_stream_t stream);

/* ---- CuPy on its own current stream: the allocator python/cuda_mempool_cupy.py installs.
 *      CuPy's CFunctionAllocator calls cuda_mempool_cupy_stream_malloc and
 *      cuda_mempool_cupy_free directly (one C call an allocation, no Python frame); the
 *      stream comes from CuPy through a registered function, CuPy's Stream object is kept
 *      alive, once a stream, while the stream has live blocks of this path, and a failure can
 *      become a Python exception (CuPy >= 14.1 raises it). ---- */

/* CuPy's C-level get_current_stream_ptr (cupy.cuda.stream.__pyx_capi__): the calling
 * thread's current CuPy stream for the current device, or -1 with a Python exception set.
 * Needs the GIL. */
typedef intptr_t (*cuda_mempool_cupy_stream_fn)(void);
/* CuPy's C-level get_stream_ptr (cupy_backends.cuda.stream.__pyx_capi__): the same for
 * `device`. */
typedef intptr_t (*cuda_mempool_cupy_device_stream_fn)(int device);
/* Keeps the calling thread's current stream object of `device` (handle `stream`) alive;
 * returns 0 on success. Holds are counted: each is matched by one release. */
typedef int (*cuda_mempool_cupy_hold_fn)(int device, cuda_mempool_stream_t stream);
/* Lets go of one hold of `stream`. */
typedef void (*cuda_mempool_cupy_release_fn)(cuda_mempool_stream_t stream);
/* Builds the exception for this thread's failed allocation of `size` bytes on `device`
 * (from cuda_mempool_last_oom / cuda_mempool_last_error), keeps it alive, and writes its type
 * and value (PyObject*) to out[0] and out[1]; returns 0 on success. */
typedef int (*cuda_mempool_cupy_make_error_fn)(size_t size, int device, intptr_t *out);
/* Sets the calling thread's Python exception: Python's PyErr_SetObject(type, value). */
typedef void (*cuda_mempool_cupy_set_error_fn)(void *type, void *value);

/* Registers the functions: device_stream (preferred) or current_stream to learn CuPy's
 * stream (both NULL: unregisters), hold and release (release NULL: holds are never released,
 * for interpreter exit), and optionally make_error with set_error: a failed
 * cuda_mempool_cupy_stream_malloc then leaves that exception pending AND THROWS a C++
 * std::runtime_error, for callers that catch it (CuPy >= 14.1 declares its allocator's malloc
 * `except +`, and Cython raises the pending Python exception). They are called on the
 * allocating or freeing thread with no lock of the library held, and must stay callable for
 * the rest of the process. Returns 0, or -1 when a lookup is given without hold, or only one
 * of make_error and set_error. */
int cuda_mempool_cupy_set_stream_hooks(cuda_mempool_cupy_stream_fn current_stream,
                                       cuda_mempool_cupy_device_stream_fn device_stream,
                                       cuda_mempool_cupy_hold_fn hold,
                                       cuda_mempool_cupy_release_fn release,
                                       cuda_mempool_cupy_make_error_fn make_error,
                                       cuda_mempool_cupy_set_error_fn set_error);

/* Releases one reference to a Python object: Python's Py_DecRef. */
typedef void (*cuda_mempool_cupy_decref_fn)(void *object);

/* Registers decref (NULL unregisters). While one is registered, make_error hands over OWNED
 * references to the type and value it writes, and the library releases both with decref right
 * after set_error (which takes references of its own), so nothing keeps a raised exception,
 * its traceback and the arrays of its frames alive once the caller has handled it. Without
 * one, make_error keeps the objects alive itself. Returns 0. */
int cuda_mempool_cupy_set_error_release(cuda_mempool_cupy_decref_fn decref);

/* CFunctionAllocator's malloc: `size` bytes on `device` for use on CuPy's current stream of
 * the calling thread (the registered lookup function). A stream other than the
 * implicit ones (NULL, cudaStreamLegacy, cudaStreamPerThread) is held through the hold hook
 * when it gets its first live block of this path and released after its last is freed
 * (with cuda_mempool_cupy_free or cuda_mempool_free). `param` is not used. NULL on failure
 * (no hooks, CuPy's lookup failed, out of memory: see cuda_mempool_last_oom); NULL without an
 * error for size 0. With the error hooks registered, a failure throws instead (see above). */
void *cuda_mempool_cupy_stream_malloc(void *param, size_t size, int device);

/* The number of streams held now by cuda_mempool_cupy_stream_malloc. */
int64_t cuda_mempool_cupy_held_streams(void);

/* ---- statistics: a value >= 0, or -1 on failure ---- */

/* Bytes in live blocks on `device`, at the pool's 512-byte rounding. */
int64_t cuda_mempool_used_bytes(int device);

/* Device memory the pool holds on `device`, live and cached (CuPy's total_bytes). */
int64_t cuda_mempool_reserved_bytes(int device);

/* Bytes the pool holds on `device` that no live block uses (reserved - used). */
int64_t cuda_mempool_free_bytes(int device);

/* The highest cuda_mempool_reserved_bytes of `device` so far. */
int64_t cuda_mempool_peak_reserved_bytes(int device);

/* Cached free blocks, on all devices. */
int64_t cuda_mempool_n_free_blocks(void);

/* Blocks allocated through this interface and not yet freed, on all devices. */
int64_t cuda_mempool_live_allocations(void);

/* ---- control: 0 on success, -1 on failure ---- */

/* Returns every cached block the pool can give back to the driver, on every device
 * (CuPy's free_all_blocks, PyTorch's empty_cache). Waits for the work that used the
 * freed memory. */
int cuda_mempool_free_all_blocks(void);

/* Caps the device memory the pool holds on `device` at `bytes`; 0 removes the cap.
 * Fails, changing nothing, if live blocks already need more. */
int cuda_mempool_set_limit(int device, size_t bytes);

/* The cap of `device` in bytes, 0 if none, or -1 on failure. */
int64_t cuda_mempool_get_limit(int device);

/* ---- memory history (the pool's timeline) ---- */

/* Starts recording what the pool does (PyTorch's _record_memory_history): what it holds
 * now, then every malloc, free, segment, page, fence, limit change and out-of-memory
 * failure, keeping the newest `max_events` (0: 1,000,000). Returns 0 or -1. */
int cuda_mempool_history_start(size_t max_events);

/* cuda_mempool_history_start, capturing the native call stack of each allocation and
 * out-of-memory failure too (slower: microseconds per allocation, more at the dump).
 * Returns 0 or -1. */
int cuda_mempool_history_start_backtraces(size_t max_events);

/* Stops the recording; its events stay for cuda_mempool_history_dump. Returns 0 or -1. */
int cuda_mempool_history_stop(void);

/* Writes the recording (on, or the last one stopped) to `path`: format 0 is a
 * self-contained HTML report, 1 PyTorch's memory snapshot pickle (memory_viz opens it).
 * Written to a temporary name, then renamed. Returns 0 or -1. */
int cuda_mempool_history_dump(const char *path, int format);

/* ---- errors ---- */

/* The message of the calling thread's most recent failure, or NULL if there was none.
 * Valid until the thread's next failure or cuda_mempool_clear_error(); successful calls
 * leave it unchanged. */
const char *cuda_mempool_last_error(void);

/* Forgets the calling thread's last error (and its out-of-memory numbers). */
void cuda_mempool_clear_error(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CUDA_MEMPOOL_H */

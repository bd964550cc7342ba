/* The part of cuda_runtime.h that nccl.h's host API uses. The bindings are generated against
 * this shim, not the toolkit's header, so that they need no CUDA toolkit (the runtime wheel's
 * cuda_runtime.h wants crt/ headers it does not carry) and do not change with its version. */
#ifndef CUDA_NCCL_SYS_SHIM_CUDA_RUNTIME_H
#define CUDA_NCCL_SYS_SHIM_CUDA_RUNTIME_H
#include <stddef.h>
typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
#endif

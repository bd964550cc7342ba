/* What cuda-solver-sys binds: cuSOLVER's dense API (cusolverDn.h).
 *
 * cusolverDn.h includes cublas_api.h, which includes cuda_fp16.h and cuda_bf16.h; those need
 * the CCCL headers (nv/target) for their device code. The host API only passes pointers to
 * 16-bit values, so their guards are defined here and the types declared with the layout the
 * headers give them (two bytes), as cuda-blas-sys does. */
#define __CUDA_FP16_H__
#define __CUDA_BF16_H__
typedef struct __half { unsigned short __x; } __half;
typedef struct __half2 { __half x, y; } __half2;
typedef struct __nv_bfloat16 { unsigned short __x; } __nv_bfloat16;
typedef struct __nv_bfloat162 { __nv_bfloat16 x, y; } __nv_bfloat162;
#include <cusolverDn.h>

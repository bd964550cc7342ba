/* What cuda-blas-sys binds: cuBLAS (the v2 API: cublas_v2.h maps the names to the *_v2
 * entry points, which are what the library exports) and cuBLASLt.
 *
 * cuda_fp16.h and cuda_bf16.h need the CCCL headers (nv/target) for their device code; the
 * host API only passes pointers to 16-bit values, so their guards are defined here and the two
 * types declared with the layout the headers give them (two bytes). */
#define __CUDA_FP16_H__
#define __CUDA_BF16_H__
typedef struct __half { unsigned short __x; } __half;
typedef struct __half2 { __half x, y; } __half2;
typedef struct __nv_bfloat16 { unsigned short __x; } __nv_bfloat16;
typedef struct __nv_bfloat162 { __nv_bfloat16 x, y; } __nv_bfloat162;
#include <cublas_v2.h>
#include <cublasLt.h>

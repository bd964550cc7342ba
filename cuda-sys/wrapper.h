/* The driver API and the profiler control functions, nothing of the runtime API. */
#include <cuda.h>
#if defined(__has_include)
#if __has_include(<cudaProfiler.h>)
#include <cudaProfiler.h>
#define CUDA_SYS_HAVE_PROFILER_H 1
#endif
#endif
#ifndef CUDA_SYS_HAVE_PROFILER_H
/* The nvidia-cuda-runtime wheel ships cuda.h without cudaProfiler.h; these two are the
 * entry points of libcuda that cudaProfiler.h declares (cuProfilerInitialize is gone since 12.0). */
CUresult CUDAAPI cuProfilerStart(void);
CUresult CUDAAPI cuProfilerStop(void);
#endif

/* What cuda-sparse-sys binds: cuSPARSE's generic API (cusparse.h): the handle, the sparse
 * (CSR, CSC, COO) and dense (vector, matrix) descriptors, SpMV and SpMM.
 *
 * Read as C: cusparse.h then includes cuComplex.h, cuda_runtime_api.h and library_types.h
 * (from the CUDA runtime headers, CUDA_INCLUDE_DIR) and not cuda_fp16.h (C++ only). */
#include <cusparse.h>

/* What cuda-nccl-sys binds: the NCCL host API. nccl.h includes cuda_runtime.h. */
#include <nccl.h>

/* nccl.h includes cuda_fp16.h; its host API passes halves only through void pointers. */

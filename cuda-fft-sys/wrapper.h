/* What cuda-fft-sys binds: cuFFT's host API (cufft.h) and its extensions (cufftXt.h: the
 * half-precision plans of cufftXtMakePlanMany and cufftXtExec, among others). */
#include <cufft.h>
#include <cufftXt.h>

/* What cuda-fft-sys binds: cuFFT's host API (the plans of cufft.h; not cufftXt). */
#include <cufft.h>

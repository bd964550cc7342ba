/* What cuda-rand-sys binds: cuRAND's host API. */
#include <curand.h>

/* NVTX3 is header-only: bindgen's wrap_static_fns turns its static inline functions into
 * symbols that build.rs compiles with cc. */
#include <nvtx3/nvToolsExt.h>

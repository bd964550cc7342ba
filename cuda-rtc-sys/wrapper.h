/* What cuda-rtc-sys binds: the NVRTC and nvJitLink host APIs. NVJITLINK_NO_INLINE hides the
 * header's static inline forwarders, so bindgen sees the versioned entry points
 * (__nvJitLinkCreate_13_0, ...) that build.rs names after their API (nvJitLinkCreate). */
#define NVJITLINK_NO_INLINE
#include <nvrtc.h>
#include <nvJitLink.h>

"""Which cheap driver calls report a sticky error, and what each costs on a healthy context.

A pool used through the C ABI by PyTorch or CuPy may never see the fault itself: the
framework's own calls do. To stop handing out memory of a lost context, the pool needs one
cheap call that answers with the sticky error. This times candidate calls on a healthy
context (ns per call, 20,000 calls), then faults the context (a kernel writing to 0x10) and
prints each call's CUresult afterwards. Only libcuda through ctypes.
"""
import ctypes, time

PTX = b"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry poke(.param .u64 p, .param .u32 v) {
  .reg .u64 %rd<3>;
  .reg .u32 %r<2>;
  ld.param.u64 %rd1, [p];
  cvta.to.global.u64 %rd2, %rd1;
  ld.param.u32 %r1, [v];
  st.global.u32 [%rd2], %r1;
  ret;
}
\0"""

cu = ctypes.CDLL("libcuda.so.1")
dev = ctypes.c_int(); ctx = ctypes.c_void_p()
assert cu.cuInit(0) == 0
cu.cuDeviceGet(ctypes.byref(dev), 0)
cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
cu.cuCtxSetCurrent(ctx)
stream = ctypes.c_void_p(); cu.cuStreamCreate(ctypes.byref(stream), 1)
ev = ctypes.c_void_p(); cu.cuEventCreate(ctypes.byref(ev), 2)
cu.cuEventRecord(ev, stream)
cu.cuStreamSynchronize(stream)
d = ctypes.c_uint64(); cu.cuMemAlloc_v2(ctypes.byref(d), 1 << 20)
o_ctx = ctypes.c_void_p(); o_dev = ctypes.c_int(); o_u64 = ctypes.c_uint64(); o_int = ctypes.c_int()
o_sz = ctypes.c_size_t(); o_sz2 = ctypes.c_size_t(); o_u32 = ctypes.c_uint()
lo = ctypes.c_int(); hi = ctypes.c_int()
CANDIDATES = [
    ("cuCtxGetCurrent", lambda: cu.cuCtxGetCurrent(ctypes.byref(o_ctx))),
    ("cuCtxGetDevice", lambda: cu.cuCtxGetDevice(ctypes.byref(o_dev))),
    ("cuCtxGetId", lambda: cu.cuCtxGetId(ctx, ctypes.byref(o_u64))),
    ("cuCtxGetFlags", lambda: cu.cuCtxGetFlags(ctypes.byref(o_u32))),
    ("cuCtxGetStreamPriorityRange", lambda: cu.cuCtxGetStreamPriorityRange(ctypes.byref(lo), ctypes.byref(hi))),
    ("cuCtxGetLimit(stack)", lambda: cu.cuCtxGetLimit(ctypes.byref(o_sz), 0)),
    ("cuStreamGetId", lambda: cu.cuStreamGetId(stream, ctypes.byref(o_u64))),
    ("cuStreamIsCapturing", lambda: cu.cuStreamIsCapturing(stream, ctypes.byref(o_int))),
    ("cuStreamGetFlags", lambda: cu.cuStreamGetFlags(stream, ctypes.byref(o_u32))),
    ("cuStreamQuery", lambda: cu.cuStreamQuery(stream)),
    ("cuEventQuery", lambda: cu.cuEventQuery(ev)),
    ("cuPointerGetAttribute(ctx)", lambda: cu.cuPointerGetAttribute(ctypes.byref(o_ctx), 1, d)),
    ("cuMemGetInfo", lambda: cu.cuMemGetInfo_v2(ctypes.byref(o_sz), ctypes.byref(o_sz2))),
    ("cuDevicePrimaryCtxGetState", lambda: cu.cuDevicePrimaryCtxGetState(dev, ctypes.byref(o_u32), ctypes.byref(o_int))),
    ("cuCtxSynchronize", lambda: cu.cuCtxSynchronize()),
]
print("healthy: ns per call (ctypes included; 'cuCtxGetCurrent' is the ctypes floor)")
for name, f in CANDIDATES:
    n = 20000
    t = time.perf_counter_ns()
    for _ in range(n):
        f()
    print(f"  {name:30s} {(time.perf_counter_ns() - t) / n:8.0f} ns  rc={f()}")
mod = ctypes.c_void_p(); fn = ctypes.c_void_p()
cu.cuModuleLoadData(ctypes.byref(mod), PTX)
cu.cuModuleGetFunction(ctypes.byref(fn), mod, b"poke")
p = ctypes.c_uint64(0x10); v = ctypes.c_uint32(7)
params = (ctypes.c_void_p * 2)(ctypes.cast(ctypes.byref(p), ctypes.c_void_p), ctypes.cast(ctypes.byref(v), ctypes.c_void_p))
print("launch", cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, params, None))
time.sleep(0.2)  # the fault has happened; nobody has synchronised yet
print("after the fault, before any synchronisation, in the order called:")
for name, f in CANDIDATES:
    print(f"  {name:30s} rc={f()}")
print("again, after cuCtxSynchronize:")
for name, f in CANDIDATES:
    print(f"  {name:30s} rc={f()}")

"""After an illegal-address fault, which driver sequence gives a working context again?

Each variant runs in a fresh process: fault the primary context with a kernel that writes to
address 0x10, then try the variant's recovery, then a checked workload (allocate, launch a
kernel that writes 42, copy back). Prints one line per variant with every call's CUresult.
Only libcuda through ctypes: nothing else in the process holds CUDA state.
"""
import ctypes, subprocess, sys, time

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

def child(variant):
    cu = ctypes.CDLL("libcuda.so.1")
    log = []
    def c(name, *args):
        r = getattr(cu, name)(*args)
        log.append(f"{name}={r}")
        return r
    dev = ctypes.c_int()
    ctx = ctypes.c_void_p()
    c("cuInit", 0)
    c("cuDeviceGet", ctypes.byref(dev), 0)
    c("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
    c("cuCtxSetCurrent", ctx)

    def work(tag):
        mod = ctypes.c_void_p(); f = ctypes.c_void_p(); d = ctypes.c_uint64()
        rs = [c("cuModuleLoadData", ctypes.byref(mod), PTX),
              c("cuModuleGetFunction", ctypes.byref(f), mod, b"poke"),
              c("cuMemAlloc_v2", ctypes.byref(d), 4)]
        p = ctypes.c_uint64(d.value); v = ctypes.c_uint32(42)
        params = (ctypes.c_void_p * 2)(ctypes.cast(ctypes.byref(p), ctypes.c_void_p), ctypes.cast(ctypes.byref(v), ctypes.c_void_p))
        rs.append(c("cuLaunchKernel", f, 1, 1, 1, 1, 1, 1, 0, None, params, None))
        rs.append(c("cuCtxSynchronize"))
        out = ctypes.c_uint32(0)
        rs.append(c("cuMemcpyDtoH_v2", ctypes.byref(out), d, 4))
        ok = all(r == 0 for r in rs) and out.value == 42
        log.append(f"{tag}:{'OK' if ok else 'FAIL'}")
        return ok

    work("before")
    # The fault.
    mod = ctypes.c_void_p(); f = ctypes.c_void_p()
    c("cuModuleLoadData", ctypes.byref(mod), PTX)
    c("cuModuleGetFunction", ctypes.byref(f), mod, b"poke")
    p = ctypes.c_uint64(0x10); v = ctypes.c_uint32(7)
    params = (ctypes.c_void_p * 2)(ctypes.cast(ctypes.byref(p), ctypes.c_void_p), ctypes.cast(ctypes.byref(v), ctypes.c_void_p))
    c("cuLaunchKernel", f, 1, 1, 1, 1, 1, 1, 0, None, params, None)
    c("cuCtxSynchronize")
    t = time.time()
    if variant == "A":      # reset with the context current, retain again
        c("cuDevicePrimaryCtxReset_v2", dev)
    elif variant == "B":    # nothing current, reset
        c("cuCtxSetCurrent", None)
        c("cuDevicePrimaryCtxReset_v2", dev)
    elif variant == "C":    # nothing current, release to zero (destroys), retain anew
        c("cuCtxSetCurrent", None)
        c("cuDevicePrimaryCtxRelease_v2", dev)
    elif variant == "D":    # wait 2 s for the fault's recovery, then as B
        time.sleep(2)
        c("cuCtxSetCurrent", None)
        c("cuDevicePrimaryCtxReset_v2", dev)
    elif variant == "E":    # no reset: a new non-primary context
        c("cuCtxSetCurrent", None)
        nc = ctypes.c_void_p()
        c("cuCtxCreate_v2", ctypes.byref(nc), 0, dev)
        ok = work("newctx")
        print(variant, "recovered" if ok else "not-recovered", f"{time.time()-t:.3f}s", " ".join(log)); return
    elif variant == "F":    # release to zero and reset, then retain anew
        c("cuCtxSetCurrent", None)
        c("cuDevicePrimaryCtxRelease_v2", dev)
        c("cuDevicePrimaryCtxReset_v2", dev)
    nctx = ctypes.c_void_p()
    c("cuDevicePrimaryCtxRetain", ctypes.byref(nctx), dev)
    c("cuCtxSetCurrent", nctx)
    ok = work("after")
    log.append(f"same_handle={nctx.value == ctx.value}")
    print(variant, "recovered" if ok else "not-recovered", f"{time.time()-t:.3f}s", " ".join(log))

if len(sys.argv) > 1:
    child(sys.argv[1])
else:
    for v in "ABCDEF":
        r = subprocess.run([sys.executable, __file__, v], capture_output=True, text=True, timeout=60)
        print((r.stdout.strip() or f"{v} crashed rc={r.returncode} {r.stderr.strip()[-300:]}"))

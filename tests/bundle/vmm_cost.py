"""The driver's own cost of the virtual-memory calls the pool makes when it moves a page:
cuMemMap, cuMemSetAccess (one call over a run of pages, or one a page) and cuMemUnmap (one a
page, or one over the run), per 2 MiB page on device 0, through libcuda directly.

Usage: python3 vmm_cost.py
"""
import ctypes, time, statistics
cu = ctypes.CDLL("libcuda.so.1")
def ck(r, what):
    if r != 0:
        raise SystemExit(f"{what}: error {r}")
ck(cu.cuInit(0), "init")
dev = ctypes.c_int(); ck(cu.cuDeviceGet(ctypes.byref(dev), 0), "dev")
ctx = ctypes.c_void_p(); ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain"); ck(cu.cuCtxSetCurrent(ctx), "set")
class Loc(ctypes.Structure): _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]
class AllocFlags(ctypes.Structure): _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte), ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]
class Prop(ctypes.Structure): _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", Loc), ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", AllocFlags)]
class Access(ctypes.Structure): _fields_ = [("location", Loc), ("flags", ctypes.c_int)]
prop = Prop(); prop.type = 1; prop.location.type = 1; prop.location.id = 0
PAGE = 2 << 20; N = 64
handles = []
for _ in range(N):
    h = ctypes.c_ulonglong(); ck(cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(PAGE), ctypes.byref(prop), ctypes.c_ulonglong(0)), "create"); handles.append(h)
va = ctypes.c_ulonglong(); ck(cu.cuMemAddressReserve(ctypes.byref(va), ctypes.c_size_t(PAGE * N), ctypes.c_size_t(0), ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)), "reserve")
acc = Access(); acc.location.type = 1; acc.location.id = 0; acc.flags = 3
res = {k: [] for k in ("map", "setaccess_run", "setaccess_page", "unmap_page", "unmap_run")}
for rep in range(10):
    t = time.perf_counter()
    for i, h in enumerate(handles):
        ck(cu.cuMemMap(ctypes.c_ulonglong(va.value + i * PAGE), ctypes.c_size_t(PAGE), ctypes.c_size_t(0), h, ctypes.c_ulonglong(0)), "map")
    res["map"].append((time.perf_counter() - t) / N)
    if rep % 2 == 0:
        t = time.perf_counter()
        ck(cu.cuMemSetAccess(ctypes.c_ulonglong(va.value), ctypes.c_size_t(PAGE * N), ctypes.byref(acc), ctypes.c_size_t(1)), "access")
        res["setaccess_run"].append((time.perf_counter() - t) / N)
    else:
        t = time.perf_counter()
        for i in range(N):
            ck(cu.cuMemSetAccess(ctypes.c_ulonglong(va.value + i * PAGE), ctypes.c_size_t(PAGE), ctypes.byref(acc), ctypes.c_size_t(1)), "access")
        res["setaccess_page"].append((time.perf_counter() - t) / N)
    if rep % 2 == 0:
        t = time.perf_counter()
        for i in range(N):
            ck(cu.cuMemUnmap(ctypes.c_ulonglong(va.value + i * PAGE), ctypes.c_size_t(PAGE)), "unmap")
        res["unmap_page"].append((time.perf_counter() - t) / N)
    else:
        t = time.perf_counter()
        r = cu.cuMemUnmap(ctypes.c_ulonglong(va.value), ctypes.c_size_t(PAGE * N))
        res["unmap_run"].append((time.perf_counter() - t) / N)
        if r != 0:
            print("one cuMemUnmap over", N, "separately mapped pages: error", r)
            for i in range(N):
                cu.cuMemUnmap(ctypes.c_ulonglong(va.value + i * PAGE), ctypes.c_size_t(PAGE))
for k, v in res.items():
    print(f"{k:16s} us per page: median {statistics.median(v)*1e6:8.2f}  (n={len(v)})")

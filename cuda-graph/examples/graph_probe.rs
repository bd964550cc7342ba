//! A probe of what the driver accepts for conditional setters, memsets in conditional bodies
//! and executable-graph memset/copy updates (diagnostics: prints one line per variant).
use std::ffi::c_void;

use cudars_core::graph::explicit::{self as ex, ConditionalKind};
use cudars_core::graph::{GraphHandle, InstantiateFlags};
use cudars_core::{Device, DevicePtr, LaunchConfig};
use cudars_graph::GraphBuilder;
use cudars_rtc::{Output, Program};

fn show<T: std::fmt::Debug, E: std::fmt::Display>(what: &str, r: &Result<T, E>) {
    match r {
        Ok(v) => println!("probe {what}: ok {v:?}"),
        Err(e) => println!("probe {what}: ERR {e}"),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dev = Device::new(0)?;
    let _b = dev.bind()?;
    let ctx = dev.primary_context()?;
    let flag = DevicePtr::alloc(&dev, 4)?;
    let buf = DevicePtr::alloc(&dev, 4096)?;
    let buf2 = DevicePtr::alloc(&dev, 4096)?;
    let sources = [
        ("plain (no call)", "typedef unsigned long long H;\nextern \"C\" __global__ void k(H h, const unsigned* f) { if (h == 12345) *(unsigned*)f = 0; }"),
        ("prelude typedef", "typedef unsigned long long cudaGraphConditionalHandle;\nextern \"C\" __device__ __cudart_builtin__ void cudaGraphSetConditional(cudaGraphConditionalHandle handle, unsigned int value);\nextern \"C\" __global__ void k(cudaGraphConditionalHandle h, const unsigned* f) { cudaGraphSetConditional(h, *f); }"),
        ("device_builtin typedef", "typedef __device_builtin__ unsigned long long cudaGraphConditionalHandle;\nextern \"C\" __device__ __cudart_builtin__ void cudaGraphSetConditional(cudaGraphConditionalHandle handle, unsigned int value);\nextern \"C\" __global__ void k(cudaGraphConditionalHandle h, const unsigned* f) { cudaGraphSetConditional(h, *f); }"),
        ("nvrtc builtin type", "extern \"C\" __device__ __cudart_builtin__ void CUDARTAPI cudaGraphSetConditional(cudaGraphConditionalHandle handle, unsigned int value);\nextern \"C\" __global__ void k(cudaGraphConditionalHandle h, const unsigned* f) { cudaGraphSetConditional(h, *f); }"),
    ];
    for (name, src) in sources {
        for out in [Output::Cubin, Output::Ptx] {
            let label = format!("{name} {out:?}");
            let compiled = Program::new(src)
                .device(&dev)?
                .output(out)
                .no_cache()
                .compile();
            let compiled = match compiled {
                Ok(c) => c,
                Err(e) => {
                    println!("probe {label}: compile ERR {e}");
                    continue;
                }
            };
            let module = match compiled.load(&dev) {
                Ok(m) => m,
                Err(e) => {
                    println!("probe {label}: load ERR {e}");
                    continue;
                }
            };
            let k = module.kernel("k")?;
            let g = GraphHandle::new(&dev)?;
            // SAFETY: a live graph and its device's context.
            let h = unsafe { ex::conditional_handle_create(g.raw(), ctx, Some(0)) }?;
            let (mut a, mut b) = (h, flag.as_raw());
            let mut params = [
                &mut a as *mut u64 as *mut c_void,
                &mut b as *mut u64 as *mut c_void,
            ];
            let cfg = LaunchConfig::new((1, 1, 1), (1, 1, 1));
            // SAFETY: probe: the parameters match `k`; the graph is never launched unless ok.
            let r = unsafe { ex::add_kernel_node(g.raw(), &[], k.function(), &cfg, &mut params) };
            show(&format!("{label}: add kernel to top graph"), &r.map(|_| ()));
            // Inside a while body.
            let g2 = GraphHandle::new(&dev)?;
            // SAFETY: as above.
            let h2 = unsafe { ex::conditional_handle_create(g2.raw(), ctx, Some(0)) }?;
            // SAFETY: as above.
            let cond =
                unsafe { ex::add_conditional_node(g2.raw(), &[], h2, ConditionalKind::While, ctx) };
            show(&format!("{label}: while node"), &cond.as_ref().map(|_| ()));
            if let Ok((_, bodies)) = cond {
                let mut a2 = h2;
                let mut params2 = [
                    &mut a2 as *mut u64 as *mut c_void,
                    &mut b as *mut u64 as *mut c_void,
                ];
                // SAFETY: as above.
                let r = unsafe {
                    ex::add_kernel_node(bodies[0], &[], k.function(), &cfg, &mut params2)
                };
                show(
                    &format!("{label}: add kernel to while body"),
                    &r.map(|_| ()),
                );
            }
        }
    }
    // Memsets.
    for (pname, pitch) in [("pitch 0", 0usize), ("pitch = bytes", 4096)] {
        let mut p = ex::memset_params(buf.as_raw(), 7, 4, 1024);
        p.pitch = pitch;
        let g = GraphHandle::new(&dev)?;
        // SAFETY: probe; buf outlives the graph.
        let r = unsafe { ex::add_memset_node(g.raw(), &[], &p, ctx) };
        show(&format!("memset top {pname}"), &r.as_ref().map(|_| ()));
        // SAFETY: probe.
        let r0 = unsafe { ex::add_memset_node(g.raw(), &[], &p, std::ptr::null_mut()) };
        show(&format!("memset top {pname} ctx null"), &r0.map(|_| ()));
        let g2 = GraphHandle::new(&dev)?;
        // SAFETY: probe.
        let h2 = unsafe { ex::conditional_handle_create(g2.raw(), ctx, Some(0)) }?;
        // SAFETY: probe.
        let cond = unsafe { ex::add_conditional_node(g2.raw(), &[], h2, ConditionalKind::If, ctx) };
        if let Ok((_, bodies)) = cond {
            // SAFETY: probe.
            let r = unsafe { ex::add_memset_node(bodies[0], &[], &p, ctx) };
            show(&format!("memset if-body {pname}"), &r.map(|_| ()));
            for (en, es, w) in [("u8 x4096", 1u32, 4096usize), ("u16 x2048", 2, 2048)] {
                let mut q = ex::memset_params(buf.as_raw(), 7, es, w);
                q.pitch = pitch;
                // SAFETY: probe.
                let r = unsafe { ex::add_memset_node(bodies[0], &[], &q, ctx) };
                show(&format!("memset if-body {pname} {en}"), &r.map(|_| ()));
            }
        }
        if let Ok(node) = r {
            let mut err = std::ptr::null_mut();
            let exec = g.instantiate_with_params(InstantiateFlags::default(), None, &mut err);
            show(
                &format!("instantiate memset graph {pname}"),
                &exec.as_ref().map(|_| ()),
            );
            if let Ok(exec) = exec {
                for (bn, target) in [("same buffer", &buf), ("other buffer", &buf2)] {
                    let mut q = ex::memset_params(target.as_raw(), 9, 4, 1024);
                    q.pitch = pitch;
                    // SAFETY: probe; buffers outlive the exec (never launched).
                    let r = unsafe { exec.set_memset_params(node, &q, ctx) };
                    show(&format!("exec memset update {pname} {bn}"), &r);
                }
            }
        }
    }
    // Executable memset updates through the builder, with other nodes around.
    let plain = Program::new("extern \"C\" __global__ void k2(unsigned* p, unsigned long long n) { unsigned long long i = blockIdx.x * 256ull + threadIdx.x; if (i < n) p[i] += 1; }")
        .device(&dev)?
        .no_cache()
        .compile()?
        .load(&dev)?;
    let k2 = plain.kernel("k2")?;
    let n = 4096usize;
    let a = DevicePtr::alloc(&dev, n * 4)?;
    let b2 = DevicePtr::alloc(&dev, n * 4)?;
    let c = DevicePtr::alloc(&dev, n * 4)?;
    for variant in [
        "memset only",
        "memset + copy",
        "memset + kernel",
        "memset + host",
        "memset + kernel + copy + host",
    ] {
        let mut g = GraphBuilder::new(&dev)?;
        let m = g.add_memset_u32(&[], &a, 0)?;
        let mut last = m;
        if variant.contains("kernel") {
            let (mut p, mut nn) = (a.as_raw(), n as u64);
            let mut params = [
                &mut p as *mut u64 as *mut c_void,
                &mut nn as *mut u64 as *mut c_void,
            ];
            let cfg = LaunchConfig::new(((n / 256) as u32, 1, 1), (256, 1, 1));
            // SAFETY: k2 over n u32 of `a`, kept by the graph.
            last = unsafe { g.add_kernel(&[last], k2.function(), &cfg, &mut params, &[&a]) }?;
        }
        if variant.contains("copy") {
            last = g.add_memcpy(&[last], &c, &a)?;
        }
        if variant.contains("host") {
            g.add_host(&[last], || {})?;
        }
        let mut exec = g.finish()?.instantiate()?;
        show(
            &format!("builder exec {variant}: set_memset other buffer"),
            &exec.set_memset_u32(m, &b2, 5),
        );
        show(
            &format!("builder exec {variant}: set_memset same buffer"),
            &exec.set_memset_u32(m, &a, 6),
        );
    }
    Ok(())
}

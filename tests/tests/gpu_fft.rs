//! GPU: cuFFT through `cuda-fft`: C2C, R2C and C2R in f32 and f64, 1-, 2- and 3-D, batched
//! and strided, against a CPU DFT; inverse after forward gives n times the input; in place;
//! refusals on the GPU that issue nothing; a plan moved between streams and threads (the
//! per-thread stream refused); a captured FFT without memory nodes that replays new inputs, and 1,000
//! captures leaving the pool's reserved bytes flat; the plan cache's bound.
#![cfg(feature = "gpu")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use cudars_core::{DevicePtr, Stream};
use cudars_fft::{cache, Direction, Error, Geometry, Layout, Plan, Precision, Transform};
use cudars_graph::CaptureMode;
use workspace_tests::gpu::{dev0, serial};
use workspace_tests::rtc::Rng;

fn upload<T: bytemuck::Pod>(stream: &Stream, host: &[T]) -> DevicePtr {
    let p = cudars_mempool::driver::malloc(stream, std::mem::size_of_val(host).max(1)).unwrap();
    p.copy_from_host(host).unwrap();
    p
}

fn download<T: bytemuck::Pod>(stream: &Stream, p: &DevicePtr, n: usize) -> Vec<T> {
    stream.synchronize().unwrap();
    let mut v = vec![T::zeroed(); n];
    p.slice(..n * std::mem::size_of::<T>())
        .unwrap()
        .copy_to_host(&mut v)
        .unwrap();
    v
}

type C = (f64, f64);

/// The DFT of `x` (row-major `shape`), `sign` -1 forward, +1 inverse, unnormalised.
fn dft(x: &[C], shape: &[usize], sign: f64) -> Vec<C> {
    let mut cur = x.to_vec();
    let total: usize = shape.iter().product();
    // One dimension at a time.
    for (d, &n) in shape.iter().enumerate() {
        let inner: usize = shape[d + 1..].iter().product();
        let outer = total / (n * inner);
        let mut next = vec![(0.0, 0.0); total];
        for o in 0..outer {
            for i in 0..inner {
                for k in 0..n {
                    let (mut re, mut im) = (0.0, 0.0);
                    for j in 0..n {
                        let v = cur[(o * n + j) * inner + i];
                        let a = sign * 2.0 * std::f64::consts::PI * ((j * k) % n) as f64 / n as f64;
                        let (s, c) = a.sin_cos();
                        re += v.0 * c - v.1 * s;
                        im += v.0 * s + v.1 * c;
                    }
                    next[(o * n + k) * inner + i] = (re, im);
                }
            }
        }
        cur = next;
    }
    cur
}

/// max |got - want| over max |want|.
fn rel(got: &[C], want: &[C]) -> f64 {
    assert_eq!(got.len(), want.len());
    let mag = want
        .iter()
        .fold(0f64, |m, w| m.max(w.0.abs()).max(w.1.abs()))
        .max(1e-300);
    got.iter().zip(want).fold(0f64, |m, (g, w)| {
        m.max((g.0 - w.0).abs()).max((g.1 - w.1).abs())
    }) / mag
}

fn complex_data(rng: &mut Rng, n: usize) -> Vec<C> {
    (0..n)
        .map(|_| (rng.f32() as f64 * 2.0 - 1.0, rng.f32() as f64 * 2.0 - 1.0))
        .collect()
}

fn to_f32(x: &[C]) -> Vec<f32> {
    x.iter().flat_map(|c| [c.0 as f32, c.1 as f32]).collect()
}
fn to_f64(x: &[C]) -> Vec<f64> {
    x.iter().flat_map(|c| [c.0, c.1]).collect()
}
fn from_f32(v: &[f32]) -> Vec<C> {
    v.chunks(2).map(|p| (p[0] as f64, p[1] as f64)).collect()
}
fn from_f64(v: &[f64]) -> Vec<C> {
    v.chunks(2).map(|p| (p[0], p[1])).collect()
}

#[test]
fn c2c_transforms_match_a_cpu_dft_in_both_precisions_and_every_rank() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let mut rng = Rng::new(3);
    for (shape, batch) in [
        (&[1000][..], 3),
        (&[64][..], 1),
        (&[12, 10][..], 2),
        (&[6, 5, 4][..], 2),
    ] {
        let n: usize = shape.iter().product();
        let x = complex_data(&mut rng, n * batch);
        let want: Vec<C> = (0..batch)
            .flat_map(|b| dft(&x[b * n..(b + 1) * n], shape, -1.0))
            .collect();
        // f32
        let (din, dout) = (
            upload(&stream, &to_f32(&x)),
            upload(&stream, &vec![0f32; 2 * n * batch]),
        );
        cudars_fft::c2c::<f32>(&stream, &din, &dout, shape, batch, Direction::Forward).unwrap();
        let got = from_f32(&download::<f32>(&stream, &dout, 2 * n * batch));
        let e32 = rel(&got, &want);
        // inverse in place: n x
        cudars_fft::c2c::<f32>(&stream, &dout, &dout, shape, batch, Direction::Inverse).unwrap();
        let back: Vec<C> = from_f32(&download::<f32>(&stream, &dout, 2 * n * batch))
            .iter()
            .map(|c| (c.0 / n as f64, c.1 / n as f64))
            .collect();
        let r32 = rel(&back, &x);
        // f64
        let (din, dout) = (
            upload(&stream, &to_f64(&x)),
            upload(&stream, &vec![0f64; 2 * n * batch]),
        );
        cudars_fft::c2c::<f64>(&stream, &din, &dout, shape, batch, Direction::Forward).unwrap();
        let got = from_f64(&download::<f64>(&stream, &dout, 2 * n * batch));
        let e64 = rel(&got, &want);
        cudars_fft::c2c::<f64>(&stream, &dout, &din, shape, batch, Direction::Inverse).unwrap();
        let back: Vec<C> = from_f64(&download::<f64>(&stream, &din, 2 * n * batch))
            .iter()
            .map(|c| (c.0 / n as f64, c.1 / n as f64))
            .collect();
        let r64 = rel(&back, &x);
        println!(
            "C2C {shape:?} x {batch}: f32 {e32:.1e} (inverse∘forward {r32:.1e}), f64 {e64:.1e} ({r64:.1e})"
        );
        assert!(
            e32 < 1e-5 && r32 < 1e-5,
            "f32 {shape:?}: {e32:.2e} {r32:.2e}"
        );
        assert!(
            e64 < 1e-12 && r64 < 1e-12,
            "f64 {shape:?}: {e64:.2e} {r64:.2e}"
        );
    }
}

#[test]
fn r2c_and_c2r_match_a_cpu_dft_and_invert() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let mut rng = Rng::new(5);
    for (shape, batch) in [(&[1001][..], 2), (&[8, 6][..], 3), (&[4, 6, 10][..], 2)] {
        let n: usize = shape.iter().product();
        let h: usize =
            shape[..shape.len() - 1].iter().product::<usize>() * (shape[shape.len() - 1] / 2 + 1);
        let x: Vec<f64> = (0..n * batch).map(|_| rng.f32() as f64 - 0.5).collect();
        let last = shape[shape.len() - 1];
        let want: Vec<C> = (0..batch)
            .flat_map(|b| {
                let xc: Vec<C> = x[b * n..(b + 1) * n].iter().map(|&v| (v, 0.0)).collect();
                let full = dft(&xc, shape, -1.0);
                // the Hermitian half: the last dimension's first n/2 + 1
                full.chunks(last)
                    .flat_map(|row| row[..last / 2 + 1].to_vec())
                    .collect::<Vec<C>>()
            })
            .collect();
        assert_eq!(want.len(), h * batch);
        // f32
        let xs: Vec<f32> = x.iter().map(|&v| v as f32).collect();
        let din = upload(&stream, &xs);
        let spec = upload(&stream, &vec![0f32; 2 * h * batch]);
        cudars_fft::r2c::<f32>(&stream, &din, &spec, shape, batch).unwrap();
        let e32 = rel(
            &from_f32(&download::<f32>(&stream, &spec, 2 * h * batch)),
            &want,
        );
        let back = upload(&stream, &vec![0f32; n * batch]);
        cudars_fft::c2r::<f32>(&stream, &spec, &back, shape, batch).unwrap();
        let got: Vec<f64> = download::<f32>(&stream, &back, n * batch)
            .iter()
            .map(|&v| v as f64 / n as f64)
            .collect();
        let r32 = got
            .iter()
            .zip(&x)
            .fold(0f64, |m, (a, b)| m.max((a - b).abs()));
        // f64
        let din = upload(&stream, &x);
        let spec = upload(&stream, &vec![0f64; 2 * h * batch]);
        cudars_fft::r2c::<f64>(&stream, &din, &spec, shape, batch).unwrap();
        let e64 = rel(
            &from_f64(&download::<f64>(&stream, &spec, 2 * h * batch)),
            &want,
        );
        let back = upload(&stream, &vec![0f64; n * batch]);
        cudars_fft::c2r::<f64>(&stream, &spec, &back, shape, batch).unwrap();
        let got: Vec<f64> = download::<f64>(&stream, &back, n * batch)
            .iter()
            .map(|&v| v / n as f64)
            .collect();
        let r64 = got
            .iter()
            .zip(&x)
            .fold(0f64, |m, (a, b)| m.max((a - b).abs()));
        println!(
            "R2C/C2R {shape:?} x {batch}: f32 {e32:.1e} (c2r∘r2c {r32:.1e}), f64 {e64:.1e} ({r64:.1e})"
        );
        assert!(e32 < 1e-5 && r32 < 1e-5, "f32 {shape:?}");
        assert!(e64 < 1e-12 && r64 < 1e-12, "f64 {shape:?}");
    }
}

#[test]
fn strided_layouts_transform_the_columns_of_a_matrix() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let mut rng = Rng::new(9);
    // A 48 x 10 row-major complex matrix: 10 transforms of length 48 down the columns,
    // written into a 48 x 12 matrix (two spare columns that must stay untouched).
    let (rows, cols, ocols) = (48, 10, 12);
    let x = complex_data(&mut rng, rows * cols);
    let g = Geometry::with_layouts(
        Transform::C2C,
        Precision::Double,
        &[rows],
        cols,
        Layout {
            embed: vec![rows],
            stride: cols,
            dist: 1,
        },
        Layout {
            embed: vec![rows],
            stride: ocols,
            dist: 1,
        },
    )
    .unwrap();
    let din = upload(&stream, &to_f64(&x));
    let sentinel = vec![(7.0, -7.0); rows * ocols];
    let dout = upload(&stream, &to_f64(&sentinel));
    cudars_fft::exec(&stream, &g, &din, &dout, Direction::Forward).unwrap();
    let got = from_f64(&download::<f64>(&stream, &dout, 2 * rows * ocols));
    let mut worst = 0f64;
    for c in 0..cols {
        let col: Vec<C> = (0..rows).map(|r| x[r * cols + c]).collect();
        let want = dft(&col, &[rows], -1.0);
        let have: Vec<C> = (0..rows).map(|r| got[r * ocols + c]).collect();
        worst = worst.max(rel(&have, &want));
    }
    for r in 0..rows {
        for c in cols..ocols {
            assert_eq!(got[r * ocols + c], (7.0, -7.0), "({r}, {c}) was written");
        }
    }
    println!("column transforms (stride {cols} -> {ocols}, dist 1): {worst:.1e}");
    assert!(worst < 1e-12);
}

#[test]
fn refusals_on_the_gpu_issue_nothing() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let n = 256;
    let x = upload(&stream, &vec![1f32; 2 * n]);
    let y = upload(&stream, &vec![3f32; 2 * n]);
    let small = upload(&stream, &vec![3f32; 2 * n - 2]);
    let mut plan = Plan::new(
        &dev,
        Geometry::packed(Transform::C2C, Precision::Single, &[n], 1).unwrap(),
    )
    .unwrap();
    let e = plan
        .exec(&stream, &x, &small, Direction::Forward)
        .unwrap_err();
    assert!(
        matches!(e, Error::BufferTooSmall { arg: "output", .. }),
        "{e}"
    );
    let odd = y.slice(4..).unwrap();
    let e = plan
        .exec(&stream, &x, &odd, Direction::Forward)
        .unwrap_err();
    assert!(
        matches!(e, Error::Misaligned { .. } | Error::BufferTooSmall { .. }),
        "{e}"
    );
    let shifted = x.slice(8..).unwrap();
    let e = plan
        .exec(&stream, &x, &shifted, Direction::Forward)
        .unwrap_err();
    assert!(
        matches!(e, Error::Overlap { .. } | Error::BufferTooSmall { .. }),
        "{e}"
    );
    let mut r2c = Plan::new(
        &dev,
        Geometry::packed(Transform::R2C, Precision::Single, &[n], 1).unwrap(),
    )
    .unwrap();
    let e = r2c.exec(&stream, &x, &y, Direction::Inverse).unwrap_err();
    assert!(matches!(e, Error::Direction { .. }), "{e}");
    assert_eq!(plan.executions() + r2c.executions(), 0);
    // Nothing was written.
    assert!(download::<f32>(&stream, &y, 2 * n)
        .iter()
        .all(|&v| v == 3.0));
    assert_eq!(plan.work_bytes(), plan.work_bytes()); // (readable without a run)
}

#[test]
fn a_plan_moves_between_streams_and_threads_and_stays_right() {
    let _s = serial();
    let dev = dev0();
    let (a, b) = (Stream::new(&dev).unwrap(), Stream::new(&dev).unwrap());
    let mut rng = Rng::new(21);
    let n = 4096;
    let batch = 16;
    let x = complex_data(&mut rng, n * batch);
    let want: Vec<C> = (0..batch)
        .flat_map(|k| dft(&x[k * n..(k + 1) * n], &[n], -1.0))
        .collect();
    let din = upload(&a, &to_f32(&x));
    a.synchronize().unwrap();
    let outs: Vec<DevicePtr> = (0..4)
        .map(|_| upload(&a, &vec![0f32; 2 * n * batch]))
        .collect();
    a.synchronize().unwrap();
    let mut plan = Plan::new(
        &dev,
        Geometry::packed(Transform::C2C, Precision::Single, &[n], batch).unwrap(),
    )
    .unwrap();
    plan.exec(&a, &din, &outs[0], Direction::Forward).unwrap();
    plan.exec(&b, &din, &outs[1], Direction::Forward).unwrap();
    // The per-thread default stream is refused, with nothing issued.
    let per_thread = Stream::per_thread(&dev);
    let e = plan
        .exec(&per_thread, &din, &outs[2], Direction::Forward)
        .unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
    // Another thread, on a stream of its own, then back to the first stream.
    let c = Stream::new(&dev).unwrap();
    let mut plan = std::thread::scope(|s| {
        s.spawn(|| {
            let mut plan = plan;
            plan.exec(&c, &din, &outs[2], Direction::Forward).unwrap();
            plan
        })
        .join()
        .unwrap()
    });
    plan.exec(&a, &din, &outs[3], Direction::Forward).unwrap();
    b.synchronize().unwrap();
    c.synchronize().unwrap();
    for (i, o) in outs.iter().enumerate() {
        let got = from_f32(&download::<f32>(&a, o, 2 * n * batch));
        let e = rel(&got, &want);
        assert!(e < 1e-5, "output {i}: {e:.2e}");
    }
    assert_eq!(plan.executions(), 4);
    println!(
        "one plan on three streams and two threads: right each time; the per-thread stream refused"
    );
}

#[test]
fn a_captured_fft_has_no_memory_node_and_replays_new_inputs() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let mut rng = Rng::new(33);
    let (n, batch) = (2048, 8);
    let din = upload(&stream, &vec![0f32; 2 * n * batch]);
    let dout = upload(&stream, &vec![0f32; 2 * n * batch]);
    stream.synchronize().unwrap();
    let mut plan = Plan::new(
        &dev,
        Geometry::packed(Transform::C2C, Precision::Single, &[n], batch).unwrap(),
    )
    .unwrap();
    let graph = cudars_graph::capture(&stream, CaptureMode::ThreadLocal, |s| {
        plan.exec(s, &din, &dout, Direction::Forward)
            .map_err(cudars_graph::Error::other)
    })
    .unwrap();
    let dot = std::env::temp_dir().join(format!("cudars-fft-{}.dot", std::process::id()));
    graph.write_dot(&dot, true).unwrap();
    let text = std::fs::read_to_string(&dot).unwrap().to_lowercase();
    let _ = std::fs::remove_file(&dot);
    assert!(
        !text.contains("mem_alloc") && !text.contains("memalloc"),
        "a memory node:\n{text}"
    );
    let exec = graph.instantiate().unwrap();
    for round in 0..3 {
        let x = complex_data(&mut rng, n * batch);
        din.copy_from_host(&to_f32(&x)).unwrap();
        exec.launch(&stream).unwrap();
        let got = from_f32(&download::<f32>(&stream, &dout, 2 * n * batch));
        let want: Vec<C> = (0..batch)
            .flat_map(|k| dft(&x[k * n..(k + 1) * n], &[n], -1.0))
            .collect();
        let e = rel(&got, &want);
        println!("replay {round} with new input: {e:.1e}");
        assert!(e < 1e-5);
    }
    // An eager execution between replays uses the eager work area and stays right.
    plan.exec(&stream, &din, &dout, Direction::Forward).unwrap();
    stream.synchronize().unwrap();
    // 1,000 captures: the pool's reserved bytes stay flat.
    let pool = cudars_mempool::driver::default_pool().unwrap();
    let id = cudars_mempool::driver::device_id(&dev);
    let mut capture_once = || {
        let g = cudars_graph::capture(&stream, CaptureMode::ThreadLocal, |s| {
            plan.exec(s, &din, &dout, Direction::Forward)
                .map_err(cudars_graph::Error::other)
        })
        .unwrap();
        g.instantiate().unwrap().launch(&stream).unwrap();
    };
    for _ in 0..10 {
        capture_once();
    }
    stream.synchronize().unwrap();
    let before = pool.stats(id).unwrap().reserved.current;
    for _ in 0..1000 {
        capture_once();
    }
    stream.synchronize().unwrap();
    let after = pool.stats(id).unwrap().reserved.current;
    println!("1,000 captured FFTs: pool reserved {before} -> {after} bytes");
    assert!(after <= before, "reserved grew from {before} to {after}");
}

#[test]
fn the_plan_cache_hits_and_keeps_its_bound() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    cache::clear();
    cache::set_size(4);
    let buf = upload(&stream, &vec![0f32; 2 * 64 * 64]);
    let out = upload(&stream, &vec![0f32; 2 * 64 * 64]);
    let (h0, m0) = cache::stats();
    for n in [8, 16, 32, 64, 8, 16] {
        cudars_fft::c2c::<f32>(&stream, &buf, &out, &[n], 1, Direction::Forward).unwrap();
    }
    let (h1, m1) = cache::stats();
    // Four plans fit the bound: 8, 16, 32, 64 miss, 8 and 16 hit.
    assert_eq!((h1 - h0, m1 - m0), (2, 4));
    assert_eq!(cache::len(), 4);
    // A fifth drops the least recently used (32): 128 misses, 32 misses again (and drops
    // 64), 8 still hits.
    for n in [128, 32, 8] {
        cudars_fft::c2c::<f32>(&stream, &buf, &out, &[n], 1, Direction::Forward).unwrap();
    }
    let (h1, m1) = cache::stats();
    assert_eq!((h1 - h0, m1 - m0), (3, 6));
    assert_eq!(cache::len(), 4);
    for _ in 0..10 {
        cudars_fft::c2c::<f32>(&stream, &buf, &out, &[128], 1, Direction::Forward).unwrap();
    }
    let (h2, m2) = cache::stats();
    assert_eq!((h2 - h1, m2 - m1), (10, 0));
    cache::set_size(cache::DEFAULT_SIZE);
    cache::clear();
    assert_eq!(cache::len(), 0);
    stream.synchronize().unwrap();
}

fn to_f16(x: &[C]) -> Vec<half::f16> {
    x.iter()
        .flat_map(|c| [half::f16::from_f64(c.0), half::f16::from_f64(c.1)])
        .collect()
}
fn from_f16(v: &[half::f16]) -> Vec<C> {
    v.chunks(2)
        .map(|p| (p[0].to_f64(), p[1].to_f64()))
        .collect()
}

#[test]
fn half_precision_transforms_match_a_cpu_dft_and_refuse_other_sizes() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let mut rng = Rng::new(16);
    // C2C, 1-D and 2-D, batched: the DFT of the rounded input, half-precision error.
    for (shape, batch) in [(&[256][..], 4), (&[16, 32][..], 2)] {
        let n: usize = shape.iter().product();
        let x = complex_data(&mut rng, n * batch);
        let xh = to_f16(&x);
        let rounded = from_f16(&xh);
        let want: Vec<C> = (0..batch)
            .flat_map(|b| dft(&rounded[b * n..(b + 1) * n], shape, -1.0))
            .collect();
        // The output starts as NaN: a transform that writes nothing (or part) fails.
        let (din, dout) = (
            upload(&stream, &xh),
            upload(&stream, &vec![half::f16::NAN; 2 * n * batch]),
        );
        cudars_fft::c2c::<half::f16>(&stream, &din, &dout, shape, batch, Direction::Forward)
            .unwrap();
        let got = from_f16(&download::<half::f16>(&stream, &dout, 2 * n * batch));
        let e = rel(&got, &want);
        println!("c2c f16 {shape:?} x {batch}: {e:.1e}");
        assert!(e < 5e-3, "{e}");
        assert!(got.iter().all(|c| c.0.is_finite() && c.1.is_finite()));
    }
    // R2C then C2R: n times the input.
    let n = 512;
    let x: Vec<half::f16> = (0..n)
        .map(|_| half::f16::from_f32(rng.f32() * 2.0 - 1.0))
        .collect();
    let h = n / 2 + 1;
    let (dx, dh, dy) = (
        upload(&stream, &x),
        upload(&stream, &vec![half::f16::ZERO; 2 * h]),
        upload(&stream, &vec![half::f16::ZERO; n]),
    );
    cudars_fft::r2c::<half::f16>(&stream, &dx, &dh, &[n], 1).unwrap();
    cudars_fft::c2r::<half::f16>(&stream, &dh, &dy, &[n], 1).unwrap();
    let y = download::<half::f16>(&stream, &dy, n);
    let e = x
        .iter()
        .zip(&y)
        .map(|(a, b)| (a.to_f64() * n as f64 - b.to_f64()).abs())
        .fold(0f64, f64::max)
        / n as f64;
    println!("r2c/c2r f16 {n}: |c2r(r2c(x)) / n - x| {e:.1e}");
    assert!(e < 1e-2, "{e}");
    // A size that is not a power of two is refused before cuFFT sees it.
    assert!(matches!(
        Geometry::packed(Transform::C2C, Precision::Half, &[1000], 1),
        Err(Error::Shape { .. })
    ));
}

#[test]
fn a_graph_replays_after_its_plan_is_dropped_and_the_cache_cleared() {
    let _s = serial();
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    let mut rng = Rng::new(41);
    let n = 4096;
    let din = upload(&stream, &vec![0f32; 2 * n]);
    let dout = upload(&stream, &vec![0f32; 2 * n]);
    let d2 = upload(&stream, &vec![0f32; 2 * n]);
    stream.synchronize().unwrap();
    // A cache miss inside a capture is refused (planning allocates), and the capture lives.
    cache::clear();
    let g = cudars_graph::capture(&stream, CaptureMode::ThreadLocal, |s| {
        let e = cudars_fft::c2c::<f32>(s, &din, &dout, &[n], 1, Direction::Forward).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Unsupported {
                    what: "FFT planning",
                    ..
                }
            ),
            "{e}"
        );
        Ok(())
    });
    assert!(g.is_ok(), "{g:?}");
    // Planned once outside: one graph through the cache, one through a plan of its own.
    cudars_fft::c2c::<f32>(&stream, &din, &dout, &[n], 1, Direction::Forward).unwrap();
    let cached = cudars_graph::capture(&stream, CaptureMode::ThreadLocal, |s| {
        cudars_fft::c2c::<f32>(s, &din, &dout, &[n], 1, Direction::Forward)
            .map_err(cudars_graph::Error::other)
    })
    .unwrap()
    .instantiate()
    .unwrap();
    let mut plan = Plan::new(
        &dev,
        Geometry::packed(Transform::C2C, Precision::Single, &[n], 1).unwrap(),
    )
    .unwrap();
    let owned = cudars_graph::capture(&stream, CaptureMode::ThreadLocal, |s| {
        plan.exec(s, &din, &d2, Direction::Forward)
            .map_err(cudars_graph::Error::other)
    })
    .unwrap()
    .instantiate()
    .unwrap();
    // The plans go: the graphs keep their handles (and cuFFT's tables) alive.
    drop(plan);
    cache::clear();
    for round in 0..3 {
        let x = complex_data(&mut rng, n);
        din.copy_from_host(&to_f32(&x)).unwrap();
        cached.launch(&stream).unwrap();
        owned.launch(&stream).unwrap();
        let want = dft(&x, &[n], -1.0);
        let (a, b) = (
            from_f32(&download::<f32>(&stream, &dout, 2 * n)),
            from_f32(&download::<f32>(&stream, &d2, 2 * n)),
        );
        println!(
            "replay {round} after the plans were dropped: {:.1e}, {:.1e}",
            rel(&a, &want),
            rel(&b, &want)
        );
        assert!(rel(&a, &want) < 1e-5 && rel(&b, &want) < 1e-5);
    }
    drop(cached);
    drop(owned);
    // With no capture running, the handles are destroyed with their graphs.
    assert_eq!(cudars_fft::plan::bury(), 0);
}

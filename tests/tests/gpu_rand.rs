//! GPU: `cuda-rand`: every generator kind and every fill, in `f32` and `f64`, against the
//! CPU's reference (moments and histograms of the numbers the GPU wrote, within stated
//! tolerances); seeds and offsets (same seed, same numbers; other offsets, other numbers);
//! `set_stream` ordering; a `cuda-mempool` pool block filled on a second stream and not
//! reused under the fill; refusals on the GPU that issue nothing; captures refused; drops
//! inside a host function and during a capture deferred; eight threads each with a generator
//! and a stream.
//!
//! cuRAND is opened from `$CUDA_CURAND_LIBRARY` or `libcurand.so.10`; without it every test
//! here fails at its first generator.
//!
//! Tolerances: with `N = 2^20` numbers the standard error of a mean is `sigma / 1024`, of a
//! variance about `sigma^2 * 0.0014`, of a histogram fraction at most `0.0005`. The checks
//! allow about ten standard errors (means 0.3%-1% of the scale, variances 2%-5%, histogram
//! fractions 0.003), so a correct fill fails them with negligible probability and a wrong
//! distribution (another mean, scale, shape, a missing half of the view) does not pass.
#![cfg(feature = "gpu")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use cudars_core::graph::{self, CaptureMode};
use cudars_core::{Device, DevicePtr, Stream};
use cudars_rand::{deferred_destroys, destroy_failures, Error, Generator, RngKind, RngOrdering};
use workspace_tests::gpu::{dev0, serial};
use workspace_tests::rtc::Rng;

const N: usize = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq)]
enum DType {
    F32,
    F64,
}

impl DType {
    fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F64 => 8,
        }
    }
}

const DTYPES: [DType; 2] = [DType::F32, DType::F64];

fn new_stream(dev: &Device) -> Stream {
    Stream::builder(dev).non_blocking(true).build().unwrap()
}

/// A generator of `kind` on `stream`: seeded with `seed` when pseudo-random, else (Sobol) at
/// offset `seed % 4096`, so each run draws from its own part of the sequence.
fn generator(kind: RngKind, stream: &Stream, seed: u64) -> Generator {
    if kind.is_pseudo() {
        let g = Generator::with_seed(kind, stream, seed).unwrap();
        assert_eq!(g.seed(), Some(seed));
        g
    } else {
        let mut g = Generator::new(kind, stream).unwrap();
        assert_eq!(g.seed(), None);
        g.set_offset(seed % 4096).unwrap();
        g
    }
}

/// The view as `T`s, after the generator's stream has finished.
fn read<T: bytemuck::Pod>(gen: &Generator, view: &DevicePtr) -> Vec<T> {
    gen.stream().synchronize().unwrap();
    let mut host = vec![T::zeroed(); view.len() / std::mem::size_of::<T>()];
    view.copy_to_host(&mut host).unwrap();
    host
}

fn read_f64(gen: &Generator, view: &DevicePtr, dtype: DType) -> Vec<f64> {
    match dtype {
        DType::F32 => read::<f32>(gen, view).into_iter().map(f64::from).collect(),
        DType::F64 => read::<f64>(gen, view),
    }
}

#[derive(Debug)]
struct Moments {
    mean: f64,
    var: f64,
    min: f64,
    max: f64,
}

fn moments(xs: &[f64]) -> Moments {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
    let min = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let max = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Moments {
        mean,
        var,
        min,
        max,
    }
}

#[track_caller]
fn close(what: &str, got: f64, want: f64, tol: f64) {
    assert!(
        (got - want).abs() <= tol,
        "{what}: {got} vs {want} (tolerance {tol})"
    );
}

/// The fraction of `xs` in each bin between consecutive `edges` (with -inf and +inf added).
fn histogram(xs: &[f64], edges: &[f64]) -> Vec<f64> {
    let mut counts = vec![0usize; edges.len() + 1];
    for &x in xs {
        counts[edges.iter().take_while(|&&e| x >= e).count()] += 1;
    }
    counts
        .into_iter()
        .map(|c| c as f64 / xs.len() as f64)
        .collect()
}

#[test]
fn uniform_numbers_of_every_kind_and_float_type_match_the_cpu_reference() {
    let _g = serial();
    let dev = dev0();
    let stream = new_stream(&dev);
    let mut rng = Rng::new(0x5eed_0001);
    for kind in RngKind::ALL {
        for dtype in DTYPES {
            let seed = rng.next_u64();
            let what = format!("{kind:?} {dtype:?} seed {seed}");
            let mut gen = generator(kind, &stream, seed);
            let out = DevicePtr::alloc(&dev, N * dtype.size()).unwrap();
            match dtype {
                DType::F32 => gen.uniform::<f32>(&out),
                DType::F64 => gen.uniform::<f64>(&out),
            }
            .unwrap();
            let xs = read_f64(&gen, &out, dtype);
            let m = moments(&xs);
            // cuRAND's uniform numbers lie in (0, 1].
            assert!(m.min > 0.0 && m.max <= 1.0, "{what}: {m:?}");
            close(&format!("{what} mean"), m.mean, 0.5, 0.003);
            close(&format!("{what} variance"), m.var, 1.0 / 12.0, 0.002);
            let edges: Vec<f64> = (1..10).map(|i| f64::from(i) / 10.0).collect();
            for (i, f) in histogram(&xs, &edges).into_iter().enumerate() {
                close(&format!("{what} decile {i}"), f, 0.1, 0.003);
            }
        }
    }
}

#[test]
fn normal_numbers_of_every_kind_and_float_type_match_the_cpu_reference() {
    let _g = serial();
    let dev = dev0();
    let stream = new_stream(&dev);
    let mut rng = Rng::new(0x5eed_0002);
    // Standard normal CDF at -2, -1, 0, 1, 2: the fractions of each bin.
    let want = [
        0.022_750, 0.135_905, 0.341_345, 0.341_345, 0.135_905, 0.022_750,
    ];
    for kind in RngKind::ALL {
        for dtype in DTYPES {
            let seed = rng.next_u64();
            let (mean, std) = (1.5, 2.0);
            let what = format!("{kind:?} {dtype:?} seed {seed}");
            let mut gen = generator(kind, &stream, seed);
            let out = DevicePtr::alloc(&dev, N * dtype.size()).unwrap();
            match dtype {
                DType::F32 => gen.normal::<f32>(&out, mean as f32, std as f32),
                DType::F64 => gen.normal::<f64>(&out, mean, std),
            }
            .unwrap();
            let xs = read_f64(&gen, &out, dtype);
            assert!(xs.iter().all(|x| x.is_finite()), "{what}: not finite");
            let m = moments(&xs);
            close(&format!("{what} mean"), m.mean, mean, 0.02);
            close(&format!("{what} std"), m.var.sqrt(), std, 0.02 * std);
            let z: Vec<f64> = xs.iter().map(|x| (x - mean) / std).collect();
            let bins = histogram(&z, &[-2.0, -1.0, 0.0, 1.0, 2.0]);
            for (i, (got, want)) in bins.into_iter().zip(want).enumerate() {
                close(&format!("{what} bin {i}"), got, want, 0.003);
            }
            // The standard form: mean 0, std 1.
            match dtype {
                DType::F32 => gen.standard_normal::<f32>(&out),
                DType::F64 => gen.standard_normal::<f64>(&out),
            }
            .unwrap();
            let m = moments(&read_f64(&gen, &out, dtype));
            close(&format!("{what} standard mean"), m.mean, 0.0, 0.01);
            close(&format!("{what} standard std"), m.var.sqrt(), 1.0, 0.02);
        }
    }
}

#[test]
fn log_normal_numbers_of_every_kind_and_float_type_match_the_cpu_reference() {
    let _g = serial();
    let dev = dev0();
    let stream = new_stream(&dev);
    let mut rng = Rng::new(0x5eed_0003);
    let (mu, s) = (0.2f64, 0.5f64);
    let want_mean = (mu + s * s / 2.0).exp();
    let want_var = ((s * s).exp() - 1.0) * (2.0 * mu + s * s).exp();
    for kind in RngKind::ALL {
        for dtype in DTYPES {
            let seed = rng.next_u64();
            let what = format!("{kind:?} {dtype:?} seed {seed}");
            let mut gen = generator(kind, &stream, seed);
            let out = DevicePtr::alloc(&dev, N * dtype.size()).unwrap();
            match dtype {
                DType::F32 => gen.log_normal::<f32>(&out, mu as f32, s as f32),
                DType::F64 => gen.log_normal::<f64>(&out, mu, s),
            }
            .unwrap();
            let xs = read_f64(&gen, &out, dtype);
            assert!(
                xs.iter().all(|&x| x > 0.0 && x.is_finite()),
                "{what}: a number <= 0 or not finite"
            );
            let m = moments(&xs);
            close(&format!("{what} mean"), m.mean, want_mean, 0.01 * want_mean);
            close(
                &format!("{what} variance"),
                m.var,
                want_var,
                0.05 * want_var,
            );
            let logs = moments(&xs.iter().map(|x| x.ln()).collect::<Vec<_>>());
            close(&format!("{what} mean of ln"), logs.mean, mu, 0.005);
            close(&format!("{what} std of ln"), logs.var.sqrt(), s, 0.01);
        }
    }
}

/// Poisson probabilities `P(X = k)` for `k < len`.
fn poisson_pmf(lambda: f64, len: usize) -> Vec<f64> {
    let mut p = (-lambda).exp();
    let mut out = Vec::with_capacity(len);
    for k in 0..len {
        out.push(p);
        p *= lambda / (k + 1) as f64;
    }
    out
}

#[test]
fn poisson_numbers_of_every_kind_match_the_cpu_reference() {
    let _g = serial();
    let dev = dev0();
    let stream = new_stream(&dev);
    let mut rng = Rng::new(0x5eed_0004);
    for kind in RngKind::ALL {
        for lambda in [4.0, 1000.0] {
            let seed = rng.next_u64();
            let what = format!("{kind:?} lambda {lambda} seed {seed}");
            let mut gen = generator(kind, &stream, seed);
            let out = DevicePtr::alloc(&dev, N * 4).unwrap();
            gen.poisson(&out, lambda).unwrap();
            let ks = read::<u32>(&gen, &out);
            let xs: Vec<f64> = ks.iter().map(|&k| f64::from(k)).collect();
            let m = moments(&xs);
            // Mean and variance are both lambda.
            close(&format!("{what} mean"), m.mean, lambda, 0.005 * lambda);
            close(&format!("{what} variance"), m.var, lambda, 0.03 * lambda);
            if lambda < 10.0 {
                let pmf = poisson_pmf(lambda, 13);
                let mut seen = vec![0usize; pmf.len()];
                for &k in &ks {
                    if let Some(c) = seen.get_mut(k as usize) {
                        *c += 1;
                    }
                }
                for (k, (c, p)) in seen.into_iter().zip(pmf).enumerate() {
                    close(&format!("{what} P(X = {k})"), c as f64 / N as f64, p, 0.003);
                }
            }
        }
    }
}

#[test]
fn raw_bits_of_every_kind_are_uniform_and_64_bit_only_from_sobol64() {
    let _g = serial();
    let dev = dev0();
    let stream = new_stream(&dev);
    let mut rng = Rng::new(0x5eed_0005);
    for kind in RngKind::ALL {
        let seed = rng.next_u64();
        let what = format!("{kind:?} seed {seed}");
        let mut gen = generator(kind, &stream, seed);
        let out = DevicePtr::alloc(&dev, N * 8).unwrap();
        if kind.is_64_bit() {
            assert!(matches!(
                gen.bits_u32(&out),
                Err(Error::Unsupported {
                    what: "bits_u32",
                    ..
                })
            ));
            gen.bits_u64(&out).unwrap();
            let xs: Vec<f64> = read::<u64>(&gen, &out)
                .into_iter()
                .map(|x| x as f64 / 2f64.powi(64))
                .collect();
            assert_eq!(xs.len(), N);
            close(&format!("{what} mean"), moments(&xs).mean, 0.5, 0.003);
        } else {
            assert!(matches!(
                gen.bits_u64(&out),
                Err(Error::Unsupported {
                    what: "bits_u64",
                    ..
                })
            ));
            gen.bits_u32(&out).unwrap();
            let words = read::<u32>(&gen, &out);
            assert_eq!(words.len(), 2 * N);
            let xs: Vec<f64> = words
                .iter()
                .map(|&x| f64::from(x) / 2f64.powi(32))
                .collect();
            close(&format!("{what} mean"), moments(&xs).mean, 0.5, 0.003);
            if kind.is_pseudo() {
                // Every bit of a pseudo-random word is random (Sobol's low bits are not).
                for bit in 0..32 {
                    let ones = words.iter().filter(|&&w| w >> bit & 1 == 1).count();
                    close(
                        &format!("{what} bit {bit}"),
                        ones as f64 / words.len() as f64,
                        0.5,
                        0.003,
                    );
                }
            }
        }
    }
}

#[test]
fn the_same_seed_gives_the_same_numbers_and_other_offsets_other_numbers() {
    let _g = serial();
    let dev = dev0();
    let stream = new_stream(&dev);
    let n = 1 << 16;
    let fill = |gen: &mut Generator| -> Vec<u32> {
        let out = DevicePtr::alloc(&dev, n * 4).unwrap();
        gen.bits_u32(&out).unwrap();
        read::<u32>(gen, &out)
    };
    let same_positions = |a: &[u32], b: &[u32]| a.iter().zip(b).filter(|(x, y)| x == y).count();
    for kind in [RngKind::Xorwow, RngKind::Philox, RngKind::Mrg32k3a] {
        let mut a = Generator::with_seed(kind, &stream, 77).unwrap();
        let mut b = Generator::with_seed(kind, &stream, 77).unwrap();
        let first = fill(&mut a);
        assert_eq!(first, fill(&mut b), "{kind:?}: same seed, other numbers");
        // The sequence goes on...
        let second = fill(&mut a);
        assert!(same_positions(&first, &second) < n / 100, "{kind:?}");
        // ... and seeding again starts it over (the offset goes back to 0, as CuPy's seed()).
        a.set_seed(77).unwrap();
        assert_eq!(fill(&mut a), first, "{kind:?}: reseeded");
        // Another seed, other numbers.
        let mut c = Generator::with_seed(kind, &stream, 78).unwrap();
        assert!(same_positions(&first, &fill(&mut c)) < n / 100, "{kind:?}");
        // Another offset, other numbers; back to offset 0, the first numbers.
        a.set_seed(77).unwrap();
        a.set_offset(1 << 20).unwrap();
        assert!(same_positions(&first, &fill(&mut a)) < n / 100, "{kind:?}");
        a.set_offset(0).unwrap();
        assert_eq!(fill(&mut a), first, "{kind:?}: offset 0 again");
    }
    // Two generators seeded from the OS (CuPy's RandomState()) differ.
    let mut x = Generator::new(RngKind::default(), &stream).unwrap();
    let mut y = Generator::new(RngKind::default(), &stream).unwrap();
    assert_eq!(x.kind(), RngKind::Xorwow);
    assert_ne!(x.seed(), y.seed());
    assert!(same_positions(&fill(&mut x), &fill(&mut y)) < n / 100);
    // Sobol in one dimension is one sequence: offset k starts k numbers in.
    let mut s = Generator::new(RngKind::Sobol32, &stream).unwrap();
    let whole = fill(&mut s);
    s.set_offset(8).unwrap();
    let shifted = fill(&mut s);
    assert_eq!(&shifted[..n - 8], &whole[8..], "Sobol32 offset 8");
}

#[test]
fn set_stream_moves_the_generator_and_orders_it_after_its_old_stream() {
    let _g = serial();
    let dev = dev0();
    let before = destroy_failures();
    for kind in [RngKind::Xorwow, RngKind::Philox, RngKind::Mrg32k3a] {
        let (s1, s2) = (new_stream(&dev), new_stream(&dev));
        let (a, b) = (
            DevicePtr::alloc(&dev, 4 * N * 4).unwrap(),
            DevicePtr::alloc(&dev, 4 * N * 4).unwrap(),
        );
        let mut gen = Generator::with_seed(kind, &s1, 9).unwrap();
        gen.normal::<f32>(&a, 0.0, 1.0).unwrap();
        gen.set_stream(&s2).unwrap();
        assert_eq!(gen.stream(), &s2);
        gen.normal::<f32>(&b, 0.0, 1.0).unwrap();
        // Only s2 is waited for: it waited for s1's fill when the generator moved.
        s2.synchronize().unwrap();
        let mut got_a = vec![0f32; 4 * N];
        let mut got_b = vec![0f32; 4 * N];
        a.copy_to_host(&mut got_a).unwrap();
        b.copy_to_host(&mut got_b).unwrap();
        // The same two fills on one stream: the same numbers.
        let mut reference = Generator::with_seed(kind, &s1, 9).unwrap();
        let (ra, rb) = (
            DevicePtr::alloc(&dev, 4 * N * 4).unwrap(),
            DevicePtr::alloc(&dev, 4 * N * 4).unwrap(),
        );
        reference.normal::<f32>(&ra, 0.0, 1.0).unwrap();
        reference.normal::<f32>(&rb, 0.0, 1.0).unwrap();
        assert_eq!(got_a, read::<f32>(&reference, &ra), "{kind:?}: first fill");
        assert_eq!(
            got_b,
            read::<f32>(&reference, &rb),
            "{kind:?}: fill after set_stream"
        );
        let m = moments(&got_b.iter().map(|&x| f64::from(x)).collect::<Vec<_>>());
        close(&format!("{kind:?} mean"), m.mean, 0.0, 0.005);
        // The same stream again is nothing to do.
        gen.set_stream(&s2).unwrap();
    }
    assert_eq!(destroy_failures(), before);
}

#[test]
fn a_pool_block_is_filled_on_a_second_stream_and_not_reused_under_the_fill() {
    let _g = serial();
    let dev = dev0();
    let alloc_stream = new_stream(&dev);
    let gen_stream = new_stream(&dev);
    let mut gen = Generator::with_seed(RngKind::Xorwow, &gen_stream, 3).unwrap();
    // A block of the pool, made on one stream, filled by the generator on another.
    for dtype in DTYPES {
        let block = cudars_mempool::driver::malloc(&alloc_stream, N * dtype.size()).unwrap();
        match dtype {
            DType::F32 => gen.normal::<f32>(&block, -1.0, 0.5),
            DType::F64 => gen.normal::<f64>(&block, -1.0, 0.5),
        }
        .unwrap();
        let m = moments(&read_f64(&gen, &block, dtype));
        close(&format!("pool block {dtype:?} mean"), m.mean, -1.0, 0.005);
        close(
            &format!("pool block {dtype:?} std"),
            m.var.sqrt(),
            0.5,
            0.01,
        );
    }
    // Dropped right after the fill is queued: the pool must not hand the block out on its
    // allocation stream before the fill has written it (the fill marked it on its stream).
    let bytes = 256 << 20;
    for round in 0..6 {
        let block = cudars_mempool::driver::malloc(&alloc_stream, bytes).unwrap();
        gen.uniform::<f32>(&block).unwrap();
        drop(block);
        let next = cudars_mempool::driver::malloc(&alloc_stream, bytes).unwrap();
        next.memset_u32_async(0xdead_beef, &alloc_stream).unwrap();
        alloc_stream.synchronize().unwrap();
        gen_stream.synchronize().unwrap();
        let mut host = vec![0u32; bytes / 4];
        next.copy_to_host(&mut host).unwrap();
        let overwritten = host.iter().filter(|&&w| w != 0xdead_beef).count();
        assert_eq!(
            overwritten, 0,
            "round {round}: the fill of the dropped block wrote the next block"
        );
    }
}

#[test]
fn refusals_on_the_gpu_issue_nothing() {
    let _g = serial();
    let dev = dev0();
    let stream = new_stream(&dev);
    let buf = DevicePtr::alloc(&dev, 4096).unwrap();
    let sentinel = 0x7f7f_7f7f;
    buf.memset_u32(sentinel).unwrap();
    let mut philox = Generator::with_seed(RngKind::Philox, &stream, 1).unwrap();
    let odd = buf.slice(..12).unwrap();
    assert_eq!(
        philox.normal::<f32>(&odd, 0.0, 1.0),
        Err(Error::OddCount {
            arg: "out",
            count: 3,
            call: "normal"
        })
    );
    assert_eq!(
        philox.log_normal::<f32>(&odd, 0.0, 1.0),
        Err(Error::OddCount {
            arg: "out",
            count: 3,
            call: "log_normal"
        })
    );
    assert_eq!(
        philox.uniform::<f64>(&odd),
        Err(Error::Length {
            arg: "out",
            len: 12,
            element: 8
        })
    );
    let misaligned = buf.slice(2..10).unwrap();
    assert_eq!(
        philox.uniform::<f32>(&misaligned),
        Err(Error::Misaligned {
            arg: "out",
            addr: misaligned.as_raw(),
            align: 4
        })
    );
    assert!(matches!(
        philox.poisson(&buf, 0.0),
        Err(Error::BadValue { arg: "lambda", .. })
    ));
    assert!(matches!(
        philox.poisson(&buf, 1e6),
        Err(Error::BadValue { arg: "lambda", .. })
    ));
    assert!(matches!(
        philox.normal::<f64>(&buf, 0.0, -1.0),
        Err(Error::BadValue { arg: "std", .. })
    ));
    assert!(matches!(
        philox.log_normal::<f32>(&buf, f32::NAN, 1.0),
        Err(Error::BadValue { arg: "mean", .. })
    ));
    assert!(matches!(
        philox.bits_u64(&buf),
        Err(Error::Unsupported {
            what: "bits_u64",
            ..
        })
    ));
    assert!(matches!(
        philox.set_ordering(RngOrdering::QuasiDefault),
        Err(Error::Unsupported { .. })
    ));
    assert!(matches!(
        philox.set_dimensions(2),
        Err(Error::Unsupported { .. })
    ));
    let mut sobol = Generator::new(RngKind::Sobol32, &stream).unwrap();
    sobol.set_dimensions(3).unwrap();
    assert_eq!(
        sobol.uniform::<f32>(&buf.slice(..16).unwrap()),
        Err(Error::NotMultipleOfDimensions {
            arg: "out",
            count: 4,
            dimensions: 3
        })
    );
    assert!(matches!(
        sobol.set_seed(1),
        Err(Error::Unsupported {
            what: "a seed",
            kind: RngKind::Sobol32,
            ..
        })
    ));
    assert!(matches!(
        Generator::with_seed(RngKind::Sobol64, &stream, 1),
        Err(Error::Unsupported { .. })
    ));
    assert!(matches!(
        sobol.set_dimensions(0),
        Err(Error::BadValue {
            arg: "dimensions",
            ..
        })
    ));
    // An empty view: nothing to do, and fine.
    philox.uniform::<f32>(&buf.slice(0..0).unwrap()).unwrap();
    stream.synchronize().unwrap();
    let mut host = vec![0u32; 1024];
    buf.copy_to_host(&mut host).unwrap();
    assert!(
        host.iter().all(|&w| w == sentinel),
        "a refused call wrote the buffer"
    );
    // The orderings of the right class are taken.
    philox.set_ordering(RngOrdering::PseudoLegacy).unwrap();
    assert_eq!(philox.ordering(), RngOrdering::PseudoLegacy);
    philox.uniform::<f32>(&buf).unwrap();
    sobol.set_ordering(RngOrdering::QuasiDefault).unwrap();
}

#[test]
#[ignore = "needs two GPUs"]
fn another_devices_view_and_stream_are_refused_when_there_are_two_devices() {
    let _g = serial();
    let devices = Device::all().unwrap();
    assert!(
        devices.len() >= 2,
        "this test needs two GPUs, found {}",
        devices.len()
    );
    let dev = devices[0];
    let stream = new_stream(&dev);
    let mut gen = Generator::with_seed(RngKind::Philox, &stream, 1).unwrap();
    let other = devices[1];
    let theirs = DevicePtr::alloc(&other, 4096).unwrap();
    assert_eq!(
        gen.uniform::<f32>(&theirs),
        Err(Error::WrongDevice {
            arg: "out",
            expected: 0,
            actual: other.ordinal()
        })
    );
    let their_stream = new_stream(&other);
    assert_eq!(
        gen.set_stream(&their_stream),
        Err(Error::WrongDevice {
            arg: "stream",
            expected: 0,
            actual: other.ordinal()
        })
    );
    assert_eq!(gen.stream(), &stream);
    // A generator of the other device works there, whichever device is current.
    let mut theirs_gen = Generator::with_seed(RngKind::Philox, &their_stream, 1).unwrap();
    let _scope = dev.scope().unwrap();
    theirs_gen.uniform::<f32>(&theirs).unwrap();
    let m = moments(
        &read::<f32>(&theirs_gen, &theirs)
            .into_iter()
            .map(f64::from)
            .collect::<Vec<_>>(),
    );
    close("other device mean", m.mean, 0.5, 0.05);
}

#[test]
fn a_capturing_stream_is_refused_and_nothing_is_captured() {
    let _g = serial();
    let dev = dev0();
    let stream = new_stream(&dev);
    let other = new_stream(&dev);
    let mut gen = Generator::with_seed(RngKind::Philox, &stream, 1).unwrap();
    let buf = DevicePtr::alloc(&dev, 4096).unwrap();
    // SAFETY: only refused calls are made during the capture, which is ended below.
    unsafe { graph::begin_capture(&stream, CaptureMode::ThreadLocal) }.unwrap();
    let fill = gen.uniform::<f32>(&buf);
    let moved = gen.set_stream(&other);
    let graph = graph::end_capture(&stream).unwrap();
    assert_eq!(
        fill,
        Err(Error::Capturing {
            arg: "the generator's stream"
        })
    );
    assert_eq!(
        moved,
        Err(Error::Capturing {
            arg: "the generator's stream"
        })
    );
    assert_eq!(graph.node_count().unwrap(), 0);
    // Moving onto a capturing stream is refused too.
    // SAFETY: as above.
    unsafe { graph::begin_capture(&other, CaptureMode::ThreadLocal) }.unwrap();
    let moved = gen.set_stream(&other);
    graph::end_capture(&other).unwrap();
    assert_eq!(moved, Err(Error::Capturing { arg: "stream" }));
    // After the capture, the generator works.
    gen.uniform::<f32>(&buf).unwrap();
    let m = moments(
        &read::<f32>(&gen, &buf)
            .into_iter()
            .map(f64::from)
            .collect::<Vec<_>>(),
    );
    assert!(m.min > 0.0 && m.max <= 1.0, "{m:?}");
}

#[test]
fn sobol_dimensions_fill_whole_points_dimension_by_dimension() {
    let _g = serial();
    let dev = dev0();
    let stream = new_stream(&dev);
    for kind in [RngKind::Sobol32, RngKind::ScrambledSobol64] {
        let mut gen = Generator::new(kind, &stream).unwrap();
        gen.set_dimensions(3).unwrap();
        assert_eq!(gen.dimensions(), 3);
        let points = 1 << 16;
        let out = DevicePtr::alloc(&dev, 3 * points * 8).unwrap();
        gen.uniform::<f64>(&out).unwrap();
        let xs = read::<f64>(&gen, &out);
        // `points` numbers of dimension 0, then of dimension 1, then of dimension 2: each a
        // uniform sequence on its own.
        for (d, chunk) in xs.chunks(points).enumerate() {
            let m = moments(chunk);
            close(&format!("{kind:?} dimension {d} mean"), m.mean, 0.5, 0.003);
            close(
                &format!("{kind:?} dimension {d} variance"),
                m.var,
                1.0 / 12.0,
                0.002,
            );
        }
        // The dimensions are different sequences.
        assert_ne!(&xs[..points], &xs[points..2 * points], "{kind:?}");
    }
}

#[test]
fn a_generator_moves_to_another_thread() {
    let _g = serial();
    let dev = dev0();
    let stream = new_stream(&dev);
    let before = destroy_failures();
    let mut gen = Generator::with_seed(RngKind::Mrg32k3a, &stream, 5).unwrap();
    let out = DevicePtr::alloc(&dev, N * 4).unwrap();
    let (gen, out) = std::thread::spawn(move || {
        gen.uniform::<f32>(&out).unwrap();
        (gen, out)
    })
    .join()
    .unwrap();
    let m = moments(
        &read::<f32>(&gen, &out)
            .into_iter()
            .map(f64::from)
            .collect::<Vec<_>>(),
    );
    close("moved generator mean", m.mean, 0.5, 0.003);
    // Dropped on yet another thread.
    std::thread::spawn(move || drop(gen)).join().unwrap();
    assert_eq!(destroy_failures(), before);
}

#[test]
fn eight_threads_each_with_a_generator_and_a_stream_get_their_seeds_numbers() {
    let _g = serial();
    let before = destroy_failures();
    let kinds = [RngKind::Philox, RngKind::Xorwow, RngKind::Mrg32k3a];
    let n = 1 << 20;
    let rounds = 4;
    let threads: Vec<_> = (0..8u64)
        .map(|i| {
            std::thread::spawn(move || {
                let dev = dev0();
                let stream = new_stream(&dev);
                let mut gen =
                    Generator::with_seed(kinds[i as usize % 3], &stream, 100 + i).unwrap();
                let out = DevicePtr::alloc(&dev, n * 4).unwrap();
                for _ in 0..rounds {
                    gen.normal::<f32>(&out, i as f32, 1.0).unwrap();
                }
                read::<f32>(&gen, &out)
            })
        })
        .collect();
    let results: Vec<Vec<f32>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    // The same seeds, one thread, one stream: the same numbers.
    let dev = dev0();
    let stream = new_stream(&dev);
    for (i, got) in results.iter().enumerate() {
        let m = moments(&got.iter().map(|&x| f64::from(x)).collect::<Vec<_>>());
        close(&format!("thread {i} mean"), m.mean, i as f64, 0.01);
        let mut gen = Generator::with_seed(kinds[i % 3], &stream, 100 + i as u64).unwrap();
        let out = DevicePtr::alloc(&dev, n * 4).unwrap();
        for _ in 0..rounds {
            gen.normal::<f32>(&out, i as f32, 1.0).unwrap();
        }
        assert_eq!(got, &read::<f32>(&gen, &out), "thread {i}");
    }
    assert_eq!(destroy_failures(), before);
}

/// Waits (at most 10 s) until no dropped generator waits to be destroyed.
fn wait_for_deferred_destroys() {
    let t = std::time::Instant::now();
    while deferred_destroys() != 0 {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "{} generator(s) still wait to be destroyed",
            deferred_destroys()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[test]
fn a_generator_dropped_inside_a_host_callback_is_destroyed_off_the_driver_thread() {
    let _g = serial();
    let dev = dev0();
    let stream = new_stream(&dev);
    let before = destroy_failures();
    let mut gen = Generator::with_seed(RngKind::Philox, &stream, 1).unwrap();
    let buf = DevicePtr::alloc(&dev, N * 4).unwrap();
    gen.uniform::<f32>(&buf).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let mut slot = Some(gen);
    stream
        .add_callback(move |_| {
            // Dropped on the driver's thread, where no CUDA call may be made.
            drop(slot.take());
            let _ = tx.send(deferred_destroys());
        })
        .unwrap();
    stream.synchronize().unwrap();
    let waiting = rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap();
    assert!(
        waiting >= 1,
        "the drop inside the callback was not deferred"
    );
    wait_for_deferred_destroys();
    assert_eq!(destroy_failures(), before);
    let mut host = vec![0f32; N];
    buf.copy_to_host(&mut host).unwrap();
    assert!(host.iter().all(|&x| x > 0.0 && x <= 1.0));
}

#[test]
fn a_generator_dropped_during_a_capture_waits_for_it_and_leaves_it_valid() {
    let _g = serial();
    let dev = dev0();
    let (gen_stream, capture_stream) = (new_stream(&dev), new_stream(&dev));
    let before = destroy_failures();
    let mut gen = Generator::with_seed(RngKind::Xorwow, &gen_stream, 1).unwrap();
    let buf = DevicePtr::alloc(&dev, N * 4).unwrap();
    gen.uniform::<f32>(&buf).unwrap();
    for mode in [CaptureMode::Global, CaptureMode::ThreadLocal] {
        let mut other = Generator::with_seed(RngKind::Philox, &gen_stream, 2).unwrap();
        other.uniform::<f32>(&buf).unwrap();
        // SAFETY: only a memset of a live view is captured; the capture is ended below.
        unsafe { graph::begin_capture(&capture_stream, mode) }.unwrap();
        buf.memset_async(0, &capture_stream).unwrap();
        // cuRAND's cudaFree (and the wait before it) would invalidate the capture here.
        drop(other);
        assert_eq!(deferred_destroys(), 1, "{mode:?}");
        let graph = graph::end_capture(&capture_stream).unwrap();
        assert_eq!(graph.node_count().unwrap(), 1, "{mode:?}");
        wait_for_deferred_destroys();
    }
    drop(gen);
    assert_eq!(deferred_destroys(), 0);
    assert_eq!(destroy_failures(), before);
}

#[test]
fn the_per_thread_default_stream_is_refused() {
    let _g = serial();
    let dev = Device::new(0).unwrap();
    let pt = Stream::per_thread(&dev);
    let e = Generator::with_seed(RngKind::Philox, &pt, 1).unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
    let stream = new_stream(&dev);
    let mut gen = Generator::with_seed(RngKind::Philox, &stream, 1).unwrap();
    let e = gen.set_stream(&pt).unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
    assert_eq!(gen.stream(), &stream);
}

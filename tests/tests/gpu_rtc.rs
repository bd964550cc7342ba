//! GPU: `cuda-rtc`: kernels compiled from CUDA C++ at run time, checked against the host on
//! random data; templates through name expressions; NVRTC's log in a compile error; a second
//! process served by the disk cache; eight processes compiling one source at once; a wrong
//! argument list refused before anything is launched.
//!
//! NVRTC is opened from `$CUDA_NVRTC_LIBRARY` (`run.sh` points it at pip's wheel when there is
//! one) or the default names; without it every test here fails at its first compile.
#![cfg(feature = "gpu")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use std::path::PathBuf;
use std::process::Command;

use cudars_core::module::ImageKind;
use cudars_core::{DevicePtr, LaunchConfig, Stream};
use cudars_rtc::{Cache, Error, Origin, Output, Program};
use workspace_tests::gpu::{dev0, serial};
use workspace_tests::rtc::{poly3, Rng, POLY, POLY_HEADER, REDUCE, SAXPY};

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cudars-gpu-rtc-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn rtc_files(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn saxpy_on(output: Output, seed: u64) {
    let dev = dev0();
    let cache = Cache::memory_only();
    let compiled = Program::new(SAXPY)
        .device(&dev)
        .unwrap()
        .output(output)
        .cache(&cache)
        .compile()
        .unwrap();
    let kernel = compiled.load(&dev).unwrap().kernel("saxpy").unwrap();
    // The driver's parameter info: float, two pointers, unsigned long long.
    let sizes: Vec<usize> = kernel.params().unwrap().iter().map(|p| p.size).collect();
    assert_eq!(sizes, vec![4, 8, 8, 8]);
    let n = (1 << 20) + 7;
    let mut rng = Rng::new(seed);
    let (x, y) = (rng.f32s(n), rng.f32s(n));
    let a = rng.f32();
    let dx = DevicePtr::alloc(&dev, n * 4).unwrap();
    let dy = DevicePtr::alloc(&dev, n * 4).unwrap();
    dx.copy_from_host(&x).unwrap();
    dy.copy_from_host(&y).unwrap();
    let stream = Stream::builder(&dev).non_blocking(true).build().unwrap();
    let cfg = kernel.config_for_elements(n as u64, 0).unwrap();
    assert!(cfg.block.0 >= 32 && cfg.block.0 <= 1024, "{cfg:?}");
    // SAFETY: saxpy touches x[i] and y[i] for i < n only; both hold n floats.
    unsafe {
        kernel
            .launch(&stream, &cfg, (a, &dx, &dy, n as u64))
            .unwrap()
    };
    stream.synchronize().unwrap();
    let mut out = vec![0f32; n];
    dy.copy_to_host(&mut out).unwrap();
    for i in 0..n {
        let want = a.mul_add(x[i], y[i]);
        assert!(
            (out[i] - want).abs() <= 1e-5 * (1.0 + want.abs()),
            "{output:?}: y[{i}] = {} != {want}",
            out[i]
        );
    }
}

#[test]
fn saxpy_cubin_matches_the_host_on_random_data() {
    let _g = serial();
    saxpy_on(Output::Cubin, 1);
}

#[test]
fn saxpy_ptx_and_lto_match_the_host_on_random_data() {
    let _g = serial();
    saxpy_on(Output::Ptx, 2);
    saxpy_on(Output::LtoCubin, 3);
}

#[test]
fn templated_reduction_through_name_expressions() {
    let _g = serial();
    let dev = dev0();
    let cache = Cache::memory_only();
    let compiled = Program::new(REDUCE)
        .name("reduce.cu")
        .name_expression("reduce<float, 256>")
        .name_expression("reduce<unsigned long long, 128>")
        .device(&dev)
        .unwrap()
        .cache(&cache)
        .compile()
        .unwrap();
    let lowered = compiled.lowered_name("reduce<float, 256>").unwrap();
    assert!(lowered.starts_with("_Z6reduceIfLi256EE"), "{lowered}");
    let module = compiled.load(&dev).unwrap();
    let stream = Stream::new(&dev).unwrap();
    let n = 3_000_017usize;
    let mut rng = Rng::new(7);

    // Floats: compare with a double-precision host sum, to float tolerance.
    let data = rng.f32s(n);
    let input = DevicePtr::alloc(&dev, n * 4).unwrap();
    input.copy_from_host(&data).unwrap();
    let out = DevicePtr::alloc(&dev, 4).unwrap();
    out.memset_async(0, &stream).unwrap();
    let k = module.kernel("reduce<float, 256>").unwrap();
    let cfg = LaunchConfig::for_elements(n as u64, 256);
    // SAFETY: reduce<float, 256> reads in[i] for i < n and adds into out[0]; 256-thread blocks.
    unsafe { k.launch(&stream, &cfg, (&input, &out, n as u64)).unwrap() };
    let mut sum = [0f32];
    stream.synchronize().unwrap();
    out.copy_to_host(&mut sum).unwrap();
    let want: f64 = data.iter().map(|&v| f64::from(v)).sum();
    assert!(
        (f64::from(sum[0]) - want).abs() <= 1e-3 * n as f64 * 1e-3 + 0.5,
        "{} vs {want}",
        sum[0]
    );

    // Integers: exact.
    let ints: Vec<u64> = (0..n).map(|_| rng.next_u64() >> 20).collect();
    let input = DevicePtr::alloc(&dev, n * 8).unwrap();
    input.copy_from_host(&ints).unwrap();
    let out = DevicePtr::alloc(&dev, 8).unwrap();
    out.memset_async(0, &stream).unwrap();
    let k = module.kernel("reduce<unsigned long long, 128>").unwrap();
    let cfg = LaunchConfig::for_elements(n as u64, 128);
    // SAFETY: as above, 128-thread blocks over u64.
    unsafe { k.launch(&stream, &cfg, (&input, &out, n as u64)).unwrap() };
    stream.synchronize().unwrap();
    let mut total = [0u64];
    out.copy_to_host(&mut total).unwrap();
    assert_eq!(total[0], ints.iter().fold(0u64, |s, &v| s.wrapping_add(v)));
}

#[test]
fn a_kernel_using_a_user_header() {
    let _g = serial();
    let dev = dev0();
    let cache = Cache::memory_only();
    let kernel = Program::new(POLY)
        .header("polynomial.h", POLY_HEADER)
        .device(&dev)
        .unwrap()
        .cache(&cache)
        .compile()
        .unwrap()
        .load(&dev)
        .unwrap()
        .kernel("poly")
        .unwrap();
    let n = 65_536usize;
    let mut rng = Rng::new(11);
    let x: Vec<f64> = (0..n).map(|_| f64::from(rng.f32()) * 4.0).collect();
    let dx = DevicePtr::alloc(&dev, n * 8).unwrap();
    let dy = DevicePtr::alloc(&dev, n * 8).unwrap();
    dx.copy_from_host(&x).unwrap();
    let stream = Stream::new(&dev).unwrap();
    // SAFETY: poly reads x[i] and writes y[i] for i < n; both hold n doubles.
    unsafe {
        kernel
            .launch(
                &stream,
                &kernel.config_for_elements(n as u64, 0).unwrap(),
                (&dx, &dy, n as u64),
            )
            .unwrap()
    };
    stream.synchronize().unwrap();
    let mut y = vec![0f64; n];
    dy.copy_to_host(&mut y).unwrap();
    for i in 0..n {
        let want = poly3(x[i]);
        assert!(
            (y[i] - want).abs() <= 1e-12 * (1.0 + want.abs()),
            "{i}: {} != {want}",
            y[i]
        );
    }
}

#[test]
fn a_compile_error_returns_nvrtc_log() {
    let _g = serial();
    let dev = dev0();
    let err = Program::new("extern \"C\" __global__ void k(float* x) { x[0] = not_declared; }")
        .name("broken.cu")
        .device(&dev)
        .unwrap()
        .no_cache()
        .compile()
        .unwrap_err();
    match &err {
        Error::Compile { log, program, .. } => {
            assert_eq!(program, "broken.cu");
            assert!(log.contains("not_declared"), "{log}");
            println!("NVRTC's log, as the error carries it:\n{log}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}

#[test]
fn a_second_process_loads_from_the_disk_cache() {
    let _g = serial();
    let dev = dev0();
    let dir = temp_dir("second-process");
    let cache = Cache::in_dir(&dir);
    let compiled = Program::new(SAXPY)
        .name("saxpy.cu")
        .device(&dev)
        .unwrap()
        .cache(&cache)
        .compile()
        .unwrap();
    assert_eq!(compiled.origin(), Origin::Compiled);
    assert_eq!(cache.stats().writes, 1);
    let helper = workspace_tests::test_child_path(env!("CARGO_BIN_EXE_test_child"));
    let out = Command::new(&helper)
        .args(["rtc", dir.to_str().unwrap(), "5"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("the second process said:\n{stdout}");
    assert!(
        stdout.contains(&format!("RTC origin=Disk key={}", compiled.key().hex())),
        "{stdout}"
    );
    assert!(stdout.contains("RTC ok"), "{stdout}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn eight_processes_compiling_one_source_at_once_leave_one_valid_entry() {
    let _g = serial();
    let dev = dev0();
    let dir = temp_dir("eight");
    std::fs::create_dir_all(&dir).unwrap();
    let helper = workspace_tests::test_child_path(env!("CARGO_BIN_EXE_test_child"));
    let children: Vec<_> = (0..8u64)
        .map(|seed| {
            Command::new(&helper)
                .args(["rtc", dir.to_str().unwrap(), &(100 + seed).to_string()])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut origins = Vec::new();
    for child in children {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success() && stdout.contains("RTC ok"),
            "a child failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        origins.push(stdout.lines().next().unwrap_or_default().to_string());
    }
    println!("the eight processes: {origins:#?}");
    let files = rtc_files(&dir);
    assert_eq!(files.len(), 1, "one entry and no temporary file: {files:?}");
    assert!(files[0].ends_with(".rtc"));
    // The entry is whole: a fresh cache loads it from disk, and it runs.
    let fresh = Cache::in_dir(&dir);
    let again = Program::new(SAXPY)
        .name("saxpy.cu")
        .device(&dev)
        .unwrap()
        .cache(&fresh)
        .compile()
        .unwrap();
    assert_eq!(again.origin(), Origin::Disk);
    assert_eq!(fresh.stats().corrupt, 0);
    assert_eq!(ImageKind::detect(again.image()), Some(ImageKind::Cubin));
    again.load(&dev).unwrap().kernel("saxpy").unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_wrong_argument_list_is_refused_before_launch() {
    let _g = serial();
    let dev = dev0();
    let cache = Cache::memory_only();
    let kernel = Program::new(SAXPY)
        .device(&dev)
        .unwrap()
        .cache(&cache)
        .compile()
        .unwrap()
        .load(&dev)
        .unwrap()
        .kernel("saxpy")
        .unwrap();
    let n = 4096usize;
    let dx = DevicePtr::alloc(&dev, n * 4).unwrap();
    let dy = DevicePtr::alloc(&dev, n * 4).unwrap();
    dx.copy_from_host(&vec![1.0f32; n]).unwrap();
    dy.copy_from_host(&vec![2.0f32; n]).unwrap();
    let stream = Stream::new(&dev).unwrap();
    let cfg = LaunchConfig::for_elements(n as u64, 256);
    // SAFETY: refused before launch (the count differs); nothing runs.
    let err = unsafe { kernel.launch(&stream, &cfg, (3.0f32, &dx, &dy)) }.unwrap_err();
    assert!(
        matches!(
            err,
            Error::ArgCount {
                expected: 4,
                given: 3,
                ..
            }
        ),
        "{err:?}"
    );
    // SAFETY: refused before launch (a double where the kernel takes a float).
    let err = unsafe { kernel.launch(&stream, &cfg, (3.0f64, &dx, &dy, n as u64)) }.unwrap_err();
    assert!(
        matches!(
            err,
            Error::ArgSize {
                index: 0,
                expected: 4,
                given: 8,
                ..
            }
        ),
        "{err:?}"
    );
    stream.synchronize().unwrap();
    let mut y = vec![0f32; n];
    dy.copy_to_host(&mut y).unwrap();
    assert!(y.iter().all(|&v| v == 2.0), "nothing may have run");
    // The right list runs.
    // SAFETY: saxpy touches x[i] and y[i] for i < n only; both hold n floats.
    unsafe {
        kernel
            .launch(&stream, &cfg, (3.0f32, &dx, &dy, n as u64))
            .unwrap()
    };
    stream.synchronize().unwrap();
    dy.copy_to_host(&mut y).unwrap();
    assert!(y.iter().all(|&v| v == 5.0));
}

#[test]
fn a_clustered_launch_runs_every_block() {
    let _g = serial();
    let dev = dev0();
    let (major, _) = dev.compute_capability().unwrap();
    assert!(
        major >= 9,
        "the suite's GPU (H100/H200) has thread-block clusters"
    );
    let cache = Cache::memory_only();
    let kernel = Program::new(
        r#"extern "C" __global__ void mark(unsigned* out) {
               out[blockIdx.x] = blockIdx.x + 1; }"#,
    )
    .device(&dev)
    .unwrap()
    .cache(&cache)
    .compile()
    .unwrap()
    .load(&dev)
    .unwrap()
    .kernel("mark")
    .unwrap();
    let out = DevicePtr::alloc(&dev, 8 * 4).unwrap();
    out.memset(0).unwrap();
    let stream = Stream::new(&dev).unwrap();
    // A cluster size that is not a divisor of the grid is refused before the driver.
    let bad = LaunchConfig::new((3, 1, 1), (32, 1, 1)).cluster((2, 1, 1));
    // SAFETY: refused before launch.
    assert!(unsafe { kernel.launch(&stream, &bad, (&out,)) }.is_err());
    // Clusters of two blocks: cuLaunchKernelEx with the cluster dimension attribute.
    let cfg = LaunchConfig::new((8, 1, 1), (32, 1, 1)).cluster((2, 1, 1));
    // SAFETY: mark writes out[blockIdx.x] for 8 blocks; out holds 8 u32s.
    unsafe { kernel.launch(&stream, &cfg, (&out,)).unwrap() };
    stream.synchronize().unwrap();
    let mut got = [0u32; 8];
    out.copy_to_host(&mut got).unwrap();
    assert_eq!(got, [1, 2, 3, 4, 5, 6, 7, 8]);
}

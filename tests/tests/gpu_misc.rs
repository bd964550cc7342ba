//! GPU: profiler control, NVTX annotations, and (with cuda-core's `library-handles` feature)
//! the cuBLAS / cuSOLVER handles of a device.
#![cfg(feature = "gpu")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use cudars_core::nvtx::{self, Color};
use cudars_core::profiler::{self, OutputMode};
use cudars_core::{Error, Stream};
use workspace_tests::gpu::dev0;

#[test]
fn profiler_start_stop_and_guard_succeed_on_the_device() {
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    profiler::start().unwrap();
    profiler::stop().unwrap();
    // Starting twice and stopping twice is harmless.
    profiler::start().unwrap();
    profiler::start().unwrap();
    profiler::stop().unwrap();
    profiler::stop().unwrap();
    {
        let _guard = profiler::profile().unwrap();
        stream.synchronize().unwrap();
    }
    let guard = profiler::profile().unwrap();
    guard.stop().unwrap();
    // From a thread with no current context (device 0's is bound for the call) and with the
    // device made current.
    std::thread::spawn(move || {
        profiler::start().unwrap();
        profiler::stop().unwrap();
        let _scope = dev.scope().unwrap();
        profiler::start().unwrap();
        profiler::stop().unwrap();
    })
    .join()
    .unwrap();
}

#[test]
fn profiler_initialize_is_unsupported_since_cuda_12() {
    match profiler::initialize("cfg", "out.csv", OutputMode::Csv) {
        Err(Error::Unsupported(why)) => assert!(why.contains("CUDA 12"), "{why}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

#[test]
fn nvtx_calls_do_not_fail_and_ranges_nest() {
    let dev = dev0();
    let stream = Stream::new(&dev).unwrap();
    nvtx::mark("gpu_misc mark");
    nvtx::mark_colored("gpu_misc coloured mark", Color::RED);
    nvtx::mark("interior\0nul is stripped");
    let outer = nvtx::range_push("outer");
    let inner = nvtx::range_push_colored("inner", Color::from_index(3));
    stream.synchronize().unwrap();
    let popped_inner = nvtx::range_pop();
    let popped_outer = nvtx::range_pop();
    // With a tool attached the levels nest (0 then 1, popped in reverse); without one NVTX
    // keeps no levels and every call reports None.
    match outer {
        Some(level) => {
            assert_eq!(inner, Some(level + 1));
            assert_eq!(popped_inner, Some(level + 1));
            assert_eq!(popped_outer, Some(level));
        }
        None => assert_eq!((inner, popped_inner, popped_outer), (None, None, None)),
    }
    {
        let _r = nvtx::range("guarded");
        let _c = nvtx::range_colored("guarded colour", Color::rgb(1, 2, 3));
        stream.synchronize().unwrap();
    }
    println!("NVTX compiled in: {}", nvtx::ENABLED);
}

#[cfg(feature = "library-handles")]
mod handles {
    use std::path::{Path, PathBuf};

    use cudars_core::handles::{self, CUBLAS_LIBRARY_ENV, CUSOLVER_LIBRARY_ENV};
    use cudars_core::Device;

    /// `lib` in the usual places a machine without a toolkit on the linker path has it: the
    /// toolkit's lib64, and the `nvidia` pip wheels' lib directories (`nvidia/cu13/lib`,
    /// `nvidia/<name>/lib`) under the site-packages of `python3` on PATH and of the system's
    /// pythons.
    fn find(lib: &str, wheel_dir: &str) -> Option<PathBuf> {
        let mut dirs = vec![PathBuf::from("/usr/local/cuda/lib64")];
        // The site-packages of the `python3` on PATH (a virtual environment's, say).
        let sites = std::process::Command::new("python3")
            .args([
                "-c",
                "import site; print('\\n'.join(site.getsitepackages()))",
            ])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        for site in sites.lines().filter(|l| !l.is_empty()) {
            let nvidia = Path::new(site).join("nvidia");
            dirs.push(nvidia.join("cu13").join("lib"));
            dirs.push(nvidia.join(wheel_dir).join("lib"));
        }
        for root in ["/usr/lib", "/usr/local/lib", "/opt/conda/lib"] {
            let Ok(entries) = std::fs::read_dir(root) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if !name.starts_with("python3") {
                    continue;
                }
                for site in ["site-packages", "dist-packages"] {
                    let nvidia = entry.path().join(site).join("nvidia");
                    dirs.push(nvidia.join("cu13").join("lib"));
                    dirs.push(nvidia.join(wheel_dir).join("lib"));
                }
            }
        }
        if let Some(home) = std::env::var_os("HOME") {
            let local = Path::new(&home).join(".local/lib");
            if let Ok(entries) = std::fs::read_dir(&local) {
                for entry in entries.flatten() {
                    let nvidia = entry.path().join("site-packages").join("nvidia");
                    dirs.push(nvidia.join("cu13").join("lib"));
                    dirs.push(nvidia.join(wheel_dir).join("lib"));
                }
            }
        }
        dirs.into_iter().find_map(|d| {
            let mut found: Vec<PathBuf> = std::fs::read_dir(&d)
                .ok()?
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with(&format!("{lib}.so.")))
                })
                .collect();
            found.sort();
            found.pop()
        })
    }

    /// Points the override variables at libraries found on this machine (unless set), so the
    /// test does not depend on the linker path. No library found: the test fails.
    fn locate() {
        if std::env::var_os(CUBLAS_LIBRARY_ENV).is_none() {
            if let Some(p) = find("libcublas", "cublas") {
                std::env::set_var(CUBLAS_LIBRARY_ENV, p);
            }
        }
        if std::env::var_os(CUSOLVER_LIBRARY_ENV).is_none() {
            if let Some(p) = find("libcusolver", "cusolver") {
                std::env::set_var(CUSOLVER_LIBRARY_ENV, p);
            }
        }
    }

    #[test]
    fn the_shared_cublas_handle_is_the_same_for_a_device_on_every_thread() {
        locate();
        let path = handles::cublas_library_path().expect("cuBLAS found and opened");
        println!("cuBLAS opened from {path}");
        let dev = Device::new(0).unwrap();
        let first = handles::cublas_handle(&dev).unwrap();
        assert!(!first.raw().is_null());
        assert_eq!(first.device(), dev);
        let again = handles::cublas_handle(&dev).unwrap();
        assert!(std::ptr::eq(first, again));
        assert_eq!(first.raw(), again.raw());
        let raw = first.raw() as usize;
        let other = std::thread::spawn(move || {
            handles::cublas_handle(&Device::new(0).unwrap())
                .unwrap()
                .raw() as usize
        })
        .join()
        .unwrap();
        assert_eq!(other, raw);
    }

    #[test]
    fn an_owned_cublas_handle_is_another_one_destroyed_on_drop() {
        locate();
        let dev = Device::new(0).unwrap();
        let shared = handles::cublas_handle(&dev).unwrap();
        let own = handles::CublasHandle::new(&dev).unwrap();
        assert!(!own.raw().is_null());
        assert_ne!(own.raw(), shared.raw());
        drop(own);
        let second = handles::CublasHandle::new(&dev).unwrap();
        assert!(!second.raw().is_null());
    }

    #[test]
    fn the_current_devices_cublas_handle_is_its_shared_one() {
        locate();
        let dev = Device::new(0).unwrap();
        let shared = handles::cublas_handle(&dev).unwrap();
        let _scope = dev.scope().unwrap();
        assert_eq!(
            handles::current_cublas_handle().unwrap().raw(),
            shared.raw()
        );
    }

    #[test]
    fn the_shared_cusolver_handle_is_the_same_for_a_device_and_owned_ones_differ() {
        locate();
        let path = handles::cusolver_library_path().expect("cuSOLVER found and opened");
        println!("cuSOLVER opened from {path}");
        let dev = Device::new(0).unwrap();
        let first = handles::cusolver_handle(&dev).unwrap();
        assert!(!first.raw().is_null());
        assert!(std::ptr::eq(first, handles::cusolver_handle(&dev).unwrap()));
        let own = handles::CusolverHandle::new(&dev).unwrap();
        assert_ne!(own.raw(), first.raw());
        drop(own);
    }
}

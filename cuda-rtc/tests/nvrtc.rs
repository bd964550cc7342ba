//! CPU, with NVRTC (feature `nvrtc-tests`): NVRTC compiles for real, no GPU needed. `cargo
//! xtask ci` runs these when it finds the library (`$CUDA_NVRTC_LIBRARY`, or the copy `.ci/run`
//! unpacks); they fail, never pass, when it cannot be loaded.
#![cfg(feature = "nvrtc-tests")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use std::path::PathBuf;

use cudars_core::module::ImageKind;
use cudars_rtc::kernel::ptx_params;
use cudars_rtc::{Arch, Cache, Compiler, Error, Origin, Output, Program};

const SAXPY: &str = r#"
extern "C" __global__ void saxpy(float a, const float* x, float* y, unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"#;

const TEMPLATED: &str = r#"
template <typename T, int BLOCK>
__global__ void reduce(const T* in, T* out, unsigned long long n) {
    __shared__ T part[BLOCK];
    unsigned long long i = blockIdx.x * (unsigned long long)BLOCK + threadIdx.x;
    part[threadIdx.x] = i < n ? in[i] : T(0);
    __syncthreads();
    for (int s = BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(out, part[0]);
}
"#;

const HOPPER: Arch = Arch::new(9, 0);

fn compiler() -> &'static Compiler {
    Compiler::global().expect("NVRTC must load for these tests (set CUDA_NVRTC_LIBRARY)")
}

fn temp_dir(tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "cudars-rtc-nvrtc-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn the_compiler_reports_its_version_and_knows_hopper() {
    let c = compiler();
    assert!(c.version().0 >= 12, "{:?}", c.version());
    assert!(
        c.supported_archs().contains(&90),
        "{:?}",
        c.supported_archs()
    );
    assert!(matches!(
        c.check_arch(Arch::new(1, 0)),
        Err(Error::ArchUnsupported { .. })
    ));
}

#[test]
fn cubin_and_ptx_outputs() {
    let cubin = Program::new(SAXPY)
        .arch(HOPPER)
        .no_cache()
        .compile_with(compiler())
        .unwrap();
    assert_eq!(ImageKind::detect(cubin.image()), Some(ImageKind::Cubin));
    // cuda-core's checks, which run before the driver reads an image, accept NVRTC's cubin
    // and refuse it truncated.
    assert_eq!(ImageKind::check(cubin.image()).unwrap(), ImageKind::Cubin);
    let cut = &cubin.image()[..cubin.image().len() - 1];
    assert!(ImageKind::check(cut).is_err());
    assert_eq!(cubin.origin(), Origin::Compiled);
    assert!(cubin.ptx().is_none());

    let ptx = Program::new(SAXPY)
        .arch(HOPPER)
        .output(Output::Ptx)
        .no_cache()
        .compile_with(compiler())
        .unwrap();
    let text = ptx.ptx().expect("PTX text");
    assert!(text.contains(".entry saxpy"), "{text}");
    assert!(text.contains(".target sm_90"), "{text}");
    // The parameters the PTX declares: float, two pointers, unsigned long long.
    let p = ptx_params(text, "saxpy").unwrap();
    let sizes: Vec<usize> = p.iter().map(|p| p.size).collect();
    assert_eq!(sizes, vec![4, 8, 8, 8]);
}

#[test]
fn name_expressions_give_lowered_names() {
    let compiled = Program::new(TEMPLATED)
        .name("reduce.cu")
        .name_expression("reduce<float, 256>")
        .name_expression("reduce<int, 128>")
        .arch(HOPPER)
        .output(Output::Ptx)
        .no_cache()
        .compile_with(compiler())
        .unwrap();
    let f = compiled.lowered_name("reduce<float, 256>").unwrap();
    let i = compiled.lowered_name("reduce<int, 128>").unwrap();
    assert!(f.starts_with("_Z6reduceIfLi256EEvPKT_PS0_y"), "{f}");
    assert_ne!(f, i);
    let ptx = compiled.ptx().unwrap();
    assert!(ptx.contains(f) && ptx.contains(i));
    assert_eq!(ptx_params(ptx, f).unwrap().len(), 3);
    assert!(compiled.lowered_name("reduce<double, 64>").is_none());
}

#[test]
fn in_memory_headers_and_options_are_used() {
    let src = r#"
        #include "scale.h"
        extern "C" __global__ void k(float* x) { x[threadIdx.x] = SCALE(x[threadIdx.x]) + OFFSET; }
    "#;
    let compiled = Program::new(src)
        .header("scale.h", "#define SCALE(v) ((v) * 2.0f)")
        .define("OFFSET", "1.0f")
        .std(17)
        .line_info()
        .fast_math()
        .arch(HOPPER)
        .no_cache()
        .compile_with(compiler())
        .unwrap();
    assert_eq!(ImageKind::detect(compiled.image()), Some(ImageKind::Cubin));
    // Without the define the same source does not compile.
    let err = Program::new(src)
        .header("scale.h", "#define SCALE(v) ((v) * 2.0f)")
        .arch(HOPPER)
        .no_cache()
        .compile_with(compiler())
        .unwrap_err();
    assert!(matches!(err, Error::Compile { .. }), "{err:?}");
}

#[test]
fn a_compile_error_carries_nvrtc_log() {
    let err = Program::new("extern \"C\" __global__ void k(float* x) { x[0] = undefined_name; }")
        .name("broken.cu")
        .arch(HOPPER)
        .no_cache()
        .compile_with(compiler())
        .unwrap_err();
    match &err {
        Error::Compile { program, log, .. } => {
            assert_eq!(program, "broken.cu");
            assert!(log.contains("undefined_name"), "{log}");
            assert!(log.contains("broken.cu"), "{log}");
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("undefined_name"));
}

#[test]
fn warnings_are_in_the_log_on_success() {
    let src = "extern \"C\" __global__ void k(float* x) { int unused_variable = 3; x[0] = 1.0f; }";
    let compiled = Program::new(src)
        .name("warns.cu")
        .arch(HOPPER)
        .no_cache()
        .compile_with(compiler())
        .unwrap();
    assert!(
        compiled.log().contains("unused_variable"),
        "{}",
        compiled.log()
    );
    // -w silences it.
    let quiet = Program::new(src)
        .option("-w")
        .arch(HOPPER)
        .no_cache()
        .compile_with(compiler())
        .unwrap();
    assert!(!quiet.log().contains("unused_variable"), "{}", quiet.log());
}

#[test]
fn an_unknown_option_is_a_compile_error_with_the_reason() {
    let err = Program::new(SAXPY)
        .option("--no-such-option")
        .arch(HOPPER)
        .no_cache()
        .compile_with(compiler())
        .unwrap_err();
    match err {
        Error::Compile { log, options, .. } => {
            assert!(log.contains("--no-such-option"), "{log}");
            assert!(options.contains("--gpu-architecture=sm_90"), "{options}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn lto_ir_is_linked_by_nvjitlink_into_a_cubin() {
    let compiled = Program::new(SAXPY)
        .arch(HOPPER)
        .output(Output::LtoCubin)
        .no_cache()
        .compile_with(compiler())
        .unwrap();
    assert_eq!(
        ImageKind::check(compiled.image()).unwrap(),
        ImageKind::Cubin
    );
    let ltoir = Program::new(SAXPY)
        .arch(HOPPER)
        .output(Output::LtoIr)
        .no_cache()
        .compile_with(compiler())
        .unwrap();
    assert!(!ltoir.image().is_empty());
    assert_ne!(ltoir.image(), compiled.image());
}

#[test]
fn the_disk_cache_serves_a_second_process_and_recompiles_damage() {
    let dir = temp_dir("disk");
    let program = |cache| {
        Program::new(SAXPY)
            .name("saxpy.cu")
            .arch(HOPPER)
            .cache(cache)
    };
    let first = Cache::in_dir(&dir);
    let a = program(&first).compile_with(compiler()).unwrap();
    assert_eq!(a.origin(), Origin::Compiled);
    assert_eq!(
        program(&first).compile_with(compiler()).unwrap().origin(),
        Origin::Memory
    );
    // A fresh cache over the same directory stands for another process.
    let second = Cache::in_dir(&dir);
    let b = program(&second).compile_with(compiler()).unwrap();
    assert_eq!(b.origin(), Origin::Disk);
    assert_eq!(a.image(), b.image());
    assert_eq!(a.key(), b.key());
    // Truncate the entry: the next process compiles again and rewrites it.
    let path = second.entry_path(&a.key()).unwrap();
    let whole = std::fs::read(&path).unwrap();
    std::fs::write(&path, &whole[..whole.len() - 7]).unwrap();
    let third = Cache::in_dir(&dir);
    let c = program(&third).compile_with(compiler()).unwrap();
    assert_eq!(c.origin(), Origin::Compiled);
    assert_eq!(third.stats().corrupt, 1);
    assert_eq!(std::fs::read(&path).unwrap(), whole);
    let fourth = Cache::in_dir(&dir);
    assert_eq!(
        program(&fourth).compile_with(compiler()).unwrap().origin(),
        Origin::Disk
    );
    // A changed option is another entry.
    let d = program(&third)
        .option("-DANOTHER=1")
        .compile_with(compiler())
        .unwrap();
    assert_eq!(d.origin(), Origin::Compiled);
    assert_ne!(d.key(), a.key());
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn concurrent_compiles_of_one_source_leave_one_valid_entry() {
    let dir = temp_dir("concurrent");
    let keys: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(|| {
                    let cache = Cache::in_dir(&dir);
                    Program::new(SAXPY)
                        .arch(HOPPER)
                        .cache(&cache)
                        .compile_with(compiler())
                        .unwrap()
                        .key()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(keys.windows(2).all(|w| w[0] == w[1]));
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec![format!("{}.rtc", keys[0].hex())]);
    let fresh = Cache::in_dir(&dir);
    let hit = Program::new(SAXPY)
        .arch(HOPPER)
        .cache(&fresh)
        .compile_with(compiler())
        .unwrap();
    assert_eq!(hit.origin(), Origin::Disk);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Soundness round 3, item 1: a header included from disk (`-I<dir>`) changes, and the same
/// program compiles again. The old key hashed the option string only, so the memory cache
/// (and, in a later process, the disk cache) returned the image of the old header.
#[test]
fn an_edited_header_on_disk_is_compiled_again_not_served_stale() {
    let root = temp_dir("stale-header");
    let inc = root.join("include");
    std::fs::create_dir_all(&inc).unwrap();
    std::fs::write(inc.join("bound.h"), "#define BOUND 1111\n").unwrap();
    let src = r#"
        #include "bound.h"
        extern "C" __global__ void k(int* out) { out[0] = BOUND; }
    "#;
    let cache = Cache::in_dir(root.join("cache"));
    let program = || {
        Program::new(src)
            .include_path(&inc)
            .arch(HOPPER)
            .output(Output::Ptx)
            .cache(&cache)
    };
    let first = program().compile_with(compiler()).unwrap();
    assert_eq!(first.origin(), Origin::Compiled);
    assert!(first.ptx().unwrap().contains("1111"));
    // Unchanged: a memory hit.
    assert_eq!(
        program().compile_with(compiler()).unwrap().origin(),
        Origin::Memory
    );
    // The header changes: compiled again, with the new value, under another key.
    std::fs::write(inc.join("bound.h"), "#define BOUND 2222\n").unwrap();
    let second = program().compile_with(compiler()).unwrap();
    assert_eq!(
        second.origin(),
        Origin::Compiled,
        "served stale from memory"
    );
    let text = second.ptx().unwrap();
    assert!(text.contains("2222") && !text.contains("1111"), "{text}");
    assert_ne!(first.key(), second.key());
    // A later process (a fresh cache over the same directory) with the old header back gets
    // the old entry from disk, and with the new one the new entry: each as compiled.
    std::fs::write(inc.join("bound.h"), "#define BOUND 1111\n").unwrap();
    let later = Cache::in_dir(root.join("cache"));
    let again = Program::new(src)
        .include_path(&inc)
        .arch(HOPPER)
        .output(Output::Ptx)
        .cache(&later)
        .compile_with(compiler())
        .unwrap();
    assert_eq!(again.origin(), Origin::Disk);
    assert!(again.ptx().unwrap().contains("1111"));
    // A header that appears earlier in the search path shadows the old one: a new key too.
    let front = root.join("front");
    std::fs::create_dir_all(&front).unwrap();
    std::fs::write(front.join("bound.h"), "#define BOUND 3333\n").unwrap();
    let with_front = || {
        Program::new(src)
            .include_path(&front)
            .include_path(&inc)
            .arch(HOPPER)
            .output(Output::Ptx)
            .cache(&cache)
            .compile_with(compiler())
            .unwrap()
    };
    let shadowed = with_front();
    assert!(shadowed.ptx().unwrap().contains("3333"));
    std::fs::write(front.join("bound.h"), "#define BOUND 4444\n").unwrap();
    let reshadowed = with_front();
    assert_eq!(reshadowed.origin(), Origin::Compiled);
    assert!(reshadowed.ptx().unwrap().contains("4444"));
    std::fs::remove_dir_all(&root).unwrap();
}

/// A computed `#include` cannot be keyed without the preprocessor: such a program compiles
/// every time (the right kernel), is never cached, and says why.
#[test]
fn a_computed_include_is_compiled_every_time() {
    let root = temp_dir("computed");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("v.h"), "#define V 5\n").unwrap();
    let src =
        "#define HDR \"v.h\"\n#include HDR\nextern \"C\" __global__ void k(int* o) { o[0] = V; }\n";
    let cache = Cache::memory_only();
    let p = Program::new(src)
        .include_path(&root)
        .arch(HOPPER)
        .output(Output::Ptx)
        .cache(&cache);
    assert!(p.uncacheable_reason().unwrap().contains("macro"));
    assert!(p.cache_key(compiler()).unwrap().is_none());
    for value in ["5", "6"] {
        std::fs::write(root.join("v.h"), format!("#define V {value}\n")).unwrap();
        let c = p.compile_with(compiler()).unwrap();
        assert_eq!(c.origin(), Origin::Compiled);
        assert!(
            c.ptx().unwrap().contains(&format!(", {value};")),
            "{}",
            c.ptx().unwrap()
        );
    }
    let st = cache.stats();
    assert_eq!((st.uncacheable, st.memory_hits, st.writes), (2, 0, 0));
    std::fs::remove_dir_all(&root).unwrap();
}

//! CUDA header sets other than the one CI runs with: fetched from the NVIDIA Python wheels with
//! pip and cached, as `.ci/run` fetches the 13.0 set, and the CI step and bundle that use them.
//!
//! | set | wheels | include directory in the wheel |
//! | --- | --- | --- |
//! | `12.x` | `nvidia-cuda-runtime-cu12==12.x.*`, `nvidia-nvtx-cu12==12.x.*` | `nvidia/cuda_runtime/include`, `nvidia/nvtx/include` |
//! | `13.x` | `nvidia-cuda-runtime==13.x.*`, `nvidia-nvtx==13.x.*` | `nvidia/cu13/include` |
//!
//! Cache: `$CUDA_HEADERS_CACHE_ROOT`, else `$XDG_CACHE_HOME/cuda-rs`, else `~/.cache/cuda-rs`;
//! one `cuda-<set>-headers/include` per set (the 13.0 one is the directory `.ci/run` fills).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{cargo, cuda_sys_build_info, fail, root, Result};

/// The header sets CI builds against, besides the 13.0 set and the snapshot: three of CUDA 12
/// and the newest CUDA 13 on the registry ([`NEWEST_13`]).
pub const CI_SETS: &[&str] = &["12.0", "12.4", "12.8", NEWEST_13];

/// The newest CUDA 13 header set the registry has (`pip index versions nvidia-cuda-runtime`).
/// Pinned, so that a new release does not change CI by itself; `cargo xtask ci` says when a
/// newer one appears.
pub const NEWEST_13: &str = "13.5";

/// The cache root for header sets.
fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("CUDA_HEADERS_CACHE_ROOT") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| root().join("target"));
    base.join("cuda-rs")
}

/// The major version of `12.4`, refusing anything outside 12.0 through 13.x.
fn parse_set(set: &str) -> Result<u32> {
    let major = set
        .split_once('.')
        .and_then(|(major, minor)| {
            minor.parse::<u32>().ok()?;
            major.parse::<u32>().ok()
        })
        .ok_or_else(|| format!("header set `{set}`: expected MAJOR.MINOR, e.g. 12.4"))?;
    if !(12..=13).contains(&major) {
        return fail(&format!(
            "header set `{set}`: the workspace supports CUDA 12.0 through 13.x"
        ));
    }
    Ok(major)
}

/// The include directory of header set `set` (`12.4`), fetched into the cache if absent.
pub fn include_dir(set: &str) -> Result<PathBuf> {
    let major = parse_set(set)?;
    let dir = cache_root().join(format!("cuda-{set}-headers/include"));
    if dir.join("cuda.h").is_file() && dir.join("nvtx3/nvToolsExt.h").is_file() {
        return Ok(dir);
    }
    println!("xtask: fetching CUDA {set} headers into {}", dir.display());
    let (wheels, subdirs): ([String; 2], &[&str]) = if major == 12 {
        (
            [
                format!("nvidia-cuda-runtime-cu12=={set}.*"),
                format!("nvidia-nvtx-cu12=={set}.*"),
            ],
            &["nvidia/cuda_runtime/include", "nvidia/nvtx/include"],
        )
    } else {
        (
            [
                format!("nvidia-cuda-runtime=={set}.*"),
                format!("nvidia-nvtx=={set}.*"),
            ],
            &["nvidia/cu13/include"],
        )
    };
    let tmp = root().join(format!("target/header-fetch-{set}"));
    let _ = std::fs::remove_dir_all(&tmp);
    let unpacked = tmp.join("unpacked");
    std::fs::create_dir_all(&unpacked).map_err(|e| e.to_string())?;
    run(Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "-d",
        ])
        .arg(&tmp)
        .args(&wheels))?;
    for entry in std::fs::read_dir(&tmp).map_err(|e| e.to_string())? {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.extension().is_some_and(|x| x == "whl") {
            run(Command::new("python3")
                .args(["-m", "zipfile", "-e"])
                .arg(&path)
                .arg(&unpacked))?;
        }
    }
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    for sub in subdirs {
        copy_tree(&unpacked.join(sub), &dir, false)?;
    }
    let _ = std::fs::remove_dir_all(&tmp);
    if !dir.join("cuda.h").is_file() {
        return fail(&format!("no cuda.h in the CUDA {set} wheels"));
    }
    Ok(dir)
}

fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().map_err(|e| format!("{cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        fail(&format!("{cmd:?} failed ({status})"))
    }
}

/// Copies the directory tree `from` into `to` (merging); with `keep_times`, each file keeps
/// its modification time, as a package manager installs files.
fn copy_tree(from: &Path, to: &Path, keep_times: bool) -> Result<()> {
    std::fs::create_dir_all(to).map_err(|e| e.to_string())?;
    for entry in std::fs::read_dir(from).map_err(|e| format!("{}: {e}", from.display()))? {
        let entry = entry.map_err(|e| e.to_string())?;
        let target = to.join(entry.file_name());
        if entry.file_type().map_err(|e| e.to_string())?.is_dir() {
            copy_tree(&entry.path(), &target, keep_times)?;
        } else {
            std::fs::copy(entry.path(), &target).map_err(|e| e.to_string())?;
            if keep_times {
                let modified = entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .map_err(|e| e.to_string())?;
                std::fs::File::options()
                    .write(true)
                    .open(&target)
                    .and_then(|f| f.set_modified(modified))
                    .map_err(|e| format!("{}: {e}", target.display()))?;
            }
        }
    }
    Ok(())
}

/// The environment that builds against header set `set`: its include directory. CI uses the
/// main target directory with it: the dependencies (checked by clippy before) are reused and
/// only cuda-sys and the workspace's crates are checked again, which keeps the three sets
/// within CI's budget on two cores.
pub fn include_env(set: &str) -> Result<Vec<(String, String)>> {
    let dir = include_dir(set)?;
    Ok(vec![(
        "CUDA_INCLUDE_DIR".into(),
        dir.to_string_lossy().into_owned(),
    )])
}

/// As [`include_env`], plus a target directory of the set's own (`target/h<set>`), so that a
/// release build for the bundle survives switching sets.
pub fn env_for(set: &str) -> Result<Vec<(String, String)>> {
    let mut env = include_env(set)?;
    env.push((
        "CARGO_TARGET_DIR".into(),
        root()
            .join(format!("target/h{set}"))
            .to_string_lossy()
            .into_owned(),
    ));
    Ok(env)
}

/// CI for one more header set: cuda-sys must generate its bindings from those headers (not
/// fall back to the snapshot), the whole workspace must type-check with every target and
/// feature, and cuda-sys's own tests (the fake old driver among them) must pass. The full CPU
/// suite runs once, against the 13.0 headers: four more runs would not fit CI's budget.
pub fn ci_set(set: &str) -> Result<()> {
    let owned = include_env(set)?;
    let env: Vec<(&str, &str)> = owned
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let source = cuda_sys_build_info(&env)?.source;
    println!("xtask: CUDA {set}: cuda-sys bindings: {source}");
    if !source.starts_with("bindgen") {
        return fail(&format!(
            "CUDA {set}: expected bindings generated from the headers, got: {source}"
        ));
    }
    cargo(
        &[
            "check",
            "--workspace",
            "--all-targets",
            "--all-features",
            "--quiet",
        ],
        &env,
    )?;
    cargo(&["test", "-p", "cudars-sys", "--quiet"], &env)
}

/// `cargo xtask gpu-bundle [--headers SET]`: with a set, points the build at those headers
/// and at `target/h<SET>`, and bundles into `target/gpu-bundle-<SET>`.
pub fn gpu_bundle_args(args: &[String]) -> Result<()> {
    match args {
        [] => crate::bundle::gpu_bundle_into(&root().join("target/gpu-bundle")),
        [flag, set] if flag == "--headers" => {
            for (key, value) in env_for(set)? {
                // Single-threaded here: every cargo the bundle runs inherits these.
                std::env::set_var(key, value);
            }
            let source = cuda_sys_build_info(&[])?.source;
            println!("xtask: CUDA {set}: cuda-sys bindings: {source}");
            if !source.starts_with("bindgen") {
                return fail(&format!(
                    "expected bindings from the CUDA {set} headers, got: {source}"
                ));
            }
            crate::bundle::gpu_bundle_into(&root().join(format!("target/gpu-bundle-{set}")))
        }
        _ => fail("usage: cargo xtask gpu-bundle [--headers MAJOR.MINOR]"),
    }
}

/// Prints a note when the registry has a CUDA 13 header set newer than [`NEWEST_13`]; says
/// nothing when pip cannot tell.
pub fn note_newer_13() {
    let Ok(out) = Command::new("python3")
        .args(["-m", "pip", "index", "versions", "nvidia-cuda-runtime"])
        .output()
    else {
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let minor = |v: &str| -> Option<u32> {
        let mut parts = v.trim().split('.');
        (parts.next()? == "13").then_some(())?;
        parts.next()?.parse().ok()
    };
    let pinned = minor(NEWEST_13).unwrap_or(0);
    let newest = text
        .lines()
        .filter_map(|l| l.strip_prefix("Available versions:"))
        .flat_map(|l| l.split(','))
        .filter_map(minor)
        .max();
    if let Some(newest) = newest.filter(|n| *n > pinned) {
        println!(
            "xtask: note: the registry has CUDA 13.{newest} headers; CI checks {NEWEST_13} (headers::NEWEST_13)"
        );
    }
}

/// The libclang shared library bindgen would load: `LIBCLANG_PATH` (a file, or the first
/// `libclang*.so*` in that directory), else the first `libclang` that `ldconfig -p` lists.
fn find_libclang() -> Result<PathBuf> {
    let is_libclang = |name: &str| {
        name.starts_with("libclang") && !name.starts_with("libclang-cpp") && name.contains(".so")
    };
    if let Some(path) = std::env::var_os("LIBCLANG_PATH").map(PathBuf::from) {
        if path.is_file() {
            return Ok(path);
        }
        let found = std::fs::read_dir(&path)
            .into_iter()
            .flatten()
            .flatten()
            .find(|e| is_libclang(&e.file_name().to_string_lossy()));
        if let Some(entry) = found {
            return Ok(entry.path());
        }
    }
    for ldconfig in ["ldconfig", "/sbin/ldconfig"] {
        let Ok(out) = Command::new(ldconfig).arg("-p").output() else {
            continue;
        };
        let text = String::from_utf8_lossy(&out.stdout);
        let found = text.lines().find_map(|line| {
            let (name, path) = line.trim().split_once(" => ")?;
            is_libclang(name).then(|| PathBuf::from(path.trim()))
        });
        if let Some(path) = found {
            return Ok(path);
        }
    }
    fail("libclang not found (LIBCLANG_PATH, ldconfig -p): the rerun check needs it")
}

/// A cuda-sys build that used the snapshot turns into a bindgen build once headers, then
/// libclang, appear where it looked, with the same environment and no change to
/// `cuda-sys/build.rs` (its `watch_for_installs`); and a build with nothing new does not run
/// the build script again. The headers are copied with their files' times kept, as a package
/// manager installs them. Runs in the main target directory (only cuda-sys is rebuilt; the
/// header-set steps rebuild it anyway).
pub fn ci_rerun_check() -> Result<()> {
    let headers = include_dir(CI_SETS[0])?;
    let libclang = find_libclang()?;
    let work = root().join("target/rerun-check");
    let _ = std::fs::remove_dir_all(&work);
    let (include, lib) = (work.join("include"), work.join("libclang"));
    for dir in [&include, &lib] {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let work_s = work.to_string_lossy().into_owned();
    let include_s = include.to_string_lossy().into_owned();
    let lib_s = lib.to_string_lossy().into_owned();
    // Every header variable leads to the empty directory, and libclang is looked for only in
    // the empty `LIBCLANG_PATH`.
    let env: Vec<(&str, &str)> = vec![
        ("CUDA_INCLUDE_DIR", &include_s),
        ("CUDA_PATH", &work_s),
        ("CUDA_HOME", &work_s),
        ("CUDA_ROOT", &work_s),
        ("CUDA_TOOLKIT_ROOT_DIR", &work_s),
        ("NVTX_INCLUDE_DIR", &include_s),
        ("LIBCLANG_PATH", &lib_s),
    ];
    // (source, NVTX compiled, modification time of the generated file: it changes when the
    // build script runs).
    let build = |what: &str| -> Result<(String, bool, std::time::SystemTime)> {
        let info = cuda_sys_build_info(&env)?;
        let stamp = std::fs::metadata(info.out_dir.join("driver.rs"))
            .and_then(|m| m.modified())
            .map_err(|e| format!("cuda-sys's driver.rs: {e}"))?;
        println!(
            "xtask: {what}: {} (NVTX {})",
            info.source,
            if info.nvtx { "on" } else { "off" }
        );
        Ok((info.source, info.nvtx, stamp))
    };
    let (source, nvtx, first) = build("no headers, no libclang")?;
    if !source.starts_with("snapshot") || nvtx {
        return fail("the first build was expected to use the snapshot with NVTX off");
    }
    let (_, _, again) = build("nothing new")?;
    if again != first {
        return fail(
            "cuda-sys's build script ran again with nothing new: a watched path is missing?",
        );
    }
    copy_tree(&headers, &include, true)?;
    let (source, nvtx, after_headers) = build("headers unpacked")?;
    if after_headers == first || !source.starts_with("snapshot") || nvtx {
        return fail(
            "headers appearing did not run cuda-sys's build script again (or it found libclang)",
        );
    }
    let name = libclang
        .file_name()
        .ok_or_else(|| format!("{}: no file name", libclang.display()))?;
    std::os::unix::fs::symlink(&libclang, lib.join(name)).map_err(|e| e.to_string())?;
    let (source, nvtx, _) = build("libclang linked into LIBCLANG_PATH")?;
    if source != format!("bindgen over {include_s}") || !nvtx {
        return fail("libclang appearing did not switch cuda-sys to bindgen with NVTX");
    }
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}

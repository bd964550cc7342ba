//! The `cudars` Python wheel (issue 49): `cargo xtask wheel [--out DIR]` builds it, and the CI
//! step builds it, installs it into a fresh virtual environment and runs the CPU test
//! (`tests/python/wheel_cpu_test.py`).
//!
//! The wheel is made by maturin from `cuda-dlpack-py` (the DLPack extension, as
//! `cudars.cudars_dlpack`) and its `python/cudars` package, into which this copies the C ABI
//! library `libcudars_mempool_capi.so` first (release build, debug info stripped). maturin is
//! taken from `MATURIN` or the PATH, else installed with pip into `target/wheel-venv`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{artifacts, cargo_json, fail, root, Result};

/// maturin's version range (the pyproject's build requirement).
const MATURIN: &str = "maturin>=1.5,<2";

/// The maturin executable: `MATURIN`, the PATH's, or one installed into `target/wheel-venv`.
fn maturin() -> Result<PathBuf> {
    if let Some(m) = std::env::var_os("MATURIN") {
        return Ok(PathBuf::from(m));
    }
    if Command::new("maturin")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return Ok(PathBuf::from("maturin"));
    }
    let venv = root().join("target/wheel-venv");
    let exe = venv.join("bin/maturin");
    if !exe.is_file() {
        println!("xtask: installing {MATURIN} into {}", venv.display());
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
        run(Command::new(venv.join("bin/pip")).args(["install", "--quiet", MATURIN]))?;
    }
    Ok(exe)
}

fn run(cmd: &mut Command) -> Result<()> {
    let shown = format!("{cmd:?}");
    let status = cmd.status().map_err(|e| format!("{shown}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        fail(&format!("{shown} failed ({status})"))
    }
}

/// Builds the wheel into `out` (cleared of older `cudars-*.whl` first); returns its path.
pub fn build(out: &Path, env: &[(&str, &str)]) -> Result<PathBuf> {
    let capi = cargo_json(
        &[
            "build",
            "-p",
            "cudars-mempool-capi",
            "--release",
            "--message-format=json",
        ],
        env,
    )?;
    let so = artifacts(&capi)
        .into_iter()
        .filter(|a| a.name == "cudars_mempool_capi")
        .flat_map(|a| a.filenames)
        .find(|p| p.extension().is_some_and(|x| x == "so"))
        .ok_or("cargo built no libcudars_mempool_capi.so")?;
    let package = root().join("cuda-dlpack-py/python/cudars");
    let to = package.join("libcudars_mempool_capi.so");
    fs::copy(&so, &to).map_err(|e| format!("copy {}: {e}", so.display()))?;
    // Debug info off (a quarter of the size); the dynamic symbols PyTorch and CuPy look up stay.
    let _ = Command::new("strip").arg("--strip-debug").arg(&to).status();
    fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    for old in wheels_in(out)? {
        fs::remove_file(&old).map_err(|e| format!("{}: {e}", old.display()))?;
    }
    let mut cmd = Command::new(maturin()?);
    cmd.current_dir(root())
        .args([
            "build",
            "--release",
            "--strip",
            "-m",
            "cuda-dlpack-py/Cargo.toml",
            "-o",
        ])
        .arg(out);
    for (k, v) in env {
        cmd.env(k, v);
    }
    run(&mut cmd)?;
    let mut built = wheels_in(out)?;
    match (built.pop(), built.is_empty()) {
        (Some(w), true) => {
            let size = fs::metadata(&w).map_err(|e| e.to_string())?.len();
            println!("xtask: wheel {} ({size} bytes)", w.display());
            Ok(w)
        }
        _ => fail(&format!(
            "maturin left no single cudars wheel in {}",
            out.display()
        )),
    }
}

fn wheels_in(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for e in fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let p = e.map_err(|e| e.to_string())?.path();
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
        if name.is_some_and(|n| n.starts_with("cudars-") && n.ends_with(".whl")) {
            found.push(p);
        }
    }
    Ok(found)
}

/// `cargo xtask wheel [--out DIR]`.
pub fn wheel_args(args: &[String]) -> Result<()> {
    let out = match args {
        [] => root().join("target/wheels"),
        [flag, dir] if flag == "--out" => PathBuf::from(dir),
        _ => return fail("usage: cargo xtask wheel [--out DIR]"),
    };
    build(&out, &[]).map(|_| ())
}

/// The CI step: build the wheel, install it into a fresh virtual environment (no index: the
/// wheel alone, no dependency), and run the CPU test with that environment's Python, from a
/// folder outside the source tree so that only the installed package can be imported.
pub fn ci_check() -> Result<()> {
    let out = root().join("target/wheels");
    let wheel = build(&out, &[])?;
    let venv = root().join("target/wheel-test-venv");
    if venv.exists() {
        fs::remove_dir_all(&venv).map_err(|e| format!("{}: {e}", venv.display()))?;
    }
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    run(Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", "--no-index", "--no-deps"])
        .arg(&wheel))?;
    let test = root().join("tests/python/wheel_cpu_test.py");
    run(Command::new(venv.join("bin/python"))
        .arg(&test)
        .arg("--expect-driver")
        .arg("absent")
        .current_dir(std::env::temp_dir()))
}

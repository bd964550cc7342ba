//! The GPU suite from `cargo xtask ci` and `cargo xtask gpu-suite`: detects a usable GPU through
//! cuda-core (the driver loads and at least one device answers), builds the suite's test
//! binaries and runs them through the bundle's own `run.sh` (see [`crate::bundle::SUITE`]).
//! Whatever happens, it ends with one line: `GPU suite: N passed, N failed on <device>` or
//! `GPU suite: not run (<reason>)`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::bundle;
use crate::util::{root, Result};

/// What the caller asked for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Want {
    /// Run the suite when a GPU is usable (the default).
    Auto,
    /// `--gpu`: fail when no GPU is usable.
    Require,
    /// `--no-gpu`: never run it.
    Skip,
}

/// Options of the GPU part of `cargo xtask ci`.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    pub want: Want,
    /// `--sanitize`: under `compute-sanitizer --tool memcheck`; implies `--gpu`.
    pub sanitize: bool,
    /// `--strict` (or `CI` set): steps that need a tool the machine may lack (headless
    /// Chromium) fail without it instead of being skipped with a line saying so.
    pub strict: bool,
}

impl Options {
    /// Reads `--gpu`, `--no-gpu`, `--sanitize` and `--strict`; anything else is an error.
    pub fn parse(args: &[String]) -> Result<Options> {
        let mut opts = Options {
            want: Want::Auto,
            sanitize: false,
            strict: std::env::var_os("CI").is_some_and(|v| !v.is_empty()),
        };
        for arg in args {
            match arg.as_str() {
                "--gpu" => opts.want = Want::Require,
                "--no-gpu" => opts.want = Want::Skip,
                "--sanitize" => opts.sanitize = true,
                "--strict" => opts.strict = true,
                other => return Err(format!("unknown option `{other}`")),
            }
        }
        if opts.sanitize {
            if opts.want == Want::Skip {
                return Err("--sanitize runs the GPU suite; it cannot go with --no-gpu".into());
            }
            opts.want = Want::Require;
        }
        Ok(opts)
    }
}

/// A GPU that answered.
pub struct Gpu {
    pub name: String,
    pub count: usize,
}

/// Looks for a usable GPU through cuda-core; `Err` carries the loader's or driver's reason.
pub fn detect() -> std::result::Result<Gpu, String> {
    let one_line = |e: cudars_core::Error| {
        e.to_string()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    let count = cudars_core::device_count().map_err(one_line)?;
    if count == 0 {
        return Err("the driver loaded and reports no CUDA device".into());
    }
    let name = cudars_core::Device::new(0)
        .and_then(|d| d.name())
        .map_err(one_line)?;
    Ok(Gpu { name, count })
}

/// Runs the GPU part; returns the summary line (already printed last) and whether it passed.
pub fn run(opts: Options) -> (String, Result<()>) {
    let finish = |line: String, result: Result<()>| {
        println!("{line}");
        (line, result)
    };
    if opts.want == Want::Skip {
        return finish("GPU suite: not run (--no-gpu)".into(), Ok(()));
    }
    let gpu = match detect() {
        Ok(gpu) => gpu,
        Err(reason) => {
            let line = format!("GPU suite: not run ({reason})");
            let result = match opts.want {
                Want::Require => Err(format!(
                    "{} requires the GPU suite and no GPU is usable: {reason}",
                    if opts.sanitize { "--sanitize" } else { "--gpu" }
                )),
                _ => Ok(()),
            };
            return finish(line, result);
        }
    };
    println!(
        "xtask: GPU suite on {} ({} device{})",
        gpu.name,
        gpu.count,
        if gpu.count == 1 { "" } else { "s" }
    );
    let sanitizer = if opts.sanitize {
        match find_sanitizer() {
            Ok(path) => Some(path),
            Err(e) => {
                return finish(
                    format!("GPU suite: not run ({e})"),
                    Err(format!("--sanitize: {e}")),
                )
            }
        }
    } else {
        None
    };
    let dir = root().join("target/gpu-suite");
    if dir.exists() {
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            return finish(
                format!("GPU suite: not run (clean {}: {e})", dir.display()),
                Err(e.to_string()),
            );
        }
    }
    if let Err(e) = bundle::suite_dir(&dir) {
        return finish(
            format!("GPU suite: not run (building it failed: {e})"),
            Err(e),
        );
    }
    match run_sh(&dir, &gpu, sanitizer.as_deref()) {
        Ok((line, passed)) => {
            let result = if passed {
                Ok(())
            } else {
                Err("the GPU suite failed".into())
            };
            finish(line, result)
        }
        Err(e) => finish(format!("GPU suite: not run ({e})"), Err(e)),
    }
}

/// Runs `dir/run.sh` (tests or sanitize), echoing its output; returns its summary line and
/// whether it exited 0.
fn run_sh(dir: &Path, gpu: &Gpu, sanitizer: Option<&Path>) -> Result<(String, bool)> {
    let mut cmd = Command::new("bash");
    cmd.arg(dir.join("run.sh"))
        .arg(if sanitizer.is_some() {
            "sanitize"
        } else {
            "tests"
        })
        .env("CUDA_RS_GPU_NAME", &gpu.name)
        .env("CUDA_RS_GPU_COUNT", gpu.count.to_string())
        .stdout(Stdio::piped());
    if let Some(s) = sanitizer {
        cmd.env("COMPUTE_SANITIZER", s);
    }
    let mut child = cmd.spawn().map_err(|e| format!("run.sh: {e}"))?;
    let mut summary = None;
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines() {
            let line = line.map_err(|e| format!("run.sh output: {e}"))?;
            if line.starts_with("GPU suite: ") {
                summary = Some(line);
            } else {
                println!("{line}");
            }
        }
    }
    let status = child.wait().map_err(|e| format!("run.sh: {e}"))?;
    let summary = summary.ok_or_else(|| format!("run.sh ended ({status}) without its summary"))?;
    Ok((summary, status.success()))
}

/// `compute-sanitizer` on the PATH, else in the CUDA toolkit.
fn find_sanitizer() -> Result<PathBuf> {
    const NAME: &str = "compute-sanitizer";
    let mut tried = Vec::new();
    let mut candidates: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join(NAME)).collect())
        .unwrap_or_default();
    for var in [
        "CUDA_HOME",
        "CUDA_PATH",
        "CUDA_ROOT",
        "CUDA_TOOLKIT_ROOT_DIR",
    ] {
        if let Some(root) = std::env::var_os(var) {
            let root = PathBuf::from(root);
            candidates.push(root.join("bin").join(NAME));
            candidates.push(root.join(NAME).join(NAME));
        }
    }
    for root in ["/usr/local/cuda", "/opt/cuda"] {
        candidates.push(Path::new(root).join("bin").join(NAME));
        candidates.push(Path::new(root).join(NAME).join(NAME));
    }
    for c in candidates {
        if c.is_file() {
            return Ok(c);
        }
        tried.push(c.display().to_string());
    }
    Err(format!(
        "{NAME} not found on the PATH or in a CUDA toolkit (CUDA_HOME, CUDA_PATH, CUDA_ROOT, \
         CUDA_TOOLKIT_ROOT_DIR, /usr/local/cuda, /opt/cuda); tried {}",
        tried.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::{Options, Want};

    fn parse(args: &[&str]) -> Result<Options, String> {
        Options::parse(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn flags_choose_what_happens_to_the_gpu_suite() {
        assert_eq!(parse(&[]).unwrap().want, Want::Auto);
        assert_eq!(parse(&["--gpu"]).unwrap().want, Want::Require);
        assert_eq!(parse(&["--no-gpu"]).unwrap().want, Want::Skip);
        let sanitize = parse(&["--sanitize"]).unwrap();
        assert!(sanitize.sanitize);
        assert_eq!(
            sanitize.want,
            Want::Require,
            "--sanitize needs the GPU suite"
        );
        assert!(parse(&["--sanitize", "--no-gpu"]).is_err());
        assert!(parse(&["--gpus"]).is_err());
    }
}

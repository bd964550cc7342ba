//! NCCL all_reduce of f32, 8 B to 1 GiB, on every GPU of the machine (one process per GPU,
//! started by `cudars_nccl::Launcher`), beside `torch.distributed` on its NCCL backend in the
//! same run (`nccl_peer.py`, one process per GPU through `torch.multiprocessing`).
//!
//! Figures follow nccl-tests: time per operation (median of 3 timed batches after warm-up, a
//! batch being back-to-back in-place all_reduces on one stream, host clock around the batch
//! and a stream synchronize), algbw = bytes / time, busbw = algbw * 2(n-1)/n. Rows: latency
//! (µs) up to 64 KiB, bus bandwidth (GB/s) above; the raw column is PyTorch's figure.
//! Targets: latency <= 1.05x PyTorch's at <= 64 KiB, busbw >= 0.98x at >= 64 MiB.
//!
//! `bench_nccl --captured`: instead, per collective, 100 in-place all_reduces launched one by
//! one against the same 100 captured in one CUDA graph (`cudars_graph::capture`) and
//! replayed, 8 B to 1 MiB, beside PyTorch's `torch.distributed` launched and captured with
//! `torch.cuda.graph` (`nccl_peer.py --captured`). Targets: captured per collective <= 0.5x
//! launched below 64 KiB, and no captured row slower than PyTorch's captured one.
//!
//! `bench_nccl --registered`: instead, the same sweep (8 B to 1 GiB) on three kinds of memory,
//! interleaved size by size: plain `cuMemAlloc` memory, memory registered with the
//! communicator (`cudars_nccl::register::alloc` + `Communicator::register`, NCCL's
//! `ncclCommRegister`) and a symmetric window (`Communicator::register_window`), beside
//! PyTorch's plain tensors and tensors of a `torch.cuda.MemPool` registered with
//! `ProcessGroupNCCL.register_mem_pool` (and with `symm=True` where PyTorch has it)
//! (`nccl_peer.py --registered`). Targets: registered and window latency <= 1/1.2 of plain
//! below 64 KiB; no row slower than PyTorch's equivalent (latency <= 1.0x at <= 64 KiB, busbw
//! >= 0.98x above).
//!
//! `NCCL_NVLS_ENABLE=0` in every process. Usage:
//! `bench_nccl [--no-peer] [--captured | --registered]`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use cudars_core::memory::DevicePtr;
use cudars_core::Stream;
use cudars_nccl::{CommConfig, Communicator, Launcher, ReduceOp};
use workspace_tests::bench::{median, Report, Target};

const MAX_BYTES: usize = 1 << 30;
const OUT_VAR: &str = "CUDARS_NCCL_BENCH_OUT";

fn sizes() -> Vec<usize> {
    let mut v = Vec::new();
    let mut s = 8;
    while s <= MAX_BYTES {
        v.push(s);
        s *= 2;
    }
    v
}

/// Same policy as nccl_peer.py's `iters_for`.
fn iters_for(bytes: usize) -> usize {
    if bytes <= 1 << 20 {
        200
    } else {
        ((4usize << 30) / bytes).clamp(10, 200)
    }
}

fn main() {
    std::env::set_var("NCCL_NVLS_ENABLE", "0");
    let code = if std::env::var_os("RANK").is_some() {
        match rank_main() {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("bench_nccl rank: {e}");
                1
            }
        }
    } else {
        match launcher_main() {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("bench_nccl: {e}");
                1
            }
        }
    };
    std::process::exit(code);
}

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Sizes of the captured comparison.
const CAPTURED_SIZES: [usize; 5] = [8, 1 << 10, 8 << 10, 64 << 10, 1 << 20];
/// Collectives in the captured graph (and launched in a batch).
const OPS: usize = 100;

/// `bytes,launched,captured` rows: seconds per collective, launched one by one and replayed
/// in a graph of [`OPS`] (median of 3 batches each).
fn captured_rows(
    comm: &Communicator,
    stream: &Stream,
    buf: &DevicePtr,
    small: &DevicePtr,
) -> Res<String> {
    let mut rows = String::from("bytes,launched,captured\n");
    for bytes in CAPTURED_SIZES {
        let launched = launched_time(comm, stream, buf, small, bytes, OPS)?;
        let captured = captured_time(comm, stream, buf, small, bytes)?;
        rows.push_str(&format!("{bytes},{launched},{captured}\n"));
    }
    Ok(rows)
}

/// Warm-up: 5 in-place all_reduces of `bytes` on `buf`, waited for.
fn warm_up(comm: &Communicator, stream: &Stream, buf: &DevicePtr, bytes: usize) -> Res<()> {
    for _ in 0..5 {
        comm.all_reduce_in_place::<f32>(buf, bytes / 4, ReduceOp::Sum, stream)?;
    }
    comm.wait(stream, Duration::from_secs(120))?;
    Ok(())
}

/// Seconds per operation: the median of 3 batches, each `issue` (which issues `ops`
/// operations) timed from a line-up of the ranks to a stream synchronize.
fn batch_time(
    comm: &Communicator,
    stream: &Stream,
    small: &DevicePtr,
    ops: usize,
    mut issue: impl FnMut() -> Res<()>,
) -> Res<f64> {
    let mut samples = Vec::new();
    for _ in 0..3 {
        // Line the ranks up before the clock starts.
        comm.all_reduce_in_place::<f32>(small, 1, ReduceOp::Sum, stream)?;
        stream.synchronize()?;
        let t = Instant::now();
        issue()?;
        stream.synchronize()?;
        samples.push(t.elapsed().as_secs_f64() / ops as f64);
    }
    Ok(median(&mut samples))
}

/// Seconds per in-place all_reduce of `bytes` on `buf`, `ops` launched back to back a batch.
fn launched_time(
    comm: &Communicator,
    stream: &Stream,
    buf: &DevicePtr,
    small: &DevicePtr,
    bytes: usize,
    ops: usize,
) -> Res<f64> {
    warm_up(comm, stream, buf, bytes)?;
    batch_time(comm, stream, small, ops, || {
        for _ in 0..ops {
            comm.all_reduce_in_place::<f32>(buf, bytes / 4, ReduceOp::Sum, stream)?;
        }
        Ok(())
    })
}

/// [`launched_time`] with the sweep's batch size ([`iters_for`]).
fn time_size(
    comm: &Communicator,
    stream: &Stream,
    buf: &DevicePtr,
    small: &DevicePtr,
    bytes: usize,
) -> Res<f64> {
    launched_time(comm, stream, buf, small, bytes, iters_for(bytes))
}

/// `bytes,plain,registered,window` rows (seconds; `nan` where a kind is missing).
fn registered_rows(
    comm: &Communicator,
    stream: &Stream,
    plain: &DevicePtr,
    small: &DevicePtr,
) -> Res<String> {
    let dev = comm.device();
    let reg_mem = cudars_nccl::register::alloc(&dev, MAX_BYTES)?;
    reg_mem.memset(0)?;
    let reg = comm.register(&reg_mem)?;
    let win_mem = cudars_nccl::register::alloc(&dev, MAX_BYTES)?;
    win_mem.memset(0)?;
    let win = match comm.register_window(&win_mem) {
        Ok(w) => Some(w),
        Err(e) => {
            eprintln!("bench_nccl rank {}: no symmetric window: {e}", comm.rank());
            None
        }
    };
    // The floor under the launched rows: the same kinds with the launch cost taken away
    // (a graph of OPS collectives, replayed), at the small sizes.
    let mut graph_rows = String::from("bytes,plain,registered,window\n");
    for bytes in CAPTURED_SIZES.into_iter().filter(|&b| b <= 64 << 10) {
        let p = captured_time(comm, stream, plain, small, bytes)?;
        let r = captured_time(comm, stream, &reg, small, bytes)?;
        let w = match &win {
            Some(w) => captured_time(comm, stream, w, small, bytes)?,
            None => f64::NAN,
        };
        graph_rows.push_str(&format!("{bytes},{p},{r},{w}\n"));
    }
    if comm.rank() == 0 {
        std::fs::write(format!("{}.captured", std::env::var(OUT_VAR)?), graph_rows)?;
    }
    let mut rows = String::from("bytes,plain,registered,window\n");
    for bytes in sizes() {
        let p = time_size(comm, stream, plain, small, bytes)?;
        let r = time_size(comm, stream, &reg, small, bytes)?;
        let w = match &win {
            Some(w) => time_size(comm, stream, w, small, bytes)?,
            None => f64::NAN,
        };
        rows.push_str(&format!("{bytes},{p},{r},{w}\n"));
    }
    Ok(rows)
}

/// Seconds per collective of a graph of [`OPS`] in-place all_reduces of `bytes` on `buf`,
/// replayed (median of 3 batches of 5 replays).
fn captured_time(
    comm: &Communicator,
    stream: &Stream,
    buf: &DevicePtr,
    small: &DevicePtr,
    bytes: usize,
) -> Res<f64> {
    warm_up(comm, stream, buf, bytes)?;
    let graph = cudars_graph::capture(stream, cudars_graph::CaptureMode::ThreadLocal, |s| {
        for _ in 0..OPS {
            comm.all_reduce_in_place::<f32>(buf, bytes / 4, ReduceOp::Sum, s)
                .map_err(cudars_graph::Error::other)?;
        }
        Ok(())
    })?
    .instantiate()?;
    graph.launch(stream)?;
    stream.synchronize()?;
    const REPLAYS: usize = 5;
    batch_time(comm, stream, small, REPLAYS * OPS, || {
        for _ in 0..REPLAYS {
            graph.launch(stream)?;
        }
        Ok(())
    })
}

fn rank_main() -> Res<()> {
    let (comm, job) = Communicator::from_env(&CommConfig::default())?;
    let dev = comm.device();
    let stream = Stream::new(&dev)?;
    let buf = DevicePtr::alloc(&dev, MAX_BYTES)?;
    buf.memset(0)?;
    let small = DevicePtr::alloc(&dev, 4)?;
    if std::env::args().any(|a| a == "--registered") {
        let rows = registered_rows(&comm, &stream, &buf, &small)?;
        if job.rank == 0 {
            std::fs::write(std::env::var(OUT_VAR)?, rows)?;
        }
        return Ok(());
    }
    if std::env::args().any(|a| a == "--captured") {
        let rows = captured_rows(&comm, &stream, &buf, &small)?;
        if job.rank == 0 {
            std::fs::write(std::env::var(OUT_VAR)?, rows)?;
        }
        return Ok(());
    }
    let mut rows = String::from("bytes,seconds\n");
    for bytes in sizes() {
        let secs = time_size(&comm, &stream, &buf, &small, bytes)?;
        rows.push_str(&format!("{bytes},{secs}\n"));
    }
    if job.rank == 0 {
        let out = std::env::var(OUT_VAR)?;
        std::fs::write(out, rows)?;
    }
    Ok(())
}

/// `bytes,launched,captured` rows, by size.
fn read_pairs(path: &Path) -> BTreeMap<usize, (f64, f64)> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return BTreeMap::new();
    };
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let mut f = l.split(',').map(str::trim);
            Some((
                f.next()?.parse().ok()?,
                (f.next()?.parse().ok()?, f.next()?.parse().ok()?),
            ))
        })
        .collect()
}

/// The rows of `--captured`.
fn captured_report(n: usize, ours_csv: &Path, torch_csv: &Path) {
    let ours = read_pairs(ours_csv);
    let torch = read_pairs(torch_csv);
    println!(
        "\n{:>8} | {:>12} {:>12} {:>7} | {:>12} {:>12} {:>7}",
        "size", "ours launch", "ours graph", "x", "torch launch", "torch graph", "x"
    );
    for (&bytes, &(l, c)) in &ours {
        let t = torch.get(&bytes).copied();
        let f = |v: Option<f64>| v.map_or("-".into(), |v| format!("{:.2}", v * 1e6));
        println!(
            "{:>8} | {:>12.2} {:>12.2} {:>7.2} | {:>12} {:>12} {:>7}",
            human(bytes),
            l * 1e6,
            c * 1e6,
            l / c,
            f(t.map(|t| t.0)),
            f(t.map(|t| t.1)),
            t.map_or("-".into(), |t| format!("{:.2}", t.0 / t.1)),
        );
    }
    println!();
    let mut report = Report::new("bench_nccl");
    for (&bytes, &(launched, captured)) in &ours {
        report.row(
            &format!(
                "nccl all_reduce {n}gpu {} captured per collective vs launched",
                human(bytes)
            ),
            "us",
            captured * 1e6,
            Some(launched * 1e6),
            "ours launched",
            if bytes < 64 << 10 {
                Target::RatioAtMost(0.5)
            } else {
                Target::None
            },
        );
        report.row(
            &format!(
                "nccl all_reduce {n}gpu {} captured per collective",
                human(bytes)
            ),
            "us",
            captured * 1e6,
            torch.get(&bytes).map(|t| t.1 * 1e6),
            "torch.cuda.graph",
            Target::RatioAtMost(1.0),
        );
    }
}

/// `bytes,a,b,c` rows, by size (`nan` kept).
fn read_triples(path: &Path) -> BTreeMap<usize, [f64; 3]> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return BTreeMap::new();
    };
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').map(str::trim).collect();
            if f.len() != 4 {
                return None;
            }
            let v = |i: usize| f[i].parse::<f64>().unwrap_or(f64::NAN);
            Some((f[0].parse().ok()?, [v(1), v(2), v(3)]))
        })
        .collect()
}

/// The rows of `--registered`.
fn registered_report(n: usize, ours_csv: &Path, torch_csv: &Path) {
    let ours = read_triples(ours_csv);
    let torch = read_triples(torch_csv);
    let factor = 2.0 * (n as f64 - 1.0) / n as f64;
    let f = |v: f64, scale: f64| {
        if v.is_finite() {
            format!("{:.2}", v * scale)
        } else {
            "-".into()
        }
    };
    println!(
        "\n{:>8} | {:>9} {:>9} {:>9} | {:>9} {:>9} {:>9} | (us per all_reduce; busbw GB/s above 64 KiB)",
        "size", "plain", "regist.", "window", "t plain", "t regist", "t symm"
    );
    for (&bytes, o) in &ours {
        let t = torch.get(&bytes).copied().unwrap_or([f64::NAN; 3]);
        let show = |v: f64| {
            if bytes <= 64 << 10 {
                f(v, 1e6)
            } else {
                f(bytes as f64 / v / 1e9 * factor, 1.0)
            }
        };
        println!(
            "{:>8} | {:>9} {:>9} {:>9} | {:>9} {:>9} {:>9}",
            human(bytes),
            show(o[0]),
            show(o[1]),
            show(o[2]),
            show(t[0]),
            show(t[1]),
            show(t[2])
        );
    }
    println!();
    let mut report = Report::new("bench_nccl");
    let some = |v: f64| v.is_finite().then_some(v);
    for (&bytes, o) in &ours {
        let t = torch.get(&bytes).copied().unwrap_or([f64::NAN; 3]);
        let size = human(bytes);
        if bytes <= 64 << 10 {
            for (kind, i) in [("registered", 1), ("window", 2)] {
                if let Some(v) = some(o[i]) {
                    report.row(
                        &format!("nccl all_reduce {n}gpu {size} {kind} latency vs plain"),
                        "us",
                        v * 1e6,
                        Some(o[0] * 1e6),
                        "ours plain",
                        if bytes < 64 << 10 {
                            Target::RatioAtMost(1.0 / 1.2)
                        } else {
                            Target::None
                        },
                    );
                }
            }
            for (kind, i, peer) in [
                ("plain", 0, "torch plain"),
                ("registered", 1, "torch MemPool registered"),
                ("window", 2, "torch MemPool symm"),
            ] {
                if let Some(v) = some(o[i]) {
                    report.row(
                        &format!("nccl all_reduce {n}gpu {size} {kind} latency"),
                        "us",
                        v * 1e6,
                        some(t[i]).map(|x| x * 1e6),
                        peer,
                        Target::RatioAtMost(1.0),
                    );
                }
            }
        } else {
            let bus = |s: f64| bytes as f64 / s / 1e9 * factor;
            for (kind, i, peer) in [
                ("plain", 0, "torch plain"),
                ("registered", 1, "torch MemPool registered"),
                ("window", 2, "torch MemPool symm"),
            ] {
                if let Some(v) = some(o[i]) {
                    report.row(
                        &format!("nccl all_reduce {n}gpu {size} {kind} busbw"),
                        "GB/s",
                        bus(v),
                        some(t[i]).map(bus),
                        peer,
                        Target::RatioAtLeast(0.98),
                    );
                }
            }
        }
    }
}

fn read_csv(path: &Path) -> BTreeMap<usize, f64> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return BTreeMap::new();
    };
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let (b, s) = l.split_once(',')?;
            Some((b.trim().parse().ok()?, s.trim().parse().ok()?))
        })
        .collect()
}

fn peer_script() -> Option<PathBuf> {
    let mut candidates = Vec::new();
    if let Some(dir) = std::env::var_os("CUDA_RS_BUNDLE_DIR") {
        candidates.push(PathBuf::from(dir).join("nccl_peer.py"));
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent().and_then(Path::parent) {
            candidates.push(dir.join("nccl_peer.py"));
        }
    }
    candidates.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("bundle/nccl_peer.py"));
    candidates.into_iter().find(|p| p.is_file())
}

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

fn launcher_main() -> Res<()> {
    let n = cudars_core::device_count()?;
    if n < 2 {
        return Err(format!("needs at least 2 GPUs, found {n}").into());
    }
    let tmp = std::env::temp_dir().join(format!("cudars-nccl-bench-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let ours_csv = tmp.join("ours.csv");
    let torch_csv = tmp.join("torch.csv");
    let captured = std::env::args().any(|a| a == "--captured");
    let registered = std::env::args().any(|a| a == "--registered");
    let mode: Vec<String> = if captured {
        vec!["--captured".into()]
    } else if registered {
        vec!["--registered".into()]
    } else {
        Vec::new()
    };
    println!(
        "bench_nccl: all_reduce f32 in place, {n} GPUs, one process each{}",
        if captured {
            ", launched against captured"
        } else if registered {
            ", plain against registered and symmetric memory"
        } else {
            ""
        }
    );
    let t = Instant::now();
    let statuses = Launcher::new(n)
        .args(mode.clone())
        .env(OUT_VAR, &ours_csv)
        .spawn()?
        .wait(Duration::from_secs(900))?;
    if !statuses.iter().all(|s| s.success()) {
        return Err(format!("a rank failed: {statuses:?}").into());
    }
    println!(
        "bench_nccl: ours done in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let peer = !std::env::args().any(|a| a == "--no-peer");
    match (peer, peer_script()) {
        (true, Some(script)) => {
            let t = Instant::now();
            let status = Command::new(std::env::var("PYTHON").unwrap_or_else(|_| "python3".into()))
                .arg(&script)
                .arg("--world")
                .arg(n.to_string())
                .arg("--out")
                .arg(&torch_csv)
                .args(&mode)
                .env("NCCL_NVLS_ENABLE", "0")
                .status();
            println!(
                "bench_nccl: torch.distributed peer {:?} in {:.1} s",
                status.map(|s| s.code()),
                t.elapsed().as_secs_f64()
            );
        }
        (true, None) => println!("bench_nccl: nccl_peer.py not found: no PyTorch column"),
        (false, _) => {}
    }
    if captured {
        captured_report(n, &ours_csv, &torch_csv);
        let _ = std::fs::remove_dir_all(&tmp);
        return Ok(());
    }
    if registered {
        registered_report(n, &ours_csv, &torch_csv);
        let graph = read_triples(&PathBuf::from(format!("{}.captured", ours_csv.display())));
        println!("\nthe launch cost taken away: per collective of a replayed graph of {OPS} (us)");
        println!(
            "{:>8} | {:>9} {:>9} {:>9}",
            "size", "plain", "regist.", "window"
        );
        for (&bytes, g) in &graph {
            println!(
                "{:>8} | {:>9.2} {:>9.2} {:>9.2}",
                human(bytes),
                g[0] * 1e6,
                g[1] * 1e6,
                g[2] * 1e6
            );
        }
        let mut report = Report::new("bench_nccl");
        for (&bytes, g) in &graph {
            for (kind, i) in [("registered", 1), ("window", 2)] {
                if g[i].is_finite() {
                    report.row(
                        &format!(
                            "nccl all_reduce {n}gpu {} captured {kind} per collective vs captured plain",
                            human(bytes)
                        ),
                        "us",
                        g[i] * 1e6,
                        Some(g[0] * 1e6),
                        "ours captured plain",
                        Target::None,
                    );
                }
            }
        }
        let _ = std::fs::remove_dir_all(&tmp);
        return Ok(());
    }
    let ours = read_csv(&ours_csv);
    let torch = read_csv(&torch_csv);
    let factor = 2.0 * (n as f64 - 1.0) / n as f64;
    println!(
        "\n{:>8} | {:>10} {:>10} {:>10} | {:>10} {:>10} {:>10} | {:>6}",
        "size", "ours us", "algbw", "busbw", "torch us", "algbw", "busbw", "t/ours"
    );
    for (&bytes, &secs) in &ours {
        let alg = bytes as f64 / secs / 1e9;
        let tt = torch.get(&bytes).copied();
        let talg = tt.map(|s| bytes as f64 / s / 1e9);
        let f = |v: Option<f64>, scale: f64| {
            v.map(|v| format!("{:.2}", v * scale))
                .unwrap_or_else(|| "-".into())
        };
        println!(
            "{:>8} | {:>10.2} {:>10.2} {:>10.2} | {:>10} {:>10} {:>10} | {:>6}",
            human(bytes),
            secs * 1e6,
            alg,
            alg * factor,
            f(tt, 1e6),
            f(talg, 1.0),
            f(talg, factor),
            f(tt.map(|t| t / secs), 1.0)
        );
    }
    println!();
    let mut report = Report::new("bench_nccl");
    for (&bytes, &secs) in &ours {
        let tt = torch.get(&bytes).copied();
        if bytes <= 64 << 10 {
            report.row(
                &format!("nccl all_reduce {n}gpu {} latency", human(bytes)),
                "us",
                secs * 1e6,
                tt.map(|t| t * 1e6),
                "torch.distributed",
                Target::RatioAtMost(1.05),
            );
        } else {
            let bus = |s: f64| bytes as f64 / s / 1e9 * factor;
            report.row(
                &format!("nccl all_reduce {n}gpu {} busbw", human(bytes)),
                "GB/s",
                bus(secs),
                tt.map(bus),
                "torch.distributed",
                if bytes >= 64 << 20 {
                    Target::RatioAtLeast(0.98)
                } else {
                    Target::None
                },
            );
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}

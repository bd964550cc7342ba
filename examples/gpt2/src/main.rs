//! `gpt2`: writes the initial weights and tokens, or trains on them.
//!
//! ```text
//! gpt2 init  --config tiny|124m [--seed 1] [--batch 4] [--steps 10] --out DIR
//!            writes DIR/weights.safetensors (config in its metadata) and DIR/tokens.safetensors
//! gpt2 train --weights W --tokens T [--steps 10] [--batch 4] [--lr 1e-4] [--out losses.json]
//!            [--dtype f32|bf16] [--graph 1]  (replay the step from a CUDA graph after step 1)
//!            [--grads-out G.safetensors]   (every parameter's gradient after step 1's backward)
//!            [--params-out P.safetensors]  (every parameter after the last step)
//!            [--memory-report R.html]      (the pool's memory timeline of the run)
//!            [--ddp 1]   one process per GPU: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
//!                        MASTER_PORT as torchrun sets them (cuda-nccl's rendezvous); --batch
//!                        is per rank, rank r takes the r-th part of each combined batch, the
//!                        gradients are all-reduced during the backward pass (overlapped);
//!                        --out gets each rank's losses
//! gpt2 bench [--config tiny|124m] [--batch 8] [--steps 20] [--dtype f32|bf16]
//!            ms per step, eager and graph-replayed, and the pool's peak reserved memory
//! ```
//! Batches go through the [`Loader`](gpt2::loader::Loader): packed on the host and uploaded
//! on a second stream while the previous step runs.
//! One JSON line per training step: `{"step": i, "loss": x, "ms": t, "tok_s": n, "peak_bytes":
//! p}` (the pool's peak reserved bytes so far).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "a command-line program: a failure ends it with its message"
)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use cudars_core::{Device, Stream};
use gpt2::init::{self, Config};
use gpt2::loader::Loader;
use gpt2::model::{AdamW, Model, Precision};
use gpt2::safetensors::{self, Tensor};

fn args() -> (String, HashMap<String, String>) {
    let mut it = std::env::args().skip(1);
    let cmd = it.next().unwrap_or_else(|| "help".into());
    let mut map = HashMap::new();
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_default();
        map.insert(k.trim_start_matches("--").to_string(), v);
    }
    (cmd, map)
}

fn get<T: std::str::FromStr>(m: &HashMap<String, String>, k: &str, default: T) -> T {
    m.get(k).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() {
    let (cmd, a) = args();
    match cmd.as_str() {
        "init" => {
            let cfg = match a.get("config").map(String::as_str) {
                Some("124m") => Config::gpt2_124m(),
                _ => Config::tiny(),
            };
            let out = PathBuf::from(a.get("out").cloned().unwrap_or_else(|| ".".into()));
            std::fs::create_dir_all(&out).unwrap();
            let seed = get(&a, "seed", 1u64);
            let (batch, steps) = (get(&a, "batch", 4usize), get(&a, "steps", 10usize));
            let params = init::init_params(&cfg, seed);
            safetensors::write(out.join("weights.safetensors"), &params, &cfg.metadata()).unwrap();
            let toks = init::tokens(&cfg, batch, steps, seed);
            let t = init::tokens_tensor(&toks);
            safetensors::write(out.join("tokens.safetensors"), &[t], &cfg.metadata()).unwrap();
            println!(
                "wrote {} parameters and {} tokens to {}",
                gpt2::model::param_count(&cfg),
                toks.len(),
                out.display()
            );
        }
        "train" => train(&a),
        "bench" => bench(&a),
        _ => {
            println!(
                "usage: gpt2 init --config tiny|124m [--seed S] [--batch B] [--steps N] --out DIR"
            );
            println!("       gpt2 train --weights W --tokens T [--steps N] [--batch B] [--lr LR] [--dtype f32|bf16] [--graph 1] [--ddp 1] [--out losses.json] [--grads-out G] [--memory-report R.html]");
            println!("       gpt2 bench [--config tiny|124m] [--batch 8] [--steps 20] [--dtype f32|bf16]   (ms/step eager and graph-replayed)");
        }
    }
}

fn precision(a: &HashMap<String, String>) -> Precision {
    match a.get("dtype").map(String::as_str) {
        Some("bf16") => Precision::Bf16,
        None | Some("f32") => Precision::F32,
        Some(other) => panic!("--dtype {other}: f32 or bf16"),
    }
}

fn peak_bytes(dev: &Device) -> u64 {
    cudars_mempool::driver::default_pool()
        .and_then(|p| p.stats(cudars_mempool::driver::device_id(dev)))
        .map(|s| s.reserved.peak)
        .unwrap_or(0)
}

fn train(a: &HashMap<String, String>) {
    let (tensors, meta) = safetensors::read(a.get("weights").expect("--weights")).unwrap();
    let cfg = Config::from_metadata(&meta).unwrap();
    let mut weights = Vec::new();
    for (t, (name, shape)) in tensors.iter().zip(init::param_specs(&cfg)) {
        assert_eq!(
            (&t.name, &t.shape),
            (&name, &shape),
            "the weights file's order"
        );
        weights.extend(t.to_f32().unwrap());
    }
    let (toks, _) = safetensors::read(a.get("tokens").expect("--tokens")).unwrap();
    let tokens: Vec<i32> = toks[0].to_i32().unwrap();
    let (batch, steps) = (get(a, "batch", 4usize), get(a, "steps", 10usize));
    let opt = AdamW {
        lr: get(a, "lr", 1e-4f32),
        ..AdamW::default()
    };
    let graph = get(a, "graph", 0u32) != 0;
    assert!(
        !(graph && get(a, "ddp", 0u32) != 0),
        "--graph 1 with --ddp 1: the data-parallel step runs eagerly (its all-reduce is not captured)"
    );
    // Data parallel, one process per GPU: the job's variables and rank 0's id over TCP.
    let ddp = (get(a, "ddp", 0u32) != 0)
        .then(|| cudars_nccl::Communicator::from_env(&cudars_nccl::CommConfig::default()).unwrap());
    let (rank, world) = ddp
        .as_ref()
        .map_or((0, 1), |(_, job)| (job.rank, job.world_size));
    let dev = match &ddp {
        Some((comm, _)) => comm.device(),
        None => Device::new(0).unwrap(),
    };
    // The memory timeline of the run (the pool's history), when asked for.
    let recorder = a.get("memory-report").map(|_| {
        let rec = std::sync::Arc::new(cudars_mempool::history::Recorder::new(
            1 << 20,
            cudars_mempool::history::Clock::Real,
        ));
        let pool = cudars_mempool::driver::default_pool().unwrap();
        pool.start_history(std::sync::Arc::clone(&rec));
        rec
    });
    let stream = Stream::new(&dev).unwrap();
    let mut model = Model::with_precision(cfg, batch, &stream, &weights, precision(a)).unwrap();
    model.set_world(world);
    let mut loader = Loader::new(&model).unwrap();
    // This rank's part of step i's combined batch.
    let part = |step: usize| {
        let (inp, tgt) = init::batch(&tokens, step, batch * world, cfg.seq);
        let n = batch * cfg.seq;
        assert!(
            inp.len() == n * world,
            "the tokens file holds fewer than one combined batch of {} x {} tokens",
            batch * world,
            cfg.seq
        );
        (
            inp[rank * n..(rank + 1) * n].to_vec(),
            tgt[rank * n..(rank + 1) * n].to_vec(),
        )
    };
    let (inp, tgt) = part(0);
    loader.prefetch(&model, &inp, &tgt).unwrap();
    let mut exec = None;
    let mut losses = Vec::new();
    for step in 0..steps {
        let t0 = Instant::now();
        loader.load(&model).unwrap();
        match &exec {
            Some(e) => model.replay(e).unwrap(),
            None => {
                model.forward().unwrap();
                match &ddp {
                    // The gradients all-reduced part by part, overlapped with the backward.
                    Some((comm, _)) => model.backward_all_reduce(comm).unwrap(),
                    None => model.backward().unwrap(),
                }
                if step == 0 {
                    if let Some(path) = a.get("grads-out") {
                        let g = model.gradients().unwrap();
                        let mut at = 0;
                        let mut out = Vec::new();
                        for (name, shape) in init::param_specs(&cfg) {
                            let n: usize = shape.iter().product();
                            out.push(Tensor::f32(&name, shape, &g[at..at + n]));
                            at += n;
                        }
                        safetensors::write(path, &out, &cfg.metadata()).unwrap();
                    }
                }
                model.update(&opt).unwrap();
            }
        }
        // The next batch is packed and uploaded while this step runs.
        if step + 1 < steps {
            let (inp, tgt) = part(step + 1);
            loader.prefetch(&model, &inp, &tgt).unwrap();
        }
        let loss = model.loss().unwrap();
        if graph && exec.is_none() && ddp.is_none() {
            exec = Some(model.capture_step(&opt).unwrap());
        }
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        let tok_s = (batch * cfg.seq) as f64 / ms * 1e3;
        let peak = peak_bytes(&dev);
        println!(
            "{{\"step\": {step}, \"rank\": {rank}, \"loss\": {loss}, \"ms\": {ms:.3}, \"tok_s\": {tok_s:.0}, \"peak_bytes\": {peak}}}"
        );
        losses.push(loss);
    }
    if let (Some(rec), Some(path)) = (&recorder, a.get("memory-report")) {
        let history = rec.history();
        let snapshot = history.snapshot();
        let options = cudars_mempool::history::report::ReportOptions {
            title: format!("gpt2 training, {} steps, batch {batch}", steps),
            ..Default::default()
        };
        std::fs::write(
            path,
            cudars_mempool::history::report::html(&history, &snapshot, &options),
        )
        .unwrap();
        println!("memory report: {path}");
    }
    if let Some(path) = a.get("params-out") {
        let p = model.parameters().unwrap();
        let mut at = 0;
        let mut out = Vec::new();
        for (name, shape) in init::param_specs(&cfg) {
            let n: usize = shape.iter().product();
            out.push(Tensor::f32(&name, shape, &p[at..at + n]));
            at += n;
        }
        safetensors::write(path, &out, &cfg.metadata()).unwrap();
    }
    if let Some(out) = a.get("out") {
        let json = format!(
            "[{}]",
            losses
                .iter()
                .map(|l| format!("{l}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        std::fs::write(out, json).unwrap();
    }
}

/// ms per step, eager and graph-replayed (batches through the loader), with the pool's peak
/// reserved memory.
fn bench(a: &HashMap<String, String>) {
    let cfg = match a.get("config").map(String::as_str) {
        Some("tiny") => Config::tiny(),
        _ => Config::gpt2_124m(),
    };
    let prec = precision(a);
    let (batch, steps) = (get(a, "batch", 8usize), get(a, "steps", 20usize));
    let params = init::init_params(&cfg, 1);
    let weights: Vec<f32> = params.iter().flat_map(|t| t.to_f32().unwrap()).collect();
    let tokens = init::tokens(&cfg, batch, steps + 3, 1);
    let opt = AdamW::default();
    let dev = Device::new(0).unwrap();
    let stream = Stream::new(&dev).unwrap();
    let model = Model::with_precision(cfg, batch, &stream, &weights, prec).unwrap();
    let mut loader = Loader::new(&model).unwrap();
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|x, y| x.partial_cmp(y).unwrap());
        v[v.len() / 2]
    };
    // Steps timed back to back, host to host: the loader uploads the next batch while the
    // step runs, and each step's loss is read (one synchronisation per step).
    let mut run = |graph: Option<&cudars_graph::GraphExec>, label: &str| -> Vec<f64> {
        let (inp, tgt) = init::batch(&tokens, 0, batch, cfg.seq);
        loader.prefetch(&model, &inp, &tgt).unwrap();
        let mut times = Vec::new();
        let mut t0 = Instant::now();
        for step in 0..steps + 3 {
            loader.load(&model).unwrap();
            match graph {
                Some(e) => model.replay(e).unwrap(),
                None => {
                    model.forward().unwrap();
                    model.backward().unwrap();
                    model.update(&opt).unwrap();
                }
            }
            if step + 1 < steps + 3 {
                let (inp, tgt) = init::batch(&tokens, step + 1, batch, cfg.seq);
                loader.prefetch(&model, &inp, &tgt).unwrap();
            }
            let loss = model.loss().unwrap();
            let t1 = Instant::now();
            if step >= 3 {
                times.push((t1 - t0).as_secs_f64() * 1e3);
            }
            t0 = t1;
            if step == steps + 2 {
                println!("{label} last loss {loss}");
            }
        }
        times
    };
    let mut eager = run(None, "eager");
    let exec = model.capture_step(&opt).unwrap();
    let mut replayed = run(Some(&exec), "graph");
    let peak = peak_bytes(&dev);
    let tokens_per_step = (batch * cfg.seq) as f64;
    let (e, g) = (median(&mut eager), median(&mut replayed));
    let spread = |v: &[f64]| v[v.len() - 1] - v[0];
    println!(
        "gpt2 {} {}L batch {batch}x{}: ours eager {e:.2} ms/step ({:.0} tok/s, spread {:.2}), graph-replayed {g:.2} ms/step ({:.0} tok/s, spread {:.2}), pool peak reserved {:.2} GiB",
        match prec {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
        },
        cfg.layers,
        cfg.seq,
        tokens_per_step / e * 1e3,
        spread(&eager),
        tokens_per_step / g * 1e3,
        spread(&replayed),
        peak as f64 / (1u64 << 30) as f64
    );
}

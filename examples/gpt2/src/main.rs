//! `gpt2`: writes the initial weights and tokens, or trains on them.
//!
//! ```text
//! gpt2 init  --config tiny|124m [--seed 1] [--batch 4] [--steps 10] --out DIR
//!            writes DIR/weights.safetensors (config in its metadata) and DIR/tokens.safetensors
//! gpt2 train --weights W --tokens T [--steps 10] [--batch 4] [--lr 1e-4] [--out losses.json]
//!            [--grads-out G.safetensors]   (every parameter's gradient after step 1's backward)
//!            [--memory-report R.html]      (the pool's memory timeline of the run)
//! gpt2 bench [--config tiny|124m] [--batch 8] [--steps 20]
//!            f32 ms per step, eager and graph-replayed, and the pool's peak reserved memory
//! ```
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
use gpt2::model::{AdamW, Model};
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
        "train" => {
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
            let (batch, steps) = (get(&a, "batch", 4usize), get(&a, "steps", 10usize));
            let opt = AdamW {
                lr: get(&a, "lr", 1e-4f32),
                ..AdamW::default()
            };
            let dev = Device::new(0).unwrap();
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
            let mut model = Model::new(cfg, batch, &stream, &weights).unwrap();
            let mut losses = Vec::new();
            for step in 0..steps {
                let (inp, tgt) = init::batch(&tokens, step, batch, cfg.seq);
                let t0 = Instant::now();
                model.set_batch(&inp, &tgt).unwrap();
                model.forward().unwrap();
                model.backward().unwrap();
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
                let loss = model.loss().unwrap();
                let ms = t0.elapsed().as_secs_f64() * 1e3;
                let tok_s = (batch * cfg.seq) as f64 / ms * 1e3;
                let peak = cudars_mempool::driver::default_pool()
                    .and_then(|p| p.stats(cudars_mempool::driver::device_id(&dev)))
                    .map(|s| s.reserved.peak)
                    .unwrap_or(0);
                println!(
                    "{{\"step\": {step}, \"loss\": {loss}, \"ms\": {ms:.3}, \"tok_s\": {tok_s:.0}, \"peak_bytes\": {peak}}}"
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
        "bench" => {
            // ms per step, eager and graph-replayed, with the pool's peak reserved memory.
            let cfg = match a.get("config").map(String::as_str) {
                Some("tiny") => Config::tiny(),
                _ => Config::gpt2_124m(),
            };
            let (batch, steps) = (get(&a, "batch", 8usize), get(&a, "steps", 20usize));
            let params = init::init_params(&cfg, 1);
            let weights: Vec<f32> = params.iter().flat_map(|t| t.to_f32().unwrap()).collect();
            let tokens = init::tokens(&cfg, batch, steps + 3, 1);
            let opt = AdamW::default();
            let dev = Device::new(0).unwrap();
            let stream = Stream::new(&dev).unwrap();
            let mut model = Model::new(cfg, batch, &stream, &weights).unwrap();
            let median = |v: &mut Vec<f64>| {
                v.sort_by(|x, y| x.partial_cmp(y).unwrap());
                v[v.len() / 2]
            };
            let mut eager = Vec::new();
            for step in 0..steps + 3 {
                let (inp, tgt) = init::batch(&tokens, step, batch, cfg.seq);
                model.set_batch(&inp, &tgt).unwrap();
                let t0 = Instant::now();
                model.forward().unwrap();
                model.backward().unwrap();
                model.update(&opt).unwrap();
                let loss = model.loss().unwrap();
                if step >= 3 {
                    eager.push(t0.elapsed().as_secs_f64() * 1e3);
                }
                if step == steps + 2 {
                    println!("eager last loss {loss}");
                }
            }
            let exec = model.capture_step(&opt).unwrap();
            let mut replayed = Vec::new();
            for step in 0..steps + 3 {
                let (inp, tgt) = init::batch(&tokens, step, batch, cfg.seq);
                model.set_batch(&inp, &tgt).unwrap();
                model.begin_step(&opt).unwrap();
                let t0 = Instant::now();
                model.replay(&exec).unwrap();
                let loss = model.loss().unwrap();
                if step >= 3 {
                    replayed.push(t0.elapsed().as_secs_f64() * 1e3);
                }
                if step == steps + 2 {
                    println!("graph last loss {loss}");
                }
            }
            let pool = cudars_mempool::driver::default_pool().unwrap();
            let peak = pool
                .stats(cudars_mempool::driver::device_id(&dev))
                .unwrap()
                .reserved
                .peak;
            let tokens_per_step = (batch * cfg.seq) as f64;
            let (e, g) = (median(&mut eager), median(&mut replayed));
            println!(
                "gpt2 f32 {}L batch {batch}x{}: ours eager {e:.2} ms/step ({:.0} tok/s), graph-replayed {g:.2} ms/step ({:.0} tok/s), pool peak reserved {:.2} GiB",
                cfg.layers,
                cfg.seq,
                tokens_per_step / e * 1e3,
                tokens_per_step / g * 1e3,
                peak as f64 / (1u64 << 30) as f64
            );
        }
        _ => {
            println!(
                "usage: gpt2 init --config tiny|124m [--seed S] [--batch B] [--steps N] --out DIR"
            );
            println!("       gpt2 train --weights W --tokens T [--steps N] [--batch B] [--lr LR] [--out losses.json] [--grads-out G]");
            println!("       gpt2 bench [--config tiny|124m] [--batch 8] [--steps 20]   (f32: ms/step eager and graph-replayed)");
        }
    }
}

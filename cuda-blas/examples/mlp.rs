//! A two-layer MLP trained on the GPU with these crates alone: cuRAND draws the weights, the
//! inputs and a hidden linear target; cuBLASLt runs the layers with their epilogues (bias +
//! GELU forward keeping the pre-activation, the bias gradients and GELU's backward fused into
//! the backward GEMMs); cuBLAS applies the SGD updates. One training step (forward, backward,
//! update) is captured into a graph once and replayed; the loss is read between replays and
//! must fall.
//!
//! Row-major throughout, like `torch.nn.Linear`: `h = gelu(x W1^T + b1)`, `y = h W2^T + b2`,
//! loss `|y - t|^2 / batch`. Run with `cargo run --release --example mlp` (cuBLAS and cuRAND
//! from `$CUDA_CUBLAS_LIBRARY` / `$CUDA_CURAND_LIBRARY` or the default names).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "example code: a failed step panics with its message"
)]

mod common;
use common::println;

use cudars_blas::{axpy, geam, nrm2, Epilogue, Gemm, LtMatmul, Mat, Op, Vector};
use cudars_core::{memory::DevicePtr, Device, Stream};
use cudars_graph::CaptureMode;
use cudars_rand::{Generator, RngKind};

const BATCH: usize = 256;
const INPUT: usize = 64;
const HIDDEN: usize = 128;
const OUTPUT: usize = 32;
const LR: f32 = 0.05;

fn buffer(stream: &Stream, elements: usize) -> DevicePtr {
    let p = cudars_mempool::driver::malloc(stream, elements * 4).unwrap();
    p.memset_async(0, stream).unwrap();
    p
}

fn main() {
    let dev = Device::new(0).unwrap();
    let stream = Stream::new(&dev).unwrap();
    let mut rng = Generator::with_seed(RngKind::Philox, &stream, 1234).unwrap();
    let b = |n| buffer(&stream, n);
    let (x, t, w_true) = (b(BATCH * INPUT), b(BATCH * OUTPUT), b(OUTPUT * INPUT));
    let (w1, b1, w2, b2) = (b(HIDDEN * INPUT), b(HIDDEN), b(OUTPUT * HIDDEN), b(OUTPUT));
    let (pre, h, y, dy) = (
        b(BATCH * HIDDEN),
        b(BATCH * HIDDEN),
        b(BATCH * OUTPUT),
        b(BATCH * OUTPUT),
    );
    let (dw1, db1, dw2, db2, dh) = (
        b(HIDDEN * INPUT),
        b(HIDDEN),
        b(OUTPUT * HIDDEN),
        b(OUTPUT),
        b(BATCH * HIDDEN),
    );
    rng.normal::<f32>(&x, 0.0, 1.0).unwrap();
    rng.normal::<f32>(&w_true, 0.0, 0.2).unwrap();
    rng.normal::<f32>(&w1, 0.0, (1.0 / INPUT as f32).sqrt())
        .unwrap();
    rng.normal::<f32>(&w2, 0.0, (1.0 / HIDDEN as f32).sqrt())
        .unwrap();
    // The target: a linear map of the input, t = x W_true^T.
    Gemm::new(
        Mat::<f32>::row_major(&x, BATCH, INPUT),
        Mat::row_major(&w_true, OUTPUT, INPUT),
        Mat::row_major(&t, BATCH, OUTPUT),
    )
    .op_b(Op::T)
    .run(&stream)
    .unwrap();

    let step = |s: &Stream| -> cudars_blas::Result<()> {
        // Forward: pre = x W1^T + b1 (kept in the aux buffer), h = gelu(pre); y = h W2^T + b2.
        LtMatmul::new(
            Mat::<f32>::row_major(&x, BATCH, INPUT),
            Mat::row_major(&w1, HIDDEN, INPUT),
            Mat::row_major(&h, BATCH, HIDDEN),
        )
        .op_b(Op::T)
        .epilogue(Epilogue::GeluAuxBias)
        .bias(&b1)
        .aux(&pre, HIDDEN)
        .run(s)?;
        LtMatmul::new(
            Mat::<f32>::row_major(&h, BATCH, HIDDEN),
            Mat::row_major(&w2, OUTPUT, HIDDEN),
            Mat::row_major(&y, BATCH, OUTPUT),
        )
        .op_b(Op::T)
        .epilogue(Epilogue::Bias)
        .bias(&b2)
        .run(s)?;
        // dy = (y - t) * 2 / batch.
        let k = 2.0 / BATCH as f32;
        geam(
            s,
            (k, Mat::<f32>::row_major(&y, BATCH, OUTPUT), Op::N),
            (-k, Mat::row_major(&t, BATCH, OUTPUT), Op::N),
            Mat::row_major(&dy, BATCH, OUTPUT),
        )?;
        // dW2 = dy^T h, db2 = the column sums of dy.
        LtMatmul::new(
            Mat::<f32>::row_major(&dy, BATCH, OUTPUT),
            Mat::row_major(&h, BATCH, HIDDEN),
            Mat::row_major(&dw2, OUTPUT, HIDDEN),
        )
        .op_a(Op::T)
        .epilogue(Epilogue::BgradA)
        .bias(&db2)
        .run(s)?;
        // dpre = (dy W2) * gelu'(pre), db1 = its column sums.
        LtMatmul::new(
            Mat::<f32>::row_major(&dy, BATCH, OUTPUT),
            Mat::row_major(&w2, OUTPUT, HIDDEN),
            Mat::row_major(&dh, BATCH, HIDDEN),
        )
        .epilogue(Epilogue::DGeluBgrad)
        .bias(&db1)
        .aux(&pre, HIDDEN)
        .run(s)?;
        // dW1 = dpre^T x.
        Gemm::new(
            Mat::<f32>::row_major(&dh, BATCH, HIDDEN),
            Mat::row_major(&x, BATCH, INPUT),
            Mat::row_major(&dw1, HIDDEN, INPUT),
        )
        .op_a(Op::T)
        .run(s)?;
        // SGD.
        for (w, g) in [(&w1, &dw1), (&b1, &db1), (&w2, &dw2), (&b2, &db2)] {
            axpy(s, -LR, Vector::<f32>::whole(g), Vector::whole(w))?;
        }
        Ok(())
    };
    let loss = |s: &Stream| -> f32 {
        let n = nrm2(s, Vector::<f32>::whole(&dy)).unwrap();
        // |dy| = 2/batch |y - t|, so |y - t|^2 / batch = (|dy| batch / 2)^2 / batch.
        let r = n * BATCH as f32 / 2.0;
        r * r / BATCH as f32
    };

    // One eager step (handles, workspaces and plans made), then the capture.
    step(&stream).unwrap();
    let first = loss(&stream);
    let graph = cudars_graph::capture(&stream, CaptureMode::ThreadLocal, |s| {
        step(s).map_err(cudars_graph::Error::other)
    })
    .unwrap();
    let exec = graph.instantiate().unwrap();
    println!("captured step: {} nodes", graph.node_count().unwrap());
    let mut last = first;
    for epoch in 0..5 {
        for _ in 0..100 {
            exec.launch(&stream).unwrap();
        }
        last = loss(&stream);
        println!("after {} replays: loss {last:.5}", (epoch + 1) * 100);
    }
    println!("loss {first:.5} -> {last:.5}");
    assert!(
        last < first * 0.5,
        "the loss did not fall: {first} -> {last}"
    );
}

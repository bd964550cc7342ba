//! GPT-2 trained on the workspace's crates alone: kernels compiled at run time by `cuda-rtc`
//! (`kernels.cu`), linear layers through `cuda-blas`'s cuBLASLt epilogues and attention through
//! its strided-batched GEMMs, everything in `cuda-mempool`'s pool, checked step for step
//! against a plain PyTorch reference (`reference/train_gpt2_ref.py`) that loads the same
//! weights (a safetensors file this crate writes) and the same tokens.
//!
//! * [`init`]: the configuration ([`init::Config::tiny`], [`init::Config::gpt2_124m`]), the
//!   parameter list, the seeded initialisation and the training tokens.
//! * [`safetensors`]: the weights file both sides read.
//! * [`model::Model`]: forward, backward and AdamW on one device, in f32 or bf16 mixed
//!   precision ([`model::Precision`]); the whole step captured into a CUDA graph.
//! * [`loader::Loader`]: batches uploaded through `cuda-xfer` on a second stream, overlapped
//!   with the step before.
//!
//! Run `cargo run --release -p gpt2 -- --help`.

pub mod init;
pub mod loader;
pub mod model;
pub mod safetensors;

/// Every failure of the example.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A driver call.
    #[error(transparent)]
    Cuda(#[from] cudars_core::Error),
    /// Compiling or launching a kernel.
    #[error(transparent)]
    Rtc(#[from] cudars_rtc::Error),
    /// A cuBLAS / cuBLASLt call or its arguments.
    #[error(transparent)]
    Blas(#[from] cudars_blas::Error),
    /// The pool.
    #[error(transparent)]
    Pool(#[from] cudars_mempool::PoolError),
    /// An NCCL collective (data parallel).
    #[error(transparent)]
    Nccl(#[from] cudars_nccl::Error),
    /// A host-to-device transfer of the loader.
    #[error(transparent)]
    Xfer(Box<cudars_xfer::Error>),
    /// Capturing or replaying the step's graph.
    #[error(transparent)]
    Graph(#[from] cudars_graph::Error),
    /// A configuration that cannot be built.
    #[error("config: {0}")]
    Config(String),
    /// Buffers of the wrong size.
    #[error("layout: {0}")]
    Layout(&'static str),
    /// A token outside the vocabulary.
    #[error("token {0} is outside the vocabulary")]
    Token(i32),
    /// A file.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The weights or tokens file.
    #[error("safetensors: {0}")]
    Safetensors(String),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

//! DLPack 1.x for `cudars_core` device memory: zero-copy exchange of CUDA tensors with
//! PyTorch, CuPy, JAX and any other DLPack producer or consumer.
//!
//! | module | what |
//! | --- | --- |
//! | [`ffi`] | the DLPack C structs (from `dlpark`), with layout tests against `dlpack.h` |

pub mod ffi;

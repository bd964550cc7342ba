//! C ABI for `cuda-mempool` (in progress).

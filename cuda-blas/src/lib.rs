//! cuBLAS (skeleton; being written).

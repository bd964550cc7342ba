//! cuRAND on cuda-core's streams and views (skeleton; being written).

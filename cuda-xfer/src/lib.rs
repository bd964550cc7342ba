//! `cuda-xfer`: filled in by its own issue; empty for now.

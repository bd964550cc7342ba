//! Compile-fail tests (trybuild): each program in `tests/compile_fail/` breaks a promise
//! the workspace's docs make ("cannot be touched", "is not `Send`", "needs `unsafe`"), and
//! must be rejected by the compiler for that reason; its `.stderr` holds the expected
//! diagnostic. Regenerate those with `TRYBUILD=overwrite cargo test -p tests --test
//! compile_fail`, then read each one.
//!
//! CPU only: the programs are compiled, never run. Left out of GPU builds (`gpu` feature):
//! the GPU bundle ships test binaries to a machine without cargo or the sources.
#![cfg(not(feature = "gpu"))]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

#[test]
fn soundness_promises_are_enforced_by_the_compiler() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("compile_fail/*.rs");
}

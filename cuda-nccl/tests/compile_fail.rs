//! Proofs of the "cannot"s in the docs: each file under `tests/ui/` must fail to compile.

#[test]
fn promises_hold_at_compile_time() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}

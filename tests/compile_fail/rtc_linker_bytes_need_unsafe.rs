// nvJitLink parses cubins and LTO-IR it is handed; bytes from anywhere are `unsafe` to add
// (soundness round 3, item 3). A program cuda-rtc compiled goes in safely through
// `Linker::add_compiled`.
use cudars_rtc::{Arch, Compiler, Linker};

fn main() {
    let mut linker = Linker::new(Compiler::global().unwrap(), Arch::new(9, 0), &["-lto"]).unwrap();
    let bytes = std::fs::read("input.bin").unwrap();
    let _ = linker.add_cubin(&bytes, "a");
    let _ = linker.add_ltoir(&bytes, "b");
}

// A kernel launch takes an `Issue` (`stream.issue(device)?`), not a stream: the capture gate
// is held from the marks of the memory the kernel uses to the launch, so a capture begun on
// another thread in between cannot capture a kernel whose memory nothing keeps alive. A
// launcher that forgets the gate does not compile.
use std::ffi::c_void;

fn launch(f: &cudars_core::Function, stream: &cudars_core::Stream) {
    let mut arg = 0u64;
    let mut params = [&mut arg as *mut u64 as *mut c_void];
    let _ = unsafe { f.launch(stream, (1, 1, 1), (1, 1, 1), 0, &mut params) };
}

fn main() {}

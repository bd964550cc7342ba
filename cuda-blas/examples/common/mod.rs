//! What the programs beside this file share: printing that survives a closed stdout.
//!
//! `program | head` closes stdout early; `std`'s `println!` would panic on the next write.
//! These macros stand in for `print!`/`println!`: a closed pipe ends the program quietly with
//! status 0, any other write error ends it with a message on stderr and status 1.

/// `println!` that exits cleanly when stdout is closed (see the module doc).
#[allow(unused_macros, reason = "not every program prints whole lines")]
macro_rules! println {
    () => {
        println!("")
    };
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout(), $($arg)*) {
            $crate::common::stdout_failed(e)
        }
    }};
}

/// `print!` that exits cleanly when stdout is closed (see the module doc).
#[allow(unused_macros, reason = "not every program prints partial lines")]
macro_rules! print {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = write!(std::io::stdout(), $($arg)*) {
            $crate::common::stdout_failed(e)
        }
    }};
}

#[allow(unused_imports, reason = "not every program uses both")]
pub(crate) use {print, println};

/// Ends the program after a failed write to stdout: status 0 for a closed pipe (the reader
/// has all it wanted), else a message and status 1.
pub fn stdout_failed(e: std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    eprintln!("error: cannot write to stdout: {e}");
    std::process::exit(1)
}

//! How failures cross the C boundary: a thread-local last-error message, and
//! [`guard`], which turns both `Err` and panics into it.
//!
//! No panic ever unwinds into C: every export runs its body inside [`guard`], which
//! catches the unwind with [`std::panic::catch_unwind`], records a message and returns
//! the export's failure value (a null pointer or a negative number).

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

thread_local! {
    /// The message of the most recent failure on this thread (`None`: none yet, or
    /// cleared).
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
}

/// Records `message` as the calling thread's last error. Interior NUL bytes, which a C
/// string cannot hold, are replaced by spaces.
pub fn set_last_error(message: &str) {
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    // A thread being torn down has no slot any more; there is nobody left to read it.
    let _ = LAST_ERROR.try_with(|slot| *slot.borrow_mut() = Some(text));
}

/// Forgets the calling thread's last error.
pub fn clear_last_error() {
    let _ = LAST_ERROR.try_with(|slot| *slot.borrow_mut() = None);
}

/// The calling thread's last error message, if any (a copy, for Rust callers and tests).
pub fn last_error_message() -> Option<String> {
    LAST_ERROR
        .try_with(|slot| {
            slot.borrow()
                .as_ref()
                .map(|s| s.to_string_lossy().into_owned())
        })
        .ok()
        .flatten()
}

/// A pointer to the calling thread's last error message, or null when there is none.
/// It stays valid until the next failure on this thread, or until
/// [`clear_last_error`], whichever comes first.
pub fn last_error_ptr() -> *const c_char {
    LAST_ERROR
        .try_with(|slot| {
            slot.borrow()
                .as_ref()
                .map_or(std::ptr::null(), |s| s.as_ptr())
        })
        .unwrap_or(std::ptr::null())
}

/// Runs `body`; on `Err(message)` or on a panic, records the message as the thread's
/// last error and returns `failure`. Never unwinds.
///
/// ```
/// use cudars_mempool_capi::error::{guard, last_error_message};
///
/// assert_eq!(guard(-1, || Ok::<i64, String>(7)), 7);
/// assert_eq!(guard(-1, || Err::<i64, String>("bad size".into())), -1);
/// assert_eq!(last_error_message().as_deref(), Some("bad size"));
/// ```
pub fn guard<T, E: std::fmt::Display>(failure: T, body: impl FnOnce() -> Result<T, E>) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(value)) => value,
        Ok(Err(e)) => {
            set_last_error(&e.to_string());
            failure
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic payload".to_string());
            set_last_error(&format!(
                "internal error (panic caught at the C boundary): {what}"
            ));
            failure
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_and_panics_become_the_failure_value_and_a_message() {
        clear_last_error();
        assert!(last_error_ptr().is_null());
        assert_eq!(guard(0u8, || Ok::<u8, String>(3)), 3);
        assert!(
            last_error_message().is_none(),
            "success must not set an error"
        );

        assert_eq!(guard(0u8, || Err::<u8, _>("first failure")), 0);
        assert_eq!(last_error_message().as_deref(), Some("first failure"));

        let r = guard(-1i64, || -> Result<i64, String> { panic!("boom {}", 42) });
        assert_eq!(r, -1);
        let msg = last_error_message().unwrap_or_default();
        assert!(msg.contains("boom 42") && msg.contains("panic"), "{msg}");
        let p = last_error_ptr();
        assert!(!p.is_null());
        // SAFETY: the pointer refers to this thread's live CString, unchanged since.
        let c = unsafe { std::ffi::CStr::from_ptr(p) };
        assert_eq!(c.to_string_lossy(), msg);

        clear_last_error();
        assert!(last_error_ptr().is_null());
    }

    #[test]
    fn messages_are_per_thread_and_nul_safe() {
        set_last_error("main\0thread");
        assert_eq!(last_error_message().as_deref(), Some("main thread"));
        let other = std::thread::spawn(last_error_message).join().ok().flatten();
        assert_eq!(other, None);
    }
}

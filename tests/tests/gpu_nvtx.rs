//! NVTX ranges reach a profiler: this binary is its own NVTX tool.
//!
//! NVTX3 looks for a tool when the first NVTX call is made: a library named by
//! `NVTX_INJECTION64_PATH`, else a statically linked one, found through the symbol
//! `InitializeInjectionNvtx2_fnptr` (weak in the NVTX code that cuda-sys compiles). This binary
//! defines that symbol, so NVTX hands it its function table exactly as it hands it to Nsight
//! Systems; the tool here records every mark, push and pop it receives, and the test checks
//! that cuda-core's ranges arrive with their names and nesting.
//!
//! It fails, never passes, when the binary was built without the NVTX headers (NVTX calls are
//! then no-ops): the GPU bundle is built with them (`CUDA_INCLUDE_DIR`, as CI has).
#![cfg(feature = "gpu")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code: a failed check panics with its message"
)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::Mutex;

/// What the tool received, in order: `push <name>`, `push-ex`, `pop`, `mark <name>`, `mark-ex`.
static EVENTS: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// The tool's own range depth (NVTX leaves the count to the tool).
static DEPTH: Mutex<i32> = Mutex::new(0);

/// `NvtxFunctionPointer`: an untyped entry of NVTX's function table.
type NvtxFunctionPointer = Option<unsafe extern "C" fn()>;
/// `NvtxGetExportTableFunc_t`.
type GetExportTable = unsafe extern "C" fn(export_table_id: u32) -> *const c_void;

/// `NvtxExportTableCallbacks` (nvtxTypes.h).
#[repr(C)]
struct ExportTableCallbacks {
    struct_size: usize,
    get_module_function_table: Option<
        unsafe extern "C" fn(
            module: c_int,
            out_table: *mut *mut *mut NvtxFunctionPointer,
            out_size: *mut c_uint,
        ) -> c_int,
    >,
}

// nvtxTypes.h
const NVTX_ETID_CALLBACKS: u32 = 1;
const NVTX_CB_MODULE_CORE: c_int = 1;
const NVTX_CBID_CORE_MARK_EX: usize = 1;
const NVTX_CBID_CORE_MARK_A: usize = 2;
const NVTX_CBID_CORE_RANGE_PUSH_EX: usize = 8;
const NVTX_CBID_CORE_RANGE_PUSH_A: usize = 9;
const NVTX_CBID_CORE_RANGE_POP: usize = 11;

fn record(event: String) {
    EVENTS.lock().unwrap().push(event);
}

/// # Safety
/// `message` is NUL-terminated (NVTX's contract).
unsafe extern "C" fn mark_a(message: *const c_char) {
    // SAFETY: NVTX passes the caller's NUL-terminated string.
    let name = unsafe { CStr::from_ptr(message) }.to_string_lossy();
    record(format!("mark {name}"));
}

unsafe extern "C" fn mark_ex(_attributes: *const c_void) {
    record("mark-ex".into());
}

/// # Safety
/// `message` is NUL-terminated (NVTX's contract).
unsafe extern "C" fn range_push_a(message: *const c_char) -> c_int {
    // SAFETY: NVTX passes the caller's NUL-terminated string.
    let name = unsafe { CStr::from_ptr(message) }.to_string_lossy();
    record(format!("push {name}"));
    let mut depth = DEPTH.lock().unwrap();
    *depth += 1;
    *depth - 1
}

unsafe extern "C" fn range_push_ex(_attributes: *const c_void) -> c_int {
    record("push-ex".into());
    let mut depth = DEPTH.lock().unwrap();
    *depth += 1;
    *depth - 1
}

unsafe extern "C" fn range_pop() -> c_int {
    record("pop".into());
    let mut depth = DEPTH.lock().unwrap();
    *depth -= 1;
    *depth
}

/// The tool's entry point, as an injection library's `InitializeInjectionNvtx2`: fills the
/// core module's slots that the test uses; returns 1 (success).
///
/// # Safety
/// Called once by NVTX with its export-table getter.
unsafe extern "C" fn initialize_injection(get_export_table: GetExportTable) -> c_int {
    // SAFETY: NVTX's getter, asked for a table id it defines.
    let callbacks = unsafe { get_export_table(NVTX_ETID_CALLBACKS) }.cast::<ExportTableCallbacks>();
    // SAFETY: for NVTX_ETID_CALLBACKS, NVTX returns its static callbacks table (or null).
    let Some(callbacks) = (unsafe { callbacks.as_ref() }) else {
        return 0;
    };
    let Some(get_table) = callbacks.get_module_function_table else {
        return 0;
    };
    let mut table: *mut *mut NvtxFunctionPointer = std::ptr::null_mut();
    let mut size: c_uint = 0;
    // SAFETY: valid out-pointers; the core module exists in every NVTX version.
    if unsafe { get_table(NVTX_CB_MODULE_CORE, &mut table, &mut size) } == 0 || table.is_null() {
        return 0;
    }
    // SAFETY: each signature matches the NVTX function of that slot (nvToolsExt.h); a slot
    // holds a pointer to NVTX's own function-pointer variable, which NVTX then calls through.
    unsafe {
        let slots: [(usize, unsafe extern "C" fn()); 5] = [
            (
                NVTX_CBID_CORE_MARK_A,
                std::mem::transmute::<unsafe extern "C" fn(*const c_char), unsafe extern "C" fn()>(
                    mark_a,
                ),
            ),
            (
                NVTX_CBID_CORE_MARK_EX,
                std::mem::transmute::<unsafe extern "C" fn(*const c_void), unsafe extern "C" fn()>(
                    mark_ex,
                ),
            ),
            (
                NVTX_CBID_CORE_RANGE_PUSH_A,
                std::mem::transmute::<
                    unsafe extern "C" fn(*const c_char) -> c_int,
                    unsafe extern "C" fn(),
                >(range_push_a),
            ),
            (
                NVTX_CBID_CORE_RANGE_PUSH_EX,
                std::mem::transmute::<
                    unsafe extern "C" fn(*const c_void) -> c_int,
                    unsafe extern "C" fn(),
                >(range_push_ex),
            ),
            (
                NVTX_CBID_CORE_RANGE_POP,
                std::mem::transmute::<unsafe extern "C" fn() -> c_int, unsafe extern "C" fn()>(
                    range_pop,
                ),
            ),
        ];
        for (id, f) in slots {
            if id >= size as usize {
                return 0;
            }
            let slot = *table.add(id);
            if slot.is_null() {
                return 0;
            }
            *slot = Some(f);
        }
    }
    1
}

/// NVTX's static-injection hook (nvtxInit.h): a strong definition that replaces the weak,
/// null one in the NVTX code compiled into cuda-sys.
#[no_mangle]
#[used]
pub static InitializeInjectionNvtx2_fnptr: Option<unsafe extern "C" fn(GetExportTable) -> c_int> =
    Some(initialize_injection);

#[test]
fn nvtx_ranges_and_marks_reach_the_tool() {
    if !cudars_core::nvtx::ENABLED {
        panic!(
            "built without the NVTX headers: NVTX calls are no-ops (build with CUDA_INCLUDE_DIR)"
        );
    }
    {
        let _outer = cudars_core::nvtx::range("cuda-rs outer");
        assert_eq!(cudars_core::nvtx::range_push("cuda-rs inner"), Some(1));
        cudars_core::nvtx::mark("cuda-rs mark");
        assert_eq!(cudars_core::nvtx::range_pop(), Some(1));
        let _colored =
            cudars_core::nvtx::range_colored("coloured", cudars_core::nvtx::Color(0xff00_ff00));
        cudars_core::nvtx::mark_colored("coloured mark", cudars_core::nvtx::Color(0xff00_00ff));
    }
    let events = EVENTS.lock().unwrap().clone();
    assert_eq!(
        events,
        [
            "push cuda-rs outer",
            "push cuda-rs inner",
            "mark cuda-rs mark",
            "pop",
            "push-ex",
            "mark-ex",
            "pop",
            "pop",
        ],
        "what the NVTX tool received"
    );
    assert_eq!(*DEPTH.lock().unwrap(), 0);
}

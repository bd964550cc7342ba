//! CPU tests of the export / import bookkeeping: tensors over fake owners and addresses that
//! nothing dereferences (no device, no driver).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::ffi::{device_type, DLDataTypeCode, DLDevice, DLManagedTensorVersioned, DlpackFlags};
use crate::*;

/// An owner that counts its drops.
struct Counted(Arc<AtomicUsize>);
impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

const BASE: u64 = 0x7f00_0000_0000;

fn cuda(id: i32) -> DLDevice {
    DLDevice {
        device_type: device_type::CUDA,
        device_id: id,
    }
}

fn export_on(
    device: DLDevice,
    size: usize,
    spec: &TensorSpec,
) -> Result<(ExportedTensor, Arc<AtomicUsize>)> {
    let drops = Arc::new(AtomicUsize::new(0));
    // SAFETY: nothing dereferences BASE: these tests only move the structs around.
    let t = unsafe {
        ExportedTensor::from_raw_parts(device, BASE, size, Counted(drops.clone()), spec)
    }?;
    Ok((t, drops))
}

fn export(size: usize, spec: &TensorSpec) -> (ExportedTensor, Arc<AtomicUsize>) {
    export_on(cuda(0), size, spec).unwrap()
}

fn import(t: ExportedTensor) -> ImportedTensor {
    // SAFETY: a tensor this crate just made and handed over.
    unsafe { ImportedTensor::from_versioned(t.into_raw()) }.unwrap()
}

/// Hands `t` over, lets `edit` change the raw struct as another producer might have made it,
/// and imports it.
fn import_edited(
    t: ExportedTensor,
    edit: impl FnOnce(&mut DLManagedTensorVersioned),
) -> Result<ImportedTensor> {
    let raw = t.into_raw();
    // SAFETY: the struct is ours until imported; nothing else uses it.
    edit(unsafe { &mut *raw });
    // SAFETY: owned, handed over once.
    unsafe { ImportedTensor::from_versioned(raw) }
}

fn strict() -> Expect {
    Expect::new().device(0).contiguous(true).mutable(true)
}

#[test]
fn types_are_send_and_sync() {
    fn both<T: Send + Sync>() {}
    both::<ExportedTensor>();
    both::<ImportedTensor>();
    both::<TensorView<f32>>();
    both::<UntypedView>();
}

#[test]
fn round_trip_keeps_the_owner_until_the_deleter_runs_once() {
    let (t, drops) = export(24, &TensorSpec::of::<f32>([2, 3]));
    assert_eq!(t.shape(), &[2, 3]);
    assert_eq!(t.strides(), &[3, 1]);
    assert_eq!(t.data(), BASE);
    assert_eq!((t.version().major, t.version().minor), (1, 3));
    assert!(t.flags().is_empty());
    let view = import(t).into_view::<f32>(&strict()).unwrap();
    assert_eq!(view.addr(), BASE);
    assert_eq!(view.shape(), &[2, 3]);
    assert_eq!(view.strides(), &[3, 1]);
    assert_eq!(view.numel(), 6);
    assert!(view.is_contiguous());
    assert_eq!(view.layout().nbytes(), 24);
    assert_eq!(
        drops.load(Ordering::SeqCst),
        0,
        "alive while the consumer holds it"
    );
    drop(view);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn legacy_round_trip() {
    let (t, drops) = export(64, &TensorSpec::of::<u16>([4, 8]).byte_offset(0));
    // SAFETY: handed over once.
    let imported = unsafe { ImportedTensor::from_legacy(t.into_raw_legacy()) }.unwrap();
    assert!(imported.is_legacy());
    assert_eq!(imported.version(), None);
    assert!(!imported.is_read_only());
    let view = imported.into_view::<u16>(&strict()).unwrap();
    assert_eq!(view.shape(), &[4, 8]);
    drop(view);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn an_export_never_handed_over_frees_itself() {
    let (t, drops) = export(16, &TensorSpec::of::<u8>([16]));
    drop(t);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn deleter_runs_once_on_another_thread() {
    let (t, drops) = export(4096, &TensorSpec::of::<u32>([1024]));
    let view = import(t).into_view::<u32>(&strict()).unwrap();
    std::thread::spawn(move || drop(view)).join().unwrap();
    assert_eq!(drops.load(Ordering::SeqCst), 1);
    // Many at once, each dropped on its own thread.
    let counters: Vec<_> = (0..32)
        .map(|_| {
            let (t, drops) = export(4, &TensorSpec::of::<f32>([1]));
            let imported = import(t);
            (std::thread::spawn(move || drop(imported)), drops)
        })
        .collect();
    for (h, drops) in counters {
        h.join().unwrap();
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }
}

#[test]
fn a_panicking_owner_does_not_unwind_into_the_consumer() {
    struct Panics;
    impl Drop for Panics {
        fn drop(&mut self) {
            panic!("owner drop panics");
        }
    }
    // SAFETY: nothing dereferences BASE.
    let t = unsafe {
        ExportedTensor::from_raw_parts(cuda(0), BASE, 4, Panics, &TensorSpec::of::<u8>([4]))
    }
    .unwrap();
    drop(import(t)); // the deleter catches the panic
}

#[test]
fn export_refusals() {
    let refuse = |size: usize, spec: TensorSpec| export_on(cuda(0), size, &spec).err().unwrap();
    assert!(matches!(
        refuse(20, TensorSpec::of::<f32>([2, 3])),
        Error::OutOfBounds {
            first: 0,
            end: 24,
            size: 20
        }
    ));
    assert!(matches!(
        refuse(24, TensorSpec::of::<f32>([2, 3]).byte_offset(4)),
        Error::OutOfBounds { .. }
    ));
    assert!(matches!(
        refuse(24, TensorSpec::of::<f32>([2, 3]).strides([3])),
        Error::StrideCount {
            ndim: 2,
            strides: 1
        }
    ));
    assert!(matches!(
        refuse(24, TensorSpec::of::<f32>([2, -3])),
        Error::InvalidShape { .. }
    ));
    assert!(matches!(
        refuse(64, TensorSpec::of::<f32>([4]).byte_offset(2)),
        Error::Misaligned { align: 4, .. }
    ));
    assert!(matches!(
        refuse(64, TensorSpec::of::<f32>([4]).strides([-1])),
        Error::OutOfBounds { first: -12, .. }
    ));
    assert!(matches!(
        refuse(usize::MAX, TensorSpec::of::<f64>([i64::MAX, i64::MAX])),
        Error::Overflow(_)
    ));
    assert!(matches!(
        refuse(64, TensorSpec::of::<u8>(vec![1; layout::MAX_DIMS + 1])),
        Error::InvalidShape { .. }
    ));
    // Accepted: negative strides inside, broadcast, empty, a scalar, an offset view.
    assert!(export_on(
        cuda(0),
        16,
        &TensorSpec::of::<f32>([4]).strides([-1]).byte_offset(12)
    )
    .is_ok());
    assert!(export_on(cuda(0), 4, &TensorSpec::of::<f32>([8]).strides([0])).is_ok());
    assert!(export_on(cuda(0), 0, &TensorSpec::of::<f32>([0, 5])).is_ok());
    assert!(export_on(cuda(0), 8, &TensorSpec::of::<f64>([])).is_ok());
    let (t, _) = export(64, &TensorSpec::of::<f32>([2, 2]).byte_offset(32));
    assert_eq!(
        t.data(),
        BASE + 32,
        "the offset is folded into the data pointer"
    );
    assert_eq!(t.dl_tensor().byte_offset, 0);
}

#[test]
fn a_refused_import_runs_the_deleter_and_check_keeps_the_tensor() {
    let (t, drops) = export(24, &TensorSpec::of::<f32>([2, 3]));
    let imported = import(t);
    assert!(matches!(
        imported.check(&Expect::new().elem(ElemType::I32)),
        Err(Error::TypeMismatch {
            expected: ElemType::I32,
            actual: ElemType::F32
        })
    ));
    assert_eq!(drops.load(Ordering::SeqCst), 0, "check keeps the tensor");
    assert!(matches!(
        imported.into_view::<i32>(&Expect::new()),
        Err(Error::TypeMismatch { .. })
    ));
    assert_eq!(
        drops.load(Ordering::SeqCst),
        1,
        "a refused into_view releases it"
    );
}

#[test]
fn device_refusals() {
    let spec = TensorSpec::of::<f32>([4]);
    let cpu = DLDevice {
        device_type: device_type::CPU,
        device_id: 0,
    };
    let (t, drops) = export_on(cpu, 16, &spec).unwrap();
    assert!(matches!(
        import(t).into_view::<f32>(&Expect::new()),
        Err(Error::NotCuda { device_type: 1, .. })
    ));
    assert_eq!(drops.load(Ordering::SeqCst), 1);

    let (t, _) = export_on(cuda(1), 16, &spec).unwrap();
    assert!(matches!(
        import(t).into_view::<f32>(&Expect::new().device(0)),
        Err(Error::WrongDevice {
            expected: 0,
            actual: 1
        })
    ));
    let (t, _) = export_on(cuda(1), 16, &spec).unwrap();
    assert!(
        import(t).into_view::<f32>(&Expect::new()).is_ok(),
        "no device asked"
    );
    // A negative device id is no ordinal: refused whether or not a device is asked for.
    let (t, drops) = export_on(cuda(-1), 16, &spec).unwrap();
    assert!(matches!(
        import(t).into_view::<f32>(&Expect::new()),
        Err(Error::InvalidDevice(-1))
    ));
    assert_eq!(
        drops.load(Ordering::SeqCst),
        1,
        "the refused tensor is released"
    );

    let managed = DLDevice {
        device_type: device_type::CUDA_MANAGED,
        device_id: 0,
    };
    let (t, _) = export_on(managed, 16, &spec).unwrap();
    assert!(matches!(
        import(t).into_view::<f32>(&Expect::new().device(1)),
        Err(Error::NotCuda {
            device_type: 13,
            ..
        })
    ));
    let (t, _) = export_on(managed, 16, &spec).unwrap();
    let view = import(t)
        .into_view::<f32>(&Expect::new().device(1).allow_managed(true))
        .unwrap();
    assert_eq!(view.layout().device, None);
}

#[test]
fn dtype_refusals() {
    let (t, drops) = export(64, &TensorSpec::of::<f32>([4]));
    let imported = import_edited(t, |m| {
        m.dl_tensor.dtype.lanes = 4;
    })
    .unwrap();
    assert!(matches!(
        imported.into_view::<f32>(&Expect::new()),
        Err(Error::UnsupportedDType {
            code: 2,
            bits: 32,
            lanes: 4
        })
    ));
    assert_eq!(drops.load(Ordering::SeqCst), 1);
    let (t, _) = export(64, &TensorSpec::of::<f32>([4]));
    let imported = import_edited(t, |m| {
        m.dl_tensor.dtype.code = DLDataTypeCode::COMPLEX;
        m.dl_tensor.dtype.bits = 64;
    })
    .unwrap();
    assert!(matches!(
        imported.elem_type(),
        Err(Error::UnsupportedDType { code: 5, .. })
    ));
    let (t, _) = export(64, &TensorSpec::of::<half::bf16>([4]));
    assert!(import(t).into_view::<half::bf16>(&Expect::new()).is_ok());
    let (t, _) = export(64, &TensorSpec::of::<bool>([4]));
    assert!(import(t).into_view::<bool>(&Expect::new()).is_ok());
}

#[test]
fn stride_refusals_only_when_contiguous_is_asked() {
    // Column-major 2x3.
    let spec = TensorSpec::of::<f32>([2, 3]).strides([1, 2]);
    let (t, _) = export(24, &spec);
    let err = import(t).into_view::<f32>(&strict()).unwrap_err();
    assert!(matches!(err, Error::NotContiguous { .. }), "{err}");
    let (t, _) = export(24, &spec);
    let view = import(t).into_view::<f32>(&Expect::new()).unwrap();
    assert!(!view.is_contiguous());
    assert_eq!(view.strides(), &[1, 2]);

    // Reversed.
    let spec = TensorSpec::of::<f32>([4]).strides([-1]).byte_offset(12);
    let (t, _) = export(16, &spec);
    assert!(matches!(
        import(t).into_view::<f32>(&strict()),
        Err(Error::NegativeStride { dim: 0, stride: -1 })
    ));
    let (t, _) = export(16, &spec);
    let view = import(t).into_view::<f32>(&Expect::new()).unwrap();
    assert_eq!(view.layout().first_byte, -12);
    assert_eq!(view.layout().span, 16);
}

#[test]
fn null_strides_mean_compact_row_major() {
    let (t, drops) = export(96, &TensorSpec::of::<i32>([2, 3, 4]));
    let imported = import_edited(t, |m| m.dl_tensor.strides = std::ptr::null_mut()).unwrap();
    assert_eq!(imported.strides(), None);
    let view = imported.into_view::<i32>(&strict()).unwrap();
    assert_eq!(view.strides(), &[12, 4, 1]);
    assert!(view.is_contiguous());
    drop(view);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn misaligned_byte_offsets_are_refused() {
    let (t, _) = export(64, &TensorSpec::of::<f32>([4]));
    let imported = import_edited(t, |m| m.dl_tensor.byte_offset = 2).unwrap();
    assert!(matches!(
        imported.into_view::<f32>(&Expect::new()),
        Err(Error::Misaligned { addr, align: 4 }) if addr == BASE + 2
    ));
    let (t, _) = export(64, &TensorSpec::of::<f32>([4]));
    let imported = import_edited(t, |m| m.dl_tensor.byte_offset = 8).unwrap();
    assert_eq!(
        imported.into_view::<f32>(&Expect::new()).unwrap().addr(),
        BASE + 8
    );
}

#[test]
fn read_only_refused_for_a_mutable_view() {
    let spec = TensorSpec::of::<u8>([8]).read_only(true);
    let (t, _) = export(8, &spec);
    assert_eq!(t.flags(), DlpackFlags::READ_ONLY);
    assert!(matches!(
        import(t).into_view::<u8>(&strict()),
        Err(Error::ReadOnly)
    ));
    let (t, _) = export(8, &spec);
    let view = import(t).into_view::<u8>(&Expect::new()).unwrap();
    assert!(view.tensor().is_read_only());
}

#[test]
fn null_data_and_bad_structure() {
    let (t, _) = export(16, &TensorSpec::of::<f32>([4]));
    let imported = import_edited(t, |m| m.dl_tensor.data = std::ptr::null_mut()).unwrap();
    assert!(matches!(
        imported.into_view::<f32>(&Expect::new()),
        Err(Error::Null("data"))
    ));

    let (t, drops) = export(16, &TensorSpec::of::<f32>([4]));
    let err = import_edited(t, |m| m.dl_tensor.ndim = -1).unwrap_err();
    assert!(matches!(err, Error::InvalidShape { .. }));
    assert_eq!(
        drops.load(Ordering::SeqCst),
        1,
        "refused at construction: deleter called"
    );

    let (t, _) = export(16, &TensorSpec::of::<f32>([4]));
    let err = import_edited(t, |m| m.dl_tensor.shape = std::ptr::null_mut()).unwrap_err();
    assert!(matches!(err, Error::Null("shape")));

    // SAFETY: null is allowed and refused.
    let versioned = unsafe { ImportedTensor::from_versioned(std::ptr::null_mut()) };
    assert!(matches!(versioned, Err(Error::Null(_))));
    // SAFETY: as above.
    let legacy = unsafe { ImportedTensor::from_legacy(std::ptr::null_mut()) };
    assert!(matches!(legacy, Err(Error::Null(_))));
}

#[test]
fn another_major_version_is_released_and_refused() {
    let (t, drops) = export(16, &TensorSpec::of::<f32>([4]));
    let err = import_edited(t, |m| m.version.major = 2).unwrap_err();
    assert!(matches!(
        err,
        Error::UnsupportedVersion { major: 2, minor: 3 }
    ));
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn minor_version_follows_the_consumer() {
    let (mut t, _) = export(16, &TensorSpec::of::<f32>([4]));
    t.set_minor_version(1);
    assert_eq!(t.version().minor, 1);
    t.set_minor_version(99);
    assert_eq!(t.version().minor, 3, "never above this crate's");
}

#[test]
fn scalars_and_empty_tensors() {
    let (t, _) = export(8, &TensorSpec::of::<f64>([]));
    assert!(t.dl_tensor().shape.is_null());
    let view = import(t).into_view::<f64>(&strict()).unwrap();
    assert_eq!(view.numel(), 1);
    assert_eq!(view.shape(), &[] as &[i64]);
    let (t, _) = export(0, &TensorSpec::of::<f32>([0, 3]));
    let view = import(t).into_view::<f32>(&strict()).unwrap();
    assert_eq!(view.numel(), 0);
    assert_eq!(view.layout().span, 0);
}

#[test]
fn errors_convert_into_the_core_error() {
    let e: cudars_core::Error = Error::ReadOnly.into();
    assert!(e.to_string().contains("read-only"));
    assert!(e.downcast_ref::<Error>().is_some());
}

#[test]
fn a_first_byte_below_i64_min_is_an_overflow_not_a_wrap() {
    // An address above 2^63 with negative strides reaching more than 2^63 bytes below it:
    // inside the address space, but the offset of the first byte does not fit an i64.
    let mut shape = [2i64, 2];
    let mut strides = [i64::MIN, -(1i64 << 62)];
    let (t, drops) = export(16, &TensorSpec::of::<u8>([2, 2]));
    let imported = import_edited(t, |m| {
        m.dl_tensor.data = 0xFFFF_FFFF_FFFF_FF00u64 as usize as *mut std::ffi::c_void;
        m.dl_tensor.shape = shape.as_mut_ptr();
        m.dl_tensor.strides = strides.as_mut_ptr();
    })
    .unwrap();
    assert!(matches!(
        imported.check(&Expect::new()),
        Err(Error::Overflow(_))
    ));
    // Dropped while `shape` and `strides` (which it points to) are still alive.
    drop(imported);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn element_bytes_past_u64_are_refused_not_overflowed() {
    // A broadcast tensor (stride 0) of 2^62 f64 elements spans 8 bytes, but its elements'
    // bytes (2^65) are no u64: `Layout::nbytes` would overflow.
    let mut shape = [1i64 << 62];
    let mut strides = [0i64];
    let (t, drops) = export(8, &TensorSpec::of::<f64>([1]));
    let imported = import_edited(t, |m| {
        m.dl_tensor.shape = shape.as_mut_ptr();
        m.dl_tensor.strides = strides.as_mut_ptr();
    })
    .unwrap();
    assert!(matches!(
        imported.check(&Expect::new()),
        Err(Error::Overflow("element bytes"))
    ));
    // Dropped while `shape` and `strides` (which it points to) are still alive.
    drop(imported);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
    let layout = Layout {
        elem: ElemType::F64,
        device: Some(0),
        addr: 0,
        shape: vec![1 << 62],
        strides: vec![0],
        contiguous: false,
        first_byte: 0,
        span: 8,
        numel: 1 << 62,
    };
    assert_eq!(layout.nbytes(), usize::MAX, "a hand-made layout saturates");
}

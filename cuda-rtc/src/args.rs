//! Kernel arguments that pass themselves: [`KernelArg`] for one, [`KernelArgs`] for a tuple.
//!
//! | argument | passed as | before the launch |
//! | --- | --- | --- |
//! | `&DevicePtr`, `&DeviceMemory` | its device address (8 bytes) | device checked; [`DevicePtr::record_stream`] on the launch stream (the memory is not freed or reused before the kernel is done, and the stream is ordered after its earlier owner: the workspace's one ordering rule) |
//! | `u8` ... `u64`, `i8` ... `i64`, `usize`, `isize`, `f32`, `f64`, `bool` | by value | - |
//! | [`ByValue<T>`] of any `bytemuck::Pod` `T` (a `#[repr(C)]` struct) | by value | - |

use std::ffi::c_void;

use cudars_core::memory::{DeviceMemory, DevicePtr};
use cudars_core::module::ParamInfo;
use cudars_core::{Device, Issue};

use crate::error::{Error, Result};

/// One kernel argument: the bytes it passes, and what it does before the launch.
pub trait KernelArg {
    /// The value the kernel receives (its size is checked against the parameter's).
    type Raw: Copy;

    /// The value passed.
    fn raw(&self) -> Self::Raw;

    /// Called before the launch, with the launch's [`Issue`] (the capture gate held, the
    /// stream checked to be of the kernel's device, [`Issue::device`]): checks the argument
    /// against that device and marks memory as used ([`DevicePtr::record_stream`]). An error
    /// stops the launch.
    fn prepare(&self, issue: &Issue<'_>) -> Result<()> {
        let _ = issue;
        Ok(())
    }

    /// For a kernel node of a graph on `device` (`cuda-graph`'s typed kernel nodes): the
    /// buffer the graph must keep alive for this argument, if any. Checks the argument's
    /// device like [`prepare`](Self::prepare). An argument that no graph can keep alive
    /// (a borrowed [`DeviceMemory`]) is an error. The default keeps nothing.
    fn keep_alive(&self, device: Device) -> Result<Option<DevicePtr>> {
        let _ = device;
        Ok(None)
    }
}

macro_rules! by_value {
    ($($t:ty),*) => {$(
        impl KernelArg for $t {
            type Raw = $t;
            #[inline]
            fn raw(&self) -> $t {
                *self
            }
        }
    )*};
}
by_value!(u8, u16, u32, u64, i8, i16, i32, i64, usize, isize, f32, f64, bool);

/// Any plain-old-data value passed by value (a `#[repr(C)]` struct the kernel takes by value).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ByValue<T: bytemuck::Pod>(pub T);

impl<T: bytemuck::Pod> KernelArg for ByValue<T> {
    type Raw = T;
    #[inline]
    fn raw(&self) -> T {
        self.0
    }
}

fn same_device(what: Device, kernel: Device) -> Result<()> {
    if what == kernel {
        Ok(())
    } else {
        Err(Error::Cuda(cudars_core::Error::WrongDevice {
            what: "kernel argument",
            expected: kernel.ordinal(),
            actual: what.ordinal(),
        }))
    }
}

impl KernelArg for &DevicePtr {
    type Raw = u64;
    #[inline]
    fn raw(&self) -> u64 {
        self.as_raw()
    }
    #[inline]
    fn prepare(&self, issue: &Issue<'_>) -> Result<()> {
        same_device(self.device(), issue.device())?;
        Ok(self.record_stream(issue)?)
    }
    fn keep_alive(&self, device: Device) -> Result<Option<DevicePtr>> {
        same_device(self.device(), device)?;
        Ok(Some((*self).clone()))
    }
}

impl KernelArg for &DeviceMemory {
    type Raw = u64;
    #[inline]
    fn raw(&self) -> u64 {
        self.as_raw()
    }
    #[inline]
    fn prepare(&self, issue: &Issue<'_>) -> Result<()> {
        // `cuMemFree` waits for the device: nothing to record.
        same_device(self.device(), issue.device())
    }
    fn keep_alive(&self, _device: Device) -> Result<Option<DevicePtr>> {
        Err(Error::Cuda(cudars_core::Error::Unsupported(
            "a borrowed DeviceMemory as a graph kernel node's argument: the graph could not \
             keep it alive; pass a DevicePtr (DeviceMemory::into_ptr)",
        )))
    }
}

/// A tuple of [`KernelArg`]s: `()`, `(a,)`, `(a, b)`, ... up to 16.
pub trait KernelArgs {
    /// How many arguments.
    const COUNT: usize;

    /// Each argument's size in bytes, in order.
    fn sizes() -> Vec<usize>;

    /// [`Error::ArgCount`] or [`Error::ArgSize`] unless the arguments match `params` in number
    /// and in each size. Allocates nothing.
    fn check(kernel: &str, params: &[ParamInfo]) -> Result<()>;

    /// [`KernelArg::prepare`] of each argument, in order.
    fn prepare(&self, issue: &Issue<'_>) -> Result<()>;

    /// [`KernelArg::keep_alive`] of each argument, in order: the buffers go to `kept`.
    fn keep_alive(&self, device: Device, kept: &mut Vec<DevicePtr>) -> Result<()>;

    /// Calls `f` with one pointer per argument to its [`KernelArg::Raw`] value, as the
    /// driver's `kernelParams` wants them.
    fn with_params<R>(&self, f: impl FnOnce(&mut [*mut c_void]) -> R) -> R;
}

/// [`Error::ArgCount`] unless `given == params.len()`.
#[inline]
fn check_count(kernel: &str, params: &[ParamInfo], given: usize) -> Result<()> {
    if params.len() == given {
        Ok(())
    } else {
        Err(Error::ArgCount {
            kernel: kernel.into(),
            expected: params.len(),
            given,
        })
    }
}

/// [`Error::ArgSize`] unless parameter `index` takes `given` bytes.
#[inline]
fn check_size(kernel: &str, params: &[ParamInfo], index: usize, given: usize) -> Result<()> {
    match params.get(index) {
        Some(p) if p.size == given => Ok(()),
        Some(p) => Err(Error::ArgSize {
            kernel: kernel.into(),
            index,
            expected: p.size,
            given,
        }),
        None => check_count(kernel, params, index + 1),
    }
}

impl KernelArgs for () {
    const COUNT: usize = 0;
    fn sizes() -> Vec<usize> {
        Vec::new()
    }
    fn check(kernel: &str, params: &[ParamInfo]) -> Result<()> {
        check_count(kernel, params, 0)
    }
    fn prepare(&self, _issue: &Issue<'_>) -> Result<()> {
        Ok(())
    }
    fn keep_alive(&self, _device: Device, _kept: &mut Vec<DevicePtr>) -> Result<()> {
        Ok(())
    }
    fn with_params<R>(&self, f: impl FnOnce(&mut [*mut c_void]) -> R) -> R {
        f(&mut [])
    }
}

macro_rules! tuple_args {
    ($count:literal; $($name:ident $idx:tt),+) => {
        impl<$($name: KernelArg),+> KernelArgs for ($($name,)+) {
            const COUNT: usize = $count;
            fn sizes() -> Vec<usize> {
                vec![$(std::mem::size_of::<$name::Raw>()),+]
            }
            #[inline]
            fn check(kernel: &str, params: &[ParamInfo]) -> Result<()> {
                check_count(kernel, params, $count)?;
                $(check_size(kernel, params, $idx, std::mem::size_of::<$name::Raw>())?;)+
                Ok(())
            }
            #[inline]
            fn prepare(&self, issue: &Issue<'_>) -> Result<()> {
                $(self.$idx.prepare(issue)?;)+
                Ok(())
            }
            fn keep_alive(&self, device: Device, kept: &mut Vec<DevicePtr>) -> Result<()> {
                $(kept.extend(self.$idx.keep_alive(device)?);)+
                Ok(())
            }
            #[inline]
            fn with_params<R>(&self, f: impl FnOnce(&mut [*mut c_void]) -> R) -> R {
                #[allow(non_snake_case)]
                let ($(mut $name,)+) = ($(self.$idx.raw(),)+);
                let mut params = [$(&mut $name as *mut $name::Raw as *mut c_void),+];
                f(&mut params)
            }
        }
    };
}

tuple_args!(1; A 0);
tuple_args!(2; A 0, B 1);
tuple_args!(3; A 0, B 1, C 2);
tuple_args!(4; A 0, B 1, C 2, D 3);
tuple_args!(5; A 0, B 1, C 2, D 3, E 4);
tuple_args!(6; A 0, B 1, C 2, D 3, E 4, F 5);
tuple_args!(7; A 0, B 1, C 2, D 3, E 4, F 5, G 6);
tuple_args!(8; A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7);
tuple_args!(9; A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8);
tuple_args!(10; A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9);
tuple_args!(11; A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9, K 10);
tuple_args!(12; A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9, K 10, L 11);
tuple_args!(13; A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9, K 10, L 11, M 12);
tuple_args!(14; A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9, K 10, L 11, M 12, N 13);
tuple_args!(15; A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9, K 10, L 11, M 12, N 13, O 14);
tuple_args!(16; A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9, K 10, L 11, M 12, N 13, O 14, P 15);

#[cfg(test)]
mod tests {
    use super::*;

    /// What `cuFuncGetParamInfo` reports for `saxpy(float a, const float* x, float* y, unsigned long long n)`.
    fn saxpy_params() -> Vec<ParamInfo> {
        vec![
            ParamInfo { offset: 0, size: 4 },
            ParamInfo { offset: 8, size: 8 },
            ParamInfo {
                offset: 16,
                size: 8,
            },
            ParamInfo {
                offset: 24,
                size: 8,
            },
        ]
    }

    #[test]
    fn matching_arguments_pass_the_check() {
        <(f32, &DevicePtr, &DevicePtr, u64) as KernelArgs>::check("saxpy", &saxpy_params())
            .unwrap();
        <(f32, &DeviceMemory, &DevicePtr, usize)>::check("saxpy", &saxpy_params()).unwrap();
        <()>::check("none", &[]).unwrap();
        assert_eq!(<(f32, &DevicePtr, u8)>::sizes(), vec![4, 8, 1]);
    }

    #[test]
    fn a_wrong_count_is_refused() {
        match <(f32, &DevicePtr, &DevicePtr)>::check("saxpy", &saxpy_params()) {
            Err(Error::ArgCount {
                kernel,
                expected: 4,
                given: 3,
            }) => assert_eq!(kernel, "saxpy"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            <(f32, &DevicePtr, &DevicePtr, u64, u64)>::check("saxpy", &saxpy_params()),
            Err(Error::ArgCount { given: 5, .. })
        ));
        assert!(matches!(
            <()>::check("saxpy", &saxpy_params()),
            Err(Error::ArgCount { given: 0, .. })
        ));
        assert!(matches!(
            <(u32,)>::check("none", &[]),
            Err(Error::ArgCount {
                expected: 0,
                given: 1,
                ..
            })
        ));
    }

    #[test]
    fn a_wrong_size_is_refused_with_its_index() {
        // f64 where the kernel takes a float; u32 where it takes an unsigned long long.
        match <(f64, &DevicePtr, &DevicePtr, u64)>::check("saxpy", &saxpy_params()) {
            Err(Error::ArgSize {
                index: 0,
                expected: 4,
                given: 8,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        match <(f32, &DevicePtr, &DevicePtr, u32)>::check("saxpy", &saxpy_params()) {
            Err(e @ Error::ArgSize { index: 3, .. }) => {
                let text = e.to_string();
                assert!(text.contains("parameter 3 is 8 byte(s)"), "{text}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn struct_arguments_are_checked_by_their_size() {
        #[repr(C)]
        #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
        struct Params {
            scale: f32,
            shift: f32,
            n: u64,
        }
        let params = [ParamInfo {
            offset: 0,
            size: 16,
        }];
        <(ByValue<Params>,)>::check("k", &params).unwrap();
        assert!(<(ByValue<[f32; 2]>,)>::check("k", &params).is_err());
    }

    #[test]
    fn parameters_point_at_each_value_in_order() {
        let args = (7u32, 2.5f64, ByValue([1u8, 2, 3]));
        args.with_params(|p| {
            assert_eq!(p.len(), 3);
            // SAFETY: each pointer points at the matching value, alive for the closure.
            unsafe {
                assert_eq!(*(p[0] as *const u32), 7);
                assert_eq!(*(p[1] as *const f64), 2.5);
                assert_eq!(*(p[2] as *const [u8; 3]), [1, 2, 3]);
            }
        });
    }
}

// A `KernelArg` is prepared with the launch's `Issue`: an implementation cannot mark its
// memory outside the gate the launch holds.
struct Arg(cudars_core::DevicePtr);

impl cudars_rtc::KernelArg for Arg {
    type Raw = u64;
    fn raw(&self) -> u64 {
        self.0.as_raw()
    }
    fn prepare(&self, device: cudars_core::Device, stream: &cudars_core::Stream) -> cudars_rtc::Result<()> {
        let _ = device;
        Ok(self.0.record_stream(stream)?)
    }
}

fn main() {}

// The driver's module loader (`cuModuleLoadDataEx`, given no length) follows the indices and
// offsets inside a cubin or fatbin without checking them: crafted bytes that pass the extent
// check crashed or hung the loading process (soundness round 3, item 3). Loading raw image
// bytes is therefore `unsafe`; PTX text (`Module::from_ptx`) and cuda-rtc's own compiled
// images (`Compiled::load`) stay safe.
use cudars_core::{module::Module, Device};

fn main() {
    let dev = Device::new(0).unwrap();
    let bytes = std::fs::read("kernel.cubin").unwrap();
    let _ = Module::from_cubin(&dev, &bytes);
    let _ = Module::from_fatbin(&dev, &bytes);
    let _ = Module::from_image(&dev, &bytes);
}
